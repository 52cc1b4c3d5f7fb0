// allocator/regular_segments.cc: see regular_segments.h.
#include "allocator/regular_segments.h"

#include <stdexcept>

#include "absl/strings/str_format.h"
#include "allocator/pool_policy.h"

namespace devmem::internal {

Grown RegularSegments::grow(const GrowRequest& req) {
  const size_t reserved =
      static_cast<size_t>(acct_.stats().reserved_bytes[kAggregatePool].current);
  if (req.segment_size > req.limit || reserved > req.limit - req.segment_size) return {};
  absl::StatusOr<void*> p = backend_.allocate_segment(req.segment_size);
  if (!p.ok()) {
    if (absl::IsResourceExhausted(p.status())) return {};
    // A driver failure that is not about memory: nothing was changed, say what broke.
    throw std::runtime_error(absl::StrFormat("devmem: %s: segment allocation of %u bytes "
                                             "failed: %s",
                                             backend_.device().ToString(), req.segment_size,
                                             p.status().ToString()));
  }
  auto* s = new Segment;
  s->addr = reinterpret_cast<uintptr_t>(*p);
  s->size = req.segment_size;
  s->stream = req.stream;
  s->small_pool = req.small;
  s->oversize = IsOversizeRequest(req.size, max_split_size_);
  Block* b = free_.new_block();
  b->addr = s->addr;
  b->size = req.segment_size;
  b->segment = s;
  b->stream = req.stream;
  b->state = BlockState::kFree;
  s->head = b;
  s->tail = b;
  table_.add(s);
  acct_.segment_allocated(s);
  return Grown{b, false};
}

void RegularSegments::give_back(Segment* s) {
  backend_.free_segment(reinterpret_cast<void*>(s->addr), s->size);
}

absl::Status RegularSegments::validate() const {
  // Nothing of its own yet besides the segments, which SegmentTable checks; a segment
  // with a reservation belongs to ExpandableSegments, which checks it.
  return absl::OkStatus();
}

}  // namespace devmem::internal
