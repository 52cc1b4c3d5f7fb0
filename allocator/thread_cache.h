// allocator/thread_cache.h: the per-(thread, device) caches in front of DevicePool
// (internal; docs/architecture.md, "Thread caches", has the design and its reasoning).
//
// A ThreadCache holds free small-pool blocks for one thread and one DevicePool, in
// bins by exact rounded size (512 B steps up to thread_cache_max_size), for the
// thread's two most recently used streams (slots). A cache-hit allocation pops a bin,
// a cache-hit free pushes one: no lock, no atomic read-modify-write, nothing written
// that another thread writes. The blocks it owns ("cache-owned": in a bin, or handed
// to the user from one) have an entry in the pool's BlockMap, which is how a free finds
// them without the device lock; their pool state is kThreadCached while in a bin and
// kAllocated while the user holds them.
//
// The quiesce protocol (an asymmetric Dekker handshake, as tcmalloc's per-CPU caches
// and folly's asymmetric fences do): the owner brackets every operation on its cache
// with begin_op()/end_op():
//     owner:   in_op = 1 (relaxed); light fence; if (revoke) { in_op = 0; slow path }
//              ... bins and counters ...; in_op = 0 (release)
//     pool:    (device lock held) revoke = 1; heavy fence; wait until in_op == 0
// The light fence is a compiler-only fence when the process registered for
// membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), whose call is then the heavy fence (it
// runs a full barrier on every CPU running a thread of the process); without membarrier
// both are seq_cst fences. Either way the pool sees in_op == 1 or the owner sees
// revoke == 1, so once the pool's wait ends the owner is outside its cache and stays
// out: it next takes the slow path, which needs the device lock, and clears `revoke`
// under it. While it holds the lock the pool may read and change every field of every
// quiesced cache. Under ThreadSanitizer (which cannot see membarrier or fence-only
// synchronization) each cache has a mutex instead, held by the owner across an
// operation and taken by the pool to quiesce it.
//
// Lifetime: the thread's caches are listed in a thread_local list; each is also
// listed by its pool (DevicePool::caches_). One process-wide registry mutex orders
// thread exit against pool destruction: at thread exit each cache whose pool is alive
// is drained into it and deleted; a pool being destroyed detaches its caches (pool =
// nullptr) and the owning thread deletes them later. Lock order: registry mutex ->
// device lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "allocator/block.h"
#include "allocator/cache_counters.h"
#include "allocator/cache_line.h"
#include "allocator/coarse_clock.h"
#include "allocator/config.h"
#include "allocator/types.h"

#if defined(__SANITIZE_THREAD__)
#define DEVMEM_TCACHE_MUTEX 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DEVMEM_TCACHE_MUTEX 1
#endif
#endif
#ifndef DEVMEM_TCACHE_MUTEX
#define DEVMEM_TCACHE_MUTEX 0
#endif

namespace devmem::internal {

class DevicePool;

// The sizing keys (allocator/config.h), fixed when the pool is made.
struct ThreadCacheLimits {
  size_t max_size = 0;    // largest request cached (a multiple of 512); 0: caches off
  size_t max_bytes = 0;   // bytes held in bins, per cache
  size_t max_blocks = 0;  // blocks held in bins, per cache
};

// The limits `config` asks for (max_size 0 when thread_cache is off).
inline ThreadCacheLimits ThreadCacheLimitsFor(const Config& config) {
  if (!config.thread_cache) return {};
  return {config.thread_cache_max_size, config.thread_cache_max_bytes,
          config.thread_cache_max_blocks};
}

// Whether the heavy fence is membarrier (decided once, before the first cache exists).
bool ThreadCacheUsesMembarrier();
// The pool's side of the handshake: makes every owner's `revoke` store visible before
// any owner's later check, or sees its in_op (see above).
void ThreadCacheHeavyFence();

class ThreadCache {
 public:
  static constexpr int kSlots = 2;  // streams cached per thread
  struct Bin {
    Block* head = nullptr;  // linked through Block::tc_next, most recent first
    uint32_t count = 0;
  };
  struct Slot {
    Stream stream;
    bool used = false;
    uint64_t last_use = 0;
    // One per 512 B size step, on lines of their own (cache_line.h): written on every
    // hit, and the first bins (the smallest sizes) are the hottest.
    LineVector<Bin> bins;
  };

  ThreadCache(DevicePool* pool, uint64_t pool_id, const ThreadCacheLimits& limits);
  ThreadCache(const ThreadCache&) = delete;
  ThreadCache& operator=(const ThreadCache&) = delete;

  // --- the owner's bracket ----------------------------------------------------------
  // False: the pool has revoked the cache; take the slow path (nothing was entered).
  bool begin_op() {
#if DEVMEM_TCACHE_MUTEX
    op_mu_.lock();
    if (revoke_.load(std::memory_order_relaxed)) {
      op_mu_.unlock();
      return false;
    }
    return true;
#else
    in_op_.store(true, std::memory_order_relaxed);
    if (light_fence_) {
      std::atomic_signal_fence(std::memory_order_seq_cst);
    } else {
      std::atomic_thread_fence(std::memory_order_seq_cst);
    }
    if (revoke_.load(std::memory_order_acquire)) {
      in_op_.store(false, std::memory_order_release);
      return false;
    }
    return true;
#endif
  }
  void end_op() {
#if DEVMEM_TCACHE_MUTEX
    op_mu_.unlock();
#else
    in_op_.store(false, std::memory_order_release);
#endif
  }

  // --- the pool's side (device lock held) ----------------------------------------------
  // Step 1 of quiescing: raise `revoke` (then one heavy fence for all caches).
  void revoke() {
#if DEVMEM_TCACHE_MUTEX
    std::lock_guard<std::mutex> lock(op_mu_);
#endif
    revoke_.store(true, std::memory_order_relaxed);
  }
  // Step 2: wait until the owner is outside its cache.
  void wait_quiet() const;
  // The owner, in its slow path with the device lock held: the cache is usable again.
  void resume() { revoke_.store(false, std::memory_order_relaxed); }

  // --- bins (inside begin_op/end_op, or quiesced under the device lock) ---------------
  // The slot caching `stream`, or nullptr.
  Slot* slot_for(Stream stream) {
    for (Slot& s : slots_) {
      if (s.used && s.stream == stream) {
        // Already the most recent (it holds the last tick): nothing to write, which is
        // every hit on one stream. The least recent slot is still the one with the
        // smaller tick.
        if (s.last_use != tick_) s.last_use = ++tick_;
        return &s;
      }
    }
    return nullptr;
  }
  Bin& bin(Slot& s, size_t size) { return s.bins[size / kMinBlockSize - 1]; }
  Block* pop(Bin& bin) {
    Block* b = bin.head;
    bin.head = b->tc_next;
    b->tc_next = nullptr;
    --bin.count;
    bytes_ -= b->size;
    --blocks_;
    return b;
  }
  void push(Bin& bin, Block* b) {
    b->tc_next = bin.head;
    bin.head = b;
    ++bin.count;
    bytes_ += b->size;
    ++blocks_;
  }
  // Whether one more block of `size` stays within the bounds.
  bool fits(size_t size) const {
    return blocks_ < limits_.max_blocks && bytes_ + size <= limits_.max_bytes;
  }

  // Counting a hit (inside an operation). The site's window exists (has_site: a
  // compare with a copy of the windows' count, not the vector's size, which divides).
  // Inlined into the hit paths (a call of their own cost a frame and a reload of `b`).
  bool has_site(SiteId site) const { return site < site_windows_; }
  [[gnu::always_inline]] void count_alloc(const Block* b) {
    counters_.bytes.add(static_cast<int64_t>(b->size));
    counters_.count.add(1);
    counters_.requested.add(static_cast<int64_t>(b->requested));
    SiteWindow& w = counters_.sites[b->site];
    w.live_bytes += static_cast<int64_t>(b->size);
    w.live_count += 1;
    w.total_bytes += static_cast<int64_t>(b->size);
    w.total_count += 1;
    if (w.live_bytes > w.hi_bytes) w.hi_bytes = w.live_bytes;
    mark(b->site, w);
  }
  [[gnu::always_inline]] void count_free(const Block* b) {
    counters_.bytes.sub(static_cast<int64_t>(b->size));
    counters_.count.sub(1);
    counters_.requested.sub_untracked(static_cast<int64_t>(b->requested));
    SiteWindow& w = counters_.sites[b->site];
    w.live_bytes -= static_cast<int64_t>(b->size);
    w.live_count -= 1;
    mark(b->site, w);
  }

  // Device lock held: room for `site`'s window (may throw std::bad_alloc, changing
  // nothing that matters: the vectors only grow).
  void reserve_site(SiteId site);

  const ThreadCacheLimits& limits() const { return limits_; }
  size_t bytes() const { return bytes_; }
  size_t blocks() const { return blocks_; }
  Slot* slots() { return slots_; }
  const Slot* slots() const { return slots_; }
  CacheCounters& counters() { return counters_; }
  // Starts a new window (after a fold).
  void reset_counters();
  uint64_t next_tick() { return ++tick_; }
  size_t& flush_cursor() { return flush_cursor_; }

  DevicePool* pool = nullptr;  // guarded by the registry mutex; nullptr once detached
  const uint64_t pool_id;

 private:
  void mark(SiteId site, SiteWindow& w) {
    if (!w.dirty) {
      w.dirty = true;
      counters_.dirty.push(site);  // room reserved (reserve_site): no call
    }
  }

  // The handshake, on its own cache line: the owner writes in_op_, the pool revoke_.
  alignas(64) std::atomic<bool> in_op_{false};
  std::atomic<bool> revoke_{false};
  const bool light_fence_;
#if DEVMEM_TCACHE_MUTEX
  std::mutex op_mu_;
#endif
  const ThreadCacheLimits limits_;
  Slot slots_[kSlots];
  // bytes_ and blocks_ are not neighbours (tick_ between them): a hit changes both, and
  // adjacent, GCC's SLP vectorizer made pop's two subtractions a vector load, shuffle,
  // arithmetic and store, with a constant from memory (about 9 instructions, not 2).
  size_t bytes_ = 0;   // in bins
  uint64_t tick_ = 0;
  size_t blocks_ = 0;  // in bins
  size_t flush_cursor_ = 0;  // the bin a flush starts at (rotates)
  size_t site_windows_ = 0;  // counters_.sites.size(), set by reserve_site
  CacheCounters counters_;
  // Keeps PublishedCoarseNowNs() fresh while a cache exists: a hit stamps
  // Block::alloc_time_ns with it (coarse_clock.h).
  CoarseTickerUse ticker_use_;
};

// --- the calling thread's caches --------------------------------------------------------
namespace tcache {

// The fast lookup: the cache last used by this thread (and its pool's id).
struct Last {
  uint64_t pool_id = 0;
  ThreadCache* cache = nullptr;
};
inline thread_local Last t_last;
// Set once the thread's cache list is destroyed (thread exit): later allocations on
// this thread (from other thread_local destructors) bypass the caches.
inline thread_local bool t_exited = false;

// This thread's cache for the pool with id `pool_id`, or nullptr. No lock.
ThreadCache* FindSlow(uint64_t pool_id);
inline ThreadCache* Find(uint64_t pool_id) {
  if (t_last.pool_id == pool_id) return t_last.cache;
  return FindSlow(pool_id);
}
// Whether this thread may still get a cache (false during and after thread exit).
inline bool CanCreate() { return !t_exited; }
// Registry mutex held: deletes the thread's caches of destroyed pools and makes room
// for one more entry in the thread's list (may throw std::bad_alloc).
void PrepareAdd();
// Registry mutex held, after PrepareAdd: lists `cache` as this thread's (no throw).
void Add(ThreadCache* cache);
// The registry mutex (see above).
std::mutex& RegistryMutex();
// A process-wide unique id for a new pool (never reused, so a stale thread_local entry
// never matches a pool made later at the same address).
uint64_t NewPoolId();

}  // namespace tcache
}  // namespace devmem::internal
