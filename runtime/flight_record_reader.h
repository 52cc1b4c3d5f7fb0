// runtime/flight_record_reader.h: reads a flight record (runtime/flight_recorder.h),
// whether its process is dead or still running.
//
//   absl::StatusOr<FlightRecord> r = ReadFlightRecord("/var/tmp/job.flight");
//   for (const FlightRecord::Device& d : r->devices) ... d.sites, d.events, d.allocated
//
// What is an error and what is not. A file that is not a flight record, of another
// version, shorter than its header declares, or whose header is damaged (its check) is
// an error naming the file and the field or byte offset. Inside a valid header, a
// record that is torn (a writer stopped inside it: the write in flight when the process
// died, or one racing this read) or damaged (its check does not match) is skipped and
// listed in `problems` with its offset, never read as values: a torn record is expected
// (at most one per lane, and one segment-stats copy, after a death), a damaged one is
// not, and makes
// the record inconsistent (consistent() is false). A file of another version (1:
// before lanes) is an error naming the file and both versions; it is not read.
//
// Thread-safety: pure functions of their input.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/types.h"
#include "runtime/json.h"
#include "runtime/trace.h"

namespace devmem {

struct FlightRecord {
  uint32_t version = 0;
  uint32_t pid = 0;
  int64_t start_unix_ns = 0;
  int64_t start_mono_ns = 0;
  // False when no clock point far enough from the anchor was written (a process that
  // lived a few milliseconds): times are then ticks since the start, not nanoseconds.
  bool clock_calibrated = true;
  SiteMap sites;  // the writing process's site ids and names (names may be cut)

  // A site's live bytes and count on a device: the sum of the lanes' shares.
  struct SiteLive {
    SiteId site = 0;
    int64_t bytes = 0;
    int64_t count = 0;
    uint64_t allocs = 0;  // allocations of the site recorded, ever
  };
  // One lane of a region (a thread's, or the shared last one: flight_recorder.h).
  struct Lane {
    uint32_t lane = 0;
    uint64_t claimed = 0;   // events numbered in it so far (its newest number, torn too)
    uint64_t last_seq = 0;  // its newest complete event in its ring (0: none)
    int64_t peak = 0;       // its share of the live bytes at their highest
    uint64_t torn = 0;      // torn records skipped in it
  };
  struct Device {
    uint32_t slot = 0;         // region index (allocators in the order they were made)
    DeviceId device;
    uint64_t claimed = 0;      // events numbered so far, all lanes
    int64_t last_event_ns = 0;  // the newest complete event's time
    // The lanes' sums. peak_allocated is the sum of the lanes' peaks: exact when one
    // thread allocated, else an upper bound (the lanes' peaks need not coincide).
    int64_t allocated = 0, peak_allocated = 0, allocations = 0;
    int64_t alloc_count = 0, free_count = 0;
    int64_t reserved = 0, peak_reserved = 0, segments = 0, mapped = 0;
    int64_t device_allocs = 0, device_frees = 0, ooms = 0;
    std::vector<SiteLive> sites;    // live (count or bytes non-zero), by site id
    std::vector<Lane> lanes;        // lanes written (events or torn records), by index
    // The rings' complete events, the lanes merged by (stamp, lane), each lane's own
    // order kept: the stamps are causal (flight_recorder.h, "Order"), so ties are
    // events no thread ordered. Each event's seq is its lane's number; event_lanes[i]
    // its lane.
    std::vector<TraceEvent> events;
    std::vector<uint32_t> event_lanes;
    uint64_t torn = 0;              // torn records skipped in this region
  };
  std::vector<Device> devices;      // regions in use

  struct Problem {
    size_t offset = 0;
    bool torn = false;  // torn (expected after a death) rather than damaged
    std::string what;
  };
  std::vector<Problem> problems;
  uint64_t torn = 0;
  uint64_t damaged = 0;
  bool consistent() const { return damaged == 0; }
};

// True when `bytes` starts with the flight record's magic (what memtrace's input
// detection asks).
bool LooksLikeFlightRecord(std::string_view bytes);

// True when the file at `path` starts with that magic (false when it cannot be read:
// the caller's own reader then says why).
bool IsFlightRecordFile(const std::string& path);

// Parses a whole file's bytes; `name` (the path) starts every message.
absl::StatusOr<FlightRecord> ParseFlightRecord(std::string_view bytes, const std::string& name);
// Reads `path` and parses it. The error names the path.
absl::StatusOr<FlightRecord> ReadFlightRecord(const std::string& path);

// Every device's events merged by time (ties: slot, then the device's own order) and
// numbered 1, 2, ...
// again, as one trace (the trace format's rules: docs/formats.md).
std::vector<TraceEvent> FlightRecordEvents(const FlightRecord& record);
// The same as a trace file's text (devmem.trace/1: the header with the record's site
// table, then one line per event), for the readers of traces (timeline, export).
std::string FlightRecordToTraceJsonl(const FlightRecord& record);

}  // namespace devmem
