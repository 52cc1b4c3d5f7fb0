// allocator/block_states.cc: see block_states.h.
#include "allocator/block_states.h"

#include <string>

#include "absl/strings/str_format.h"

namespace devmem::internal {
namespace {

absl::Status Violation(const std::string& what) {
  return absl::InternalError("devmem validate(): " + what);
}

}  // namespace

absl::Status BlockStates::validate_block(const Block* b, StatRecount* rc,
                                         BlockTally* tally) const {
  const Segment* s = b->segment;
  const bool small = s->small_pool;
  const int64_t size = static_cast<int64_t>(b->size);
  switch (b->state) {
    case BlockState::kAllocated: {
      ++tally->allocated_blocks;
      auto it = allocated_.find(b->addr);
      if (it == allocated_.end() || it->second != b) {
        return Violation(absl::StrFormat(
            "allocated block %#x is missing from the allocated table", b->addr));
      }
      if (b->requested == 0 || b->requested > b->size) {
        return Violation(absl::StrFormat("allocated block %#x: requested %u of %u",
                                         b->addr, b->requested, b->size));
      }
      StatRecount::add(rc->allocation, small, 1);
      StatRecount::add(rc->allocated_bytes, small, size);
      StatRecount::add(rc->requested_bytes, small, static_cast<int64_t>(b->requested));
      StatRecount::add(rc->active, small, 1);
      StatRecount::add(rc->active_bytes, small, size);
      if (s->oversize) ++rc->oversize_allocations;
      if (b->site >= rc->sites.size()) {
        return Violation(absl::StrFormat("block %#x has site %u with no stats", b->addr,
                                         b->site));
      }
      rc->sites[b->site].live_bytes += size;
      rc->sites[b->site].live_count += 1;
      break;
    }
    case BlockState::kPending:
      if (b->pending_events <= 0) {
        return Violation(absl::StrFormat("pending block %#x waits for no event", b->addr));
      }
      tally->pending_events += b->pending_events;
      StatRecount::add(rc->active, small, 1);
      StatRecount::add(rc->active_bytes, small, size);
      StatRecount::add(rc->pending_bytes, small, size);
      break;
    case BlockState::kFree: {
      ++tally->free_blocks;
      if (b->prev != nullptr && b->prev->state == BlockState::kFree) {
        return Violation(absl::StrFormat(
            "free blocks %#x and %#x are adjacent but not coalesced", b->prev->addr,
            b->addr));
      }
      if (absl::Status st = free_.validate_free_block(b); !st.ok()) return st;
      StatRecount::add(rc->free_bytes, small, size);
      if (b->is_split()) {
        StatRecount::add(rc->inactive_split, small, 1);
        StatRecount::add(rc->inactive_split_bytes, small, size);
      }
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status BlockStates::validate_count(size_t allocated_blocks) const {
  if (allocated_blocks != allocated_.size()) {
    return Violation(absl::StrFormat("allocated table holds %u blocks, segments hold %u",
                                     allocated_.size(), allocated_blocks));
  }
  return absl::OkStatus();
}

}  // namespace devmem::internal
