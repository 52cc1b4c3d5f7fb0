// allocator/device_pool_validate.cc: DevicePool::validate(), the invariant checker.
//
// Recounts every statistic from the data structures and checks the invariants of
// docs/architecture.md. Tests call it constantly (every few thousand random
// operations); it is O(blocks) and takes the device lock for the whole walk.
#include <array>
#include <cinttypes>
#include <iterator>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "allocator/device_pool.h"

namespace devmem::internal {
namespace {

absl::Status Violation(const std::string& what) {
  return absl::InternalError("devmem validate(): " + what);
}

}  // namespace

absl::Status DevicePool::validate() const {
  MutexLock lock(&mu_);
  // Thread caches stay out while the lock is held, their hits folded in.
  quiesce_for_read_locked();
  StatRecount rc;
  size_t free_blocks = 0;
  size_t allocated_blocks = 0;        // in allocated_
  size_t cache_owned_allocated = 0;   // handed out by a thread cache
  size_t thread_cached_blocks = 0;
  int64_t pending_events = 0;
  std::vector<SiteStats>& site_recount = rc.sites;
  site_recount.resize(acct_.site_stats().size());
  uintptr_t previous_end = 0;
  // Per reservation: its runs and the bytes they map, recounted.
  absl::flat_hash_map<const Reservation*, std::pair<int, size_t>> runs;
  for (const auto& [base, s] : segments_) {
    if (base != s->addr) return Violation("segment table key differs from its address");
    if (s->addr < previous_end) {
      return Violation(absl::StrFormat("segment %#x overlaps the segment before it",
                                       s->addr));
    }
    previous_end = s->addr + s->size;
    const bool small = s->small_pool;
    StatRecount::add(rc.segment, small, 1);
    StatRecount::add(rc.reserved_bytes, small, static_cast<int64_t>(s->size));
    if (s->oversize) ++rc.oversize_segments;
    if (s->expandable()) {
      const Reservation* r = s->reservation;
      auto it = expandable_.find(std::make_pair(r->stream.handle, r->small_pool));
      if (it == expandable_.end() || it->second != r) {
        return Violation(absl::StrFormat(
            "expandable segment %#x belongs to a reservation not in the table", s->addr));
      }
      if (s->stream != r->stream || s->small_pool != r->small_pool) {
        return Violation(absl::StrFormat(
            "expandable segment %#x: stream or pool differs from its reservation", s->addr));
      }
      if (s->addr < r->addr || s->size > r->va_size || s->addr - r->addr > r->va_size - s->size) {
        return Violation(absl::StrFormat(
            "expandable segment %#x (%u bytes) lies outside its reservation %#x (%u bytes)",
            s->addr, s->size, r->addr, r->va_size));
      }
      if (s->size == 0 || granularity_ == 0 || s->addr % granularity_ != 0 ||
          s->size % granularity_ != 0) {
        return Violation(absl::StrFormat(
            "expandable segment %#x maps %u bytes, not whole granules of %u", s->addr,
            s->size, granularity_));
      }
      if (const auto next = std::next(segments_.find(base));
          next != segments_.end() && next->second->reservation == r &&
          next->first == s->addr + s->size) {
        return Violation(absl::StrFormat(
            "expandable segments %#x and %#x are adjacent but not merged", s->addr,
            next->first));
      }
      runs[r].first += 1;
      runs[r].second += s->size;
    }
    if (s->head == nullptr || s->head->prev != nullptr) {
      return Violation(absl::StrFormat("segment %#x: bad head block", s->addr));
    }
    uintptr_t expect = s->addr;
    int busy = 0;
    const Block* prev = nullptr;
    for (const Block* b = s->head; b != nullptr; prev = b, b = b->next) {
      if (b->addr != expect || b->size == 0 || b->prev != prev || b->segment != s) {
        return Violation(absl::StrFormat(
            "segment %#x: blocks do not tile it (block %#x size %u, expected address "
            "%#x)",
            s->addr, b->addr, b->size, expect));
      }
      if (b->addr % kMinBlockSize != 0 || b->size % kMinBlockSize != 0) {
        return Violation(absl::StrFormat("block %#x size %u is not %u-byte aligned",
                                         b->addr, b->size, kMinBlockSize));
      }
      if (b->stream != s->stream) {
        return Violation(absl::StrFormat("block %#x is on another stream than its segment",
                                         b->addr));
      }
      expect += b->size;
      const int64_t size = static_cast<int64_t>(b->size);
      switch (b->state) {
        case BlockState::kAllocated: {
          ++busy;
          auto it = allocated_.find(b->addr);
          const bool in_table = it != allocated_.end() && it->second == b;
          const bool in_map = block_map_.find(b->addr) == b;
          if (in_table == in_map) {
            return Violation(absl::StrFormat(
                "allocated block %#x is %s", b->addr,
                in_table ? "both in the allocated table and owned by the thread caches"
                         : "missing from the allocated table"));
          }
          ++(in_table ? allocated_blocks : cache_owned_allocated);
          if (b->requested == 0 || b->requested > b->size) {
            return Violation(absl::StrFormat("allocated block %#x: requested %u of %u",
                                             b->addr, b->requested, b->size));
          }
          StatRecount::add(rc.allocation, small, 1);
          StatRecount::add(rc.allocated_bytes, small, size);
          StatRecount::add(rc.requested_bytes, small, static_cast<int64_t>(b->requested));
          StatRecount::add(rc.active, small, 1);
          StatRecount::add(rc.active_bytes, small, size);
          if (s->oversize) ++rc.oversize_allocations;
          if (b->site >= site_recount.size()) {
            return Violation(absl::StrFormat("block %#x has site %u with no stats",
                                             b->addr, b->site));
          }
          site_recount[b->site].live_bytes += size;
          site_recount[b->site].live_count += 1;
          break;
        }
        case BlockState::kPending:
          ++busy;
          if (b->pending_events <= 0) {
            return Violation(absl::StrFormat("pending block %#x waits for no event",
                                             b->addr));
          }
          pending_events += b->pending_events;
          StatRecount::add(rc.active, small, 1);
          StatRecount::add(rc.active_bytes, small, size);
          StatRecount::add(rc.pending_bytes, small, size);
          break;
        case BlockState::kThreadCached:
          ++busy;
          ++thread_cached_blocks;
          if (!small || !b->stream_uses.empty()) {
            return Violation(absl::StrFormat(
                "thread-cached block %#x is in the large pool or has recorded streams",
                b->addr));
          }
          StatRecount::add(rc.thread_cached, small, 1);
          StatRecount::add(rc.thread_cached_bytes, small, size);
          break;
        case BlockState::kFree: {
          ++free_blocks;
          if (prev != nullptr && prev->state == BlockState::kFree) {
            return Violation(absl::StrFormat(
                "free blocks %#x and %#x are adjacent but not coalesced", prev->addr,
                b->addr));
          }
          if (absl::Status st = free_.validate_free_block(b); !st.ok()) return st;
          StatRecount::add(rc.free_bytes, small, size);
          if (b->is_split()) {
            StatRecount::add(rc.inactive_split, small, 1);
            StatRecount::add(rc.inactive_split_bytes, small, size);
          }
          break;
        }
      }
    }
    if (prev != s->tail) {
      return Violation(absl::StrFormat("segment %#x: tail pointer is not its last block",
                                       s->addr));
    }
    if (expect != s->addr + s->size) {
      return Violation(absl::StrFormat(
          "segment %#x of %u bytes: its blocks end at %#x, not at its end", s->addr,
          s->size, expect));
    }
    if (busy != s->busy_blocks) {
      return Violation(absl::StrFormat("segment %#x: busy count %d, recount %d", s->addr,
                                       s->busy_blocks, busy));
    }
    if (busy == 0 && s->head->next != nullptr) {
      return Violation(absl::StrFormat("unused segment %#x is not one free block",
                                       s->addr));
    }
  }
  for (const auto& [key, r] : expandable_) {
    const auto [count, mapped] = runs[r];
    if (count != r->runs || mapped != r->mapped) {
      return Violation(absl::StrFormat(
          "reservation %#x records %d runs mapping %u bytes; its segments are %d mapping %u",
          r->addr, r->runs, r->mapped, count, mapped));
    }
  }
  if (absl::Status st = free_.validate_count(free_blocks); !st.ok()) return st;
  if (absl::Status st = validate_caches_locked(thread_cached_blocks, cache_owned_allocated);
      !st.ok()) {
    return st;
  }
  if (allocated_blocks != allocated_.size()) {
    return Violation(absl::StrFormat("allocated table holds %u blocks, segments hold %u",
                                     allocated_.size(), allocated_blocks));
  }
  // Every queued event belongs to a pending block of this pool, and each block has as
  // many queued events as it waits for (not only the totals agree).
  if (absl::Status st = events_.validate(
          [this](uintptr_t addr) ABSL_NO_THREAD_SAFETY_ANALYSIS -> const Block* {
            return block_containing(addr);
          },
          pending_events);
      !st.ok()) {
    return st;
  }
  return acct_.validate(rc);
}

}  // namespace devmem::internal
