// cuda/cuda_backend.cc: the CUDA backend (cuda_backend.h), and its registration with
// allocator/backend_factory.h.
//
// Error policy:
//   * allocate_segment: cudaErrorMemoryAllocation is ResourceExhausted (the sticky
//     last-error is cleared so later calls do not see it); other failures name the
//     call and the CUDA error.
//   * Calls whose answer the allocator's correctness rests on (recording, querying and
//     waiting for events, synchronizing streams) end the process with the CUDA error
//     when they fail: answering "done" wrongly would let memory be reused while a
//     kernel still uses it. Such failures mean the CUDA context is already broken.
//   * Clean-up calls (cudaFree, cudaStreamDestroy, cudaEventDestroy) report failures
//     on stderr and carry on, except cudaErrorCudartUnloading (process exit), which is
//     expected and ignored.
#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "allocator/backend_factory.h"
#include "allocator/config.h"

namespace devmem {
namespace {

// "out of memory (cudaErrorMemoryAllocation, error 2)".
std::string CudaErrorText(cudaError_t err) {
  return absl::StrCat(cudaGetErrorString(err), " (", cudaGetErrorName(err), ", error ",
                      static_cast<int>(err), ")");
}

// The absl code for a CUDA failure of `call`.
absl::Status CudaStatus(absl::string_view where, absl::string_view call,
                        cudaError_t err) {
  std::string message = absl::StrCat(where, ": ", call, ": ", CudaErrorText(err));
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(std::move(message));
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
      return absl::UnavailableError(std::move(message));
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
      return absl::InvalidArgumentError(std::move(message));
    default:
      return absl::InternalError(std::move(message));
  }
}

[[noreturn]] void FatalCuda(absl::string_view where, absl::string_view call,
                            cudaError_t err) {
  std::fprintf(stderr, "devmem: fatal: %s: %s: %s\n", std::string(where).c_str(),
               std::string(call).c_str(), CudaErrorText(err).c_str());
  std::fflush(stderr);
  std::abort();
}

void ReportCuda(absl::string_view where, absl::string_view call, cudaError_t err) {
  if (err == cudaSuccess || err == cudaErrorCudartUnloading) return;
  std::fprintf(stderr, "devmem: %s: %s: %s\n", std::string(where).c_str(),
               std::string(call).c_str(), CudaErrorText(err).c_str());
}

// Makes `device` current for the guard's lifetime and restores the caller's current
// device afterwards, so the backend never changes which device its callers' own CUDA
// calls go to. Switching is skipped when the device is already current.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      cudaGetLastError();  // not sticky, but leave nothing behind
      previous_ = -1;
    }
    if (previous_ != device) cudaSetDevice(device);
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

cudaStream_t ToCuda(Stream stream) {
  return reinterpret_cast<cudaStream_t>(stream.handle);
}
cudaEvent_t ToCuda(Event event) { return reinterpret_cast<cudaEvent_t>(event.handle); }

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", the form nvidia-smi and DCGM print.
std::string FormatUuid(const cudaUUID_t& uuid) {
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    absl::StrAppendFormat(&out, "%02x", static_cast<unsigned char>(uuid.bytes[i]));
  }
  return out;
}

// The trampoline cudaLaunchHostFunc calls; owns and deletes the function.
void CUDART_CB RunHostFn(void* arg) {
  std::unique_ptr<std::function<void()>> fn(static_cast<std::function<void()>*>(arg));
  (*fn)();
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int index, DeviceInfo info)
      : device_{DeviceType::kCuda, index},
        name_(device_.ToString()),
        info_(std::move(info)) {}

  DeviceId device() const override { return device_; }
  Capabilities caps() const override {
    return Capabilities{
        .streams = true, .virtual_memory = false, .host_accessible = false};
  }
  DeviceInfo info() const override { return info_; }

  absl::StatusOr<void*> allocate_segment(size_t bytes) override {
    DeviceGuard guard(device_.index);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaSuccess) return p;
    // cudaMalloc's failure is also left as the thread's last error; clear it so that
    // the next unrelated cudaGetLastError() does not report this handled OOM.
    cudaGetLastError();
    std::string call =
        absl::StrCat("cudaMalloc(", bytes, " bytes = ", FormatBytes(bytes), ")");
    return CudaStatus(name_, call, err);
  }

  void free_segment(void* p, size_t bytes) override {
    DeviceGuard guard(device_.index);
    ReportCuda(name_, absl::StrFormat("cudaFree(%p, %u bytes)", p, bytes), cudaFree(p));
  }

  MemInfo mem_info() override {
    DeviceGuard guard(device_.index);
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    if (cudaError_t err = cudaMemGetInfo(&free_bytes, &total_bytes); err != cudaSuccess) {
      ReportCuda(name_, "cudaMemGetInfo", err);
      return MemInfo{};
    }
    return MemInfo{.free_bytes = free_bytes, .total_bytes = total_bytes};
  }

  absl::StatusOr<Stream> create_stream() override {
    DeviceGuard guard(device_.index);
    cudaStream_t stream = nullptr;
    if (cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        err != cudaSuccess) {
      return CudaStatus(name_, "cudaStreamCreateWithFlags(cudaStreamNonBlocking)", err);
    }
    return Stream{reinterpret_cast<uintptr_t>(stream)};
  }

  void destroy_stream(Stream stream) override {
    if (stream.handle == 0) return;  // the default stream is not ours to destroy
    DeviceGuard guard(device_.index);
    // The contract promises the queued work has run when this returns.
    ReportCuda(name_, "cudaStreamSynchronize", cudaStreamSynchronize(ToCuda(stream)));
    ReportCuda(name_, "cudaStreamDestroy", cudaStreamDestroy(ToCuda(stream)));
  }

  absl::Status launch_host_fn(Stream stream, std::function<void()> fn) override {
    if (!fn) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": launch_host_fn of an empty function"));
    }
    DeviceGuard guard(device_.index);
    auto owned = std::make_unique<std::function<void()>>(std::move(fn));
    if (cudaError_t err = cudaLaunchHostFunc(ToCuda(stream), RunHostFn, owned.get());
        err != cudaSuccess) {
      return CudaStatus(name_, "cudaLaunchHostFunc", err);
    }
    owned.release();  // RunHostFn deletes it
    return absl::OkStatus();
  }

  Event record_event(Stream stream) override {
    DeviceGuard guard(device_.index);
    cudaEvent_t event = nullptr;
    if (cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        err != cudaSuccess) {
      FatalCuda(name_, "cudaEventCreateWithFlags(cudaEventDisableTiming)", err);
    }
    if (cudaError_t err = cudaEventRecord(event, ToCuda(stream)); err != cudaSuccess) {
      FatalCuda(name_, "cudaEventRecord", err);
    }
    return Event{reinterpret_cast<uintptr_t>(event)};
  }

  bool event_done(Event event) override {
    // Events are not tied to a current device for queries; no guard needed.
    cudaError_t err = cudaEventQuery(ToCuda(event));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) {
      cudaGetLastError();  // NotReady is not an error, but clear it anyway
      return false;
    }
    FatalCuda(name_, "cudaEventQuery", err);
  }

  void synchronize_event(Event event) override {
    if (cudaError_t err = cudaEventSynchronize(ToCuda(event)); err != cudaSuccess) {
      FatalCuda(name_, "cudaEventSynchronize", err);
    }
  }

  void release_event(Event event) override {
    ReportCuda(name_, "cudaEventDestroy", cudaEventDestroy(ToCuda(event)));
  }

  void synchronize_stream(Stream stream) override {
    DeviceGuard guard(device_.index);
    if (cudaError_t err = cudaStreamSynchronize(ToCuda(stream)); err != cudaSuccess) {
      FatalCuda(name_, "cudaStreamSynchronize", err);
    }
  }

 private:
  const DeviceId device_;
  const std::string name_;  // "cuda:N", for messages
  const DeviceInfo info_;
};

// Registers the factory before main(): cuda/ is linked whole-archive, so this object
// file (and this initializer) is always in the program.
[[maybe_unused]] const bool kRegistered = [] {
  RegisterCudaBackendFactory(CudaBackendFactory{
      .device_count = [] { return CudaDeviceCount(); },
      .make = [](const Config&, int index) { return NewCudaBackend(index); },
  });
  return true;
}();

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("cudaGetDeviceCount: ", CudaErrorText(err)));
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(int index) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (index < 0 || index >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda:", index, " does not exist (the CUDA driver reports ", *count,
                     " devices)"));
  }
  const std::string name = absl::StrCat("cuda:", index);
  cudaDeviceProp prop{};
  if (cudaError_t err = cudaGetDeviceProperties(&prop, index); err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(name, "cudaGetDeviceProperties", err);
  }
  DeviceInfo info{.name = prop.name, .uuid = FormatUuid(prop.uuid), .backend = "cuda"};
  return std::make_unique<CudaBackend>(index, std::move(info));
}

}  // namespace devmem
