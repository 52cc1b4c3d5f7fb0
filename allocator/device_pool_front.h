// allocator/device_pool_front.h: DevicePool's thread-cache hit paths, allocate_front and
// free_front (internal; allocator/thread_cache.h has the protocol, device_pool_tcache.cc
// the slow paths they fall back to, docs/architecture.md "Thread caches" the design).
//
// Why a header: CachingAllocator::allocate and free (caching_allocator.cc) are their only
// callers, and a hit is a few dozen instructions. Out of line, each hit paid a second
// frame (six callee-saved registers pushed and popped, the arguments moved again) on
// top of the public method's: about 20 instructions an allocation and as many a free,
// a sixth of a shipped pair's allocator share. Always inline (GCC's heuristics keep
// them out of line as too large), the hit runs in the public method's frame; every
// miss still calls out (the slow paths are out of line).
//
// Thread-safety: as device_pool.h says for allocate_front/free_front (no lock on a hit).
#pragma once

#include <cstddef>
#include <cstdint>

#include "allocator/device_pool.h"

namespace devmem::internal {

namespace front_internal {
// A hit's event carries the block's order word (AllocEvent::block_order) and no pool
// word: it does not hold the device lock.
inline AllocEvent HitEvent(AllocAction action, DeviceId device, const Block* b) {
  return AllocEvent{action, device, b->stream, b->addr, b->size, b->requested, b->site,
                    &b->trace_order};
}
inline void Emit(AllocatorObserver* observer, const AllocEvent& event) {
  if (observer != nullptr) observer->on_event(event);
}
}  // namespace front_internal

[[gnu::always_inline]] inline void* DevicePool::allocate_front(size_t requested, Stream stream, SiteId site) {
  // 1 .. max_size (max_size 0: caches off; requested 0 wraps around). Not while a
  // private pool is allocated to: routing to it happens under the lock.
  if (requested - 1 < cache_limits_.max_size && !allocating_to_pools()) {
    // Read before the cache is looked up: with no ticker running it is a call, and a
    // call anywhere between the lookup and the hit's end made GCC keep the cache and
    // the block on the stack throughout (about 20 instructions a hit). A reading a few
    // instructions early is as good (coarse_clock.h: never later than the call).
    const int64_t now = PublishedCoarseNowNs();
    ThreadCache* tc = tcache::Find(pool_id_);
    if (tc == nullptr) [[unlikely]] return allocate_without_cache(requested, stream, site);
    if (!tc->begin_op()) [[unlikely]] return cache_allocate_slow(tc, requested, stream, site);
    bool need_site = false;
    if (ThreadCache::Slot* slot = tc->slot_for(stream)) {
      const size_t size = (requested + kMinBlockSize - 1) & ~(kMinBlockSize - 1);
      ThreadCache::Bin& bin = tc->bin(*slot, size);
      if (bin.head != nullptr) {
        if (tc->has_site(site)) [[likely]] {
          Block* b = tc->pop(bin);
          b->state = BlockState::kAllocated;
          b->requested = requested;
          b->site = site;
          b->alloc_time_ns = now;
          tc->count_alloc(b);
          const AllocEvent event = front_internal::HitEvent(AllocAction::kAlloc, device_, b);
          tc->end_op();
          front_internal::Emit(front_observer_.load(std::memory_order_acquire), event);
          return reinterpret_cast<void*>(event.addr);
        }
        need_site = true;  // its counters need memory: under the lock
      }
    }
    tc->end_op();
    if (need_site) return cache_allocate_slow(tc, requested, stream, site);
  }
  return allocate(requested, stream, site);
}

[[gnu::always_inline]] inline void DevicePool::free_front(void* ptr, size_t size_hint) {
  if (ptr == nullptr) return;
  if (cache_limits_.max_size != 0 && size_hint <= cache_limits_.max_size) {
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    ThreadCache* tc = tcache::Find(pool_id_);
    // A map entry is exact for a block the caller holds: it was written under the lock
    // before the block was handed to the caller (which then passed it here).
    Block* b = block_map_.find(addr);
    if (b != nullptr && tc != nullptr && tc->begin_op()) [[likely]] {
      if (b->state == BlockState::kAllocated && b->stream_uses.empty() &&
          tc->fits(b->size) && tc->has_site(b->site)) [[likely]] {
        if (ThreadCache::Slot* slot = tc->slot_for(b->stream)) [[likely]] {
          const AllocEvent event = front_internal::HitEvent(AllocAction::kFree, device_, b);
          tc->count_free(b);
          b->state = BlockState::kThreadCached;
          tc->push(tc->bin(*slot, b->size), b);
          // Reported before the operation ends: until then no drainer can give the
          // block to another thread, whose allocation would be reported first.
          front_internal::Emit(front_observer_.load(std::memory_order_acquire), event);
          tc->end_op();
          return;
        }
      }
      tc->end_op();
    }
    // A cache-owned block that this thread cannot keep as it is, or a pool-owned
    // block that its cache may adopt.
    if (b != nullptr || tc != nullptr) return cache_free_slow(tc, ptr);
  }
  free(ptr);
}

}  // namespace devmem::internal
