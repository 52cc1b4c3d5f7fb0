// allocator/expandable_recycle.cc: ExpandableSegments' unmapping of idle granules
// (recycling; see expandable_segments.h for when it happens and what it costs).
#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/errors.h"
#include "allocator/expandable_segments.h"

namespace devmem::internal {

StreamFootprint ExpandableSegments::footprint(const Reservation* r) const {
  StreamFootprint f;
  f.in_use = r->use->in_use;
  f.in_use_peak = r->use->in_use_peak;
  // The stream's two reservations (small pool, large pool): two lookups, made only
  // when a request must map.
  for (const bool small : {false, true}) {
    auto it = reservations_.find(std::make_pair(r->stream.handle, small));
    if (it != reservations_.end()) f.mapped += it->second->mapped;
  }
  for (const Deferred& d : deferred_) {
    if (d.reservation->stream == r->stream) f.deferred += d.bytes;
  }
  return f;
}

absl::Status ExpandableSegments::validate_stream_use() const {
  absl::flat_hash_map<const StreamUse*, int64_t> in_use;
  for (const auto& [key, r] : reservations_) {
    auto it = streams_.find(r->stream.handle);
    if (it == streams_.end() || r->use != &it->second) {
      return absl::InternalError(absl::StrFormat(
          "devmem validate(): reservation %#x does not count its use in its stream's "
          "record",
          r->addr));
    }
  }
  for (auto seg = table_.begin(); seg != table_.end(); ++seg) {
    const Segment* s = seg->second;
    if (!s->expandable()) continue;
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      if (b->state != BlockState::kFree) in_use[s->reservation->use] += b->size;
    }
  }
  for (const auto& [handle, use] : streams_) {
    const auto it = in_use.find(&use);
    const int64_t counted = it == in_use.end() ? 0 : it->second;
    if (use.in_use != counted || use.in_use_peak < use.in_use) {
      return absl::InternalError(absl::StrFormat(
          "devmem validate(): stream %#x records %d bytes in use in expandable segments "
          "(peak %d); its blocks out of the free sets hold %d",
          handle, use.in_use, use.in_use_peak, counted));
    }
  }
  return absl::OkStatus();
}

size_t ExpandableSegments::unmap_range(Block* b, uintptr_t c0, uintptr_t c1) {
  Segment* s = b->segment;
  Reservation* r = s->reservation;
  const size_t bytes = c1 - c0;
  const uintptr_t b_end = b->addr + b->size;
  const uintptr_t s_end = s->addr + s->size;
  // What this allocates, before anything changes: a second Block when b keeps parts on
  // both sides of the hole, and a Segment when the run splits in two.
  const bool keeps_below = c0 > b->addr;
  const bool keeps_above = c1 < b_end;
  std::unique_ptr<Segment> split_off =
      (keeps_below || b->prev != nullptr) && (keeps_above || b->next != nullptr)
          ? std::make_unique<Segment>()
          : nullptr;
  Block* second = keeps_below && keeps_above ? free_.new_block() : nullptr;
  acct_.unmapping(s, c0, bytes);
  // The driver before the books: a DriverError leaves b free and counted, as it was.
  try {
    backend_.unmap(reinterpret_cast<void*>(c0), bytes);
  } catch (...) {
    if (second != nullptr) free_.delete_block(second);
    throw;
  }
  free_.erase(b);
  acct_.unmapped(s, bytes);
  r->mapped -= bytes;

  // What is left of b below and above the hole.
  Block* before = b->prev;
  Block* after = b->next;
  Block* below = nullptr;
  Block* above = nullptr;
  if (c0 > b->addr) {
    below = b;
    b->size = c0 - b->addr;
  }
  if (c1 < b_end) {
    above = below != nullptr ? second : b;
    above->addr = c1;
    above->size = b_end - c1;
    above->segment = s;
    above->stream = s->stream;
    above->state = BlockState::kFree;
    above->free_seq = b->free_seq;
  }
  if (below == nullptr && above == nullptr) free_.delete_block(b);
  Block* left_tail = below != nullptr ? below : before;  // last block below the hole
  Block* right_head = above != nullptr ? above : after;  // first block above it
  if (left_tail != nullptr) left_tail->next = nullptr;
  if (right_head != nullptr) {
    right_head->prev = nullptr;
    right_head->next = above != nullptr ? after : right_head->next;
    if (above != nullptr && after != nullptr) after->prev = above;
  }
  if (below != nullptr) below->prev = before;

  if (left_tail != nullptr && right_head != nullptr) {
    // The run splits in two. The side with fewer blocks moves to a new Segment, so
    // the walk that re-points blocks costs the smaller side only.
    const Block* x = left_tail;
    const Block* y = right_head;
    while (x != nullptr && y != nullptr) {
      x = x->prev;
      y = y->next;
    }
    const bool move_left = x == nullptr;
    Segment* n = split_off.release();
    n->stream = s->stream;
    n->small_pool = s->small_pool;
    n->reservation = r;
    n->last_used = s->last_used;
    if (move_left) {
      n->addr = s->addr;
      n->size = c0 - s->addr;
      n->head = s->head;
      n->tail = left_tail;
      table_.rekey(s, c1);
      s->size = s_end - c1;
      s->head = right_head;
    } else {
      n->addr = c1;
      n->size = s_end - c1;
      n->head = right_head;
      n->tail = s->tail;
      s->size = c0 - s->addr;
      s->tail = left_tail;
    }
    table_.add(n);
    for (Block* m = n->head; m != nullptr; m = m->next) {
      m->segment = n;
      if (m->state != BlockState::kFree) ++n->busy_blocks;
    }
    s->busy_blocks -= n->busy_blocks;
    acct_.run_added(s->small_pool);
    ++r->runs;
  } else if (left_tail != nullptr) {
    s->size = c0 - s->addr;
    s->tail = left_tail;
  } else if (right_head != nullptr) {
    table_.rekey(s, c1);
    s->size = s_end - c1;
    s->head = right_head;
  } else {
    table_.remove(s);
    acct_.run_removed(s->small_pool);
    --r->runs;
    delete s;
  }
  if (below != nullptr) free_.insert(below);
  if (above != nullptr) free_.insert(above);
  return bytes;
}

size_t ExpandableSegments::recycle_except(size_t bytes, const Scope& scope) {
  if (bytes == 0) return 0;
  struct Candidate {
    size_t span;  // whole granules inside the block, in bytes
    uintptr_t addr;
    Block* block;
  };
  std::vector<Candidate> candidates;
  for (const FreeIndex::FreeSet* set : {&free_.set(false), &free_.set(true)}) {
    for (Block* b : *set) {
      if (!b->segment->expandable() || b == scope.keep_a || b == scope.keep_b) continue;
      if (scope.only != nullptr && b->segment->reservation != scope.only) continue;
      if (b->free_seq > scope.freed_by) continue;
      const uintptr_t c0 = round_to_granule(b->addr);
      const uintptr_t c1 = (b->addr + b->size) / granularity_ * granularity_;
      if (c1 > c0) candidates.push_back(Candidate{c1 - c0, b->addr, b});
    }
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.span != b.span ? a.span > b.span : a.addr < b.addr;
  });
  std::vector<uintptr_t> synced;  // stream handles waited for by this call
  size_t released = 0;
  for (const Candidate& c : candidates) {
    if (released >= bytes) break;
    Block* b = c.block;
    const uintptr_t c1 = (b->addr + b->size) / granularity_ * granularity_;
    const size_t want = bytes - released;  // may be SIZE_MAX: compare before rounding
    const size_t take = want >= c.span ? c.span : round_to_granule(want);
    if (scope.sync &&
        std::find(synced.begin(), synced.end(), b->stream.handle) == synced.end()) {
      synchronize_for_release(b->stream);  // a retired stream: its event (stream_retire.h)
      synced.push_back(b->stream.handle);
    }
    released += unmap_range(b, c1 - take, c1);
  }
  return released;
}

void ExpandableSegments::recycle_proactively(Reservation* r, size_t bytes,
                                             const Placement& p, uint64_t free_seq) {
  // Proactive recycling is a footprint optimisation: when no event can be recorded it
  // is skipped this time rather than failing the allocation.
  Event event;
  try {
    event = backend_.record_event(r->stream);
  } catch (const DriverError&) {
    throw;  // the device is broken, not busy: the allocator must learn of it
  } catch (const std::exception&) {
    return;
  }
  bool idle = false;
  try {
    idle = backend_.event_done(event);
  } catch (...) {
    backend_.release_event(event);
    throw;
  }
  if (idle) {
    // The stream is idle: every block free now is free in stream order already.
    backend_.release_event(event);
    recycle_except(bytes, Scope{p.left, p.right, r, UINT64_MAX, /*sync=*/false});
    return;
  }
  // One decision per reservation: the new event comes later on the same stream, so it
  // covers every block the old one did, and more.
  for (Deferred& d : deferred_) {
    if (d.reservation == r) {
      backend_.release_event(d.event);
      d.event = event;
      d.free_seq = free_seq;
      d.bytes += bytes;
      deferred_bytes_ += bytes;
      return;
    }
  }
  try {
    deferred_.push_back(Deferred{r, event, free_seq, bytes});
  } catch (...) {
    backend_.release_event(event);
    throw;
  }
  deferred_bytes_ += bytes;
}

size_t ExpandableSegments::complete_deferred(bool wait) {
  size_t released = 0;
  for (size_t i = 0; i < deferred_.size();) {
    const Deferred d = deferred_[i];
    if (wait) {
      backend_.synchronize_event(d.event);
    } else if (!backend_.event_done(d.event)) {
      ++i;
      continue;
    }
    backend_.release_event(d.event);
    deferred_[i] = deferred_.back();
    deferred_.pop_back();
    deferred_bytes_ -= d.bytes;
    // Memory may have been allocated or given back since the decision: only what is
    // still over the cap goes, and only blocks free since before the event.
    const size_t want = DeferredRecycleBytes(recycle_threshold_, footprint(d.reservation),
                                             d.bytes);
    released += recycle_except(want, Scope{nullptr, nullptr, d.reservation, d.free_seq,
                                           /*sync=*/false});
  }
  return released;
}

}  // namespace devmem::internal
