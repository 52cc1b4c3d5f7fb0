// allocator/reclaimer.cc: see reclaimer.h.
#include "allocator/reclaimer.h"

#include <algorithm>
#include <vector>

namespace devmem::internal {

size_t Reclaimer::reclaim(size_t bytes, Urgency urgency) {
  // Decisions waiting for their events first (they change the segments): under
  // pressure (stage 2 of the retry, empty_cache) waited for, otherwise only those
  // already complete.
  const bool wait = urgency == Urgency::kRetryWaitAll || urgency == Urgency::kEmptyCache;
  size_t released = regular_.complete_deferred(wait);
  if (expandable_ != nullptr) released += expandable_->complete_deferred(wait);

  std::vector<Segment*> unused = table_.unused();  // address order, for stable ties
  if (urgency == Urgency::kGarbageCollect) {
    // Oldest first: the segments the program has gone longest without needing.
    std::stable_sort(unused.begin(), unused.end(), [](const Segment* a, const Segment* b) {
      return a->last_used < b->last_used;
    });
  } else {
    // Largest first: the fewest driver calls for the bytes.
    std::stable_sort(unused.begin(), unused.end(),
                     [](const Segment* a, const Segment* b) { return a->size > b->size; });
  }
  for (Segment* s : unused) {
    if (released >= bytes) break;
    released += s->size;
    source_of(s).release(s);
  }
  if (released < bytes && expandable_ != nullptr) {
    released += expandable_->recycle(bytes - released);
  }
  if (urgency == Urgency::kEmptyCache) {
    regular_.release_address_space();
    if (expandable_ != nullptr) expandable_->release_address_space();
  }
  // What was unmapped (now or by earlier deferred recycling) is still device memory
  // in the backend's handle reserve until released: giving memory back means that
  // too. Not added to `released`: those bytes left reserved_bytes when unmapped.
  if (expandable_ != nullptr) expandable_->release_handle_reserve();
  return released;
}

}  // namespace devmem::internal
