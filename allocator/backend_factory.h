// allocator/backend_factory.h: makes the backend a Config asks for.
//
// allocator/ knows the cpu and sim backends. Backends that live in higher-numbered
// folders (cuda/) register a factory here at static-initialization time (cuda/ is
// linked whole-archive for that), so allocator/ never links CUDA.
//
//   backend:auto  -> cuda when a cuda factory is registered and reports a device,
//                    else sim (the reason is printed once on stderr)
//   backend:cuda  -> cuda, or an error saying why not (no toolkit, no driver, no device)
//   backend:sim   -> the simulated device, sized by sim_capacity; indices below
//                    sim_devices, else InvalidArgument
//   backend:cpu   -> host memory through jemalloc
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "allocator/backend.h"
#include "allocator/config.h"

namespace devmem {

// Makes the backend for device `index` of the kind `config.backend` names.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const Config& config, int index = 0);

// The kind `auto` resolves to on this machine (kCuda or kSim), with the reason when it
// is not cuda. Computed once.
BackendKind ResolveAutoBackend(std::string* why_not_cuda = nullptr);

// Registration hook for cuda/. `device_count` returns the number of usable devices or
// an error explaining why there are none; `make` creates the backend for an index.
// `make_pinned_host` (optional) creates the cpu_pinned backend: page-locked host
// memory (cudaHostAlloc) whose streams and events are the GPUs' (MakePinnedHostBackend).
struct CudaBackendFactory {
  std::function<absl::StatusOr<int>()> device_count;
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(const Config&, int)> make;
  std::function<absl::StatusOr<std::unique_ptr<Backend>>()> make_pinned_host;
};
void RegisterCudaBackendFactory(CudaBackendFactory factory);

// The simulated and cpu backends, directly (tests use these). MakeSimBackend takes any
// index (sim_devices is not checked) and throws std::runtime_error when the device's
// address space cannot be reserved; MakeBackend returns that as an error.
std::unique_ptr<Backend> MakeSimBackend(const Config& config, int index = 0);
std::unique_ptr<Backend> MakeCpuBackend();

// The backend of the cpu_pinned device: the cuda factory's pinned host memory when it
// is registered and finds a device; otherwise plain host memory (the cpu backend,
// reporting cpu_pinned), said once on stderr in one line with the reason. Never fails.
std::unique_ptr<Backend> MakePinnedHostBackend();

}  // namespace devmem
