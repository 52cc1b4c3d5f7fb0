// allocator/poll_work.h: whether a DevicePool has anything for process_events() to
// do, readable without the device lock (internal).
//
// Why: the runtime's poller calls process_events() on every allocator every 5 ms. With
// nothing queued the call used to take the device lock only to find the queues empty:
// an idle or single-stream program paid one lock round trip per device per round, and
// a thread on the allocation slow path could find the lock held by the poller. Now
// each part that queues work for the poll publishes whether it has any, and
// process_events() returns before the lock when none has.
//
// The sources, one bit each, each set and cleared by the part that owns the work, at
// the mutation itself (never later in the same lock hold, since several callers
// release the lock midway, ScopedUnlock):
//   kQueuedEvents      EventQueues: cross-stream frees' events queued (count_ > 0);
//   kRetirements       StreamRetirements: a release_stream whose event has not been
//                      seen to complete (retiring_ > 0);
//   kDeferredEvents    BlockStates: blocks freed during a capture whose events are not
//                      recorded yet (deferred_ non-empty);
//   kDeferredRecycles  ExpandableSegments: proactive recycling decisions waiting for
//                      their events (deferred_ non-empty).
// That is everything poll_locked (device_pool.h) acts on. Garbage collection is not
// among them: it runs on the allocation path, before a grow, never in a poll.
//
// Invariant (checked by DevicePool::validate): whenever the device lock is not held,
// bits() has each source's bit set exactly when that source has work. While it is
// held, the holder may be between a mutation and its publication (the same statement
// pair); no one else writes.
//
// Memory ordering: every write is made under the device lock, by the one thread holding
// it, so the bits' modification order is the lock's order and the last value written
// is the state at the last release. The poller reads them without the lock. Relaxed is
// enough, for both: the bits carry no data, only themselves; what the poll then reads
// (queues, blocks) it reads under the lock, which orders it. What relaxed keeps is
// coherence: a poll whose load comes after a store in the bits' modification order
// reads it or a later value, and a poll that happens after the store (a thread that
// freed and then signalled the poller through any synchronization) reads it too. A
// poll that reads a bit clear while a free sets it concurrently is the poll that, with
// the lock, would have taken the lock before that free: it misses the event exactly as
// that one did, and the next round polls it. So no queued event waits longer than it
// did when every round took the lock: one poll interval at most, beyond its completion.
//
// Pools with work, for a poller of many (the runtime's, runtime/runtime.cc): attach()
// names a counter that holds the number of attached pools whose bits are not 0; the
// poller skips its own registry lock while it reads 0. Each pool adds 1 when its bits
// go from 0 to non-zero and takes it back when they return to 0 (or when it detaches
// or is destroyed with work left, a poisoned pool's), all under its device lock, with
// read-modify-writes because pools change it concurrently; relaxed, by the argument
// above.
//
// Thread-safety: set(), attach() and detach() only under the owning pool's device lock;
// bits() and any() from any thread.
#pragma once

#include <atomic>
#include <cstdint>

namespace devmem::internal {

class PollWork {
 public:
  enum Source : uint32_t {
    kQueuedEvents = 1u << 0,
    kRetirements = 1u << 1,
    kDeferredEvents = 1u << 2,
    kDeferredRecycles = 1u << 3,
  };

  PollWork() = default;
  // Takes this pool's share out of the attached counter (no other thread uses the pool
  // any more).
  ~PollWork() { detach(); }
  PollWork(const PollWork&) = delete;
  PollWork& operator=(const PollWork&) = delete;

  // Publishes whether `source` has work. Device lock held.
  void set(Source source, bool has_work) {
    const uint32_t old = bits_.load(std::memory_order_relaxed);
    const uint32_t now = has_work ? (old | source) : (old & ~static_cast<uint32_t>(source));
    if (now == old) return;  // the common case on a busy path: no store at all
    bits_.store(now, std::memory_order_relaxed);
    if (pools_with_work_ != nullptr && (old == 0) != (now == 0)) {
      pools_with_work_->fetch_add(now != 0 ? 1 : -1, std::memory_order_relaxed);
    }
  }

  // Lock-free: the sources with work (0: none).
  uint32_t bits() const { return bits_.load(std::memory_order_relaxed); }
  bool any() const { return bits() != 0; }

  // Counts this pool in `*counter` while it has work (replacing any counter attached
  // before; nullptr detaches). Device lock held; `counter` must outlive the attachment.
  void attach(std::atomic<int64_t>* counter) {
    if (counter == pools_with_work_) return;
    detach();
    pools_with_work_ = counter;
    if (counter != nullptr && bits() != 0) counter->fetch_add(1, std::memory_order_relaxed);
  }
  void detach() {
    if (pools_with_work_ != nullptr && bits() != 0) {
      pools_with_work_->fetch_sub(1, std::memory_order_relaxed);
    }
    pools_with_work_ = nullptr;
  }

 private:
  std::atomic<uint32_t> bits_{0};
  // The attached counter, or null. Written and read under the device lock only.
  std::atomic<int64_t>* pools_with_work_ = nullptr;
};

}  // namespace devmem::internal
