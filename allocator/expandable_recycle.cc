// allocator/expandable_recycle.cc: ExpandableSegments' unmapping of idle granules
// (recycling; see expandable_segments.h for when it happens and what it costs).
#include <algorithm>
#include <memory>
#include <vector>

#include "allocator/expandable_segments.h"

namespace devmem::internal {

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
  free_.erase(b);
  acct_.unmapping(s, c0, bytes);
  backend_.unmap(reinterpret_cast<void*>(c0), bytes);
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

size_t ExpandableSegments::recycle_except(size_t bytes, const Block* keep_a,
                                          const Block* keep_b, const Reservation* only) {
  if (bytes == 0) return 0;
  struct Candidate {
    size_t span;  // whole granules inside the block, in bytes
    uintptr_t addr;
    Block* block;
  };
  std::vector<Candidate> candidates;
  for (const FreeIndex::FreeSet* set : {&free_.set(false), &free_.set(true)}) {
    for (Block* b : *set) {
      if (!b->segment->expandable() || b == keep_a || b == keep_b) continue;
      if (only != nullptr && b->segment->reservation != only) continue;
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
    if (std::find(synced.begin(), synced.end(), b->stream.handle) == synced.end()) {
      backend_.synchronize_stream(b->stream);
      synced.push_back(b->stream.handle);
    }
    released += unmap_range(b, c1 - take, c1);
  }
  return released;
}

}  // namespace devmem::internal
