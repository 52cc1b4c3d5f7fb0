// tests/fake_cuda/fake_cuda_peer.h: the seam between the fake runtime (fake_cuda.cc)
// and its model of peer access (fake_cuda_peer.cc). Internal to the fake; tests use
// the CUDA API and fake_cuda.h.
//
// Peer access (what the model follows; the CUDA runtime API's "Peer Device Memory
// Access" and the programming guide's virtual memory management chapter):
//   * cudaDeviceCanAccessPeer(&can, d, p) is 1 for two distinct devices (0 with
//     DEVMEM_FAKE_CUDA_NO_PEER=1, read at every call) and 0 for d == p.
//   * cudaDeviceEnablePeerAccess(p, 0) lets the current device reach device p's
//     cudaMalloc'd memory (one way); a second enable is cudaErrorPeerAccessAlreadyEnabled,
//     p == current or an invalid p cudaErrorInvalidDevice, flags != 0
//     cudaErrorInvalidValue, a pair that cannot cudaErrorPeerAccessUnsupported.
//     cudaDeviceDisablePeerAccess(p) undoes it (cudaErrorPeerAccessNotEnabled if not).
//     It has no effect on virtual-memory mappings: a mapping is reachable only by the
//     devices cuMemSetAccess granted (fake_cuda.cc keeps a bit per device).
//   * Device work runs on the device of its stream. A kernel (cudaMemset*) over another
//     device's cudaMalloc'd memory needs peer access enabled to it; a copy
//     (cudaMemcpy*, cudaMemcpyPeer*) does not (the driver stages it). Either needs
//     every mapping it touches granted to its device. Work that reaches memory its
//     device may not is not done: the device faults when its stream reaches it
//     (cudaErrorIllegalAddress, sticky, as a GPU's illegal access), and the fake says
//     why on stderr.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace fake_cuda {

// --- offered by fake_cuda.cc -----------------------------------------------------------

// The calling thread's current device (its primary context becomes current, as for
// every runtime call).
int CurrentDevice();
bool IsDevice(int device);
// cudaSuccess, or the sticky error of a faulted device.
cudaError_t DeviceFault(int device);
// DEVMEM_FAKE_CUDA_FAIL's error for this call now, or 0.
int InjectedFailure(const char* call);
// cudaMemcpyPeerAsync (wait false) and cudaMemcpyPeer (stream nullptr, wait true).
cudaError_t MemcpyPeer(const char* call, void* dst, int dst_device, const void* src,
                       int src_device, size_t count, cudaStream_t stream, bool wait);

// --- offered by fake_cuda_peer.cc ------------------------------------------------------

// True once `accessor` enabled peer access to `owner` (and has not disabled it).
// A leaf: takes only the model's own lock.
bool PeerAccessEnabled(int accessor, int owner);

}  // namespace fake_cuda
