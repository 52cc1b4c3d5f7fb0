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
// store of the chunk's count, inline in the caller (Record), with no call on the path.
// The time is the raw TraceClock tick (runtime/trace_clock.h: the TSC where the kernel
// keeps time with it), converted to nanoseconds when read: within tens of ns of
// CLOCK_MONOTONIC, order exact. (A tick published by a background thread every
// millisecond would save the TSC read, ~9 ns on the AMD EPYC development VM, a quarter
// of a cache-hit pair, but allocs and frees of one block on two threads within that
// millisecond would then tie, and a merge by lane could put the alloc before the free:
// memtrace timeline refuses that as a double alloc.)
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
  // Inline (below): the runtime's observer records every event through it.
  [[gnu::always_inline]] inline void Record(const AllocEvent& event);

  struct Lane;   // one writer's chunk and its claims (trace.cc)
  struct Chunk;  // a chunk's header: which claim holds it, how many slots are written
  // One event: [0] tick, [1] action | device type << 8 | device index << 16 (16 bits)
  // | thread << 32, [2] stream, [3] addr, [4] size, [5] requested, [6] site; [7] unused.
  struct alignas(64) Slot {
    std::atomic<uint64_t> words[8] = {};
  };
  // What Record touches of its lane, first in every Lane (trace.cc); only the thread
  // that holds the lane reads or writes it.
  struct LaneHead {
    Slot* slots = nullptr;                  // the open chunk's first slot
    std::atomic<uint32_t>* count = nullptr;  // the open chunk's published count
    uint32_t used = 0;                      // slots written in the open chunk
    uint32_t limit = 0;                     // its slots (K); 0 while the lane has none
    uint64_t thread_bits = 0;               // the holder's thread number << 32
  };

 private:
  friend struct LaneCache;
  // The calling thread's lane, taken on its first event (cold: a mutex).
  [[gnu::noinline]] LaneHead* ThisThreadLane();
  // Record's cold half: the lane's chunk is full (or it has none): claims the next,
  // then records the event, or drops it when no chunk is free.
  [[gnu::noinline]] void RecordSlow(LaneHead* head, const AllocEvent& event, int64_t tick);
  static void WriteSlot(Slot& slot, const AllocEvent& event, int64_t tick, uint64_t thread_bits);
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

// The hot path's lookup (trace.cc): the last ring this thread recorded into (its uid)
// and its lane there. constinit and trivially destructible: reading them is one
// thread-pointer-relative load each, no TLS wrapper call.
namespace trace_internal {
extern constinit thread_local uint64_t tls_ring_uid;
extern constinit thread_local TraceRing::LaneHead* tls_ring_lane;
}  // namespace trace_internal

inline void TraceRing::WriteSlot(Slot& slot, const AllocEvent& event, int64_t tick,
                                 uint64_t thread_bits) {
  const uint64_t packed = static_cast<uint64_t>(event.action) |
                          static_cast<uint64_t>(event.device.type) << 8 |
                          (static_cast<uint64_t>(event.device.index) & 0xffff) << 16 |
                          thread_bits;
  slot.words[0].store(static_cast<uint64_t>(tick), std::memory_order_relaxed);
  slot.words[1].store(packed, std::memory_order_relaxed);
  slot.words[2].store(event.stream.handle, std::memory_order_relaxed);
  slot.words[3].store(event.addr, std::memory_order_relaxed);
  slot.words[4].store(event.size, std::memory_order_relaxed);
  slot.words[5].store(event.requested, std::memory_order_relaxed);
  slot.words[6].store(event.site, std::memory_order_relaxed);
}

inline void TraceRing::Record(const AllocEvent& event) {
  // The lane first, then the tick: a lane passes to a new thread when its thread exits,
  // and a tick read before taking over the lane could be older than the last tick the
  // exited thread wrote there (the merge needs each lane's ticks in order).
  LaneHead* lane = trace_internal::tls_ring_uid == uid_ ? trace_internal::tls_ring_lane
                                                        : ThisThreadLane();
  const int64_t tick = clock_.Now();
  if (lane->used == lane->limit) [[unlikely]] {
    RecordSlow(lane, event, tick);
    return;
  }
  WriteSlot(lane->slots[lane->used], event, tick, lane->thread_bits);
  lane->count->store(++lane->used, std::memory_order_release);
}

}  // namespace devmem
