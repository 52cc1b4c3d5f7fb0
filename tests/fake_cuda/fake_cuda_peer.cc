// tests/fake_cuda/fake_cuda_peer.cc: the fake runtime's peer access calls
// (cudaDeviceCanAccessPeer, cudaDeviceEnablePeerAccess, cudaDeviceDisablePeerAccess).
// fake_cuda_peer.h says what is modeled; fake_cuda.cc checks, for each piece of device
// work, that its device may reach the memory.
#include "tests/fake_cuda/fake_cuda_peer.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "tests/fake_cuda/fake_cuda_capture.h"

namespace fake_cuda {
namespace {

struct PeerTable {
  std::mutex mu;
  std::set<std::pair<int, int>> enabled;  // (accessor, owner)
};

PeerTable& Peers() {
  static PeerTable* const table = new PeerTable;  // never destroyed: stream threads
  return *table;
}

bool PairCanAccess(int device, int peer) {
  if (device == peer) return false;
  const char* e = std::getenv("DEVMEM_FAKE_CUDA_NO_PEER");
  return e == nullptr || std::string(e) == "0";
}

}  // namespace

bool PeerAccessEnabled(int accessor, int owner) {
  PeerTable& t = Peers();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.enabled.count({accessor, owner}) != 0;
}

}  // namespace fake_cuda

extern "C" {

cudaError_t CUDARTAPI cudaDeviceCanAccessPeer(int* can_access, int device, int peer) {
  fake_cuda::EnterCall("cudaDeviceCanAccessPeer");
  if (can_access == nullptr) return fake_cuda::RecordError(cudaErrorInvalidValue);
  if (!fake_cuda::IsDevice(device) || !fake_cuda::IsDevice(peer)) {
    return fake_cuda::RecordError(cudaErrorInvalidDevice);
  }
  if (int e = fake_cuda::InjectedFailure("cudaDeviceCanAccessPeer")) {
    return fake_cuda::RecordError(static_cast<cudaError_t>(e));
  }
  *can_access = fake_cuda::PairCanAccess(device, peer) ? 1 : 0;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  fake_cuda::EnterCall("cudaDeviceEnablePeerAccess");
  const int device = fake_cuda::CurrentDevice();
  if (cudaError_t e = fake_cuda::DeviceFault(device)) return fake_cuda::RecordError(e);
  if (!fake_cuda::IsDevice(peer) || peer == device) {
    return fake_cuda::RecordError(cudaErrorInvalidDevice);
  }
  if (flags != 0) return fake_cuda::RecordError(cudaErrorInvalidValue);
  if (!fake_cuda::PairCanAccess(device, peer)) {
    return fake_cuda::RecordError(cudaErrorPeerAccessUnsupported);
  }
  if (int e = fake_cuda::InjectedFailure("cudaDeviceEnablePeerAccess")) {
    return fake_cuda::RecordError(static_cast<cudaError_t>(e));
  }
  fake_cuda::PeerTable& t = fake_cuda::Peers();
  std::lock_guard<std::mutex> lock(t.mu);
  if (!t.enabled.emplace(device, peer).second) {
    return fake_cuda::RecordError(cudaErrorPeerAccessAlreadyEnabled);
  }
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaDeviceDisablePeerAccess(int peer) {
  fake_cuda::EnterCall("cudaDeviceDisablePeerAccess");
  const int device = fake_cuda::CurrentDevice();
  if (cudaError_t e = fake_cuda::DeviceFault(device)) return fake_cuda::RecordError(e);
  if (!fake_cuda::IsDevice(peer) || peer == device) {
    return fake_cuda::RecordError(cudaErrorInvalidDevice);
  }
  fake_cuda::PeerTable& t = fake_cuda::Peers();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.enabled.erase({device, peer}) == 0) {
    return fake_cuda::RecordError(cudaErrorPeerAccessNotEnabled);
  }
  return cudaSuccess;
}

}  // extern "C"
