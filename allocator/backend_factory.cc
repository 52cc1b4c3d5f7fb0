// allocator/backend_factory.cc: makes the backend a Config asks for
// (backend_factory.h), and holds the registration slot that cuda/ fills.
#include "allocator/backend_factory.h"

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "allocator/cpu_backend.h"
#include "allocator/mutex.h"
#include "allocator/sim_backend.h"

namespace devmem {
namespace {

constexpr absl::string_view kBuiltWithoutCuda = "devmem was built without CUDA support";

// The cuda factory slot. A function-local static, so it is constructed before its
// first use even when that use is another file's static initializer (cuda/ registers
// itself that way). Guarded by a mutex because registration and use may race.
struct CudaRegistry {
  Mutex mu;
  std::optional<CudaBackendFactory> factory ABSL_GUARDED_BY(mu);
};
CudaRegistry& Registry() {
  static CudaRegistry* registry = new CudaRegistry;  // never destroyed: no exit races
  return *registry;
}

// A copy of the registered factory, so it is called without the registry's lock.
std::optional<CudaBackendFactory> CudaFactory() {
  CudaRegistry& registry = Registry();
  MutexLock lock(&registry.mu);
  return registry.factory;
}

struct AutoResolution {
  BackendKind kind = BackendKind::kSim;
  std::string why_not_cuda;
};

AutoResolution ResolveAuto() {
  std::optional<CudaBackendFactory> cuda = CudaFactory();
  if (!cuda) return {BackendKind::kSim, std::string(kBuiltWithoutCuda)};
  absl::StatusOr<int> count = cuda->device_count();
  if (!count.ok()) return {BackendKind::kSim, std::string(count.status().message())};
  if (*count <= 0) return {BackendKind::kSim, "the CUDA driver reports 0 devices"};
  return {BackendKind::kCuda, ""};
}

}  // namespace

void RegisterCudaBackendFactory(CudaBackendFactory factory) {
  CudaRegistry& registry = Registry();
  MutexLock lock(&registry.mu);
  registry.factory = std::move(factory);
}

BackendKind ResolveAutoBackend(std::string* why_not_cuda) {
  // Computed once (a function-local static is initialized exactly once, thread-safely),
  // and the fallback is announced once per process, on one line.
  static const AutoResolution* resolution = [] {
    auto* r = new AutoResolution(ResolveAuto());
    if (r->kind != BackendKind::kCuda) {
      std::fprintf(stderr,
                   "devmem: no CUDA device (%s); backend:auto uses the simulated device "
                   "(sim)\n",
                   r->why_not_cuda.c_str());
    }
    return r;
  }();
  if (why_not_cuda != nullptr) *why_not_cuda = resolution->why_not_cuda;
  return resolution->kind;
}

namespace {
SimOptions SimOptionsFor(const Config& config, int index) {
  SimOptions options;
  options.index = index;
  options.capacity = config.sim_capacity;
  options.alloc_latency_ns = config.sim_alloc_latency_ns;
  options.free_latency_ns = config.sim_free_latency_ns;
  options.fail_nth = config.sim_fail_nth;
  options.fail_probability = config.sim_fail_probability;
  options.seed = config.sim_seed;
  options.driver_costs = config.sim_driver_cost;
  return options;
}
}  // namespace

std::unique_ptr<Backend> MakeSimBackend(const Config& config, int index) {
  return NewSimBackend(SimOptionsFor(config, index));
}

std::unique_ptr<Backend> MakeCpuBackend() { return NewCpuBackend(); }

std::unique_ptr<Backend> MakePinnedHostBackend() {
  std::string why = std::string(kBuiltWithoutCuda);
  if (std::optional<CudaBackendFactory> cuda = CudaFactory();
      cuda && cuda->make_pinned_host) {
    absl::StatusOr<int> count = cuda->device_count();
    if (count.ok() && *count > 0) {
      absl::StatusOr<std::unique_ptr<Backend>> pinned = cuda->make_pinned_host();
      if (pinned.ok()) return *std::move(pinned);
      why = std::string(pinned.status().message());
    } else {
      why = count.ok() ? "the CUDA driver reports 0 devices"
                       : std::string(count.status().message());
    }
  }
  std::fprintf(stderr, "devmem: cpu_pinned is plain host memory here (%s)\n", why.c_str());
  return NewCpuBackend(DeviceId{DeviceType::kCpuPinned, 0});
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const Config& config, int index) {
  if (index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("backend:", std::string(BackendKindName(config.backend)),
                     ": device index ", index, " is negative"));
  }
  BackendKind kind = config.backend;
  if (kind == BackendKind::kAuto) kind = ResolveAutoBackend();
  switch (kind) {
    case BackendKind::kSim: {
      if (index >= config.sim_devices) {
        return absl::InvalidArgumentError(absl::StrCat(
            "backend:sim: sim:", index, " does not exist (sim_devices is ",
            config.sim_devices, ": sim:0 .. sim:", config.sim_devices - 1, ")"));
      }
      absl::StatusOr<std::unique_ptr<SimBackend>> sim =
          CreateSimBackend(SimOptionsFor(config, index));
      if (!sim.ok()) return sim.status();
      return std::unique_ptr<Backend>(*std::move(sim));
    }
    case BackendKind::kCpu:
      if (index != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "backend:cpu: device index ", index, " requested; cpu has only index 0"));
      }
      return MakeCpuBackend();
    case BackendKind::kCuda: {
      std::optional<CudaBackendFactory> cuda = CudaFactory();
      if (!cuda) {
        return absl::FailedPreconditionError(
            absl::StrCat("backend:cuda: ", kBuiltWithoutCuda));
      }
      absl::StatusOr<int> count = cuda->device_count();
      if (!count.ok()) {
        return absl::Status(count.status().code(),
                            absl::StrCat("backend:cuda: ", count.status().message()));
      }
      if (index >= *count) {
        return absl::UnavailableError(absl::StrCat(
            "backend:cuda: cuda:", index, " does not exist (the CUDA driver reports ",
            *count, " device", *count == 1 ? "" : "s", ")"));
      }
      return cuda->make(config, index);
    }
    case BackendKind::kAuto:
      break;  // resolved above
  }
  return absl::InternalError("MakeBackend: unknown backend kind");
}

}  // namespace devmem
