// allocator/event_queues.cc: see event_queues.h.
#include "allocator/event_queues.h"

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_format.h"

namespace devmem::internal {

size_t EventQueues::enqueue(Block* b) {
  if (retired_.empty()) [[likely]] return record(b, b->stream_uses);
  // A stream being retired may be destroyed already: no event is recorded on it, the
  // block waits for its retirement event. A retired stream's work has completed.
  absl::InlinedVector<Stream, 2> live;
  absl::InlinedVector<Stream, 2> retiring;
  if (retired_.state(b->stream) == StreamRetireState::kRetiring) retiring.push_back(b->stream);
  for (Stream s : b->stream_uses) {
    switch (retired_.state(s)) {
      case StreamRetireState::kLive: live.push_back(s); break;
      case StreamRetireState::kRetiring: retiring.push_back(s); break;
      case StreamRetireState::kRetired: break;
    }
  }
  for (Stream s : retiring) retired_.reserve_wait(s);  // may throw: nothing changed
  const size_t queued = record(b, live);                // transactional
  for (Stream s : retiring) retired_.add_wait(s, b);    // no throw: room was made
  return queued + retiring.size();
}

bool EventQueues::queued_streams(std::vector<Stream>* live) const {
  bool all_live = retired_.retiring() == 0;
  live->reserve(queues_.size());
  for (const auto& [stream, queue] : queues_) {
    if (queue.empty()) continue;
    if (!retired_.empty() && retired_.state(stream) != StreamRetireState::kLive) {
      all_live = false;
      continue;
    }
    live->push_back(stream);
  }
  return all_live;
}

template <typename Streams>
size_t EventQueues::record(Block* b, const Streams& streams) {
  size_t queued = 0;
  try {
    for (Stream s : streams) {
      std::deque<PendingEvent>& queue = queues_[s];
      queue.push_back(PendingEvent{Event{}, b});
      queue.back().event = pool_.record(s);
      ++queued;
    }
  } catch (...) {
    // Undo in reverse: each entry is the last of its stream's queue (a stream appears
    // once in stream_uses); one whose record threw holds Event{}.
    for (auto q = streams.rbegin(); q != streams.rend(); ++q) {
      auto pit = queues_.find(*q);
      if (pit == queues_.end() || pit->second.empty() || pit->second.back().block != b) {
        continue;
      }
      if (pit->second.back().event.handle != 0) {
        pool_.release(pit->second.back().event);
      }
      pit->second.pop_back();
      if (pit->second.empty()) queues_.erase(pit);
    }
    throw;
  }
  count_ += queued;
  publish();
  return queued;
}

absl::Status EventQueues::validate(absl::FunctionRef<const Block*(uintptr_t)> block_at,
                                   int64_t pending_events) const {
  auto violation = [](const std::string& what) {
    return absl::InternalError("devmem validate(): " + what);
  };
  size_t queued = 0;
  absl::flat_hash_map<const Block*, int> queued_per_block;
  for (const auto& [stream, queue] : queues_) {
    queued += queue.size();
    for (const PendingEvent& pe : queue) {
      const Block* b = pe.block;
      const Block* found = b == nullptr ? nullptr : block_at(b->addr);
      if (found != b) {
        return violation(absl::StrFormat(
            "an event queued on stream %#x names a block that no segment holds",
            stream.handle));
      }
      if (b->state != BlockState::kPending) {
        return violation(absl::StrFormat(
            "an event queued on stream %#x names block %#x, which is %s, not pending",
            stream.handle, b->addr, BlockStateName(b->state)));
      }
      ++queued_per_block[b];
    }
  }
  if (absl::Status st = retired_.count_waits(&queued_per_block); !st.ok()) return st;
  int64_t waits = 0;
  for (const auto& [b, n] : queued_per_block) {
    waits += n;
    if (n != b->pending_events) {
      return violation(absl::StrFormat("pending block %#x waits for %d events; %d are queued",
                                       b->addr, b->pending_events, n));
    }
  }
  if (queued != count_ || waits != pending_events) {
    return violation(absl::StrFormat(
        "pending events: %u queued (and %d retirement waits), counter %u, blocks wait for %d",
        queued, waits - static_cast<int64_t>(queued), count_, pending_events));
  }
  return absl::OkStatus();
}

}  // namespace devmem::internal
