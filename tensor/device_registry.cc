// tensor/device_registry.cc: the tensor layer's device -> allocator table (see
// device_registry.h).
#include "tensor/device_registry.h"

#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "allocator/backend_factory.h"
#include "allocator/config.h"
#include "tensor/errors.h"

namespace devmem {
namespace {

struct Registry {
  absl::Mutex mu;
  absl::flat_hash_map<DeviceId, std::shared_ptr<CachingAllocator>> allocators
      ABSL_GUARDED_BY(mu);
};

// Never destroyed: tensors in static objects may die after any registry would.
Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

Config ConfigOrThrow() {
  absl::StatusOr<Config> config = ConfigFromEnv();
  if (!config.ok()) ThrowInvalidArgument(std::string(config.status().message()));
  return *std::move(config);
}

std::shared_ptr<CachingAllocator> CreateAllocator(DeviceId device) {
  Config config = ConfigOrThrow();
  std::unique_ptr<Backend> backend;
  switch (device.type) {
    case DeviceType::kCpu:
      config.backend = BackendKind::kCpu;
      backend = MakeCpuBackend();
      break;
    case DeviceType::kSim:
      config.backend = BackendKind::kSim;
      backend = MakeSimBackend(config, device.index);
      break;
    case DeviceType::kCuda: {
      config.backend = BackendKind::kCuda;
      absl::StatusOr<std::unique_ptr<Backend>> made = MakeBackend(config, device.index);
      if (!made.ok()) {
        throw UnsupportedDeviceError(Cat("device ", device.ToString(),
                                         " is not available: ", made.status().message()));
      }
      backend = *std::move(made);
      break;
    }
  }
  return std::make_shared<CachingAllocator>(std::move(backend), config);
}

DeviceId ComputeDefaultDevice() {
  const Config config = ConfigOrThrow();
  switch (config.backend) {
    case BackendKind::kCuda:
      return DeviceId{DeviceType::kCuda, 0};
    case BackendKind::kSim:
      return DeviceId{DeviceType::kSim, 0};
    case BackendKind::kCpu:
      return DeviceId{DeviceType::kCpu, 0};
    case BackendKind::kAuto:
      break;
  }
  return ResolveAutoBackend() == BackendKind::kCuda ? DeviceId{DeviceType::kCuda, 0}
                                                    : DeviceId{DeviceType::kSim, 0};
}

}  // namespace

DeviceId DefaultDevice() {
  // A throwing initializer leaves the static uninitialized; the next call retries.
  static const DeviceId device = ComputeDefaultDevice();
  return device;
}

std::shared_ptr<CachingAllocator> AllocatorFor(DeviceId device) {
  if (device.type == DeviceType::kCpu && device.index != 0) {
    ThrowInvalidArgument(
        Cat("AllocatorFor: the cpu device has index 0 only, got ", device.index));
  }
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  std::shared_ptr<CachingAllocator>& slot = r.allocators[device];
  if (slot == nullptr) {
    try {
      slot = CreateAllocator(device);
    } catch (...) {
      r.allocators.erase(device);  // no empty entry left behind
      throw;
    }
  }
  return slot;
}

ScopedAllocatorOverride::ScopedAllocatorOverride(
    std::shared_ptr<CachingAllocator> allocator)
    : allocator_(std::move(allocator)),
      device_(allocator_ != nullptr ? allocator_->device() : DeviceId{}) {
  if (allocator_ == nullptr)
    ThrowInvalidArgument("ScopedAllocatorOverride: null allocator");
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  std::shared_ptr<CachingAllocator>& slot = r.allocators[device_];
  previous_ = std::exchange(slot, allocator_);
}

ScopedAllocatorOverride::~ScopedAllocatorOverride() {
  std::shared_ptr<CachingAllocator> ours;  // released after the lock
  Registry& r = GetRegistry();
  {
    absl::MutexLock lock(&r.mu);
    if (previous_ != nullptr) {
      ours = std::exchange(r.allocators[device_], std::move(previous_));
    } else {
      auto it = r.allocators.find(device_);
      if (it != r.allocators.end()) {
        ours = std::move(it->second);
        r.allocators.erase(it);
      }
    }
  }
}

}  // namespace devmem
