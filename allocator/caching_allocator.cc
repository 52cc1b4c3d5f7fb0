// allocator/caching_allocator.cc: the public face of one device's allocator. Every
// method forwards to the DevicePool behind the device lock (allocator/device_pool.h),
// which keeps the header free of container and mutex types; allocate and free go to
// its thread-cache front end first.
#include "allocator/caching_allocator.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/arena_internal.h"
#include "allocator/device_pool.h"
#include "allocator/device_pool_front.h"
#include "allocator/errors.h"
#include "allocator/stack_sampler.h"

namespace devmem {
namespace {

// The rule of allocator/backend.h: no allocator call from a stream callback (it would
// deadlock against a holder of the device lock synchronizing that stream). Checked
// before the device lock is taken; the message names the call and the device.
std::string InCallbackMessage(const internal::DevicePool& pool, const char* op) {
  return absl::StrCat("devmem: ", op, " on ", pool.device().ToString(),
                      " from a stream callback (a launch_host_fn function): stream "
                      "callbacks must not call the allocator, which may be waiting for "
                      "that stream while holding its lock; do the work after the stream "
                      "is synchronized, or on another thread");
}
// The throw out of line and cold, so that the check inlines into allocate and free as
// a load and a branch: called with a frame of its own it cost about 20 instructions a
// call, 5% of a cache-hit pair.
[[noreturn, gnu::noinline, gnu::cold]] void ThrowInStreamCallback(
    const internal::DevicePool& pool, const char* op) {
  throw InvalidArgumentError(InCallbackMessage(pool, op));
}
inline void RefuseInStreamCallback(const internal::DevicePool& pool, const char* op) {
  if (InStreamCallback()) [[unlikely]] ThrowInStreamCallback(pool, op);
}

// Runs `body`, a call that may reach the driver: refused on a poisoned pool; a
// DriverError from inside poisons it and is rethrown naming the call (errors.h).
template <typename Body>
decltype(auto) DeviceCall(internal::DevicePool& pool, const char* op, Body&& body) {
  if (pool.poisoned()) [[unlikely]] pool.throw_poisoned(op);
  try {
    return body();
  } catch (const DriverError& e) {
    throw DriverError(pool.poison(op, e.what()));
  }
}

}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<Backend> backend, const Config& config)
    : pool_(std::make_unique<internal::DevicePool>(std::move(backend), config)),
      arenas_(std::make_unique<internal::Arenas>(pool_.get(), pool_->device())) {
  pool_->set_arena_hook(arenas_.get());
  pool_->set_sample_owner(this);  // the key of this allocator's samples
  stack_sampler::SetMeanBytes(config.stack_sample_bytes);  // process-wide (stack_sampler.h)
}

CachingAllocator::~CachingAllocator() {
  pool_->set_arena_hook(nullptr);
  arenas_.reset();
  stack_sampler::ForgetOwner(this);
}

// allocate and free go through the thread caches, which take the device lock only on a
// miss; their hit paths inline here (device_pool_front.h).
void* CachingAllocator::allocate(size_t bytes, Stream stream, SiteId site) {
  RefuseInStreamCallback(*pool_, "allocate");
  return DeviceCall(*pool_, "allocate", [&] {
    // Scoped arenas come first: an arena buffer must never reach a thread cache. Not while
    // a private pool is allocated to: its allocations take the pool's path.
    if (!pool_->allocating_to_pools()) [[likely]] {
      if (void* p = arenas_->allocate(bytes, stream, site)) return p;
    }
    void* p = pool_->allocate_front(bytes, stream, site);
    stack_sampler::OnAllocate(this, p, bytes, site);  // sampled stacks (stack_sampler.h)
    return p;
  });
}
void CachingAllocator::free(void* ptr) {
  RefuseInStreamCallback(*pool_, "free");
  if (ptr == nullptr) return;  // a no-op, poisoned or not
  DeviceCall(*pool_, "free", [&] {
    if (arenas_->free(ptr)) return;
    pool_->free_front(ptr, 0);
    stack_sampler::OnFree(this, ptr);  // after: a refused free keeps its sample
  });
}
void CachingAllocator::free(void* ptr, size_t size) {
  RefuseInStreamCallback(*pool_, "free");
  if (ptr == nullptr) return;
  DeviceCall(*pool_, "free", [&] {
    if (arenas_->free(ptr)) return;
    pool_->free_front(ptr, size);
    stack_sampler::OnFree(this, ptr);
  });
}
void CachingAllocator::record_stream(void* ptr, Stream stream) {
  RefuseInStreamCallback(*pool_, "record_stream");
  DeviceCall(*pool_, "record_stream", [&] {
    if (arenas_->record_stream(ptr, stream)) return;
    pool_->record_stream(ptr, stream);
  });
}
void CachingAllocator::release_stream(Stream stream) {
  RefuseInStreamCallback(*pool_, "release_stream");
  DeviceCall(*pool_, "release_stream", [&] {
    // An empty retained chunk of the stream would serve the handle's next stream.
    arenas_->release_retained();
    pool_->release_stream(stream);
  });
}
void CachingAllocator::begin_allocate_to_pool(PoolId pool, StreamFilter filter) {
  RefuseInStreamCallback(*pool_, "begin_allocate_to_pool");
  pool_->begin_allocate_to_pool(pool, std::move(filter));
}
void CachingAllocator::end_allocate_to_pool(PoolId pool) {
  RefuseInStreamCallback(*pool_, "end_allocate_to_pool");
  // Not refused on a poisoned pool (the capture's bookkeeping must end; the pool then
  // makes no driver call), but a DriverError of the release it may run (the end of the
  // last capture gives released pools back) poisons it, as for release_pool.
  try {
    pool_->end_allocate_to_pool(pool);
  } catch (const DriverError& e) {
    throw DriverError(pool_->poison("end_allocate_to_pool", e.what()));
  }
}
void CachingAllocator::release_pool(PoolId pool) {
  RefuseInStreamCallback(*pool_, "release_pool");
  // Gives memory back to the device: refused on a poisoned pool, and a DriverError
  // poisons it, as for empty_cache.
  DeviceCall(*pool_, "release_pool", [&] { pool_->release_pool(pool); });
}
void CachingAllocator::empty_cache() {
  RefuseInStreamCallback(*pool_, "empty_cache");
  DeviceCall(*pool_, "empty_cache", [&] {
    arenas_->release_retained();
    pool_->empty_cache();
  });
}
void CachingAllocator::trim(size_t keep_bytes) {
  RefuseInStreamCallback(*pool_, "trim");
  DeviceCall(*pool_, "trim", [&] {
    arenas_->release_retained();
    pool_->trim(keep_bytes);
  });
}
absl::Status CachingAllocator::set_memory_fraction(double fraction) {
  if (InStreamCallback()) {
    return absl::InvalidArgumentError(InCallbackMessage(*pool_, "set_memory_fraction"));
  }
  return pool_->set_memory_fraction(fraction);
}
void CachingAllocator::process_events() {
  RefuseInStreamCallback(*pool_, "process_events");
  DeviceCall(*pool_, "process_events", [&] { pool_->process_events(); });
}
absl::Status CachingAllocator::enable_peer_access(int peer) {
  if (InStreamCallback()) {
    return absl::InvalidArgumentError(InCallbackMessage(*pool_, "enable_peer_access"));
  }
  // The backend keeps the access list and its own lock (it is held across map calls,
  // so a map made meanwhile grants the peer either way): no device lock needed.
  return DeviceCall(*pool_, "enable_peer_access",
                    [&] { return backend().enable_peer_access(peer); });
}
PollStats CachingAllocator::poll_stats() const { return pool_->poll_stats(); }

void CachingAllocator::set_poll_counter(std::atomic<int64_t>* counter) {
  RefuseInStreamCallback(*pool_, "set_poll_counter");
  pool_->set_poll_counter(counter);
}

bool CachingAllocator::poisoned() const { return pool_->poisoned(); }
DeviceStats CachingAllocator::stats() const {
  RefuseInStreamCallback(*pool_, "stats");
  return pool_->stats();
}
void CachingAllocator::reset_peak_stats() {
  RefuseInStreamCallback(*pool_, "reset_peak_stats");
  pool_->reset_peak_stats();
}
void CachingAllocator::reset_accumulated_stats() {
  RefuseInStreamCallback(*pool_, "reset_accumulated_stats");
  pool_->reset_accumulated_stats();
}
std::vector<SiteStats> CachingAllocator::site_stats() const {
  RefuseInStreamCallback(*pool_, "site_stats");
  return pool_->site_stats();
}
std::vector<SiteUsage> CachingAllocator::top_sites(size_t k) const {
  RefuseInStreamCallback(*pool_, "top_sites");
  return pool_->top_sites(k);
}
AllocatorSnapshot CachingAllocator::snapshot() const {
  RefuseInStreamCallback(*pool_, "snapshot");
  AllocatorSnapshot snap = pool_->snapshot();
  snap.arena_buffers = arenas_->buffers();
  AttachSampledStacks(this, &snap);  // after the device lock: the sampler's own lock
  return snap;
}
SnapshotLockStats CachingAllocator::snapshot_lock_stats() const {
  return pool_->snapshot_lock_stats();
}
std::optional<BlockInfo> CachingAllocator::find_allocation(const void* ptr) const {
  RefuseInStreamCallback(*pool_, "find_allocation");
  if (auto b = arenas_->find(ptr)) return b;
  return pool_->find_allocation(ptr);
}
absl::Status CachingAllocator::validate() const {
  if (InStreamCallback()) return absl::InvalidArgumentError(InCallbackMessage(*pool_, "validate"));
  if (absl::Status s = pool_->validate(); !s.ok()) return s;
  // Without draining the thread caches: validate() changes nothing.
  return arenas_->validate(pool_->segments_for_validation());
}
ArenaReport CachingAllocator::arena_report() const {
  RefuseInStreamCallback(*pool_, "arena_report");
  return arenas_->report();
}
std::vector<ArenaBufferInfo> CachingAllocator::arena_buffers() const {
  RefuseInStreamCallback(*pool_, "arena_buffers");
  return arenas_->buffers();
}
void CachingAllocator::set_observer(AllocatorObserver* observer) {
  RefuseInStreamCallback(*pool_, "set_observer");
  pool_->set_observer(observer);
  pool_->set_front_observer(observer);
  arenas_->set_observer(observer);
}
// These take no lock: safe anywhere.
DeviceId CachingAllocator::device() const { return pool_->device(); }
Backend& CachingAllocator::backend() const { return pool_->backend(); }
const Config& CachingAllocator::config() const { return pool_->config(); }

}  // namespace devmem
