// allocator/regular_segments.cc: see regular_segments.h.
#include "allocator/regular_segments.h"

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "absl/strings/str_format.h"
#include "allocator/pool_policy.h"
#include "allocator/private_pools.h"

namespace devmem::internal {

Grown RegularSegments::grow(const GrowRequest& req) {
  const size_t reserved =
      static_cast<size_t>(acct_.stats().reserved_bytes[kAggregatePool].current) +
      in_flight_.bytes();
  if (req.segment_size > req.limit || reserved > req.limit - req.segment_size) return {};
  // What may throw comes before the driver call, so that a segment is never lost.
  auto seg = std::make_unique<Segment>();
  Block* b = free_.new_block();
  // The intent: its bytes count against the memory limit while the lock is released,
  // so two threads cannot both overshoot it. The pool is consistent here (the segment
  // is nowhere yet), so other threads may allocate, free and validate meanwhile.
  in_flight_.begin_grow(req.segment_size);
  absl::StatusOr<void*> p;
  {
    ScopedUnlock unlocked(req.lock);
    p = req.during_capture ? backend_.allocate_segment_during_capture(req.segment_size)
                           : backend_.allocate_segment(req.segment_size);
  }
  in_flight_.end_grow(req.segment_size);
  if (!p.ok()) {
    free_.delete_block(b);
    if (absl::IsResourceExhausted(p.status())) return {};
    // A driver failure that is not about memory: nothing was changed, say what broke.
    throw std::runtime_error(absl::StrFormat("devmem: %s: segment allocation of %u bytes "
                                             "failed: %s",
                                             backend_.device().ToString(), req.segment_size,
                                             p.status().ToString()));
  }
  if (req.private_pool != nullptr) {
    try {
      req.private_pool->segments.push_back(seg.get());
    } catch (...) {
      free_.delete_block(b);
      // Never used, so no stream to wait for. (During a capture the driver may refuse
      // the free; the backend reports that on stderr and the bytes stay lost.)
      backend_.free_segment(*p, req.segment_size);
      throw;
    }
  }
  Segment* s = seg.release();
  s->private_pool = req.private_pool;
  s->addr = reinterpret_cast<uintptr_t>(*p);
  s->size = req.segment_size;
  s->stream = req.stream;
  s->small_pool = req.small;
  s->oversize = IsOversizeRequest(req.size, max_split_size_);
  b->addr = s->addr;
  b->size = req.segment_size;
  b->segment = s;
  b->stream = req.stream;
  b->state = BlockState::kFree;
  s->head = b;
  s->tail = b;
  b->free_seq = 0;  // never used
  table_.add(s);
  acct_.segment_allocated(s);
  return Grown{b, false};
}

void RegularSegments::give_back_call(uintptr_t addr, size_t size) {
  backend_.free_segment(reinterpret_cast<void*>(addr), size);
}

void RegularSegments::detached(Segment* s) {
  if (s->private_pool == nullptr) return;
  std::vector<Segment*>& list = s->private_pool->segments;
  if (auto it = std::find(list.begin(), list.end(), s); it != list.end()) list.erase(it);
}

void RegularSegments::restored(Segment* s) {
  if (s->private_pool == nullptr) return;
  s->private_pool->segments.push_back(s);  // within capacity (regular_segments.h)
}

}  // namespace devmem::internal
