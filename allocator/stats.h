// allocator/stats.h: allocator statistics in the vocabulary PyTorch users know.
//
// Every Stat is {current, peak, allocated (total increases), freed (total decreases)};
// current == allocated - freed always. Each comes as a StatArray indexed by
// StatPool: the aggregate, the small pool and the large pool.
//
// Meanings (bytes; the *_count arrays count blocks or segments the same way):
//   allocated       blocks handed to the user and not yet freed
//   active          allocated + pending (freed by the user, waiting for other streams)
//   inactive_split  free blocks that are part of a split segment (fragmentation)
//   requested       bytes the user asked for (before 512 B rounding) of allocated blocks
//   reserved        segment bytes held from the driver
//   thread_cached   free blocks held in per-thread caches (allocator/thread_cache.h);
//                   not allocated, not active
//   cached          reserved - active: free blocks, ready to be handed out again
//                   (those in the free sets and those in thread caches)
// Invariant (checked by CachingAllocator::validate()):
//   reserved == allocated + pending + free-set bytes + thread_cached, every value
//   equals a recount.
// With thread caches, cache hits are counted per thread and folded in when stats are
// read (CachingAllocator::stats() quiesces the caches), so every current value and
// total is exact whenever no allocation or free runs concurrently; a peak is exact
// for one thread, and with several may be off by what the others' caches served
// between two folds (docs/architecture.md, "Thread caches").
#pragma once

#include <array>
#include <initializer_list>
#include <cstdint>
#include <string>

#include "allocator/driver_calls.h"

namespace devmem {

struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  // total of all increases
  int64_t freed = 0;      // total of all decreases

  void increase(int64_t amount) {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void decrease(int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void reset_peak() { peak = current; }
  void reset_accumulated() { allocated = current; freed = 0; }
  friend bool operator==(const Stat&, const Stat&) = default;
};

enum StatPool : int { kAggregatePool = 0, kSmallPool = 1, kLargePool = 2 };
inline constexpr int kNumStatPools = 3;
using StatArray = std::array<Stat, kNumStatPools>;

// Adds `n` (may be negative via DecreaseStat) to the aggregate and to the small or
// large pool's entry: every change to a per-pool statistic goes to both.
inline void IncreaseStat(StatArray& a, bool small_pool, int64_t n) {
  a[kAggregatePool].increase(n);
  a[small_pool ? kSmallPool : kLargePool].increase(n);
}
inline void DecreaseStat(StatArray& a, bool small_pool, int64_t n) {
  a[kAggregatePool].decrease(n);
  a[small_pool ? kSmallPool : kLargePool].decrease(n);
}

struct DeviceStats {
  // counts
  StatArray allocation;           // allocated blocks
  StatArray segment;              // segments held
  StatArray active;               // allocated + pending blocks
  StatArray inactive_split;       // free blocks inside split segments
  // bytes
  StatArray allocated_bytes;
  StatArray reserved_bytes;
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;
  StatArray pending_bytes;        // freed by the user, waiting for events
  StatArray thread_cached;        // blocks in thread caches (small pool only)
  StatArray thread_cached_bytes;
  // blocks and segments of oversize segments (made for requests >= max_split_size)
  Stat oversize_allocations;
  Stat oversize_segments;
  // events
  int64_t num_alloc_retries = 0;  // times every cache was flushed to retry a segment alloc
  int64_t num_ooms = 0;           // OutOfMemoryError thrown
  int64_t num_device_alloc = 0;   // segment allocations (cudaMalloc / map)
  int64_t num_device_free = 0;    // segment frees (cudaFree / unmap)
  int64_t num_sync_all_streams = 0;
  int64_t cache_hits = 0;         // allocations served from cached blocks
  int64_t cache_misses = 0;       // allocations that needed a new segment
  int64_t num_frees = 0;          // user frees
  int64_t max_split_size = 0;     // the configured limit (INT64_MAX when none)
  // The shared free sets (free cached blocks, ready for reuse; private pools' free
  // blocks, which serve only their pool, are not in them), per pool and in aggregate:
  // their bytes (cached_bytes(pool) less those private free blocks), how many blocks,
  // and the largest block
  // (in aggregate: the larger pool's). Current values only, kept incrementally
  // (allocator/free_index.h), so reading them costs no walk over the blocks. Not in the
  // JSON forms (docs/formats.md): a snapshot's segments hold them.
  std::array<int64_t, kNumStatPools> free_bytes{};
  std::array<int64_t, kNumStatPools> free_blocks{};
  std::array<int64_t, kNumStatPools> largest_free_block{};
  // Private pools (graph capture, allocator/pool_id.h): how many exist (live or
  // released and still giving memory back), the bytes of their segments and of their
  // allocated blocks. Part of reserved_bytes and allocated_bytes above (memory of the
  // device like any other), broken out because no other work can use it. Current
  // values, counted when read (a walk over the private pools' segments only).
  int64_t private_pools = 0;
  int64_t private_reserved_bytes = 0;
  int64_t private_allocated_bytes = 0;
  // The backend's driver calls by kind, the time in them, and its physical-handle
  // reserve (allocator/driver_calls.h). Since the backend was made: neither
  // reset_peak_stats() nor reset_accumulated_stats() changes them.
  DriverCallStats driver;

  // reserved - active, for the aggregate or one pool.
  int64_t cached_bytes(StatPool pool = kAggregatePool) const {
    return reserved_bytes[pool].current - active_bytes[pool].current;
  }
  // A readable multi-line table (the shape of torch.cuda.memory_summary()).
  std::string ToString() const;
};

// Calls fn(Stat&) on every Stat of `stats` (each pool of each StatArray, and the
// oversize Stats), for operations that treat them all alike (resets).
template <typename Fn>
void ForEachStat(DeviceStats& stats, Fn&& fn) {
  for (StatArray* a : {&stats.allocation, &stats.segment, &stats.active,
                       &stats.inactive_split, &stats.allocated_bytes, &stats.reserved_bytes,
                       &stats.active_bytes, &stats.inactive_split_bytes,
                       &stats.requested_bytes, &stats.pending_bytes,
                       &stats.thread_cached, &stats.thread_cached_bytes}) {
    for (Stat& s : *a) fn(s);
  }
  fn(stats.oversize_allocations);
  fn(stats.oversize_segments);
}

// Per call site (see allocator/site.h), kept by each allocator.
struct SiteStats {
  int64_t live_bytes = 0;   // bytes of blocks from this site that are allocated now
  int64_t live_count = 0;
  int64_t peak_live_bytes = 0;
  int64_t total_bytes = 0;  // bytes ever allocated from this site
  int64_t total_count = 0;
  friend bool operator==(const SiteStats&, const SiteStats&) = default;
};

// What CachingAllocator::process_events() calls cost (CachingAllocator::poll_stats):
// how many there were and how many took the device lock; the others found nothing
// queued without it (allocator/poll_work.h). Counted with relaxed increments, not on
// the allocation path; for tests (DevicePoolPollTest, RuntimePollerTest).
struct PollStats {
  uint64_t calls = 0;   // process_events() calls that were not refused
  uint64_t locked = 0;  // of them, those that took the device lock (work was queued)
};

}  // namespace devmem
