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
  if (privates_.any_underway()) return;
  pools_underway_.store(false, std::memory_order_release);
  // What waited for the end of the captures. A failure here (a driver error recording
  // an event) leaves the rest deferred to the next poll and propagates.
  if (blocks_.has_deferred()) record_deferred_events_locked();
  release_private_pools_locked();
}

void DevicePool::release_pool(PoolId pool) {
  MutexLock lock(&mu_);
  PrivatePool* p = nullptr;
  if (absl::Status st = privates_.release(pool, device_.ToString(), &p); !st.ok()) {
    throw InvalidArgumentError(std::string(st.message()));
  }
  // Its unused segments go back now unless a capture (of another pool) is under way;
  // then at the end of the last one (end_allocate_to_pool), or on empty_cache.
  if (p->released && !privates_.any_underway()) release_private_pool_locked(p);
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

void DevicePool::release_private_pools_locked() {
  std::vector<PrivatePool*> released;
  for (const auto& [id, p] : privates_) {
    if (p->released) released.push_back(p.get());
  }
  for (PrivatePool* p : released) release_private_pool_locked(p);
}

void DevicePool::release_private_pool_locked(PrivatePool* pool) {
  const std::vector<Segment*> segments = pool->segments;  // release() changes the list
  for (Segment* s : segments) {
    if (s->busy_blocks != 0) continue;  // goes back once its blocks are freed
    // Waits for its stream, then frees it, under the lock: the loop walks the pool's
    // list, which another thread could change were the lock released. The release
    // takes it out of the pool's list, and a DriverError puts it back there, cached
    // and counted as before (RegularSegments::detached, restored).
    regular_.release({s}, /*lock=*/nullptr);
  }
  privates_.forget_if_empty(pool);
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
