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
// (at most one per allocator region after a death), a damaged one is not, and makes
// the record inconsistent (consistent() is false).
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

  struct SiteLive {
    SiteId site = 0;
    int64_t bytes = 0;
    int64_t count = 0;
    uint64_t seq = 0;  // the event that last changed it
  };
  struct Device {
    uint32_t slot = 0;         // region index (allocators in the order they were made)
    DeviceId device;
    uint64_t claimed = 0;      // events numbered so far (the next number minus one)
    uint64_t last_seq = 0;     // the newest complete event in the ring (0: none)
    // Stats as of event `stats_seq` (the newer of the two summaries' seqs).
    uint64_t stats_seq = 0;
    int64_t last_event_ns = 0;
    int64_t allocated = 0, peak_allocated = 0, allocations = 0;
    int64_t alloc_count = 0, free_count = 0;
    int64_t reserved = 0, peak_reserved = 0, segments = 0, mapped = 0;
    int64_t device_allocs = 0, device_frees = 0, ooms = 0;
    std::vector<SiteLive> sites;    // live (count or bytes non-zero), by site id
    std::vector<TraceEvent> events; // the ring's complete events, oldest first
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

// Every device's events merged by time (ties: slot, then seq) and numbered 1, 2, ...
// again, as one trace (the trace format's rules: docs/formats.md).
std::vector<TraceEvent> FlightRecordEvents(const FlightRecord& record);
// The same as a trace file's text (devmem.trace/1: the header with the record's site
// table, then one line per event), for the readers of traces (timeline, export).
std::string FlightRecordToTraceJsonl(const FlightRecord& record);

}  // namespace devmem
