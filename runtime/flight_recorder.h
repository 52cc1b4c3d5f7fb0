// runtime/flight_recorder.h: a record of the process's allocator state that outlives it.
//
// With `flight_recorder:PATH` the runtime keeps, in PATH mapped MAP_SHARED, the recent
// events of each allocator (a ring), the live bytes and counts per site, and the stats
// (allocated, reserved, segments, peaks, OOMs), all current after every event. The
// mapping is the page cache itself: when the process dies for any reason (SIGKILL, the
// OOM killer, a driver fault, abort) nothing needs to be written at death, and the file
// holds the state of the last event. `memtrace postmortem PATH` reads it
// (runtime/flight_record_reader.h); the layout is runtime/flight_record_format.h and
// docs/formats.md ("Flight record").
//
//   absl::StatusOr<std::unique_ptr<FlightRecorder>> r = FlightRecorder::Create(path);
//   FlightDevice* d = (*r)->AddAllocator(allocator.device());
//   allocator.set_observer(d);          // or: DeviceObserver forwards to d->Record
//
// The file. Created with O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600 (it names files,
// functions and tags); an existing PATH is reused only when it is a regular file of
// this user with one link (then truncated, chmod 0600); a symlink, another user's file
// or anything else is refused with the reason. The file is locked (flock, exclusive)
// while the process lives, so a second process given the same PATH is refused instead
// of overwriting a live record, and a reader can tell a live record from a dead one.
// Its size is fixed at creation (about 28 MiB with the defaults: mostly the rings) and
// reserved on disk (posix_fallocate), so a full disk is an error at start rather than a
// SIGBUS later.
//
// Concurrency (docs/architecture.md, "Flight recorder"). Each allocator gets its own
// device region (AddAllocator), and an allocator's observer is called under its device
// lock (allocator/observer.h), so each region has one writer at a time and the lock
// orders successive writers: the ring's claim counter, the live-site entries and the
// stats are updated with plain (relaxed atomic) stores, no read-modify-write, in this
// order: ring slot, live-site entry, stats. Every record is committed seqlock-style
// (runtime/flight_record_format.h), so a reader, in this process or another, during
// the process's life or after its death, can tell complete records from torn ones; the
// summaries are double-buffered, so the one write a death can tear leaves the previous
// copy whole. The site table is shared by all regions: a site is named by the first
// thread that records it (a compare-and-swap on a per-site flag of this process), once.
// Two allocators of one device (an override, a replaced allocator) get two regions,
// never one shared by two device locks.
//
// Cost: Record runs on every allocation and free; devmem-bench reports
// flight_recorder_overhead_ratio (tools/bench/flight_recorder.cc), target <= 1.15.
//
// Time. Events are stamped with CLOCK_MONOTONIC (NowNs) as a thread of the recorder
// last read it: it refreshes one atomic every millisecond, and Record loads it. So an
// event's time is up to about a millisecond early (more while that thread waits for a
// CPU), and the order of events is their numbers', not their times'. Reading a clock
// per event cost more than all the rest of Record on the development VM (the TSC
// 10-30 ns a read, the vDSO's coarse clock 5-15 ns, under load).
//
// Lifetime: the recorder and its FlightDevices must outlive every allocator they
// observe; the runtime keeps its recorder for the life of the process (runtime.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "allocator/mutex.h"
#include "allocator/observer.h"
#include "allocator/types.h"

namespace devmem {

class FlightRecorder;

// The writer of one allocator's region. Not copyable; owned by its FlightRecorder.
// Thread-safety: Record may be called from any thread. Most events arrive under the
// device lock, but thread-cache hits report from their own thread without it
// (allocator/observer.h), so Record serializes writers on `write_mu_`: the region keeps
// exactly one writer at a time, which the seqlock records rely on.
class FlightDevice final : public AllocatorObserver {
 public:
  void on_event(const AllocEvent& event) override { Record(event); }
  // on_event without the virtual dispatch (DeviceObserver forwards here).
  void Record(const AllocEvent& event);

  FlightDevice(const FlightDevice&) = delete;
  FlightDevice& operator=(const FlightDevice&) = delete;

 private:
  friend class FlightRecorder;
  FlightDevice(FlightRecorder* recorder, unsigned char* region);
  void RecordSite(SiteId site, int64_t bytes, int64_t count, uint64_t seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  Mutex write_mu_;  // one writer of the region at a time (see above)
  void WriteHot(uint64_t seq, int64_t tick);
  void WriteCold(uint64_t seq);

  struct SiteLive {
    int64_t bytes = 0;
    int64_t count = 0;
    uint32_t next_copy = 0;
  };

  FlightRecorder* const recorder_;
  uint64_t* const page_;   // the device page (identity, claim counter, stats)
  uint64_t* const sites_;  // site_slots x 8 words
  uint64_t* const ring_;   // ring_slots x 8 words
  const uint64_t ring_mask_;
  const uint32_t site_slots_;
  // This process's copy of what the region holds (the writer never reads the mapping).
  uint64_t next_seq_ = 1;
  std::vector<SiteLive> live_;
  int64_t allocated_ = 0, peak_allocated_ = 0, allocations_ = 0;
  int64_t alloc_count_ = 0, free_count_ = 0;
  int64_t reserved_ = 0, peak_reserved_ = 0, mapped_ = 0;
  int64_t segments_ = 0, device_allocs_ = 0, device_frees_ = 0, ooms_ = 0;
  uint32_t hot_copy_ = 0, cold_copy_ = 0;
  // Regular segments (segment_alloc) by address, so that a segment_free is known to
  // end one (an expandable run's release is a segment_free too, with no alloc).
  std::unordered_map<uintptr_t, size_t> regular_segments_;
};

class FlightRecorder {
 public:
  struct Options {
    uint32_t device_slots = 8;       // allocators recorded (one region each)
    uint32_t ring_slots = 1u << 15;  // events kept per allocator (a power of two)
    uint32_t site_slots = 16392;     // site ids with their own entry (the last: the rest)
    uint32_t name_slot_bytes = 256;  // bytes per site name (file, function, tag cut)
  };

  // Creates (or safely reuses, see the file comment) `path`, sized for `options`. The
  // error names the path and the reason. Nothing is left half-made on error: a file
  // this call created is removed.
  static absl::StatusOr<std::unique_ptr<FlightRecorder>> Create(const std::string& path,
                                                                const Options& options);
  static absl::StatusOr<std::unique_ptr<FlightRecorder>> Create(const std::string& path) {
    return Create(path, Options{});
  }
  ~FlightRecorder();  // unmaps and closes (the file stays, with its last state)

  // A new region for an allocator of `device`, or nullptr when every region is taken
  // (said once on stderr; that allocator's events are not recorded).
  FlightDevice* AddAllocator(DeviceId device);

  const std::string& path() const { return path_; }

  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

 private:
  friend class FlightDevice;
  FlightRecorder(std::string path, int fd, unsigned char* base, size_t bytes,
                 const Options& options);
  // Writes the site's name slot unless it is written or being written. Cold.
  void NameSite(SiteId site) noexcept;
  void Tick();
  bool NeedsName(SiteId site) const {
    return site < name_limit_ && named_[site].load(std::memory_order_relaxed) == 0;
  }

  const std::string path_;
  const int fd_;
  unsigned char* const base_;
  const size_t bytes_;
  const Options options_;
  const SiteId name_limit_;  // sites below it have a name slot
  // The time events are stamped with (NowNs), refreshed by `ticker_` every millisecond.
  alignas(64) std::atomic<int64_t> now_ns_{0};
  std::thread ticker_;
  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool stop_ = false;  // guarded by tick_mu_
  // 0: not named, 1: being named (or naming failed), 2: named.
  std::unique_ptr<std::atomic<uint8_t>[]> named_;
  Mutex mu_;
  std::deque<std::unique_ptr<FlightDevice>> devices_ ABSL_GUARDED_BY(mu_);
  bool warned_full_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace devmem
