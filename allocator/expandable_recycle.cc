// allocator/expandable_recycle.cc: ExpandableSegments' unmapping of idle granules
// (recycling; see expandable_segments.h for when it happens and what it costs).
#include <algorithm>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/errors.h"
#include "allocator/expandable_segments.h"
#include "allocator/release_fence.h"

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

ExpandableSegments::Hole ExpandableSegments::detach_range(Block* b, uintptr_t c0,
                                                          uintptr_t c1) {
  Segment* s = b->segment;
  Reservation* r = s->reservation;
  const size_t bytes = c1 - c0;
  const uintptr_t b_end = b->addr + b->size;
  const uintptr_t s_end = s->addr + s->size;
  // What this allocates, before anything changes: a second Block when b keeps parts on
  // both sides of the hole, and a Segment when the run splits in two.
  in_flight_ranges_.reserve(in_flight_ranges_.size() + 1);  // may throw: before changes
  const bool keeps_below = c0 > b->addr;
  const bool keeps_above = c1 < b_end;
  std::unique_ptr<Segment> split_off =
      (keeps_below || b->prev != nullptr) && (keeps_above || b->next != nullptr)
          ? std::make_unique<Segment>()
          : nullptr;
  Block* second = keeps_below && keeps_above ? free_.new_block() : nullptr;
  // What throws comes before; now the books. The unmap itself comes later, with the
  // lock released (unmap_holes): until then the granules are in flight, in no block
  // and no gap. An unmap that throws links them back (the pool is as it was).
  Hole hole{r, c0, bytes, s->stream, s->last_used, b->free_seq};
  acct_.unmapping(s, c0, bytes);
  free_.erase(b);
  acct_.unmapped(s, bytes);
  r->mapped -= bytes;
  in_flight_ranges_.push_back(InFlight{r, c0, bytes, InFlight::kUnmapping});
  hole.give_back = in_flight_.begin_give_back(bytes);

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
  return hole;
}

size_t ExpandableSegments::unmap_holes(const std::vector<Hole>& holes,
                                       const std::vector<Stream>& streams, Mutex* lock) {
  if (holes.empty()) return 0;
  size_t done = 0;
  std::exception_ptr error;
  // Every stream first (each once), then every unmap: nothing queued before the frees
  // may still use the memory. The streams are named under the lock (an event each,
  // release_fence.h); the waits and the unmaps run with it released: the granules are
  // out of every block and run and registered being unmapped (detach_range), so no
  // placement, allocation or other recycle touches them meanwhile, and a
  // release_stream that returns meanwhile is followed by no call on its stream.
  ReleaseFence fence(backend_, event_pool_, retirements_);
  try {
    fence.record(streams);
    ScopedUnlock unlocked(lock);
    fence.wait();
    for (; done < holes.size(); ++done) {
      backend_.unmap(reinterpret_cast<void*>(holes[done].at), holes[done].bytes);
    }
  } catch (...) {
    error = std::current_exception();
  }
  fence.finish();
  size_t unmapped = 0;
  for (size_t i = 0; i < holes.size(); ++i) {
    const Hole& h = holes[i];
    end_in_flight(h.reservation, h.at);
    in_flight_.end_give_back(h.bytes, h.give_back);
    if (i < done) {
      unmapped += h.bytes;
      continue;
    }
    // Not unmapped (a DriverError: the pool is poisoned but stays readable): the
    // granules are free mapped memory again, counted as before. Should the host be
    // out of memory for their Block too, they stay forgotten (a poisoned pool maps
    // nothing again).
    try {
      Block* b = link_mapped(h.reservation, h.at, h.bytes, h.last_used, /*undo=*/true);
      b->free_seq = std::max(b->free_seq, h.free_seq);
      free_.insert(b);
    } catch (const std::bad_alloc&) {
    }
  }
  if (error) std::rethrow_exception(error);
  return unmapped;
}

size_t ExpandableSegments::recycle_except(size_t bytes, const Scope& scope, Mutex* lock) {
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
  // Each chosen range leaves its block and run now (the books); the streams are waited
  // for and the granules unmapped with the lock released (unmap_holes).
  std::vector<Stream> streams;  // to wait for (each once)
  std::vector<Hole> holes;
  holes.reserve(candidates.size());
  // Reserved before any hole is detached: a push_back that threw after a detach would
  // leave that give-back begun and never ended (its generation would never drain, and
  // stage 2's wait would block on it: segment_source.h).
  streams.reserve(candidates.size());
  size_t released = 0;
  for (const Candidate& c : candidates) {
    if (released >= bytes) break;
    Block* b = c.block;
    const uintptr_t c1 = (b->addr + b->size) / granularity_ * granularity_;
    const size_t want = bytes - released;  // may be SIZE_MAX: compare before rounding
    const size_t take = want >= c.span ? c.span : round_to_granule(want);
    if (scope.sync && std::find(streams.begin(), streams.end(), b->stream) == streams.end()) {
      streams.push_back(b->stream);  // a retired stream: its event (stream_retire.h)
    }
    try {
      holes.push_back(detach_range(b, c1 - take, c1));
    } catch (...) {
      unmap_holes(holes, streams, lock);  // those detached already go
      throw;
    }
    released += take;
  }
  return unmap_holes(holes, streams, lock);
}

void ExpandableSegments::recycle_proactively(Reservation* r, size_t bytes, Block* keep_a,
                                             Block* keep_b, uint64_t free_seq,
                                             Mutex* lock) {
  // Proactive recycling is a footprint optimisation: when no event can be recorded it
  // is skipped this time rather than failing the allocation.
  Event event;
  try {
    event = record_pooled_event(r->stream);
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
    event_completed(event);
    recycle_except(bytes, Scope{keep_a, keep_b, r, UINT64_MAX, /*sync=*/false}, lock);
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
  publish_deferred();
}

size_t ExpandableSegments::complete_deferred(bool wait, Mutex* lock) {
  size_t released = 0;
  // Another thread may add, merge or complete decisions while the lock is released
  // (the waits, the unmaps): the walk goes on from where it was, and a decision it
  // passes by is for a later call.
  for (size_t i = 0; i < deferred_.size();) {
    const Deferred d = deferred_[i];
    if (!wait && !backend_.event_done(d.event)) {
      ++i;
      continue;
    }
    deferred_[i] = deferred_.back();
    deferred_.pop_back();
    deferred_bytes_ -= d.bytes;
    publish_deferred();  // before the lock is released below
    if (wait) {
      // Memory pressure: wait for the stream, with the lock released. The event is this
      // call's alone now; the reservation stays (pinned) meanwhile.
      const Pin pin(pinned_, d.reservation);
      try {
        ScopedUnlock unlocked(lock);
        backend_.synchronize_event(d.event);
      } catch (...) {
        backend_.release_event(d.event);
        throw;
      }
    }
    event_completed(d.event);  // queried done, or waited for
    // Memory may have been allocated or given back since the decision: only what is
    // still over the cap goes, and only blocks free since before the event.
    const size_t want = DeferredRecycleBytes(recycle_threshold_, footprint(d.reservation),
                                             d.bytes);
    released += recycle_except(want, Scope{nullptr, nullptr, d.reservation, d.free_seq,
                                           /*sync=*/false},
                               lock);
  }
  return released;
}

}  // namespace devmem::internal
