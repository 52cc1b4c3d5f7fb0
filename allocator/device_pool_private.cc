// allocator/device_pool_private.cc: DevicePool's side of CUDA graph capture: private
// pools (allocator/pool_id.h, private_pools.h) and the rules that keep a capture
// intact (docs/architecture.md, "Graph capture and private pools").
//
// While a capture may be under way (an allocation to a private pool has begun and not
// ended, or the backend says the allocating stream captures):
//   * no event is queried or waited for and no stream is synchronized: poll_locked,
//     process_events(), empty_cache() and trim() skip those steps, and a free with
//     record_stream uses records its events only once no capture is under way (an
//     event recorded in a capture can never be queried);
//   * no memory goes back to the device and none is mapped: a miss takes a regular
//     segment from Backend::allocate_segment_during_capture (cudaMalloc with the
//     thread's capture mode relaxed, which a capture allows), after taking the thread
//     caches' blocks back if the device has no room; the staged retry's release stages
//     and garbage collection wait for the capture to end;
//   * thread caches and arenas step aside (allocating_to_pools()), so every allocation
//     routed to a private pool takes the locked path.
// A private pool's blocks never leave it: freed, they return to its free sets, which
// only allocations routed to that pool search, so an eager allocation on another
// stream is never handed memory a graph's replays write.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/device_pool.h"
#include "allocator/errors.h"

namespace devmem::internal {

void DevicePool::begin_allocate_to_pool(PoolId pool, StreamFilter filter) {
  MutexLock lock(&mu_);
  // Other threads' driver calls made with the lock released (driver_in_flight.h), and
  // the operations that would make more, end first: none may reach the driver once a
  // capture may be under way.
  in_flight_.wait_for_idle(&mu_);
  if (absl::Status st = privates_.begin(pool, std::move(filter), device_.ToString());
      !st.ok()) {
    throw InvalidArgumentError(std::string(st.message()));
  }
  pools_underway_.store(true, std::memory_order_release);
  // Blocks the thread caches hold are shared-pool blocks: nothing to do with them, but
  // from now on every allocation takes the locked path, where routing happens.
}

void DevicePool::end_allocate_to_pool(PoolId pool) {
  MutexLock lock(&mu_);
  if (absl::Status st = privates_.end(pool, device_.ToString()); !st.ok()) {
    throw InvalidArgumentError(std::string(st.message()));
  }
  // An allocation routed to the pool before this end may still be in the driver with
  // the lock released (grow_during_capture_locked); its segment joins the pool's list
  // when it takes the lock back. Wait for it, so that no segment joins a pool after its
  // capture has ended: the pool stays known meanwhile (forget_if_empty and the release
  // skip a growing pool), and it is looked up again by id after each wake.
  in_flight_.wait_until(&mu_, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    const PrivatePool* p = privates_.find(pool);
    return p == nullptr || p->growing == 0;
  });
  if (privates_.any_underway()) return;
  pools_underway_.store(false, std::memory_order_release);
  // A poisoned device makes no more driver calls (CachingAllocator refuses them); the
  // bookkeeping above still ends the capture.
  if (poisoned()) return;
  // What waited for the end of the captures. A failure here (a driver error recording
  // an event) leaves the rest deferred to the next poll and propagates.
  if (blocks_.has_deferred()) record_deferred_events_locked();
  // The released pools' segments go back with the lock released: one operation, so
  // that no capture begins before their frees are done (begin_allocate_to_pool).
  const DriverInFlight::Operation op(in_flight_);
  release_private_pools_locked();
}

void DevicePool::release_pool(PoolId pool) {
  MutexLock lock(&mu_);
  PrivatePool* p = nullptr;
  if (absl::Status st = privates_.release(pool, device_.ToString(), &p); !st.ok()) {
    throw InvalidArgumentError(std::string(st.message()));
  }
  // Its unused segments go back now unless a capture (of another pool) is under way;
  // then at the end of the last one (end_allocate_to_pool), or on empty_cache. With
  // the lock released for the driver calls: one operation, as empty_cache.
  if (p->released && !privates_.any_underway()) {
    const DriverInFlight::Operation op(in_flight_);
    release_private_pools_locked(p);
  }
}

bool DevicePool::capturing_locked(Stream stream) {
  return privates_.any_underway() || backend_->capture_state(stream) != CaptureState::kNone;
}

Block* DevicePool::grow_during_capture_locked(size_t size, Stream stream, PrivatePool* pool) {
  const bool small = IsSmall(size);
  size_t segment_size = 0;
  SegmentSizeFor(size, &segment_size);  // cannot fail: checked by allocate()
  GrowRequest req = grow_request(size, segment_size, small, stream);
  req.during_capture = true;
  req.private_pool = pool;
  // The pool stays known and unreleased while the grows below run with the lock
  // released (PrivatePool::growing; end_allocate_to_pool waits for them).
  struct GrowPin {
    PrivatePool* p;
    explicit GrowPin(PrivatePool* pool) : p(pool) {
      if (p != nullptr) ++p->growing;
    }
    ~GrowPin() {
      if (p != nullptr) --p->growing;
    }
  } const pin(pool);
  if (Block* b = regular_.grow(req).block) {
    acct_.count_cache_miss();
    return b;
  }
  // Out of memory. Giving cached segments back would need the driver; the thread
  // caches' blocks (shared pool) need none.
  if (pool == nullptr && drain_thread_caches_locked() > 0) {
    if (Block* b = free_.take_best_fit(size, stream, config_.max_split_size)) {
      acct_.count_cache_hit();
      return b;
    }
  }
  if (const size_t exact = ExactSegmentSize(size, segment_size); exact != 0) {
    req = grow_request(size, exact, small, stream);
    req.during_capture = true;
    req.private_pool = pool;
    if (Block* b = regular_.grow(req).block) {
      acct_.count_cache_miss();
      return b;
    }
  }
  return nullptr;
}

bool DevicePool::defer_events_locked(const Block* b) {
  if (privates_.any_underway()) return true;
  const StreamRetirements& retired = events_.retirements();
  for (const Stream s : b->stream_uses) {
    // A released stream may be destroyed: it captures nothing, and must not be asked.
    if (!retired.empty() && retired.state(s) != StreamRetireState::kLive) continue;
    if (backend_->capture_state(s) != CaptureState::kNone) return true;
  }
  return false;
}

void DevicePool::record_deferred_events_locked() {
  blocks_.record_deferred_events([this](const Block* b) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !defer_events_locked(b);
  });
}

void DevicePool::release_private_pools_locked(PrivatePool* only) {
  // The choice, under the lock: every unused segment (one free block) of the released
  // pools, each pool that has one pinned for the window below. All that may throw
  // (std::bad_alloc) comes before the first change.
  std::vector<Segment*> unused;
  std::vector<PrivatePool*> pinned;  // distinct: each pool is looked at once
  std::vector<PrivatePool*> empty;   // released pools with nothing to give back now
  auto choose = [&](PrivatePool* p) {
    // A grow into it is under way (its capture is ending): it goes back once that is
    // done, at the end of end_allocate_to_pool or on a later release.
    if (p->growing > 0) return;
    const size_t before = unused.size();
    for (Segment* s : p->segments) {
      if (s->busy_blocks == 0) unused.push_back(s);  // the others: once they are freed
    }
    (unused.size() != before ? pinned : empty).push_back(p);
  };
  if (only != nullptr) {
    choose(only);
  } else {
    for (const auto& [id, p] : privates_) {
      if (p->released) choose(p.get());
    }
  }
  for (PrivatePool* p : empty) privates_.forget_if_empty(p);
  if (unused.empty()) return;
  regular_.reserve_detached(unused.size());  // may throw: before any change
  for (PrivatePool* p : pinned) ++p->releasing;
  // Every chosen segment leaves the books now: its pool's list, the free sets, the
  // table and the statistics (RegularSegments::detached, SegmentSource); its bytes
  // count as a give-back in flight (DriverInFlight) until the driver has them.
  const DriverInFlight::Ticket ticket = regular_.detach_for_release(unused);
  // give_back_detached records a fence event on each segment's stream (under the
  // lock), releases the lock, waits for the events, frees the segments, and takes the
  // lock back. What other threads can do meanwhile, and what each sees:
  //   * allocate and free on the device (cache hits, misses, grows): none finds these
  //     segments (they are in no table, set or list); their bytes still count against
  //     the memory limit, and the staged retry waits for them (wait_for_give_backs)
  //     before it reports an OOM.
  //   * allocate into a pool being released: impossible. A released pool has no
  //     allocation under way (release_pool refuses a pool still being allocated to,
  //     end_allocate_to_pool waits for grows routed to it before its end, and a pool
  //     with one in flight is not chosen above) and begin_allocate_to_pool refuses it
  //     for as long as it is known, which the pin makes last until this release is
  //     done. A free of a block of one of its
  //     busy segments returns the block to the pool's free set (the pool is alive);
  //     that segment goes back on a later release, not on this one.
  //   * release_pool of the same pool again: the pool is still known and released,
  //     so InvalidArgumentError ("released already"), changing nothing, as before.
  //   * empty_cache, stage 2 of the staged retry, or the end of the last capture (of
  //     any pool) run this function too: they choose only among the segments in the
  //     pools' lists then (freed since, never these), release them in a window of
  //     their own, and do not forget a pinned pool even when its list is empty; the
  //     last release to finish forgets it. The reclaimer never takes private
  //     segments (SegmentTable::unused skips them).
  //   * a capture beginning: begin_allocate_to_pool waits until no operation is under
  //     way (every caller of this holds one) and no give-back is in flight, so no
  //     free of this release reaches the driver once a capture may have begun.
  //   * snapshot(), stats(), validate(): consistent (the segments are in no book and
  //     in no statistic; the pools' lists and the table agree).
  //   * release_stream of a segment's stream: may return meanwhile; the release
  //     waits only for the event recorded under the lock (release_fence.h).
  // Pool destruction cannot overlap (no other thread may use the allocator then).
  // On a DriverError (a fence wait or a free) the segments not given back are put
  // back as they were, each into its pool (pinned, so alive): its list
  // (RegularSegments::restored), its free set, the table and the statistics.
  auto unpin = [&]() noexcept {
    for (PrivatePool* p : pinned) {
      --p->releasing;
      privates_.forget_if_empty(p);  // the last release of a pool left empty forgets it
    }
  };
  try {
    regular_.give_back_detached(unused, ticket, &mu_);
  } catch (...) {
    unpin();
    throw;
  }
  unpin();
}

void DevicePool::private_stats_locked(DeviceStats* stats) const {
  stats->private_pools = static_cast<int64_t>(privates_.size());
  stats->private_reserved_bytes = 0;
  stats->private_allocated_bytes = 0;
  for (const auto& [id, p] : privates_) {
    for (const Segment* s : p->segments) {
      stats->private_reserved_bytes += static_cast<int64_t>(s->size);
      for (const Block* b = s->head; b != nullptr; b = b->next) {
        if (b->state == BlockState::kAllocated) {
          stats->private_allocated_bytes += static_cast<int64_t>(b->size);
        }
      }
    }
  }
}

absl::Status DevicePool::validate_private_locked() const {
  size_t private_segments = 0;
  for (const auto& [addr, s] : segments_) {
    if (s->private_pool == nullptr) continue;
    ++private_segments;
    if (s->expandable()) {
      return absl::InternalError(absl::StrFormat(
          "devmem validate(): segment %#x of private pool %s is expandable", s->addr,
          s->private_pool->id.ToString()));
    }
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      if (b->state == BlockState::kThreadCached || block_map_.find(b->addr) == b) {
        return absl::InternalError(absl::StrFormat(
            "devmem validate(): block %#x of private pool %s is in a thread cache",
            b->addr, s->private_pool->id.ToString()));
      }
    }
  }
  return privates_.validate(private_segments);
}

}  // namespace devmem::internal
