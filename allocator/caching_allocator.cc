// allocator/caching_allocator.cc: the public face of one device's allocator. Every
// method forwards to the DevicePool behind the device lock (allocator/device_pool.h),
// which keeps the header free of container and mutex types.
#include "allocator/caching_allocator.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/device_pool.h"
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
void RefuseInStreamCallback(const internal::DevicePool& pool, const char* op) {
  if (InStreamCallback()) [[unlikely]] throw InvalidArgumentError(InCallbackMessage(pool, op));
}

}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<Backend> backend, const Config& config)
    : pool_(std::make_unique<internal::DevicePool>(std::move(backend), config)) {
  stack_sampler::SetMeanBytes(config.stack_sample_bytes);  // process-wide (stack_sampler.h)
}

CachingAllocator::~CachingAllocator() { stack_sampler::ForgetOwner(this); }

void* CachingAllocator::allocate(size_t bytes, Stream stream, SiteId site) {
  RefuseInStreamCallback(*pool_, "allocate");
  void* p = pool_->allocate(bytes, stream, site);
  stack_sampler::OnAllocate(this, p, bytes, site);  // sampled stacks (stack_sampler.h)
  return p;
}
void CachingAllocator::free(void* ptr) {
  RefuseInStreamCallback(*pool_, "free");
  pool_->free(ptr);
  stack_sampler::OnFree(this, ptr);  // after: a refused free keeps its sample
}
void CachingAllocator::record_stream(void* ptr, Stream stream) {
  RefuseInStreamCallback(*pool_, "record_stream");
  pool_->record_stream(ptr, stream);
}
void CachingAllocator::empty_cache() {
  RefuseInStreamCallback(*pool_, "empty_cache");
  pool_->empty_cache();
}
void CachingAllocator::trim(size_t keep_bytes) {
  RefuseInStreamCallback(*pool_, "trim");
  pool_->trim(keep_bytes);
}
absl::Status CachingAllocator::set_memory_fraction(double fraction) {
  if (InStreamCallback()) {
    return absl::InvalidArgumentError(InCallbackMessage(*pool_, "set_memory_fraction"));
  }
  return pool_->set_memory_fraction(fraction);
}
void CachingAllocator::process_events() {
  RefuseInStreamCallback(*pool_, "process_events");
  pool_->process_events();
}
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
  return pool_->snapshot();
}
std::optional<BlockInfo> CachingAllocator::find_allocation(const void* ptr) const {
  RefuseInStreamCallback(*pool_, "find_allocation");
  return pool_->find_allocation(ptr);
}
absl::Status CachingAllocator::validate() const {
  if (InStreamCallback()) return absl::InvalidArgumentError(InCallbackMessage(*pool_, "validate"));
  return pool_->validate();
}
void CachingAllocator::set_observer(AllocatorObserver* observer) {
  RefuseInStreamCallback(*pool_, "set_observer");
  pool_->set_observer(observer);
}
// These take no lock: safe anywhere.
DeviceId CachingAllocator::device() const { return pool_->device(); }
Backend& CachingAllocator::backend() const { return pool_->backend(); }
const Config& CachingAllocator::config() const { return pool_->config(); }

}  // namespace devmem
