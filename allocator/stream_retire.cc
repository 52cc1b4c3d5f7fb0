// allocator/stream_retire.cc: see stream_retire.h.
#include "allocator/stream_retire.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace devmem::internal {

StreamRetirements::~StreamRetirements() {
  for (auto& [stream, e] : entries_) {
    if (!e.done) backend_.release_event(e.event);  // never throws (backend.h)
  }
}

void StreamRetirements::begin(Stream s, size_t waits) {
  std::vector<Block*> blocks;
  blocks.reserve(waits);
  entries_.reserve(entries_.size() + 1);
  // Last: nothing after it throws, so the event cannot leak.
  const Event event = backend_.record_event(s);
  Entry& e = entries_[s];  // a retired entry is replaced: the handle's new stream
  e.event = event;
  e.done = false;
  e.blocks = std::move(blocks);
  ++retiring_;
  publish();
}

void StreamRetirements::reserve_wait(Stream s) {
  std::vector<Block*>& blocks = entries_.at(s).blocks;
  blocks.reserve(blocks.size() + 1);
}

void StreamRetirements::add_wait(Stream s, Block* b) { entries_.at(s).blocks.push_back(b); }

size_t StreamRetirements::poll(bool wait, size_t budget,
                               absl::FunctionRef<void(Block*)> done) {
  size_t queried = 0;
  for (auto& [stream, e] : entries_) {
    if (retiring_ == 0 || queried == budget) break;
    if (e.done) continue;
    ++queried;
    if (wait) {
      backend_.synchronize_event(e.event);
    } else if (!backend_.event_done(e.event)) {
      continue;
    }
    backend_.release_event(e.event);
    e.event = Event{};
    e.done = true;
    --retiring_;
    publish();
    std::vector<Block*> blocks = std::move(e.blocks);
    e.blocks = {};
    for (Block* b : blocks) {
      if (--b->pending_events == 0) done(b);
    }
  }
  return queried;
}

void StreamRetirements::synchronize_for_release(Stream s) {
  auto it = entries_.empty() ? entries_.end() : entries_.find(s);
  if (it == entries_.end()) {
    backend_.synchronize_stream(s);
  } else if (!it->second.done) {
    backend_.synchronize_event(it->second.event);
  }
}

absl::Status StreamRetirements::count_waits(
    absl::flat_hash_map<const Block*, int>* waits) const {
  size_t retiring = 0;
  for (const auto& [stream, e] : entries_) {
    if (e.done) {
      if (!e.blocks.empty()) {
        return absl::InternalError(absl::StrFormat(
            "devmem validate(): retired stream %#x still lists %u waiting blocks",
            stream.handle, e.blocks.size()));
      }
      continue;
    }
    ++retiring;
    for (const Block* b : e.blocks) {
      if (b->state != BlockState::kPending) {
        return absl::InternalError(absl::StrFormat(
            "devmem validate(): block %#x waits for the retirement of stream %#x but "
            "is %s, not pending",
            b->addr, stream.handle, BlockStateName(b->state)));
      }
      ++(*waits)[b];
    }
  }
  if (retiring != retiring_) {
    return absl::InternalError(absl::StrFormat(
        "devmem validate(): %u streams retiring, counter %u", retiring, retiring_));
  }
  return absl::OkStatus();
}

}  // namespace devmem::internal
