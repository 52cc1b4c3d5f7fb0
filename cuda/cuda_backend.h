// cuda/cuda_backend.h: the CUDA backend: allocator/backend.h over the CUDA runtime API.
//
// Segments are cudaMalloc/cudaFree; streams are non-blocking CUDA streams (Stream{0}
// is the legacy default stream); events are timing-free CUDA events; launch_host_fn is
// cudaLaunchHostFunc. Every call runs with the backend's device current and restores
// the caller's current device afterwards. No virtual-memory management yet (that needs
// the driver API's cuMemCreate/cuMemMap), and device memory is not host accessible.
//
// Programs do not call this header: the backend registers itself with
// RegisterCudaBackendFactory (allocator/backend_factory.h) at static-initialization
// time, and MakeBackend(config) with backend:cuda or backend:auto finds it. It is here
// for tests and tools that want a CUDA backend directly.
//
// This header includes no CUDA header, so its users need no CUDA toolkit.
//
// Thread-safety: every method may be called from any thread (the CUDA runtime is
// thread-safe; the backend keeps no mutable state of its own).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "allocator/backend.h"

namespace devmem {

// The number of CUDA devices, or UnavailableError naming the CUDA error (name, code
// and description) when the driver cannot say: no driver, too old a driver, no device.
absl::StatusOr<int> CudaDeviceCount();

// A backend for cuda:`index`. Errors: those of CudaDeviceCount, InvalidArgument for an
// index with no device, and errors from cudaGetDeviceProperties.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int index);

}  // namespace devmem
