// allocator/device_pool_expandable.cc: expandable segments, DevicePool's use of the
// backend's virtual memory (block.h defines Reservation and its runs).
//
// Each (stream, pool) gets one reserved address range. Memory is mapped into it one
// granule (2 MiB on CUDA) at a time, where a request needs it, and unmapped from
// inside free blocks, so the device footprint follows what is allocated rather than
// where it was allocated: a 32 MiB request that fits in none of the 16 MiB holes
// between live buffers can take the holes' physical memory (unmapped) at a new
// address, instead of new memory next to them.
//
// When granules are unmapped ("recycled"):
//   * under memory pressure: the device or the memory fraction refuses a map, or the
//     staged retry, trim, empty_cache and garbage collection ask for bytes back;
//   * proactively, when a request must map new memory and reserved bytes would then
//     exceed (1 + expandable_recycle_threshold) x allocated: that is fragmentation
//     growing the footprint, so idle granules are unmapped first (at most as many as
//     are being mapped; the footprint never shrinks on the allocation path).
// Steady workloads whose cached memory stays under the threshold never recycle, so
// they map once and then run from the cache like regular segments.
//
// The cost of recycling is a stream synchronization (a free block may still be used
// by work queued on its stream before the free; unmapping, unlike cudaFree, does not
// wait for it) plus the unmap and map calls; it is counted in num_device_free and
// num_device_alloc.
//
// Thread-safety: every method here requires DevicePool::mu_.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/device_pool.h"

namespace devmem::internal {
Reservation* DevicePool::reservation(Stream stream, bool small) {
  const auto key = std::make_pair(stream.handle, small);
  auto it = expandable_.find(key);
  if (it != expandable_.end()) return it->second;
  if (reservation_failed_.contains(key)) return nullptr;
  // Address space is cheap but not free. The large pool's range is twice the device:
  // recycling leaves unmapped gaps between live blocks, and new mappings must find
  // room beside them. The small pool (requests <= 1 MiB) gets a quarter of the device.
  // When a range is used up anyway, requests fall back to regular segments.
  const size_t total = std::min(device_total_, memory_limit());
  const size_t va = ReservationSize(total, granularity_, small);
  absl::StatusOr<void*> p = backend_->reserve_address(va);
  if (!p.ok()) {
    reservation_failed_.insert(key);
    return nullptr;
  }
  auto* r = new Reservation;
  r->addr = reinterpret_cast<uintptr_t>(*p);
  r->va_size = va;
  r->stream = stream;
  r->small_pool = small;
  expandable_.emplace(key, r);
  return r;
}

DevicePool::Placement DevicePool::place(const Reservation* r, size_t size) const {
  Placement best;
  auto offer = [&](uintptr_t at, size_t bytes, Block* left, Block* right) {
    if (bytes == 0) return;
    if (best.bytes == 0 || bytes < best.bytes || (bytes == best.bytes && at < best.at)) {
      best = Placement{at, bytes, left, right};
    }
  };
  // One unmapped gap [g0, g1) between the run `lo` (ending at g0, or none) and the run
  // `hi` (starting at g1, or none).
  auto consider = [&](uintptr_t g0, uintptr_t g1, const Segment* lo, const Segment* hi) {
    if (g1 <= g0) return;
    const size_t gap = g1 - g0;
    Block* lf = lo != nullptr && lo->tail->state == BlockState::kFree ? lo->tail : nullptr;
    Block* rf = hi != nullptr && hi->head->state == BlockState::kFree ? hi->head : nullptr;
    const size_t lb = lf != nullptr ? lf->size : 0;
    const size_t rb = rf != nullptr ? rf->size : 0;
    // Extend the free block below (or start fresh at the gap's bottom).
    if (lb < size) {
      const size_t need = round_to_granule(size - lb);
      if (need <= gap) offer(g0, need, lf, nullptr);
    }
    // Extend the free block above, mapping the top of the gap.
    if (rf != nullptr && rb < size) {
      const size_t need = round_to_granule(size - rb);
      if (need <= gap) offer(g1 - need, need, nullptr, rf);
    }
    // Fill the whole gap, joining both.
    if (lf != nullptr && rf != nullptr && lb + gap + rb >= size) offer(g0, gap, lf, rf);
  };
  uintptr_t prev_end = r->addr;
  const Segment* prev = nullptr;
  const uintptr_t end = r->addr + r->va_size;
  for (auto it = segments_.lower_bound(r->addr); it != segments_.end() && it->first < end;
       ++it) {
    const Segment* s = it->second;
    consider(prev_end, s->addr, prev, s);
    prev_end = s->addr + s->size;
    prev = s;
  }
  consider(prev_end, end, prev, nullptr);
  return best;
}

Block* DevicePool::try_expand(Reservation* r, size_t size, bool* va_full) {
  const Placement p = place(r, size);
  if (p.bytes == 0) {
    *va_full = true;
    return nullptr;
  }
  const size_t limit = memory_limit();
  if (p.bytes > limit) return nullptr;
  auto reserved = [&] {
    return static_cast<size_t>(acct_.stats().reserved_bytes[kAggregatePool].current);
  };
  // How much to recycle before mapping: what the memory limit demands, and what keeps
  // the footprint within the threshold (never more than is about to be mapped).
  // The limit may take idle granules from any reservation; the threshold only from
  // this one: another stream's cache is likely to be wanted back by that stream.
  if (reserved() > limit - p.bytes) {
    recycle(reserved() + p.bytes - limit, p.left, p.right);
    if (reserved() > limit - p.bytes) return nullptr;
  }
  // The recycle trigger is measured against the peak of allocated bytes (since
  // reset_peak_stats), not the current value: a program between two peaks will need
  // the memory again, and unmapping it only to map it back is churn.
  const Stat& allocated = acct_.stats().allocated_bytes[kAggregatePool];
  if (const size_t over = ProactiveRecycleBytes(recycle_threshold_, allocated.peak,
                                                allocated.current, size, reserved(), p.bytes);
      over > 0) {
    recycle(over, p.left, p.right, r);
  }
  void* at = reinterpret_cast<void*>(p.at);
  absl::Status st = backend_->map(at, p.bytes);
  if (absl::IsResourceExhausted(st) && recycle(p.bytes, p.left, p.right) > 0) {
    // The device itself is full (other processes, or a sim capacity below the
    // fraction): idle granules of ours make room.
    st = backend_->map(at, p.bytes);
  }
  if (!st.ok()) {
    if (absl::IsResourceExhausted(st)) return nullptr;
    throw std::runtime_error(absl::StrFormat("devmem: %s: mapping %u bytes at %p failed: %s",
                                             device_.ToString(), p.bytes, at,
                                             st.ToString()));
  }
  // link_mapped allocates its Block and Segment before it changes anything: if that
  // throws, the mapping is undone and the pool is as it was.
  try {
    return link_mapped(r, p.at, p.bytes);
  } catch (...) {
    backend_->unmap(at, p.bytes);
    throw;
  }
}

Block* DevicePool::link_mapped(Reservation* r, uintptr_t at, size_t bytes) {
  const uintptr_t end = at + bytes;
  // The runs just below and just above the new range, if they touch it.
  Segment* lo = nullptr;
  if (auto it = segments_.lower_bound(at); it != segments_.begin()) {
    Segment* s = std::prev(it)->second;
    if (s->reservation == r && s->addr + s->size == at) lo = s;
  }
  Segment* hi = nullptr;
  if (auto it = segments_.find(end); it != segments_.end() && it->second->reservation == r) {
    hi = it->second;
  }
  // Everything that allocates first (see try_expand); nothing below throws.
  std::unique_ptr<Segment> fresh =
      lo == nullptr && hi == nullptr ? std::make_unique<Segment>() : nullptr;
  Block* b = free_.new_block();
  r->mapped += bytes;
  acct_.mapped(r, at, bytes);
  // Free neighbours leave their set before any link changes (the set's split
  // statistics depend on the links).
  Block* lf = lo != nullptr && lo->tail->state == BlockState::kFree ? lo->tail : nullptr;
  Block* rf = hi != nullptr && hi->head->state == BlockState::kFree ? hi->head : nullptr;
  if (lf != nullptr) free_.erase(lf);
  if (rf != nullptr) free_.erase(rf);

  b->addr = at;
  b->size = bytes;
  b->stream = r->stream;
  b->state = BlockState::kFree;
  Segment* s;
  if (lo != nullptr) {
    s = lo;
    b->prev = lo->tail;
    lo->tail->next = b;
    s->tail = b;
    s->size += bytes;
    if (hi != nullptr) {  // the gap is filled: hi's blocks join lo
      b->next = hi->head;
      hi->head->prev = b;
      s->tail = hi->tail;
      s->size += hi->size;
      s->busy_blocks += hi->busy_blocks;
      for (Block* x = hi->head; x != nullptr; x = x->next) x->segment = s;
      segments_.erase(hi->addr);
      acct_.run_removed(r->small_pool);
      --r->runs;
      delete hi;
    }
  } else if (hi != nullptr) {
    s = hi;
    rekey_segment(s, at);
    s->size += bytes;
    b->next = hi->head;
    hi->head->prev = b;
    s->head = b;
  } else {
    s = fresh.release();
    s->addr = at;
    s->size = bytes;
    s->stream = r->stream;
    s->small_pool = r->small_pool;
        s->reservation = r;
    s->head = s->tail = b;
    s->last_used = use_clock_;
    segments_.emplace(at, s);
    acct_.run_added(r->small_pool);
    ++r->runs;
  }
  b->segment = s;
  // Coalesce with the free neighbours (out of their sets already).
  if (lf != nullptr) {
    b->addr = lf->addr;
    b->size += lf->size;
    b->prev = lf->prev;
    if (b->prev != nullptr) {
      b->prev->next = b;
    } else {
      s->head = b;
    }
    free_.delete_block(lf);
  }
  if (rf != nullptr) {
    b->size += rf->size;
    b->next = rf->next;
    if (b->next != nullptr) b->next->prev = b;
    free_.delete_block(rf);
  }
  if (b->next == nullptr) s->tail = b;
  return b;
}

size_t DevicePool::unmap_range(Block* b, uintptr_t c0, uintptr_t c1) {
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
  backend_->unmap(reinterpret_cast<void*>(c0), bytes);
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
      rekey_segment(s, c1);
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
    segments_.emplace(n->addr, n);
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
    rekey_segment(s, c1);
    s->size = s_end - c1;
    s->head = right_head;
  } else {
    segments_.erase(s->addr);
    acct_.run_removed(s->small_pool);
    --r->runs;
    delete s;
  }
  if (below != nullptr) free_.insert(below);
  if (above != nullptr) free_.insert(above);
  return bytes;
}

size_t DevicePool::recycle(size_t bytes, const Block* keep_a, const Block* keep_b,
                           const Reservation* only) {
  if (!use_expandable_ || bytes == 0) return 0;
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
      backend_->synchronize_stream(b->stream);
      synced.push_back(b->stream.handle);
    }
    released += unmap_range(b, c1 - take, c1);
  }
  return released;
}

void DevicePool::rekey_segment(Segment* s, uintptr_t addr) {
  segments_.erase(s->addr);
  s->addr = addr;
  segments_.emplace(addr, s);
}

void DevicePool::release_empty_reservations() {
  for (auto it = expandable_.begin(); it != expandable_.end();) {
    Reservation* r = it->second;
    if (r->runs != 0) {
      ++it;
      continue;
    }
    backend_->release_address(reinterpret_cast<void*>(r->addr), r->va_size);
    delete r;
    expandable_.erase(it++);
  }
}

}  // namespace devmem::internal
