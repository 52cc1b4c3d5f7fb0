// allocator/event_queues.h: the stream-event queues of one DevicePool (internal).
//
// A block freed after record_stream() on other streams is *pending* until an event
// recorded on each of those streams completes. EventQueues holds those events, one
// FIFO per stream they were recorded on: a stream completes its events in order, so
// only the front of each queue needs polling.
//
// It owns the events (recorded through the Backend, released once waited for) and the
// queues; it does not own the blocks, and it changes nothing about a block except its
// `pending_events` count: when that reaches 0, poll() hands the block to its caller,
// which makes it free.
//
// Invariants (validate): every queued event names a pending block; each block has
// exactly as many queued events as it waits for; size() is the number queued.
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include <cstddef>
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "allocator/backend.h"
#include "allocator/block.h"

namespace devmem::internal {

class EventQueues {
 public:
  EventQueues() = default;
  EventQueues(const EventQueues&) = delete;
  EventQueues& operator=(const EventQueues&) = delete;

  // Records an event on each stream of b->stream_uses (each appears once) and queues it
  // for `b`. Transactional: if a record (or the memory for an entry) throws, the events
  // recorded so far are released, nothing stays queued, and the exception propagates.
  // Returns the number queued (b->stream_uses.size()); the caller adds it to
  // b->pending_events.
  size_t enqueue(Backend& backend, Block* b);

  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }

  // Releases the events that completed (with `wait`: synchronizes every queued event
  // first, so none stays queued) and decrements their blocks' pending_events; calls
  // done(b) for each block whose count reaches 0, in completion order.
  template <typename Done>
  void poll(Backend& backend, bool wait, Done&& done);

  // The queues' share of validate(): every queued event names a block that
  // `block_at(addr)` finds and that is pending, one event per waited-for event, and
  // the total equals `pending_events` (the sum over pending blocks) and size().
  absl::Status validate(absl::FunctionRef<const Block*(uintptr_t)> block_at,
                        int64_t pending_events) const;

 private:
  friend class DevicePoolTestPeer;  // corrupts a queue to show validate() notices
  struct PendingEvent {
    Event event;
    Block* block;
  };
  absl::flat_hash_map<Stream, std::deque<PendingEvent>> queues_;
  size_t count_ = 0;
};

template <typename Done>
void EventQueues::poll(Backend& backend, bool wait, Done&& done) {
  for (auto it = queues_.begin(); it != queues_.end();) {
    std::deque<PendingEvent>& queue = it->second;
    while (!queue.empty()) {
      PendingEvent pe = queue.front();
      if (wait) {
        backend.synchronize_event(pe.event);
      } else if (!backend.event_done(pe.event)) {
        break;  // later events on this stream cannot be done either
      }
      backend.release_event(pe.event);
      queue.pop_front();
      --count_;
      if (--pe.block->pending_events == 0) done(pe.block);
    }
    if (queue.empty()) {
      queues_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace devmem::internal
