// allocator/cache_counters.h: what a thread cache counts between two folds into its
// pool's statistics (internal; allocator/thread_cache.h, pool_accounting.h).
//
// A cache hit (allocation from a thread cache, or a free into one) takes no lock, so it
// cannot change DeviceStats; it counts here instead, in fields only the owning thread
// writes. PoolAccounting::fold_thread_cache adds a window of counts to the statistics
// with the device lock held and the cache quiesced (thread_cache.h), after which the
// window starts again from zero. `hi`/`lo` are the highest and lowest running totals
// within the window, so that a fold can move each Stat's peak exactly as if every hit
// had been applied at once: exact for one thread; with several, each thread's window is
// applied on top of the others' folded totals (docs/architecture.md, "Thread caches").
//
// Thread-safety: none; the owner writes during an operation, the pool reads and resets
// while the cache is quiesced.
#pragma once

#include <cstddef>
#include <cstdint>

#include "allocator/cache_line.h"
#include "allocator/site.h"

namespace devmem::internal {

// A running total within a window: up (added), down (taken), and its extremes.
struct WindowCounter {
  int64_t up = 0;
  int64_t down = 0;
  int64_t hi = 0;  // max of up - down within the window (>= 0)
  int64_t lo = 0;  // min of up - down within the window (<= 0)
  void add(int64_t n) {
    up += n;
    if (up - down > hi) hi = up - down;
  }
  void sub(int64_t n) {
    down += n;
    if (up - down < lo) lo = up - down;
  }
  // sub() for a counter whose negation no stat follows, so whose `lo` is never read
  // (requested: pool_accounting.cc applies it with sign +1 only); it stays 0.
  void sub_untracked(int64_t n) { down += n; }
  bool empty() const { return up == 0 && down == 0; }
};

// One site's share of a window. live_bytes and live_count are not neighbours: a free
// takes from both, and adjacent, GCC's SLP vectorizer made those two subtractions six
// vector instructions (two loads, two arithmetic, a shuffle, a store) instead of two.
struct SiteWindow {
  int64_t live_bytes = 0;  // allocated minus freed, bytes
  int64_t hi_bytes = 0;    // max of live_bytes within the window
  int64_t live_count = 0;
  int64_t total_bytes = 0;  // allocated
  int64_t total_count = 0;
  bool dirty = false;       // listed in CacheCounters::dirty
};

// The sites touched in a window, each listed once (SiteWindow::dirty): room is made
// for every site beforehand (reserve, under the device lock), so that listing one on a
// hit is a store and an increment. It was a vector's push_back into reserved capacity,
// whose possible call to grow made GCC keep the whole hit path's values on the stack
// (about 15 instructions on each of allocate and free).
class DirtySites {
 public:
  // Room for ids 0 .. n-1 (may throw std::bad_alloc, changing nothing).
  void reserve(size_t n) {
    if (n > ids_.size()) ids_.resize(n);
  }
  // `id` is listed at most once per window and is below the reserved n: never overflows.
  void push(SiteId id) { ids_[size_++] = id; }
  void clear() { size_ = 0; }
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  const SiteId* begin() const { return ids_.data(); }
  const SiteId* end() const { return ids_.data() + size_; }
  const SiteId* data() const { return ids_.data(); }

 private:
  LineVector<SiteId> ids_;  // ids_.size() is the room; the first size_ are listed
  size_t size_ = 0;
};

struct CacheCounters {
  // Allocations from the cache add, frees into it subtract (all small-pool blocks).
  WindowCounter bytes;      // block bytes: allocated and active (+), thread-cached (-)
  // Blocks, likewise. Its `up` is also the allocations the cache served
  // (DeviceStats::cache_hits) and its `down` the user frees it took (num_frees): a hit
  // adds or takes exactly one block, so no separate counters are kept for those.
  WindowCounter count;
  WindowCounter requested;  // requested bytes (taken with sub_untracked: no `lo`)
  // On lines of their own (cache_line.h): the owner writes them on every hit.
  LineVector<SiteWindow> sites;  // by SiteId; grown under the device lock only
  DirtySites dirty;              // sites touched in this window (room reserved)

  bool empty() const { return bytes.empty() && count.empty(); }
};

}  // namespace devmem::internal
