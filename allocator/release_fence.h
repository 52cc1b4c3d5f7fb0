// allocator/release_fence.h: the stream waits before memory goes back to the device,
// with the device lock released (internal).
//
// Memory is free in stream order only: work queued on a block's stream before its
// free may still use it, so a segment free, a run's unmap or a recycle's unmap waits
// for that stream first. Synchronizing the stream itself with the lock released is
// wrong: once release_stream(s) returns the program may destroy s, and only the
// device lock keeps release_stream out between "s is live" and the driver call. So the
// stream is named to the driver once, under the lock: an event of the pool's own
// (EventPool) is recorded on it there; what is waited for with the lock released is
// that event, which stays valid (and completes) after the stream is destroyed.
//
//   ReleaseFence fence(backend, events, retirements);
//   fence.record(streams);          // under the lock: one event per live stream
//   { ScopedUnlock u(lock); fence.wait(); /* the driver's frees or unmaps */ }
//   fence.finish();                 // under the lock again: the events go back
//
// The event is recorded after the blocks' frees (they are free, detached, when the
// release is decided), so it completes after all work queued before them: the same
// point synchronize_stream waited for, without holding the lock for it. Retired
// streams (stream_retire.h) are waited for by nothing: their work has completed and
// the handle must not be named. A retiring stream has no free block (release_stream
// makes them pending; they come free only once it is retired), so a release never
// names one; should one reach record(), its retirement event is waited for there,
// under the lock (that event is StreamRetirements', which a poll may release once the
// lock is free).
//
// Owns: the events recorded, from record() until finish() (or the destructor, on an
// exception path, which gives them back to the backend: they may not have completed).
// Thread-safety: record() and finish() need the device lock (the EventPool is guarded
// by it); wait() touches only the backend (thread-safe) and this object's events,
// which no one else sees.
#pragma once

#include <vector>

#include "allocator/backend.h"
#include "allocator/event_pool.h"
#include "allocator/stream_retire.h"
#include "allocator/types.h"

namespace devmem::internal {

class ReleaseFence {
 public:
  // `pool`: the device's event pool, or nullptr (a new event per stream, released at
  // the end); `retirements`: the pool's retired streams, or nullptr (all live).
  ReleaseFence(Backend& backend, EventPool* pool, StreamRetirements* retirements)
      : backend_(backend), pool_(pool), retirements_(retirements) {}
  // Gives back what finish() did not (an exception between record and finish).
  ~ReleaseFence();
  ReleaseFence(const ReleaseFence&) = delete;
  ReleaseFence& operator=(const ReleaseFence&) = delete;

  // Under the lock: marks the point each of `streams` (distinct) must pass. Throws
  // what recording an event throws (DriverError, std::bad_alloc); the events recorded
  // so far stay this object's (the destructor gives them back).
  void record(const std::vector<Stream>& streams);
  // Any lock state (the callers release the device lock): waits for every marked
  // point. Throws what Backend::synchronize_event throws.
  void wait();
  // Under the lock: the events go back to the pool (completed: kept for reuse when
  // wait() returned, else released). Never throws.
  void finish() noexcept;

  size_t events() const { return events_.size(); }

 private:
  Backend& backend_;
  EventPool* const pool_;
  StreamRetirements* const retirements_;
  std::vector<Event> events_;
  bool waited_ = false;
};

}  // namespace devmem::internal
