// tensor/storage.cc: creating and freeing storages (see storage.h).
#include "tensor/storage.h"

#include "tensor/live_storages.h"

#include <cstdio>
#include <exception>

namespace devmem {

Storage::Storage(void* data, size_t bytes, DeviceId device, Stream stream,
                 AllocatorRef allocator, Deleter deleter) noexcept
    : data_(data),
      bytes_(bytes),
      device_(device),
      stream_(stream),
      allocator_(allocator.allocator),
      allocator_owner_(std::move(allocator.owner)),
      deleter_(std::move(deleter)) {}

Storage::~Storage() {
  // Unlisted before the block is freed: a snapshot never annotates an address whose
  // storage is gone (LiveStorages reads storages under the same lock).
  if (listed_) LiveStorages::Get().Remove(this);
  if (allocator_ != nullptr) {
    try {
      // With the size it asked for, as PyTorch's free passes it: a block too large for
      // the thread caches goes straight to the pool, without the cache map's lookup
      // (CachingAllocator::free(ptr, size); the size is a hint, the pointer is checked).
      allocator_->free(data_, bytes_);
    } catch (const std::exception& e) {
      // The allocator does not know this block: its books and ours disagree. Say so
      // loudly; throwing from a destructor would terminate far from the cause.
      std::fprintf(stderr,
                   "devmem: freeing the storage of %zu bytes at %p on %s failed: %s\n",
                   bytes_, data_, device_.ToString().c_str(), e.what());
    }
  } else if (deleter_) {
    deleter_(data_);
  }
}

StoragePtr Storage::Allocate(std::shared_ptr<CachingAllocator> allocator, size_t bytes,
                             Stream stream, SiteId site, Contents contents) {
  CachingAllocator* raw = allocator.get();
  return Allocate(AllocatorRef{raw, std::move(allocator)}, bytes, stream, site,
                  std::move(contents));
}

StoragePtr Storage::Allocate(AllocatorRef allocator, size_t bytes, Stream stream,
                             SiteId site, Contents contents) {
  CachingAllocator& a = *allocator.allocator;
  const DeviceId device = a.device();
  void* data = a.allocate(bytes, stream, site);
  // If `new` throws, give the block back before propagating, so nothing leaks. `a`
  // stays valid meanwhile: the allocation function runs before the constructor's
  // arguments are evaluated, so `allocator.owner` has not been moved from when it
  // throws; the constructor is noexcept.
  Storage* s;
  try {
    s = new Storage(data, bytes, device, stream, std::move(allocator), nullptr);
  } catch (...) {
    a.free(data);
    throw;
  }
  StoragePtr ptr(s);  // from here on, an exception frees the storage
  if (data != nullptr) {
    s->contents_ = std::move(contents);
    LiveStorages::Get().Add(s);
    s->listed_ = true;
  }
  return ptr;
}

StoragePtr Storage::WrapForeign(void* data, size_t bytes, DeviceId device,
                                Deleter deleter, Stream stream) {
  return StoragePtr(
      new Storage(data, bytes, device, stream, AllocatorRef{}, std::move(deleter)));
}

void Storage::record_stream(Stream stream) const {
  if (allocator_ != nullptr && data_ != nullptr) allocator_->record_stream(data_, stream);
}

void StoragePtr::Destroy(Storage* s) noexcept { delete s; }

}  // namespace devmem
