// tensor/device_registry.cc: the tensor layer's view of the runtime's device registry
// (see device_registry.h): every function forwards to Runtime (runtime/runtime.h),
// keeping the tensor layer's error types.
#include "tensor/device_registry.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/runtime.h"
#include "tensor/errors.h"

namespace devmem {

DeviceId DefaultDevice() { return Runtime::Get().default_device(); }

std::shared_ptr<CachingAllocator> AllocatorFor(DeviceId device) {
  if ((device.type == DeviceType::kCpu || device.type == DeviceType::kCpuPinned) &&
      device.index != 0) {
    ThrowInvalidArgument(Cat("AllocatorFor: the ", DeviceTypeName(device.type),
                             " device has index 0 only, got ", device.index));
  }
  Runtime& runtime = Runtime::Get();  // a bad DEVMEM_CONF throws InvalidArgumentError
  try {
    return runtime.allocator(device);
  } catch (const std::invalid_argument& e) {
    // The runtime says a device cannot be had with invalid_argument; tensors call
    // that an unsupported device (tensor/errors.h).
    throw UnsupportedDeviceError(e.what());
  }
}

ScopedAllocatorOverride::ScopedAllocatorOverride(
    std::shared_ptr<CachingAllocator> allocator)
    : allocator_(std::move(allocator)),
      device_(allocator_ != nullptr ? allocator_->device() : DeviceId{}) {
  if (allocator_ == nullptr)
    ThrowInvalidArgument("ScopedAllocatorOverride: null allocator");
  previous_ = Runtime::Get().exchange_allocator(device_, allocator_);
}

ScopedAllocatorOverride::~ScopedAllocatorOverride() {
  // Restores the previous allocator, or none (created again on next use). Ours is
  // released after the registry's lock (it may be the last owner).
  std::shared_ptr<CachingAllocator> ours =
      Runtime::Get().exchange_allocator(device_, std::move(previous_));
}

}  // namespace devmem
