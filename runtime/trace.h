// runtime/trace.h: a bounded trace of allocator events (DESIGN.md "Trace").
//
// A TraceRing is an AllocatorObserver: attach it to allocators with set_observer and
// every alloc, free, free_completed, segment_alloc/free/map/unmap and oom lands here
// with the time, the thread and the site. It keeps about the newest `capacity` events;
// each event read has a sequence number (starting at 1, never reused), so a reader asks
// for "everything after N" and learns how many it missed.
//
// Cost: on_event runs on every allocation and free, under the device lock or, for
// thread-cache hits, on the allocating thread without it (allocator/observer.h); the
// runtime records by default (trace_entries), so devmem-bench reports
// tracing_overhead_ratio on the shipped path (target <= 1.15). So a writer touches
// nothing another thread writes: each thread writes into a chunk of slots it owns (a
// "lane"), claimed from the shared pool of chunks with one atomic increment per
// kChunkEvents events, not per event; an event is seven relaxed stores and one release
// store of the chunk's count. The time is the raw TraceClock tick
// (runtime/trace_clock.h), converted to nanoseconds when read.
//
// Numbers and order: events get their sequence numbers when read (since, next_seq):
// the reader takes what every lane published since the last read, merges the lanes by
// time (each lane's own order kept) and numbers the result after the numbers already
// given; events overwritten before any read took them are numbered too, as a gap, and
// counted as missed. So when no writer is in flight (quiescent) the numbers follow the
// events' times exactly, and every event is read or counted as missed; an event whose
// writer is still writing while a read runs gets its number at the next read, after
// events that happened later (as the old single ring did for a preempted writer, it
// may then be out of time order by the length of that preemption).
//
// Memory: capacity + kChunkEvents slots of 64 bytes, plus, once read, the numbered
// events the readers page through (capacity x 64 bytes), plus a chunk list per lane.
// docs/configuration.md ("Trace ring size") has the measurement behind the default.
//
// Thread-safety: on_event may be called concurrently from any threads (each thread
// writes its own lane); since/next_seq may be called from any thread at any time
// (readers serialize among themselves on a mutex writers never take) and never block
// writers. A reader that races a writer recycling a chunk counts the chunk's unread
// events as missed rather than returning torn ones.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "allocator/mutex.h"
#include "allocator/observer.h"
#include "runtime/trace_clock.h"

namespace devmem {

struct TraceEvent {
  uint64_t seq = 0;      // 1, 2, 3, ... in the order events happened (see above)
  int64_t time_ns = 0;   // monotonic clock (NowNs() epoch) when the event happened
  AllocAction action = AllocAction::kAlloc;
  DeviceId device;
  Stream stream;
  uintptr_t addr = 0;
  size_t size = 0;
  size_t requested = 0;
  SiteId site = kUnknownSite;
  uint32_t thread = 0;   // a small per-process thread number (1, 2, ...)
};

// A small per-process thread number: 1 for the first thread that records an event (in
// a TraceRing or a flight record, runtime/flight_recorder.h: one numbering for both).
uint32_t TraceThreadNumber();

class TraceRing : public AllocatorObserver {
 public:
  // Events per chunk (at most; fewer for small capacities, see trace.cc).
  static constexpr size_t kChunkEvents = 64;

  // capacity > 0: the number of events kept (InvalidArgumentError otherwise). The
  // chunks are allocated and zeroed here.
  explicit TraceRing(size_t capacity);
  ~TraceRing() override;

  void on_event(const AllocEvent& event) override;

  // Events with seq > after, oldest first, at most `limit`. *missed (if given) is the
  // number of events after `after` that were overwritten before this read.
  std::vector<TraceEvent> since(uint64_t after, size_t limit = SIZE_MAX,
                                uint64_t* missed = nullptr) const;
  // The sequence number the next event will get (after numbering what was published).
  uint64_t next_seq() const;
  size_t capacity() const;

  // on_event without the virtual dispatch, for observers that forward to a ring.
  void Record(const AllocEvent& event);

  struct Lane;   // one writer's chunk and its claims (trace.cc)
  struct Chunk;  // a chunk's header: which claim holds it, how many slots are written
  struct Slot;   // one event (64 bytes)

 private:
  friend struct LaneCache;
  // The calling thread's lane, taken on its first event (cold: a mutex).
  Lane* ThisThreadLane();
  Lane* AcquireLane();
  void ReleaseLane(Lane* lane);  // at thread exit: closes its chunk, frees the lane
  // Gives `lane` a fresh chunk (closing its full one); false when every chunk is held
  // open by another lane (the event is then dropped and counted as missed).
  bool Claim(Lane* lane);
  // Numbers what the lanes published since the last call (see above).
  void Collect() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);

  const size_t capacity_;
  const uint32_t chunk_events_;  // K: slots per chunk
  const uint32_t num_chunks_;    // C
  const uint64_t uid_;           // this ring's identity for the threads' lane caches
  std::unique_ptr<Chunk[]> chunks_;  // C headers
  std::unique_ptr<Slot[]> slots_;    // C x K slots: chunk p's are [p K, (p + 1) K)
  TraceClock clock_;
  alignas(64) std::atomic<uint64_t> claims_{0};  // chunk claims so far (one per K events)

  mutable Mutex lanes_mu_;
  std::vector<std::unique_ptr<Lane>> lanes_ ABSL_GUARDED_BY(lanes_mu_);
  std::vector<Lane*> free_lanes_ ABSL_GUARDED_BY(lanes_mu_);

  // The readers' side: numbered events, newest capacity_ of them (allocated on the
  // first read), and per lane how far it was read.
  struct Numbered;
  struct Cursor;
  mutable Mutex read_mu_;
  mutable uint64_t next_ ABSL_GUARDED_BY(read_mu_) = 1;  // the seq the next event gets
  mutable std::vector<Numbered> numbered_ ABSL_GUARDED_BY(read_mu_);
  mutable std::vector<Cursor> cursors_ ABSL_GUARDED_BY(read_mu_);
};

}  // namespace devmem
