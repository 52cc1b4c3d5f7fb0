// allocator/device_pool_retire.cc: release_stream, the retirement of a stream that
// the program is about to destroy (allocator/stream_retire.h has the states).
//
// Why: free blocks are keyed by the raw stream handle, and a destroyed stream's handle
// comes back for the next stream created while the old one still runs its queued
// kernels. Without retirement the next allocation on the new stream could get a block
// those kernels use (a device use-after-free), and a later release of the old
// stream's memory would synchronize a handle that names no stream.
//
// What release_stream(s) does, under the device lock: the thread caches give back
// their blocks of `s` and forget the stream (so no cache hit bypasses the checks
// below); one event is recorded on `s`; every free block of `s` (in the shared or a
// private pool) leaves its free set and every pending one gains a wait, both pending
// on that event. Afterwards, until the event completes: a free of a block of `s`, or
// of a block with a recorded use on `s`, waits for the event instead of recording one
// on `s`; allocate and record_stream on the handle throw InvalidArgumentError naming
// it; memory of `s` goes back only after the event. Once it completes the blocks are
// free on `s` again (the handle's next stream may reuse them: the old work is done),
// and the handle is retired until its next allocation or record_stream, which makes
// it live (a new stream). Nothing synchronizes `s` from then on: the release paths
// wait for the retirement event (StreamRetirements::synchronize_for_release).
#include <cstddef>

#include "absl/strings/str_format.h"
#include "allocator/device_pool.h"
#include "allocator/errors.h"

namespace devmem::internal {

void DevicePool::release_stream(Stream stream) {
  if (stream.handle == 0) {
    throw InvalidArgumentError(absl::StrFormat(
        "devmem: release_stream(stream 0x0) on %s: the default stream is never "
        "destroyed, so it cannot be released",
        device_.ToString()));
  }
  MutexLock lock(&mu_);
  StreamRetirements& retired = events_.retirements();
  // An earlier retirement of the handle may have completed since it was last polled.
  if (retired.state(stream) == StreamRetireState::kRetiring) poll_locked(kPollAllEvents);
  if (retired.state(stream) == StreamRetireState::kRetiring) {
    throw InvalidArgumentError(absl::StrFormat(
        "devmem: release_stream(stream %#x) on %s: the stream is released already and "
        "its queued work has not completed",
        stream.handle, device_.ToString()));
  }
  // A capture's blocks wait for events that cannot be recorded yet (device_pool_private.cc);
  // their streams are retired only once no capture is under way.
  if (blocks_.has_deferred()) record_deferred_events_locked();
  if (privates_.any_underway() || blocks_.has_deferred() ||
      backend_->capture_state(stream) != CaptureState::kNone) {
    throw InvalidArgumentError(absl::StrFormat(
        "devmem: release_stream(stream %#x) on %s: a graph capture is under way; "
        "release the stream after the capture ends",
        stream.handle, device_.ToString()));
  }

  // The thread caches' blocks of the stream go back to the pool (to be retired with the
  // rest) and their slots are freed; bin_for_free_locked claims none for it again
  // while it is not live.
  bool cached = false;
  for (ThreadCache* c : caches_) {
    for (int i = 0; i < ThreadCache::kSlots; ++i) {
      cached |= c->slots()[i].used && c->slots()[i].stream == stream;
    }
  }
  if (cached) {
    quiesce_caches_locked();
    for (ThreadCache* c : caches_) fold_cache_locked(c);  // may throw: nothing changed
    for (ThreadCache* c : caches_) {
      ThreadCache::Slot* slots = c->slots();
      for (int i = 0; i < ThreadCache::kSlots; ++i) {
        if (!slots[i].used || slots[i].stream != stream) continue;
        flush_cache_locked(c, 0, 0, i);
        slots[i].used = false;
      }
    }
  }

  // The blocks that will wait for the retirement event, counted first so that the
  // event is recorded (the last step that may throw) with room for all of them.
  size_t waits = 0;
  for (const auto& [addr, s] : segments_) {
    if (s->stream != stream) continue;
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      waits += b->state == BlockState::kFree || b->state == BlockState::kPending;
    }
  }
  retired.begin(stream, waits);  // throws (DriverError, bad_alloc) changing nothing
  for (const auto& [addr, s] : segments_) {
    if (s->stream != stream) continue;
    for (Block* b = s->head; b != nullptr; b = b->next) {
      if (b->state == BlockState::kFree) {
        blocks_.retire_free_block(b);
      } else if (b->state == BlockState::kPending) {
        blocks_.retire_pending_block(b);
      }
    }
  }
}

void DevicePool::claim_stream_locked(Stream stream, const char* op) {
  StreamRetirements& retired = events_.retirements();
  switch (retired.state(stream)) {
    case StreamRetireState::kLive:
      return;
    case StreamRetireState::kRetiring:
      throw InvalidArgumentError(absl::StrFormat(
          "devmem: %s on %s: stream %#x was released (release_stream) and the work "
          "queued on it before has not completed; a stream given this handle again "
          "can use the allocator once it has",
          op, device_.ToString(), stream.handle));
    case StreamRetireState::kRetired:
      retired.forget(stream);  // a new stream with the old handle
      if (expandable_ != nullptr) expandable_->restart_stream_peak(stream);
      return;
  }
}

}  // namespace devmem::internal
