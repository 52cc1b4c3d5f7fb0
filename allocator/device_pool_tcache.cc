// allocator/device_pool_tcache.cc: DevicePool's side of the per-thread caches: the
// front end's slow paths (its cache hits, without the lock, are inline in
// device_pool_front.h), and quiescing, folding and draining the caches
// (allocator/thread_cache.h has the protocol; docs/architecture.md, "Thread caches",
// the design).
//
// Who owns a small block: the pool (free sets, the allocated table, pending queues) or the
// thread caches ("cache-owned": an entry in block_map_; in a bin, kThreadCached, or
// handed out from one, kAllocated). A block becomes cache-owned when a user frees it
// into a cache (adopt: the first free of a pool-allocated block) and stops being so
// when a cache gives it back (flush, drain) or when a free cannot keep it in a cache
// (record_stream'd, no cache on the freeing thread): then it turns pool-owned
// allocated (the allocated table) and free_locked() frees it as usual.
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_format.h"
#include "allocator/device_pool.h"
#include "allocator/device_pool_front.h"
#include "allocator/errors.h"

namespace devmem::internal {
using front_internal::Emit;
using front_internal::HitEvent;

// The hit paths, allocate_front and free_front, are inline in device_pool_front.h.

// --- slow paths --------------------------------------------------------------------------

void* DevicePool::allocate_without_cache(size_t requested, Stream stream, SiteId site) {
  if (tcache::CanCreate()) create_thread_cache();
  return allocate(requested, stream, site);
}

ThreadCache* DevicePool::create_thread_cache() {
  ThreadCacheUsesMembarrier();  // decided before the first cache exists
  auto cache = std::make_unique<ThreadCache>(this, pool_id_, cache_limits_);
  // Registry mutex, then the device lock (thread_cache.h).
  std::lock_guard<std::mutex> registry(tcache::RegistryMutex());
  tcache::PrepareAdd();
  {
    MutexLock lock(&mu_);
    caches_.push_back(cache.get());
  }
  ThreadCache* c = cache.release();
  tcache::Add(c);  // no throw: room was made
  return c;
}

void DevicePool::resume_cache_locked(ThreadCache* tc) {
  tc->resume();
  fold_cache_locked(tc);
}

void* DevicePool::cache_allocate_slow(ThreadCache* tc, size_t requested, Stream stream,
                                      SiteId site) {
  EnsureCoarseTicker();  // a forked child's hits read the clock until it runs again
  AllocEvent event;
  bool hit = false;
  {
    MutexLock lock(&mu_);
    resume_cache_locked(tc);
    const size_t size = (requested + kMinBlockSize - 1) & ~(kMinBlockSize - 1);
    ThreadCache::Slot* slot = tc->slot_for(stream);
    // A miss after all when the cache was drained meanwhile: the pool serves it.
    if (slot != nullptr && tc->bin(*slot, size).head != nullptr) {
      tc->reserve_site(site);  // may throw; nothing changed yet
      Block* b = tc->pop(tc->bin(*slot, size));
      b->state = BlockState::kAllocated;
      b->requested = requested;
      b->site = site;
      b->alloc_time_ns = PublishedCoarseNowNs();
      tc->count_alloc(b);
      event = HitEvent(AllocAction::kAlloc, device_, b);
      hit = true;
    }
  }
  if (!hit) return allocate(requested, stream, site);
  Emit(front_observer_.load(std::memory_order_acquire), event);
  return reinterpret_cast<void*>(event.addr);
}

ThreadCache::Bin* DevicePool::bin_for_free_locked(ThreadCache* tc, const Block* b) {
  // A private pool's blocks never enter a cache (device_pool_private.cc).
  if (tc == nullptr || !b->stream_uses.empty() || !b->segment->small_pool ||
      b->size > cache_limits_.max_size || b->segment->private_pool != nullptr) {
    return nullptr;
  }
  // Nor a released stream's, until its handle serves a new stream (a slot for it would
  // let cache hits bypass the refusal: device_pool_retire.cc).
  if (!events_.retirements().empty() &&
      events_.retirements().state(b->stream) != StreamRetireState::kLive) {
    return nullptr;
  }
  ThreadCache::Slot* slot = tc->slot_for(b->stream);
  if (slot == nullptr) {
    // Claim a slot for this stream: an unused one, else the least recently used,
    // whose blocks go back to the pool first.
    int pick = 0;
    ThreadCache::Slot* slots = tc->slots();
    for (int i = 0; i < ThreadCache::kSlots; ++i) {
      if (!slots[i].used) {
        pick = i;
        break;
      }
      if (slots[i].last_use < slots[pick].last_use) pick = i;
    }
    flush_cache_locked(tc, 0, 0, pick);
    slot = &slots[pick];
    slot->used = true;
    slot->stream = b->stream;
    slot->last_use = tc->next_tick();
  }
  if (!tc->fits(b->size)) {
    // Full: give half back, starting where the last flush stopped (thread_cache.h).
    flush_cache_locked(tc, tc->limits().max_bytes / 2, tc->limits().max_blocks / 2);
    if (!tc->fits(b->size)) return nullptr;  // larger than half the byte bound
  }
  return &tc->bin(*slot, b->size);
}

void DevicePool::cache_free_slow(ThreadCache* tc, void* ptr) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  AllocEvent event;
  {
    MutexLock lock(&mu_);
    if (tc != nullptr) resume_cache_locked(tc);
    if (Block* b = block_map_.find(addr)) {
      // Cache-owned.
      if (b->state != BlockState::kAllocated) {
        throw InvalidArgumentError(describe_bad_pointer("free", ptr));
      }
      if (tc != nullptr) tc->reserve_site(b->site);  // may throw; nothing changed yet
      if (ThreadCache::Bin* bin = bin_for_free_locked(tc, b)) {
        event = HitEvent(AllocAction::kFree, device_, b);
        tc->count_free(b);
        b->state = BlockState::kThreadCached;
        tc->push(*bin, b);
        // Under the lock, for the same reason as in free_front.
        Emit(front_observer_.load(std::memory_order_acquire), event);
      } else {
        // It leaves the caches: pool-owned allocated, then freed as any other block
        // (events for record_stream uses, statistics, trace).
        blocks_.cache_owned_to_table(b);  // may throw; nothing changed yet
        block_map_.clear(addr);
        free_locked(ptr);
        return;
      }
    } else {
      Block* p = blocks_.allocated(addr);
      ThreadCache::Bin* bin = nullptr;
      if (p != nullptr && BlockMap::Mappable(addr) && p->segment->small_pool &&
          p->size <= cache_limits_.max_size && p->stream_uses.empty()) {
        bin = bin_for_free_locked(tc, p);
      }
      if (bin != nullptr) tc->reserve_site(p->site);  // may throw; nothing changed yet
      if (bin == nullptr || !block_map_.set(addr, p)) {
        free_locked(ptr);  // not adoptable (or no memory for the map): as before
        return;
      }
      // Adopt: the user's free, then the block enters the bin.
      blocks_.allocated_to_thread_cache(p);
      tc->push(*bin, p);
      return;  // block_freed_by_user reported the free
    }
  }
}

// --- quiescing, folding, draining --------------------------------------------------------

void DevicePool::quiesce_caches_locked() const {
  if (caches_.empty()) return;
  for (ThreadCache* c : caches_) c->revoke();
  ThreadCacheHeavyFence();
  for (ThreadCache* c : caches_) c->wait_quiet();
}

void DevicePool::quiesce_for_read_locked() const {
  quiesce_caches_locked();
  auto* self = const_cast<DevicePool*>(this);
  for (ThreadCache* c : caches_) self->fold_cache_locked(c);
}

void DevicePool::fold_cache_locked(ThreadCache* tc) {
  CacheCounters& c = tc->counters();
  if (c.empty() && c.dirty.empty()) return;
  SiteId top = 0;
  for (SiteId s : c.dirty) top = std::max(top, s);
  acct_.reserve_site(top);  // may throw; nothing changed yet
  acct_.fold_thread_cache(c);
  tc->reset_counters();
}

void DevicePool::release_cached_block(Block* b) {
  // The pool now orders this memory's events after the block's last (its free, traced
  // without the lock): AllocEvent::pool_order.
  acct_.order_after(b->trace_order);
  block_map_.clear(b->addr);
  blocks_.thread_cached_to_free(b);
}

void DevicePool::flush_cache_locked(ThreadCache* tc, size_t keep_bytes, size_t keep_blocks,
                                    int only) {
  const size_t bins = cache_limits_.max_size / kMinBlockSize;
  ThreadCache::Slot* slots = tc->slots();
  size_t& cursor = tc->flush_cursor();
  const size_t start = cursor;
  for (size_t step = 0; step < bins; ++step) {
    if (tc->bytes() <= keep_bytes && tc->blocks() <= keep_blocks) break;
    const size_t i = (start + step) % bins;
    for (int s = 0; s < ThreadCache::kSlots; ++s) {
      if (only >= 0 && s != only) continue;
      ThreadCache::Bin& bin = slots[s].bins[i];
      while (bin.head != nullptr && (tc->bytes() > keep_bytes || tc->blocks() > keep_blocks)) {
        release_cached_block(tc->pop(bin));
      }
    }
    if (only < 0) cursor = (i + 1) % bins;
  }
}

size_t DevicePool::drain_thread_caches_locked() {
  quiesce_caches_locked();
  size_t bytes = 0;
  for (ThreadCache* c : caches_) {
    fold_cache_locked(c);
    bytes += c->bytes();
    flush_cache_locked(c, 0, 0);
  }
  return bytes;
}

void DevicePool::sync_thread_caches() {
  MutexLock lock(&mu_);
  quiesce_for_read_locked();
}

void DevicePool::drain_thread_caches() {
  MutexLock lock(&mu_);
  drain_thread_caches_locked();
}

void DevicePool::release_thread_cache(ThreadCache* tc) {
  MutexLock lock(&mu_);
  tc->resume();
  try {
    fold_cache_locked(tc);
  } catch (const std::bad_alloc&) {
    // No memory for a site's counters at thread exit: its hits stay uncounted (the
    // statistics are off by them) rather than ending the process.
    std::fprintf(stderr, "devmem: %s: out of host memory folding a thread cache's "
                         "counters at thread exit; statistics may be off\n",
                 device_.ToString().c_str());
  }
  flush_cache_locked(tc, 0, 0);
  caches_.erase(std::remove(caches_.begin(), caches_.end(), tc), caches_.end());
}

void DevicePool::detach_thread_caches() {
  std::lock_guard<std::mutex> registry(tcache::RegistryMutex());
  MutexLock lock(&mu_);
  // Their owners may be between operations; no one may use a pool being destroyed, so
  // nothing waits here. The blocks die with the segments.
  for (ThreadCache* c : caches_) c->pool = nullptr;
  caches_.clear();
}

// --- lookups ------------------------------------------------------------------------------

Block* DevicePool::find_allocated_locked(uintptr_t addr) const {
  if (Block* b = blocks_.allocated(addr)) return b;
  Block* b = block_map_.find(addr);
  return b != nullptr && b->state == BlockState::kAllocated ? b : nullptr;
}

// --- validate()'s share --------------------------------------------------------------------

absl::Status DevicePool::validate_caches_locked(size_t thread_cached_blocks,
                                                size_t cache_owned_allocated) const {
  auto violation = [](const std::string& what) {
    return absl::InternalError("devmem validate(): " + what);
  };
  size_t in_bins = 0;
  for (const ThreadCache* c : caches_) {
    size_t bytes = 0, blocks = 0;
    const ThreadCache::Slot* slots = c->slots();
    for (int s = 0; s < ThreadCache::kSlots; ++s) {
      const size_t bins = cache_limits_.max_size / kMinBlockSize;
      for (size_t i = 0; i < bins; ++i) {
        const ThreadCache::Bin& bin = slots[s].bins[i];
        uint32_t n = 0;
        for (const Block* b = bin.head; b != nullptr; b = b->tc_next, ++n) {
          if (!slots[s].used || b->state != BlockState::kThreadCached ||
              b->size != (i + 1) * kMinBlockSize || b->stream != slots[s].stream ||
              block_map_.find(b->addr) != b) {
            return violation(absl::StrFormat(
                "block %#x in a thread cache's bin for %u bytes: state %s, size %u, the "
                "map %s it",
                b->addr, (i + 1) * kMinBlockSize, BlockStateName(b->state), b->size,
                block_map_.find(b->addr) == b ? "names" : "does not name"));
          }
          if (n > bin.count) break;  // a cycle: reported below
          bytes += b->size;
          ++blocks;
        }
        if (n != bin.count) {
          return violation(absl::StrFormat(
              "a thread cache's bin for %u bytes counts %u blocks but links %u",
              (i + 1) * kMinBlockSize, bin.count, n));
        }
      }
    }
    if (bytes != c->bytes() || blocks != c->blocks()) {
      return violation(absl::StrFormat(
          "a thread cache counts %u bytes in %u blocks; its bins hold %u in %u",
          c->bytes(), c->blocks(), bytes, blocks));
    }
    if (blocks > c->limits().max_blocks || bytes > c->limits().max_bytes) {
      return violation(absl::StrFormat(
          "a thread cache holds %u bytes in %u blocks, over its bounds", bytes, blocks));
    }
    in_bins += blocks;
  }
  // Each thread-cached block of the segments is in some bin; with the counts equal, in
  // exactly one.
  if (in_bins != thread_cached_blocks) {
    return violation(absl::StrFormat(
        "thread caches' bins hold %u blocks but segments hold %u thread-cached ones",
        in_bins, thread_cached_blocks));
  }
  if (block_map_.size() != thread_cached_blocks + cache_owned_allocated) {
    return violation(absl::StrFormat(
        "the block map has %u entries but the caches own %u blocks (%u in bins, %u "
        "allocated)",
        block_map_.size(), thread_cached_blocks + cache_owned_allocated,
        thread_cached_blocks, cache_owned_allocated));
  }
  return absl::OkStatus();
}

}  // namespace devmem::internal
