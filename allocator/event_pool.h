// allocator/event_pool.h: the reusable events of one DevicePool (internal).
//
// A cross-stream free records an event on each stream the block was used on. Creating
// and destroying one per free costs two driver calls (cudaEventCreateWithFlags,
// cudaEventDestroy) on top of the record, and the create and destroy take driver locks
// that every thread of the process contends for. CUDA's idiom, which PyTorch's event
// pool follows, is to create an event once and record it again for each use. EventPool
// keeps completed events and records one of them again (Backend::rerecord_event)
// where the backend can; it creates a new one only when it keeps none.
//
// Owns: the kept events (completed; nothing waits for them). An event that record()
// returns is the caller's until it comes back through recycle() (completed: it may be
// kept) or release() (maybe not completed: it goes back to the backend). The kept
// events go back to the backend when the pool is destroyed, so the pool must not
// outlive its backend.
// Bounded: at most capacity() events are kept; a completed event beyond that goes back
// to the backend. The events in flight are not bounded here: each pending block needs
// its own (allocator/event_queues.h).
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include <cstddef>
#include <vector>

#include "allocator/backend.h"

namespace devmem::internal {

class EventPool {
 public:
  // Events kept per device: more than the cross-stream frees a program usually has in
  // flight at once, few enough (8 bytes each, plus the driver's event) not to matter.
  static constexpr size_t kDefaultCapacity = 64;

  // May throw std::bad_alloc (the room for `capacity` events is reserved up front).
  explicit EventPool(Backend& backend, size_t capacity = kDefaultCapacity);
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An event recorded on `stream`: a kept one recorded again, or else a new one.
  // Throws what the backend's record throws; the pool is then as it was.
  Event record(Stream stream);
  // Takes back an event that record() returned and that has completed (event_done
  // returned true or synchronize_event returned). Never throws.
  void recycle(Event event) noexcept;
  // Gives an event that record() returned, completed or not, back to the backend.
  void release(Event event) noexcept { backend_.release_event(event); }

  // Gives every kept event back to the backend (empty_cache: a program that empties
  // the cache before it exits, or before another library takes the device, holds no
  // driver object of the allocator's after it). Never throws.
  void release_kept() noexcept;

  size_t kept() const { return kept_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  Backend& backend_;
  const size_t capacity_;
  // Completed events, capacity_ reserved so that recycle() never allocates.
  std::vector<Event> kept_;
  // False once the backend said it cannot record an event again: nothing is kept then.
  bool reusable_ = true;
};

}  // namespace devmem::internal
