// allocator/caching_allocator.cc: the public face of one device's allocator. Every
// method forwards to the DevicePool behind the device lock (allocator/device_pool.h),
// which keeps the header free of container and mutex types.
#include "allocator/caching_allocator.h"

#include "allocator/device_pool.h"

namespace devmem {

CachingAllocator::CachingAllocator(std::unique_ptr<Backend> backend, const Config& config)
    : pool_(std::make_unique<internal::DevicePool>(std::move(backend), config)) {}

CachingAllocator::~CachingAllocator() = default;

void* CachingAllocator::allocate(size_t bytes, Stream stream, SiteId site) {
  return pool_->allocate(bytes, stream, site);
}
void CachingAllocator::free(void* ptr) { pool_->free(ptr); }
void CachingAllocator::record_stream(void* ptr, Stream stream) {
  pool_->record_stream(ptr, stream);
}
void CachingAllocator::empty_cache() { pool_->empty_cache(); }
void CachingAllocator::trim(size_t keep_bytes) { pool_->trim(keep_bytes); }
absl::Status CachingAllocator::set_memory_fraction(double fraction) {
  return pool_->set_memory_fraction(fraction);
}
void CachingAllocator::process_events() { pool_->process_events(); }
DeviceStats CachingAllocator::stats() const { return pool_->stats(); }
void CachingAllocator::reset_peak_stats() { pool_->reset_peak_stats(); }
void CachingAllocator::reset_accumulated_stats() { pool_->reset_accumulated_stats(); }
std::vector<SiteStats> CachingAllocator::site_stats() const { return pool_->site_stats(); }
std::vector<SiteUsage> CachingAllocator::top_sites(size_t k) const {
  return pool_->top_sites(k);
}
AllocatorSnapshot CachingAllocator::snapshot() const { return pool_->snapshot(); }
std::optional<BlockInfo> CachingAllocator::find_allocation(const void* ptr) const {
  return pool_->find_allocation(ptr);
}
absl::Status CachingAllocator::validate() const { return pool_->validate(); }
void CachingAllocator::set_observer(AllocatorObserver* observer) {
  pool_->set_observer(observer);
}
DeviceId CachingAllocator::device() const { return pool_->device(); }
Backend& CachingAllocator::backend() const { return pool_->backend(); }
const Config& CachingAllocator::config() const { return pool_->config(); }

}  // namespace devmem
