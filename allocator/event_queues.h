// allocator/event_queues.h: the stream-event queues of one DevicePool (internal).
//
// A block freed after record_stream() on other streams is *pending* until an event
// recorded on each of those streams completes. EventQueues holds those events, one
// FIFO per stream they were recorded on: a stream completes its events in order, so
// only the front of each queue needs polling.
//
// It owns the queues and, through its EventPool (allocator/event_pool.h), the events:
// recorded from the pool, and given back to it (completed) or to the backend once waited
// for. It does not own the blocks, and it changes nothing about a block except its
// `pending_events` count: when that reaches 0, poll() hands the block to its caller,
// which makes it free.
//
// Bounded polling: the allocation path polls at most kAllocationEventPollBudget events
// per call, so a backlog of completed events costs an allocation a fixed number of
// queries rather than one per event; the runtime's poller (process_events) and the
// staged retry poll without a budget, so no block stays pending once its events have
// completed.
//
// Streams being retired (release_stream, allocator/stream_retire.h) get no new
// events: a block that would wait for one (its own stream, or a recorded use) waits
// for the stream's retirement event instead, kept in `retirements()`, which poll()
// polls too; a use on a stream already retired needs nothing (its work completed).
//
// Invariants (validate): every queued event names a pending block; each block has
// exactly as many queued events and retirement waits as it waits for; size() is the
// number queued; the PollWork given to set_poll_work has kQueuedEvents set exactly when
// size() > 0 (and StreamRetirements keeps kRetirements), updated by every enqueue and
// poll before it returns (allocator/poll_work.h).
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "allocator/backend.h"
#include "allocator/block.h"
#include "allocator/event_pool.h"
#include "allocator/poll_work.h"
#include "allocator/stream_retire.h"

namespace devmem::internal {

// Events the allocation path polls per call (each event_done query counts, done or
// not): enough to keep up with the cross-stream frees between two allocations of a
// program without a poller, few enough that an allocation never walks a backlog.
inline constexpr size_t kAllocationEventPollBudget = 8;
// A budget that polls every queued event.
inline constexpr size_t kPollAllEvents = SIZE_MAX;

class EventQueues {
 public:
  // Records through `backend`, which must outlive this object.
  explicit EventQueues(Backend& backend, size_t pool_capacity = EventPool::kDefaultCapacity)
      : backend_(backend), pool_(backend, pool_capacity) {}
  EventQueues(const EventQueues&) = delete;
  EventQueues& operator=(const EventQueues&) = delete;

  // Records an event on each stream of b->stream_uses (each appears once) and queues it
  // for `b`. Transactional: if a record (or the memory for an entry) throws, the events
  // recorded so far are released, nothing stays queued, and the exception propagates.
  // Returns the number queued (b->stream_uses.size() while no stream is retired); the
  // caller adds it to b->pending_events. With retirements: the streams being retired
  // (b->stream included) count one retirement wait each instead of an event, retired
  // ones nothing, so the result may be 0 (the block is free at once).
  size_t enqueue(Block* b);
  // True when a free of `b` must wait even without recorded uses: its own stream is
  // being retired.
  bool own_stream_retiring(const Block* b) const {
    return !retired_.empty() &&
           retired_.state(b->stream) == StreamRetireState::kRetiring;
  }

  size_t size() const { return count_; }
  // Nothing to poll: no queued event and no retirement under way.
  bool empty() const { return count_ == 0 && retired_.retiring() == 0; }
  const EventPool& pool() const { return pool_; }
  EventPool& pool() { return pool_; }
  // The streams with queued events, for a wait that records one event of its own on
  // each (release_fence.h): the live ones go to *live; returns false when some queue's
  // stream is not live, or a retirement is under way (events that only their own
  // records, or the retirement's, can be waited for).
  bool queued_streams(std::vector<Stream>* live) const;
  StreamRetirements& retirements() { return retired_; }
  const StreamRetirements& retirements() const { return retired_; }
  // Where the queues (and the retirements) publish whether they hold work for a poll
  // (allocator/poll_work.h); null: nowhere. Set once, before use; `work` outlives this.
  void set_poll_work(PollWork* work) {
    work_ = work;
    retired_.set_poll_work(work);
    publish();
  }

  // Releases the events that completed (with `wait`: synchronizes queued events first,
  // so they all complete) and decrements their blocks' pending_events; calls done(b)
  // for each block whose count reaches 0, in completion order. Queries (or waits for)
  // at most `budget` events, oldest first on each stream; the poll after one that ran
  // out starts with the next stream, so streams take turns and none waits behind
  // another's backlog.
  // Retirement events (retirements()) are polled first, each query counting against
  // `budget`.
  template <typename Done>
  void poll(bool wait, size_t budget, Done&& done);

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
  // Records and queues an event on each of `streams` for `b` (enqueue's transaction).
  template <typename Streams>
  size_t record(Block* b, const Streams& streams);
  // Publishes count_ != 0 (kQueuedEvents). After every change of count_, before the
  // caller can release the lock.
  void publish() {
    if (work_ != nullptr) work_->set(PollWork::kQueuedEvents, count_ != 0);
  }
  Backend& backend_;
  PollWork* work_ = nullptr;
  // Declared before queues_: queued events go back to it as they complete.
  EventPool pool_;
  StreamRetirements retired_{backend_};
  absl::flat_hash_map<Stream, std::deque<PendingEvent>> queues_;
  size_t count_ = 0;
  // Where the next poll starts (a stream that may no longer have a queue: then the
  // first in the map's order).
  Stream resume_{};
};

template <typename Done>
void EventQueues::poll(bool wait, size_t budget, Done&& done) {
  if (retired_.retiring() != 0) [[unlikely]] {
    budget -= retired_.poll(wait, budget, absl::FunctionRef<void(Block*)>(done));
  }
  if (queues_.empty()) return;
  // count_ drops below; the bit follows it at every return (none releases the lock
  // before: done() only moves blocks to the free sets).
  struct Publish {
    EventQueues* q;
    ~Publish() { q->publish(); }
  } publish_at_return{this};
  auto it = queues_.find(resume_);
  if (it == queues_.end()) it = queues_.begin();
  // Visits each stream once, from `it` round to the one before it. Erasing an emptied
  // queue invalidates only its own iterator (and never rehashes), so the order of the
  // others stays as it was.
  for (size_t left = queues_.size(); left > 0; --left) {
    std::deque<PendingEvent>& queue = it->second;
    while (!queue.empty()) {
      if (budget == 0) {
        // The next poll starts with the stream after this one: streams take turns.
        auto next = std::next(it);
        resume_ = (next == queues_.end() ? queues_.begin() : next)->first;
        return;
      }
      --budget;
      const PendingEvent pe = queue.front();
      if (wait) {
        backend_.synchronize_event(pe.event);
      } else if (!backend_.event_done(pe.event)) {
        break;  // later events on this stream cannot be done either
      }
      queue.pop_front();
      --count_;
      pool_.recycle(pe.event);
      if (--pe.block->pending_events == 0) done(pe.block);
    }
    auto next = std::next(it);
    if (queue.empty()) queues_.erase(it);
    it = next == queues_.end() ? queues_.begin() : next;
  }
}

}  // namespace devmem::internal
