// allocator/reclaimer.cc: see reclaimer.h.
#include "allocator/reclaimer.h"

#include <algorithm>
#include <vector>

namespace devmem::internal {

size_t Reclaimer::reclaim(size_t bytes, Urgency urgency) {
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
  size_t released = 0;
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
  return released;
}

}  // namespace devmem::internal
