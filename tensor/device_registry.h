// tensor/device_registry.h: which CachingAllocator serves each device, for tensors.
//
// Example:
//   DeviceId dev = DefaultDevice();  // cuda:0, or sim:0 without a GPU
//   std::shared_ptr<CachingAllocator> a = AllocatorFor(dev);  // made on first use
//
//   // In a test: a small simulated device whose stats the test reads.
//   Config c; c.backend = BackendKind::kSim; c.sim_capacity = 64 * kMiB;
//   auto alloc = std::make_shared<CachingAllocator>(MakeSimBackend(c, 7), c);
//   ScopedAllocatorOverride use(alloc);  // sim:7 -> alloc until the scope ends
//   Tensor t = zeros({4, 4}, {.device = DeviceId{DeviceType::kSim, 7}});
//
// These functions forward to the runtime's process-wide registry (runtime/runtime.h),
// so tensors share their allocators (and the trace, metrics and OOM dumps) with
// everything else in the process.
//
// One allocator per device, created on first use from the configuration in DEVMEM_CONF
// (ConfigFromEnv): cpu gets the cpu backend, sim:N the simulated device N, cuda:N the
// CUDA backend (an error saying why when there is none). The policy keys of the
// configuration (max_split_size, ...) apply to every device.
//
// Ownership: the registry holds a shared_ptr to each allocator it creates and never
// destroys them (they live until the process exits, so tensors in static objects stay
// valid, and a Storage may point at one without a reference count). A Storage holds a
// shared_ptr to any other allocator (an override's), so an overridden allocator lives
// as long as the last tensor it backs.
//
// Thread-safety: every function may be called from any thread (the runtime's registry
// lock is held while a device's allocator is created, never while one runs;
// AllocatorRefFor takes it only on a thread's first use of a device after an
// exchange, or for an override).
#pragma once

#include <memory>

#include "allocator/caching_allocator.h"
#include "allocator/types.h"
#include "runtime/runtime.h"

namespace devmem {

// The device tensors go to when none is named: the backend DEVMEM_CONF asks for
// (cuda:0, sim:0 or cpu); with backend:auto (the default), cuda:0 when
// ResolveAutoBackend() finds CUDA, else sim:0. Computed once. Throws
// InvalidArgumentError carrying the message when DEVMEM_CONF does not parse.
DeviceId DefaultDevice();

// The allocator of `device`, created on first use. Throws InvalidArgumentError when
// DEVMEM_CONF does not parse, UnsupportedDeviceError (tensor/errors.h) when the device
// cannot be had (cuda without a GPU), each with the reason.
std::shared_ptr<CachingAllocator> AllocatorFor(DeviceId device);

// The same, without a lock or a reference count on the common path (what tensor
// creation uses): Runtime::allocator_ref (runtime/runtime.h) with AllocatorFor's
// checks and errors. `owner` is null when the runtime keeps the allocator until exit,
// else the reference to hold while the allocator is used (an override's).
AllocatorRef AllocatorRefFor(DeviceId device);

// While it lives, AllocatorFor(allocator->device()) returns `allocator` (which must not
// be null: InvalidArgumentError); on
// destruction the previous one (or none: created on next use) is back. Tensors
// created meanwhile keep using `allocator` until they die.
//
// The runtime's observer (trace, OOM dumps and callbacks) is set on `allocator`,
// replacing any it had (Runtime::exchange_allocator).
//
// Scoped: overrides of one device must end in the reverse order of their creation,
// and not concurrently with another override of the same device. Not copyable or
// movable, because it restores global state on destruction.
class ScopedAllocatorOverride {
 public:
  explicit ScopedAllocatorOverride(std::shared_ptr<CachingAllocator> allocator);
  ~ScopedAllocatorOverride();
  ScopedAllocatorOverride(const ScopedAllocatorOverride&) = delete;
  ScopedAllocatorOverride& operator=(const ScopedAllocatorOverride&) = delete;

  CachingAllocator& allocator() const { return *allocator_; }
  DeviceId device() const { return device_; }

 private:
  std::shared_ptr<CachingAllocator> allocator_;
  DeviceId device_;
  std::shared_ptr<CachingAllocator> previous_;  // null when the device had none yet
};

}  // namespace devmem
