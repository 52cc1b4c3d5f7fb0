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
  size_t released = regular_.complete_deferred(wait, lock_);
  if (expandable_ != nullptr) released += expandable_->complete_deferred(wait, lock_);

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
  // The choice first, and every chosen segment out of the books, under the lock; then
  // each source's segments go back in one batch (one release of the lock per source).
  std::vector<Segment*> regular;
  std::vector<Segment*> expandable;
  for (Segment* s : unused) {
    if (released >= bytes) break;
    released += s->size;
    (s->expandable() ? expandable : regular).push_back(s);
  }
  // Room for both detaches before either (a bad_alloc in the second would strand the
  // first batch out of the books).
  regular_.reserve_detached(regular.size());
  if (expandable_ != nullptr) expandable_->reserve_detached(expandable.size());
  const DriverInFlight::Ticket regular_ticket = regular_.detach_for_release(regular);
  const DriverInFlight::Ticket expandable_ticket =
      expandable_ != nullptr ? expandable_->detach_for_release(expandable) : 0;
  try {
    regular_.give_back_detached(regular, regular_ticket, lock_);
  } catch (...) {
    // A DriverError: the device is broken, the expandable ones go back to the books.
    if (expandable_ != nullptr) {
      expandable_->give_back_detached(expandable, expandable_ticket, lock_, false);
    }
    throw;
  }
  if (expandable_ != nullptr) {
    expandable_->give_back_detached(expandable, expandable_ticket, lock_);
  }
  if (released < bytes && expandable_ != nullptr) {
    released += expandable_->recycle(bytes - released, lock_);
  }
  if (urgency == Urgency::kEmptyCache) {
    regular_.release_address_space(lock_);
    if (expandable_ != nullptr) expandable_->release_address_space(lock_);
  }
  // What was unmapped (now or by earlier deferred recycling) is still device memory
  // in the backend's handle reserve until released: giving memory back means that
  // too. Not added to `released`: those bytes left reserved_bytes when unmapped.
  if (expandable_ != nullptr) expandable_->release_handle_reserve(lock_);
  return released;
}

}  // namespace devmem::internal
