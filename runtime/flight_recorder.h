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
// Its size is fixed at creation (about 52 MiB with the defaults: mostly the lanes'
// site tables, touched only where written) and reserved on disk (posix_fallocate), so
// a full disk is an error at start rather than a SIGBUS later.
//
// Concurrency (docs/architecture.md, "Flight recorder"). Each allocator gets its own
// device region (AddAllocator). Most of an allocator's events come under its device
// lock, but thread-cache hits (alloc and free) report from their thread without it
// (allocator/observer.h), concurrently. So each region has `lane_slots` lanes, and a
// thread records into a lane of its own (the same lane index in every region of the
// recorder, taken on its first event and given back when the thread exits): a lane
// has one writer, which updates it with plain (relaxed atomic) stores, no lock and no
// read-modify-write: per event its ring slot, then its peak (only when it rises). The
// lane's share of each site's live bytes lives in this process's memory, and is
// copied into the file's entries (the ones that changed) by a checkpoint every
// flight::CheckpointEvents(ring_slots) events of the lane and at the recorder's
// destruction; the reader adds the ring's events past each entry's checkpoint
// (flight_record_format.h, "Checkpoints": the ring always holds them), then sums the
// lanes' shares. Threads that come
// when every other lane is taken share the last lane, under a mutex (the cost of
// version 1 on every event). The segment stats change only on events that come under
// the device lock (segment alloc/free/map/unmap, OOM), so the device lock orders their
// writers. Every record is committed seqlock-style (runtime/flight_record_format.h),
// so a reader, in this process or another, during the process's life or after its
// death, can tell complete records from torn ones; the summaries are double-buffered,
// so the one write a death can tear in each lane leaves the previous copy whole. The
// site table is shared by all regions: a site is named by the first thread that
// records it (a compare-and-swap on a per-site flag of this process), once. Two
// allocators of one device (an override, a replaced allocator) get two regions, never
// one shared by two device locks.
//
// Order (a hybrid logical clock, the trace ring's: runtime/trace.h, "Time and order").
// A lane's events are numbered 1, 2, ... in its own order, and each carries a stamp in
// the trace clock's ticks (runtime/trace_clock.h), the largest of
//   - the clock as its ticker thread last published it (one relaxed load);
//   - the lane's last stamp + 1;
//   - the block's last stamp + 1 (AllocEvent::block_order: its alloc's, read by its
//     free on whichever thread);
//   - the device pool's last stamp + 1 (AllocEvent::pool_order, events under the
//     device lock);
// and becomes the lane's, the block's and the pool's. With the trace ring on as well
// (the default) the ring stamps the event first and the recorder's stamp is one tick
// past it: both stay causal. So an event causally after another (the same thread, the
// same block's alloc and free on two threads, through the device lock) has a larger
// stamp, and the reader merges the lanes by (stamp, lane): ties are events no thread
// ordered, and a free never reads before its block's alloc, whatever the clock's
// steps (flight_record_reader.h).
//
// Cost: Record runs on every allocation and free; devmem-bench reports
// flight_recorder_overhead_ratio (tools/bench/flight_recorder.cc), target <= 1.15. Per
// event: the lane lookup (one thread-local compare), the stamp, the ring slot (nine
// stores and its check), the share (two adds in this process's memory).
//
// Time. A stamp is the trace clock's coarse tick (the TSC, or CLOCK_MONOTONIC ns where
// the kernel does not keep time with the TSC), raised for order as above: up to about
// a millisecond early (more while the ticker waits for a CPU), and ahead only by the
// +1 ticks of a causal chain. Reading a clock per event cost more than all the rest of
// Record on the development VM (the TSC 10-30 ns a read, the vDSO's coarse clock 5-15
// ns, under load). With TSC ticks the file says so (header flag) and holds the
// clock's anchor (header) and a clock point (tick, ns) in every region in use,
// rewritten by the recorder's thread every kClockPointPeriodMs and at destruction,
// which the reader maps ticks to nanoseconds by.
//
// Lifetime: the recorder and its FlightDevices must outlive every allocator they
// observe; the runtime keeps its recorder for the life of the process (runtime.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdlib>
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
#include "runtime/trace_clock.h"

namespace devmem {

class FlightRecorder;

// The writer of one allocator's region. Not copyable; owned by its FlightRecorder.
// Thread-safety: Record may be called from any thread (see the file comment: each
// thread writes its own lane; segment events come under the device lock).
class FlightDevice final : public AllocatorObserver {
 public:
  void on_event(const AllocEvent& event) override { Record(event); }
  // on_event without the virtual dispatch (DeviceObserver forwards here).
  void Record(const AllocEvent& event);

  FlightDevice(const FlightDevice&) = delete;
  FlightDevice& operator=(const FlightDevice&) = delete;

 private:
  friend class FlightRecorder;
  // One lane's writer state. Only the thread holding the lane index touches it (the
  // recorder's mutex hands it from a thread that exited to the next), except the
  // shared lane, whose writers hold `mu`.
  // The lane's share of one site, current after every event, in this process's memory
  // (the file's entry is its copy as of the lane's last checkpoint).
  // (The count is allocs - frees, each counted apart: an event adds 1 to the one its
  // action indexes.)
  struct SiteShare {
    int64_t bytes = 0;
    uint64_t epoch = 0;  // the lane's epoch it was last listed dirty in (0: never seen)
    uint64_t counts[2] = {0, 0};  // [kAlloc]: allocations, [kFree]: frees
  };
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  struct alignas(64) Lane {
    uint64_t* page = nullptr;   // the lane page (its peak copies)
    uint64_t* sites = nullptr;  // site_slots x 8 words
    uint64_t* ring = nullptr;   // ring_slots x 8 words
    uint64_t next_seq = 1;      // the number its next event gets
    uint64_t last = 0;          // the stamp of its last event (see "Order")
    int64_t live = 0;           // its share of the live bytes, and that share's peak
    int64_t peak = 0;
    // The checkpoint's epoch (raised by each checkpoint, so that every share is
    // unlisted at once), and the shares listed.
    uint32_t dirty_count = 0;
    uint64_t epoch = 1;
    SiteShare* shares = nullptr;  // site_slots (calloc: pages only where touched)
    uint32_t* dirty = nullptr;    // checkpoint_events_ indices: changed since the last
    uint32_t peak_copy = 0;
    bool shared = false;        // the last lane: written under `mu`
    Mutex mu;
  };

  FlightDevice(FlightRecorder* recorder, unsigned char* region, DeviceId device);
  // The event into `lane` (its one writer). Inlined into Record and RecordShared: one
  // call per event, no more.
  [[gnu::always_inline]] inline void Write(Lane& lane, const AllocEvent& e);
  [[gnu::noinline]] void RecordShared(Lane& lane, const AllocEvent& e);
  // The thread's first event in this recorder (takes its lane), or an event into the
  // shared lane.
  [[gnu::noinline]] void RecordSlow(const AllocEvent& e);
  // An alloc's or a free's change to the lane's share of its site and to the lane's
  // live bytes (and peak, when it rises). `action` is 0 (alloc) or 1 (free).
  [[gnu::always_inline]] inline void Add(Lane& lane, SiteShare& share, uint8_t action,
                                         size_t size, uint64_t seq);
  // The rare ends of an event, out of line: the lane's first event of share `i` in
  // this epoch (lists it for the checkpoint, names a site new to the lane), and an
  // event that is a checkpoint's or not an alloc or free (a segment event's stats).
  [[gnu::noinline]] void List(Lane& lane, uint32_t i, const AllocEvent& e, uint64_t seq);
  [[gnu::noinline]] void Finish(Lane& lane, const AllocEvent& e, uint64_t seq);
  // Copies the listed shares into their file entries as of event `seq` (the lane's
  // newest), then starts a new epoch (flight_record_format.h, "Checkpoints").
  void Checkpoint(Lane& lane, uint64_t seq);
  void WriteEntry(Lane& lane, uint32_t i, uint64_t seq);
  // Every lane's checkpoint, at the recorder's destruction (no writer left: see
  // "Lifetime"), so that a record closed cleanly has its entries current.
  void CheckpointAll();
  [[gnu::noinline]] void WritePeak(Lane& lane, uint64_t seq);
  // A segment event's stats (under the device lock, see the file comment).
  [[gnu::noinline]] void RecordCold(const AllocEvent& e);
  void WriteCold(uint64_t seq);
  void WriteClock(uint64_t seq, int64_t tick, int64_t ns);  // the recorder's thread only

  FlightRecorder* const recorder_;
  const uint64_t uid_;      // the recorder's, for the lane lookup
  uint64_t* const page_;    // the device page (identity, segment stats)
  // The region's device as a ring slot packs it (an allocator's events are all of its
  // device).
  const uint64_t device_bits_;
  const uint64_t ring_mask_;
  const uint32_t site_slots_;
  const uint32_t checkpoint_events_;  // flight::CheckpointEvents(ring_slots): a power of two
  const uint64_t checkpoint_mask_;    // checkpoint_events_ - 1: after events s & mask == 0
  std::unique_ptr<Lane[]> lanes_;
  std::unique_ptr<SiteShare, FreeDeleter> shares_;  // lane l's: [l * site_slots_, ...)
  std::unique_ptr<uint32_t[]> dirty_;
  // The segment stats: written only on events under the device lock.
  uint64_t cold_seq_ = 0;
  int64_t reserved_ = 0, peak_reserved_ = 0, mapped_ = 0;
  int64_t segments_ = 0, device_allocs_ = 0, device_frees_ = 0, ooms_ = 0;
  uint32_t cold_copy_ = 0;
  uint32_t clock_copy_ = 0;  // the recorder's thread's (WriteClock)
  // Regular segments (segment_alloc) by address, so that a segment_free is known to
  // end one (an expandable run's release is a segment_free too, with no alloc).
  std::unordered_map<uintptr_t, size_t> regular_segments_;
};

class FlightRecorder {
 public:
  struct Options {
    uint32_t device_slots = 8;       // allocators recorded (one region each)
    uint32_t ring_slots = 1u << 13;  // events kept per lane (a power of two)
    uint32_t lane_slots = 4;         // lanes per allocator (the last shared by the rest)
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
  void WriteClockPoints();  // into every region in use
  bool NeedsName(SiteId site) const {
    return site < name_limit_ && named_[site].load(std::memory_order_relaxed) == 0;
  }
  // The calling thread's lane index, taken on its first event (cold: a mutex).
  [[gnu::noinline]] uint32_t ThisThreadLane();
  uint32_t AcquireLane();
  void ReleaseLane(uint32_t lane);  // at thread exit

  friend struct FlightLaneCache;

  const std::string path_;
  const int fd_;
  unsigned char* const base_;
  const size_t bytes_;
  const Options options_;
  const SiteId name_limit_;  // sites below it have a name slot
  const uint64_t uid_;       // this recorder's identity for the threads' lane caches
  // How often the recorder's thread rewrites the regions' clock points (TSC only).
  static constexpr int kClockPointPeriodMs = 10;
  // The clock events are stamped with (see "Time"): keeps the trace clock's ticker
  // running while the recorder lives.
  TraceClock clock_;
  uint64_t clock_seq_ = 0;  // clock points written (by ticker_, then the destructor)
  std::thread ticker_;      // writes the clock points (Tick)
  std::mutex tick_mu_;
  std::condition_variable tick_cv_;
  bool stop_ = false;  // guarded by tick_mu_
  // 0: not named, 1: being named (or naming failed), 2: named.
  std::unique_ptr<std::atomic<uint8_t>[]> named_;
  Mutex mu_;
  std::deque<std::unique_ptr<FlightDevice>> devices_ ABSL_GUARDED_BY(mu_);
  bool warned_full_ ABSL_GUARDED_BY(mu_) = false;
  // Lane indices: never handed out yet from next_lane_ on; given back by exited
  // threads in free_lanes_. The last index (the shared lane) is never given back.
  uint32_t next_lane_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint32_t> free_lanes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace devmem
