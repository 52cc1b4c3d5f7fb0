// allocator/device_pool_validate.cc: DevicePool::validate(), the invariant checker.
//
// Each part checks its own share (SegmentTable: tiling; BlockStates: each block's
// state; FreeIndex: the free sets; the segment sources: their records; EventQueues:
// the events; PoolAccounting: every statistic against the recount gathered here).
// Tests call it constantly (every few thousand random operations); it is O(blocks) and
// takes the device lock for the whole walk.
#include "absl/strings/str_format.h"
#include "allocator/device_pool.h"

namespace devmem::internal {

absl::Status DevicePool::validate() const {
  MutexLock lock(&mu_);
  // Thread caches stay out while the lock is held, their hits folded in.
  quiesce_for_read_locked();
  StatRecount rc;
  BlockTally tally;
  rc.sites.resize(acct_.site_stats().size());
  absl::Status st = segments_.validate(
      [&](const Segment* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (s->expandable() && expandable_ == nullptr) {
          return absl::InternalError(absl::StrFormat(
              "devmem validate(): segment %#x is expandable but expandable segments are "
              "off",
              s->addr));
        }
        StatRecount::add(rc.segment, s->small_pool, 1);
        StatRecount::add(rc.reserved_bytes, s->small_pool, static_cast<int64_t>(s->size));
        if (s->oversize) ++rc.oversize_segments;
        return absl::OkStatus();
      },
      [&](const Block* b) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return blocks_.validate_block(b, &rc, &tally);
      });
  if (!st.ok()) return st;
  if (st = regular_.validate(); !st.ok()) return st;
  if (st = in_flight_.validate(); !st.ok()) return st;
  if (expandable_ != nullptr) {
    if (st = expandable_->validate(); !st.ok()) return st;
  }
  size_t private_free = 0;
  for (const auto& [id, p] : privates_) private_free += p->small_free.size() + p->large_free.size();
  if (st = free_.validate_count(tally.free_blocks, private_free); !st.ok()) return st;
  if (st = blocks_.validate_count(tally.allocated_blocks, tally.deferred_blocks); !st.ok()) {
    return st;
  }
  if (st = validate_private_locked(); !st.ok()) return st;
  if (st = validate_caches_locked(tally.thread_cached_blocks, tally.cache_owned_allocated);
      !st.ok()) {
    return st;
  }
  // Every queued event belongs to a pending block of this pool, and each block has as
  // many queued events as it waits for (not only the totals agree).
  if (st = events_.validate(
          [this](uintptr_t addr) ABSL_NO_THREAD_SAFETY_ANALYSIS -> const Block* {
            return block_containing(addr);
          },
          tally.pending_events);
      !st.ok()) {
    return st;
  }
  if (st = validate_poll_work_locked(); !st.ok()) return st;
  return acct_.validate(rc);
}

absl::Status DevicePool::validate_poll_work_locked() const {
  // Each source's bit against the source itself (allocator/poll_work.h): a clear bit
  // with work queued would leave that work to the allocation path, a set one with none
  // would cost the poller the lock for nothing.
  struct Source {
    PollWork::Source bit;
    const char* name;
    bool has_work;
  };
  const Source sources[] = {
      {PollWork::kQueuedEvents, "queued cross-stream events", events_.size() != 0},
      {PollWork::kRetirements, "stream retirements under way",
       events_.retirements().retiring() != 0},
      {PollWork::kDeferredEvents, "blocks whose events wait for a capture's end",
       blocks_.has_deferred()},
      {PollWork::kDeferredRecycles, "deferred recycling decisions",
       expandable_ != nullptr && expandable_->has_deferred()},
  };
  const uint32_t bits = poll_work_.bits();
  uint32_t known = 0;
  for (const Source& src : sources) {
    known |= src.bit;
    const bool published = (bits & src.bit) != 0;
    if (published != src.has_work) {
      return absl::InternalError(absl::StrFormat(
          "devmem validate(): the poll-work flag says %s %s, but there %s (flags %#x)",
          published ? "there are" : "there are no", src.name,
          src.has_work ? "are" : "are none", bits));
    }
  }
  if ((bits & ~known) != 0) {
    return absl::InternalError(
        absl::StrFormat("devmem validate(): the poll-work flags %#x name no source", bits));
  }
  return absl::OkStatus();
}

}  // namespace devmem::internal
