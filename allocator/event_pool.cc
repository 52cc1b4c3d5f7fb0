// allocator/event_pool.cc: see event_pool.h.
#include "allocator/event_pool.h"

namespace devmem::internal {

EventPool::EventPool(Backend& backend, size_t capacity)
    : backend_(backend), capacity_(capacity) {
  kept_.reserve(capacity_);
}

EventPool::~EventPool() { release_kept(); }

Event EventPool::record(Stream stream) {
  if (reusable_ && !kept_.empty()) {
    // Popped only once the record succeeded: an event whose record threw is still
    // completed and kept.
    if (backend_.rerecord_event(kept_.back(), stream)) {
      const Event event = kept_.back();
      kept_.pop_back();
      return event;
    }
    // This backend makes a new event per record: keep none from now on.
    reusable_ = false;
    release_kept();
  }
  return backend_.record_event(stream);
}

void EventPool::release_kept() noexcept {
  for (Event event : kept_) backend_.release_event(event);
  kept_.clear();  // keeps the reserved capacity: recycle() still never allocates
}

void EventPool::recycle(Event event) noexcept {
  if (reusable_ && kept_.size() < capacity_) {
    kept_.push_back(event);  // within the reserved capacity: does not allocate
  } else {
    backend_.release_event(event);
  }
}

}  // namespace devmem::internal
