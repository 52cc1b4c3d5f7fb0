// cuda/cuda_device_guard.h: DeviceGuard, shared by the CUDA backend (cuda_backend.cc)
// and the tensor kernels (cuda_kernels.cc). Internal to cuda/: it includes the CUDA
// runtime's header.
//
// Thread-safety: the current device is per thread; a guard is used on one thread.
#pragma once

#include <cuda_runtime_api.h>

namespace devmem {

// Makes `device` current for the guard's lifetime and restores the caller's current
// device afterwards, so the backend never changes which device its callers' own CUDA
// calls go to. Switching is skipped when the device is already current, except with
// kBindContext: driver API calls (cuMem*) do not initialize anything by themselves
// and need the device's primary context current on this thread, which cudaSetDevice
// guarantees (CUDA 12 and later; cudaFree(nullptr) before that).
class DeviceGuard {
 public:
  enum Mode { kRuntimeOnly, kBindContext };
  explicit DeviceGuard(int device, Mode mode = kRuntimeOnly) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();  // not sticky, but leave nothing behind
      previous_ = -1;
    }
    if (previous_ != device || mode == kBindContext) cudaSetDevice(device);
#if CUDART_VERSION < 12000
    if (mode == kBindContext) cudaFree(nullptr);
#endif
  }
  ~DeviceGuard() {
    int current = -1;
    if (previous_ >= 0 && cudaGetDevice(&current) == cudaSuccess &&
        current != previous_) {
      cudaSetDevice(previous_);
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace devmem
