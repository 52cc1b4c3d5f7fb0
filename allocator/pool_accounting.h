// allocator/pool_accounting.h: a DevicePool's statistics, per-site counters and trace
// emission, changed together by one method per block or segment state change
// (internal).
//
// Every change of a block's state (allocated, freed by the user, pending, free again,
// entering or leaving a free set) and of a segment's (allocated, freed, mapped,
// unmapped, a run added or removed) is reported here by the part of DevicePool that
// makes it, through the method named for it; that method updates DeviceStats, the
// site's counters and the observer's trace together, so they cannot drift apart. No
// other code writes a statistic.
//
// Owns: the DeviceStats, the SiteStats table, the observer pointer (not the observer).
// Invariants (validate): every statistic's current value equals the recount the caller
// made from the blocks, current == allocated - freed and peak >= current; per-site live
// bytes and counts equal theirs.
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "allocator/block.h"
#include "allocator/cache_counters.h"
#include "allocator/observer.h"
#include "allocator/oom_report.h"
#include "allocator/stats.h"

namespace devmem::internal {

// What validate() compares the statistics against: a recount from the blocks.
struct StatRecount {
  using PerPool = std::array<int64_t, kNumStatPools>;
  PerPool allocation{}, allocated_bytes{}, requested_bytes{}, active{}, active_bytes{},
      pending_bytes{}, segment{}, reserved_bytes{}, inactive_split{},
      inactive_split_bytes{}, free_bytes{}, thread_cached{}, thread_cached_bytes{};
  int64_t oversize_allocations = 0, oversize_segments = 0;
  std::vector<SiteStats> sites;  // live_bytes and live_count only

  static void add(PerPool& a, bool small, int64_t n) {
    a[kAggregatePool] += n;
    a[small ? kSmallPool : kLargePool] += n;
  }
};

class PoolAccounting {
 public:
  PoolAccounting(DeviceId device, size_t max_split_size);
  PoolAccounting(const PoolAccounting&) = delete;
  PoolAccounting& operator=(const PoolAccounting&) = delete;

  // --- before a change: what may need host memory ------------------------------------
  // Makes room for `site`'s counters (may throw std::bad_alloc; changes nothing else).
  void reserve_site(SiteId site) {
    if (site >= site_stats_.size()) site_stats_.resize(site + 1);
  }

  // --- block state changes ---------------------------------------------------------
  // A free block was handed to the user for `requested` bytes from `site` (b->site,
  // b->requested are set).
  void block_allocated(const Block* b) {
    const bool small = b->segment->small_pool;
    const auto size = static_cast<int64_t>(b->size);
    IncreaseStat(stats_.allocation, small, 1);
    IncreaseStat(stats_.allocated_bytes, small, size);
    IncreaseStat(stats_.requested_bytes, small, static_cast<int64_t>(b->requested));
    IncreaseStat(stats_.active, small, 1);
    IncreaseStat(stats_.active_bytes, small, size);
    if (b->segment->oversize) stats_.oversize_allocations.increase(1);
    SiteStats& ss = site_stats_[b->site];
    ss.live_bytes += size;
    ss.live_count += 1;
    ss.total_bytes += size;
    ss.total_count += 1;
    ss.peak_live_bytes = std::max(ss.peak_live_bytes, ss.live_bytes);
    emit(AllocAction::kAlloc, b, b->size, b->requested);
  }
  // The user freed an allocated block (it becomes free or pending next; still active).
  void block_freed_by_user(const Block* b) {
    const bool small = b->segment->small_pool;
    DecreaseStat(stats_.allocation, small, 1);
    DecreaseStat(stats_.allocated_bytes, small, static_cast<int64_t>(b->size));
    DecreaseStat(stats_.requested_bytes, small, static_cast<int64_t>(b->requested));
    if (b->segment->oversize) stats_.oversize_allocations.decrease(1);
    ++stats_.num_frees;
    SiteStats& ss = site_stats_[b->site];
    ss.live_bytes -= static_cast<int64_t>(b->size);
    ss.live_count -= 1;
    emit(AllocAction::kFree, b, b->size, b->requested);
  }
  // A user-freed block waits for events on other streams.
  void block_pending(const Block* b) {
    IncreaseStat(stats_.pending_bytes, b->segment->small_pool, static_cast<int64_t>(b->size));
  }
  // A pending block's last event completed (it becomes free next).
  void block_free_completed(const Block* b) {
    DecreaseStat(stats_.pending_bytes, b->segment->small_pool, static_cast<int64_t>(b->size));
    emit(AllocAction::kFreeCompleted, b, b->size, 0);
  }
  // A free block (out of its set) of a stream being retired waits for the retirement's
  // event (release_stream): active and pending again, not traced (no user call).
  void block_retiring(const Block* b) {
    IncreaseStat(stats_.active, b->segment->small_pool, 1);
    IncreaseStat(stats_.active_bytes, b->segment->small_pool, static_cast<int64_t>(b->size));
    IncreaseStat(stats_.pending_bytes, b->segment->small_pool, static_cast<int64_t>(b->size));
  }
  // Such a block's retirement completed (it becomes free next, untraced).
  void block_retire_completed(const Block* b) {
    DecreaseStat(stats_.pending_bytes, b->segment->small_pool, static_cast<int64_t>(b->size));
  }
  // A user-freed or completed block stops being active (before it coalesces).
  void block_inactive(const Block* b) {
    DecreaseStat(stats_.active, b->segment->small_pool, 1);
    DecreaseStat(stats_.active_bytes, b->segment->small_pool, static_cast<int64_t>(b->size));
  }
  // A free block entered / left its free set (inactive_split counts split ones).
  void free_block_listed(const Block* b) {
    if (!b->is_split()) return;
    IncreaseStat(stats_.inactive_split, b->segment->small_pool, 1);
    IncreaseStat(stats_.inactive_split_bytes, b->segment->small_pool,
                 static_cast<int64_t>(b->size));
  }
  void free_block_unlisted(const Block* b) {
    if (!b->is_split()) return;
    DecreaseStat(stats_.inactive_split, b->segment->small_pool, 1);
    DecreaseStat(stats_.inactive_split_bytes, b->segment->small_pool,
                 static_cast<int64_t>(b->size));
  }

  // --- thread caches (allocator/thread_cache.h) ---------------------------------------
  // A free block (out of its free set) or a user-freed block (after block_freed_by_user
  // and block_inactive) entered a thread cache's bin.
  void block_to_thread_cache(const Block* b) {
    IncreaseStat(stats_.thread_cached, b->segment->small_pool, 1);
    IncreaseStat(stats_.thread_cached_bytes, b->segment->small_pool,
                 static_cast<int64_t>(b->size));
  }
  // A block left a thread cache's bin for the free sets.
  void block_from_thread_cache(const Block* b) {
    DecreaseStat(stats_.thread_cached, b->segment->small_pool, 1);
    DecreaseStat(stats_.thread_cached_bytes, b->segment->small_pool,
                 static_cast<int64_t>(b->size));
  }
  // Adds a thread cache's window of hits (cache_counters.h): allocations from its bins
  // are allocations (allocated, active, requested, site live and total counts) and
  // leave thread_cached; frees into them the reverse. The sites' counters exist
  // (reserve_site of the largest dirty site).
  void fold_thread_cache(const CacheCounters& c);

  // --- segment state changes -------------------------------------------------------
  // A regular segment was allocated from the backend.
  void segment_allocated(const Segment* s);
  // A segment (regular, or a whole expandable run) goes back to the backend. In two
  // steps: the observer hears of it first (the trace orders the release where it
  // starts, before the stream is waited for), then the statistics change. Both come
  // before the driver calls, which run with the device lock released
  // (driver_in_flight.h): the statistics describe what the pool holds, and a driver
  // error (allocator/errors.h) puts the segment back with segment_release_undone.
  void segment_releasing(const Segment* s);
  void segment_released(const Segment* s);
  void segment_release_undone(const Segment* s);
  // [at, at + bytes) of reservation `r` was mapped / is being unmapped (the same two
  // steps, both before the unmap; unmap_undone when the unmap threw).
  void mapped(const Reservation* r, uintptr_t at, size_t bytes);
  void unmapping(const Segment* s, uintptr_t at, size_t bytes);
  void unmapped(const Segment* s, size_t bytes);
  void unmap_undone(bool small, size_t bytes);
  // An expandable run was created (a map in a gap, a split by an unmap) or removed
  // (merged into its neighbour, unmapped whole).
  void run_added(bool small) { IncreaseStat(stats_.segment, small, 1); }
  void run_removed(bool small) { DecreaseStat(stats_.segment, small, 1); }

  // --- events of the allocation path -----------------------------------------------
  void count_cache_hit() { ++stats_.cache_hits; }
  void count_cache_miss() { ++stats_.cache_misses; }
  void count_alloc_retry() { ++stats_.num_alloc_retries; }
  void count_sync_all_streams() { ++stats_.num_sync_all_streams; }
  // An allocation failed: counts it and emits the kOom event.
  void out_of_memory(Stream stream, size_t size, size_t requested, SiteId site);

  // --- introspection ---------------------------------------------------------------
  const DeviceStats& stats() const { return stats_; }
  const std::vector<SiteStats>& site_stats() const { return site_stats_; }
  std::vector<SiteUsage> top_sites(size_t k) const;
  // Live bytes of sites whose kind is an explicit copy (for the OOM report).
  size_t copy_bytes() const;
  void reset_peak();
  void reset_accumulated();
  // The pool's order word (AllocEvent::pool_order) is at least `order` from now on: a
  // block a thread cache gives back (its last event was traced without the lock).
  void order_after(uint64_t order) { trace_order_ = std::max(trace_order_, order); }
  AllocatorObserver* observer() const { return observer_; }
  void set_observer(AllocatorObserver* observer) { observer_ = observer; }

  // This part's share of validate(): the statistics against `rc`.
  absl::Status validate(const StatRecount& rc) const;

 private:
  void emit(AllocAction action, const Block* b, size_t size, size_t requested) {
    if (observer_ == nullptr) return;
    observer_->on_event(AllocEvent{action, device_, b->stream, b->addr, size, requested,
                                   b->site, &b->trace_order, &trace_order_});
  }

  const DeviceId device_;
  DeviceStats stats_;
  std::vector<SiteStats> site_stats_;
  AllocatorObserver* observer_ = nullptr;
  // AllocEvent::pool_order of every event emitted here (all under the device lock).
  uint64_t trace_order_ = 0;
};

}  // namespace devmem::internal
