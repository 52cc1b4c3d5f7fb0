// allocator/block_states.cc: see block_states.h.
#include "allocator/block_states.h"

#include <algorithm>
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
  if (b->retired_cache && (b->state != BlockState::kPending || b->pending_events != 1)) {
    return Violation(absl::StrFormat(
        "block %#x is marked as a retired stream's cached block but is %s with %d events",
        b->addr, BlockStateName(b->state), b->pending_events));
  }
  switch (b->state) {
    case BlockState::kAllocated: {
      auto it = allocated_.find(b->addr);
      const bool in_table = it != allocated_.end() && it->second == b;
      const bool in_map = cache_map_ != nullptr && cache_map_->find(b->addr) == b;
      if (in_table == in_map) {
        return Violation(absl::StrFormat(
            "allocated block %#x is %s", b->addr,
            in_table ? "both in the allocated table and owned by the thread caches"
                     : "missing from the allocated table"));
      }
      ++(in_table ? tally->allocated_blocks : tally->cache_owned_allocated);
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
      if (b->events_deferred) {
        if (b->pending_events != 0 || b->stream_uses.empty() ||
            std::find(deferred_.begin(), deferred_.end(), b) == deferred_.end()) {
          return Violation(absl::StrFormat(
              "pending block %#x waits for the end of a capture but is not deferred "
              "right (%d events, %u streams)",
              b->addr, b->pending_events, b->stream_uses.size()));
        }
        ++tally->deferred_blocks;
        StatRecount::add(rc->active, small, 1);
        StatRecount::add(rc->active_bytes, small, size);
        StatRecount::add(rc->pending_bytes, small, size);
        break;
      }
      if (b->pending_events <= 0) {
        return Violation(absl::StrFormat("pending block %#x waits for no event", b->addr));
      }
      tally->pending_events += b->pending_events;
      StatRecount::add(rc->active, small, 1);
      StatRecount::add(rc->active_bytes, small, size);
      StatRecount::add(rc->pending_bytes, small, size);
      break;
    case BlockState::kThreadCached:
      ++tally->thread_cached_blocks;
      if (!small || !b->stream_uses.empty()) {
        return Violation(absl::StrFormat(
            "thread-cached block %#x is in the large pool or has recorded streams",
            b->addr));
      }
      StatRecount::add(rc->thread_cached, small, 1);
      StatRecount::add(rc->thread_cached_bytes, small, size);
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

absl::Status BlockStates::validate_count(size_t allocated_blocks,
                                         size_t deferred_blocks) const {
  if (allocated_blocks != allocated_.size()) {
    return Violation(absl::StrFormat("allocated table holds %u blocks, segments hold %u",
                                     allocated_.size(), allocated_blocks));
  }
  if (deferred_blocks != deferred_.size()) {
    return Violation(absl::StrFormat(
        "%u blocks wait for the end of a capture, %u are listed as such",
        deferred_blocks, deferred_.size()));
  }
  return absl::OkStatus();
}

}  // namespace devmem::internal
