// cuda/cuda_backend.h: the CUDA backend: allocator/backend.h over the CUDA runtime API.
//
// Segments are cudaMalloc/cudaFree; streams are non-blocking CUDA streams (Stream{0}
// is the legacy default stream); events are timing-free CUDA events; launch_host_fn is
// cudaLaunchHostFunc. Every call runs with the backend's device current and restores
// the caller's current device afterwards. Device memory is not host accessible.
//
// Virtual memory (expandable segments): caps().virtual_memory is true when the driver's
// cuMem* entry points resolved (through the runtime: libcuda is not linked) and the
// device reports CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED. granularity()
// is the driver's recommended granularity for pinned device memory, at least 2 MiB.
// reserve_address/release_address are cuMemAddressReserve/cuMemAddressFree; map backs
// each granule with its own cuMemCreate allocation (so unmap may take any granule-
// aligned part of earlier maps) and grants this device, and every peer that
// enable_peer_access granted, read/write access; unmap unmaps the granules (their
// handles go to the reserve). enable_peer_access(peer) enables peer access from the
// peer for regular segments and re-grants every mapped range with the peer added, one
// cuMemSetAccess per contiguous range. IPC (allocator/ipc.h): where the driver has
// POSIX file-descriptor handles, granules are created exportable and the backend is an
// IpcBackend (ipc_export: a descriptor per granule; ipc_import maps another process's
// export); sharing() reports it, and expandable_segments:auto means expandable segments
// only then (allocator/segment_kind_policy.h). When either condition fails, granularity() is 0,
// reserve_address and map return Unimplemented with the reason, and the allocator
// uses regular segments.
//
// Programs do not call this header: the backend registers itself with
// RegisterCudaBackendFactory (allocator/backend_factory.h) at static-initialization
// time, and MakeBackend(config) with backend:cuda or backend:auto finds it. It is here
// for tests and tools that want a CUDA backend directly.
//
// This header includes no CUDA header, so its users need no CUDA toolkit.
//
// Thread-safety: every method may be called from any thread (the CUDA runtime and
// driver are thread-safe; the backend's one mutable state, its table of reservations
// and mapped granules, is guarded by a mutex).
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/backend.h"

namespace devmem {

// The number of CUDA devices, or UnavailableError naming the CUDA error (name, code
// and description) when the driver cannot say: no driver, too old a driver, no device.
absl::StatusOr<int> CudaDeviceCount();

// A backend for cuda:`index`. Errors: those of CudaDeviceCount, InvalidArgument for an
// index with no device, and errors from cudaGetDeviceProperties.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int index);

// The cpu_pinned device's backend: page-locked host memory (cudaHostAlloc, portable;
// cudaFreeHost), which GPU copies read and write asynchronously. It has no streams of
// its own: memory is allocated on kPinnedHostStream (the host, which has no queue),
// and the GPU streams that copy through a block are announced with record_stream, so
// the caching allocator reuses the block only once their events completed: the host
// must not refill a staging buffer that a pending copy still reads. Events are
// recorded on those GPU streams (with the stream's device current); synchronize_stream
// and launch_host_fn take them too. Errors: those of CudaDeviceCount, Unavailable
// without a device.
absl::StatusOr<std::unique_ptr<Backend>> NewCudaPinnedHostBackend();

// The stream cpu_pinned memory is allocated on: no CUDA stream has this handle.
inline constexpr Stream kPinnedHostStream{~uintptr_t{0}};

// Device memory, for tests and tools, since the host cannot touch it: fills `bytes` at
// `device_ptr` with `value`, and copies `bytes` from `device_ptr` to `host`, on
// cuda:`index`. Both return when the work is done; errors name the CUDA call.
absl::Status CudaMemsetSync(int index, void* device_ptr, int value, size_t bytes);
absl::Status CudaCopyToHost(int index, void* host, const void* device_ptr, size_t bytes);

}  // namespace devmem
