// cuda/cuda_backend.cc: the CUDA backend (cuda_backend.h), and its registration with
// allocator/backend_factory.h.
//
// Virtual memory (expandable segments) uses the driver API's cuMem* calls, which are
// not in the runtime. libcuda is never linked: a devmem program must start, and fall
// back to sim, on a machine without a driver. The driver's entry points are fetched
// once per process through the runtime (cudaGetDriverEntryPointByVersion, DriverApi()
// below); <cuda.h> is included for its types and enums only. One physical allocation
// (cuMemCreate) backs each granule, and a table maps granule addresses to their
// handles, so that unmap may take any granule-aligned part of earlier maps, as the
// allocator asks (PyTorch's ExpandableSegment does the same).
//
// Driver cost (allocator/driver_calls.h): an unmapped granule keeps its handle in a
// physical-handle reserve, and map takes handles from it before calling cuMemCreate,
// so a warm device remaps without creating; release_handle_reserve() gives the
// reserve back (cuMemRelease). cuMemMap is one call per handle (about 1 us: each
// granule is its own allocation, so that any granule can be unmapped alone), while
// cuMemSetAccess and cuMemUnmap take each contiguous range in one call, as NVIDIA's
// vectorAddMMAP sample does over several mappings. Every driver call is counted by
// kind with the time it took (steady clock around the call).
//
// Error policy:
//   * allocate_segment: cudaErrorMemoryAllocation is ResourceExhausted (the sticky
//     last-error is cleared so later calls do not see it); other failures name the
//     call and the CUDA error.
//   * map: CUDA_ERROR_OUT_OF_MEMORY from cuMemCreate is ResourceExhausted; any other
//     driver failure names the call and the driver's error. Either way the granules
//     this call mapped are unmapped first, the handles it created released and those it
//     took from the reserve put back, so a failed map leaves the device as it was. Bad arguments (misaligned, outside every reservation,
//     overlapping a mapping) are InvalidArgument naming the pointer and size.
//     reserve_address fails the same way (ResourceExhausted when the driver has no
//     address space left).
//   * Calls whose answer the allocator's correctness rests on (recording, querying and
//     waiting for events, synchronizing streams) and the calls that give memory back
//     (free_segment's cudaFree, unmap's cuMemUnmap and cuMemRelease) throw DriverError
//     (allocator/errors.h) naming the device, the call and the CUDA error when they
//     fail: answering "done" wrongly would let memory be reused while a kernel still
//     uses it, and a failed free must not be counted as memory given back. Such
//     failures mean the CUDA context is broken (a sticky error after a device-side
//     assert or an illegal address); the allocator poisons itself on one and never
//     ends the process (backend.h). cudaErrorCudartUnloading and
//     CUDA_ERROR_DEINITIALIZED (process exit) are expected there and ignored.
//   * Clean-up calls of what the allocator no longer holds (cudaStreamDestroy,
//     cudaEventDestroy, release_address's cuMemAddressFree) report failures on stderr
//     and carry on, with the same two exceptions. unmap and release_address of a
//     range that is not (entirely) mapped or reserved are reported the same way and
//     change nothing.
//   * Graph capture: capture_state is cudaStreamGetCaptureInfo (a failure is a
//     DriverError naming it); allocate_segment_during_capture is cudaMalloc with
//     the thread's capture interaction mode relaxed for the call.
//   * A runtime failure that is returned or reported is handled: the thread's last
//     error it set is cleared (CudaStatus, ReportCuda), as allocate_segment does.
#include "cuda/cuda_backend.h"

#include <cuda.h>  // driver API types and enums only: no cu* function is linked
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <map>
#include <stdexcept>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/base/thread_annotations.h"
#include "allocator/backend_factory.h"
#include "allocator/config.h"
#include "allocator/errors.h"
#include "allocator/mutex.h"
#include "cuda/cuda_device_guard.h"

namespace devmem {
namespace {

// "out of memory (cudaErrorMemoryAllocation, error 2)".
std::string CudaErrorText(cudaError_t err) {
  return absl::StrCat(cudaGetErrorString(err), " (", cudaGetErrorName(err), ", error ",
                      static_cast<int>(err), ")");
}

// The absl code for a CUDA failure of `call`. Also clears the thread's last error,
// which the failed call set: the failure is handled here, so the program's next
// cudaGetLastError() (PyTorch checks it after every kernel launch) must not see it.
absl::Status CudaStatus(absl::string_view where, absl::string_view call,
                        cudaError_t err) {
  cudaGetLastError();
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

// Errors after which the context is corrupt and every later call on it fails the same
// way ("sticky": the CUDA runtime documentation's "the process must be terminated and
// relaunched"). Even where a method returns a Status, these throw DriverError, so
// that the allocator learns the device is gone instead of retrying.
bool IsSticky(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

// A failure of a call that returns no Status (backend.h): DriverError, with the
// thread's last error cleared as CudaStatus does.
[[noreturn]] void ThrowCuda(absl::string_view where, absl::string_view call,
                            cudaError_t err) {
  throw DriverError(std::string(CudaStatus(where, call, err).message()));
}

void ReportCuda(absl::string_view where, absl::string_view call, cudaError_t err) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // handled here, as in CudaStatus
  if (err == cudaErrorCudartUnloading) return;
  std::fprintf(stderr, "devmem: %s: %s: %s\n", std::string(where).c_str(),
               std::string(call).c_str(), CudaErrorText(err).c_str());
}

// --- the driver API, through the runtime ---------------------------------------------

// The driver entry points the virtual-memory code uses. Their types come from <cuda.h>'s
// declarations (decltype does not reference the symbols, so nothing links libcuda).
struct DriverApi {
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuGetErrorName) get_error_name = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) mem_get_allocation_granularity = nullptr;
  decltype(&::cuMemAddressReserve) mem_address_reserve = nullptr;
  decltype(&::cuMemAddressFree) mem_address_free = nullptr;
  decltype(&::cuMemCreate) mem_create = nullptr;
  decltype(&::cuMemMap) mem_map = nullptr;
  decltype(&::cuMemSetAccess) mem_set_access = nullptr;
  decltype(&::cuMemUnmap) mem_unmap = nullptr;
  decltype(&::cuMemRelease) mem_release = nullptr;
  // Empty when every entry point resolved; else why one did not.
  std::string error;
  bool ok() const { return error.empty(); }
};

// Fetches `symbol` from the driver into `*fn`, in the version of the <cuda.h> this file
// was compiled against (so the pointer's type matches). False, with the reason in
// `*error`, when the driver lacks it or cannot be loaded.
template <typename Fn>
bool ResolveDriverSymbol(const char* symbol, Fn* fn, std::string* error) {
  void* p = nullptr;
  cudaError_t err = cudaSuccess;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  // cudaGetDriverEntryPoint is deprecated from 12.5 on, in favour of this.
  err = cudaGetDriverEntryPointByVersion(symbol, &p, CUDA_VERSION, cudaEnableDefault,
                                         &found);
#elif CUDART_VERSION >= 12000
  err = cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault, &found);
#else
  err = cudaGetDriverEntryPoint(symbol, &p, cudaEnableDefault);
  if (err == cudaSuccess && p != nullptr) found = cudaDriverEntryPointSuccess;
#endif
  if (err != cudaSuccess) {
    cudaGetLastError();
    *error = absl::StrCat("cudaGetDriverEntryPoint(", symbol, "): ", CudaErrorText(err));
    return false;
  }
  if (found != cudaDriverEntryPointSuccess || p == nullptr) {
    *error = absl::StrCat("the CUDA driver has no ", symbol, " for CUDA ", CUDA_VERSION,
                          found == cudaDriverEntryPointVersionNotSufficent
                              ? " (the driver is older than the toolkit)"
                              : "");
    return false;
  }
  *fn = reinterpret_cast<Fn>(p);
  return true;
}

// The process's driver entry points, resolved on first use (thread-safe: a function-local
// static) and never freed. Call only after the runtime found a device (CudaDeviceCount),
// which also initializes the driver (cuInit) that these calls need.
const DriverApi& Driver() {
  static const DriverApi* const api = [] {
    auto* d = new DriverApi;
    std::string error;
    const bool ok =
        ResolveDriverSymbol("cuGetErrorString", &d->get_error_string, &error) &&
        ResolveDriverSymbol("cuGetErrorName", &d->get_error_name, &error) &&
        ResolveDriverSymbol("cuDeviceGet", &d->device_get, &error) &&
        ResolveDriverSymbol("cuDeviceGetAttribute", &d->device_get_attribute, &error) &&
        ResolveDriverSymbol("cuMemGetAllocationGranularity",
                            &d->mem_get_allocation_granularity, &error) &&
        ResolveDriverSymbol("cuMemAddressReserve", &d->mem_address_reserve, &error) &&
        ResolveDriverSymbol("cuMemAddressFree", &d->mem_address_free, &error) &&
        ResolveDriverSymbol("cuMemCreate", &d->mem_create, &error) &&
        ResolveDriverSymbol("cuMemMap", &d->mem_map, &error) &&
        ResolveDriverSymbol("cuMemSetAccess", &d->mem_set_access, &error) &&
        ResolveDriverSymbol("cuMemUnmap", &d->mem_unmap, &error) &&
        ResolveDriverSymbol("cuMemRelease", &d->mem_release, &error);
    if (!ok) d->error = error.empty() ? "a driver entry point did not resolve" : error;
    return d;
  }();
  return *api;
}

// "out of memory (CUDA_ERROR_OUT_OF_MEMORY, error 2)", the driver's CudaErrorText.
std::string CuErrorText(CUresult result) {
  const DriverApi& d = Driver();
  const char* text = nullptr;
  const char* name = nullptr;
  if (d.get_error_string == nullptr ||
      d.get_error_string(result, &text) != CUDA_SUCCESS) {
    text = nullptr;
  }
  if (d.get_error_name == nullptr || d.get_error_name(result, &name) != CUDA_SUCCESS) {
    name = nullptr;
  }
  return absl::StrCat(text != nullptr ? text : "unknown driver error", " (",
                      name != nullptr ? name : "CUresult", ", error ",
                      static_cast<int>(result), ")");
}

// The absl code for a driver failure of `call` (as CudaStatus for the runtime).
absl::Status CuStatus(absl::string_view where, absl::string_view call, CUresult result) {
  std::string message = absl::StrCat(where, ": ", call, ": ", CuErrorText(result));
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return absl::ResourceExhaustedError(std::move(message));
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_NO_DEVICE:
      return absl::UnavailableError(std::move(message));
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_DEVICE:
      return absl::InvalidArgumentError(std::move(message));
    case CUDA_ERROR_NOT_SUPPORTED:
      return absl::UnimplementedError(std::move(message));
    default:
      return absl::InternalError(std::move(message));
  }
}

// ReportCuda for driver calls; CUDA_ERROR_DEINITIALIZED is the driver's
// cudaErrorCudartUnloading (the process is exiting) and is ignored.
void ReportCu(absl::string_view where, absl::string_view call, CUresult result) {
  if (result == CUDA_SUCCESS || result == CUDA_ERROR_DEINITIALIZED) return;
  std::fprintf(stderr, "devmem: %s: %s: %s\n", std::string(where).c_str(),
               std::string(call).c_str(), CuErrorText(result).c_str());
}

// The driver's sticky errors carry the runtime's numbers (CUDA_ERROR_ASSERT is 710, as
// cudaErrorAssert is).
bool IsStickyCu(CUresult result) { return IsSticky(static_cast<cudaError_t>(result)); }

// ThrowCuda for driver calls.
[[noreturn]] void ThrowCu(absl::string_view where, absl::string_view call,
                          CUresult result) {
  throw DriverError(std::string(CuStatus(where, call, result).message()));
}

void Report(absl::string_view where, absl::string_view message) {
  std::fprintf(stderr, "devmem: %s: %s\n", std::string(where).c_str(),
               std::string(message).c_str());
}

// Pinned device memory on `device`: what each granule is made of.
CUmemAllocationProp PinnedOn(CUdevice device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

// What NewCudaBackend found out about the device's virtual memory management.
struct VirtualMemorySupport {
  bool supported = false;
  CUdevice device = 0;
  size_t granularity = 0;  // the recommended granularity, at least 2 MiB
  std::string unavailable;  // why not, when !supported
};

constexpr size_t kMinGranularity = 2 * kMiB;

VirtualMemorySupport ProbeVirtualMemory(const std::string& name, int index) {
  VirtualMemorySupport vm;
  const DriverApi& d = Driver();
  if (!d.ok()) {
    vm.unavailable = d.error;
    return vm;
  }
  DeviceGuard guard(index, DeviceGuard::kBindContext);
  if (CUresult r = d.device_get(&vm.device, index); r != CUDA_SUCCESS) {
    vm.unavailable = std::string(CuStatus(name, "cuDeviceGet", r).message());
    return vm;
  }
  int supported = 0;
  if (CUresult r = d.device_get_attribute(
          &supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, vm.device);
      r != CUDA_SUCCESS) {
    vm.unavailable = std::string(
        CuStatus(name,
                 "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_"
                 "SUPPORTED)",
                 r)
            .message());
    return vm;
  }
  if (supported == 0) {
    vm.unavailable = "the device reports no virtual memory management "
                     "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0)";
    return vm;
  }
  const CUmemAllocationProp prop = PinnedOn(vm.device);
  size_t recommended = 0;
  if (CUresult r = d.mem_get_allocation_granularity(&recommended, &prop,
                                                    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
      r != CUDA_SUCCESS || recommended == 0) {
    vm.unavailable =
        r != CUDA_SUCCESS
            ? std::string(CuStatus(name,
                                   "cuMemGetAllocationGranularity(pinned device memory, "
                                   "CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)",
                                   r)
                              .message())
            : std::string("cuMemGetAllocationGranularity reported a granularity of 0");
    return vm;
  }
  // At least 2 MiB (the allocator's large-block rounding), and still a multiple of
  // what the driver recommends.
  const size_t at_least = std::max(recommended, kMinGranularity);
  vm.granularity = (at_least + recommended - 1) / recommended * recommended;
  vm.supported = true;
  return vm;
}

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
  StreamCallbackScope scope;  // backend.h: callbacks must not call the allocator
  (*fn)();
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int index, DeviceInfo info, VirtualMemorySupport vm)
      : device_{DeviceType::kCuda, index},
        name_(device_.ToString()),
        info_(std::move(info)),
        vm_(std::move(vm)) {}

  // Gives back what the allocator left mapped or reserved (nothing, normally).
  ~CudaBackend() override {
    MutexLock lock(&vm_mu_);
    if (granules_.empty() && reservations_.empty() && spare_.empty()) return;
    DeviceGuard guard(device_.index, DeviceGuard::kBindContext);
    const DriverApi& d = Driver();
    for (const auto& [at, handle] : granules_) {
      ReportCu(name_, "cuMemUnmap", d.mem_unmap(at, vm_.granularity));
      ReportCu(name_, "cuMemRelease", d.mem_release(handle));
    }
    for (CUmemGenericAllocationHandle handle : spare_) {
      ReportCu(name_, "cuMemRelease", d.mem_release(handle));
    }
    spare_.clear();
    for (const auto& [base, bytes] : reservations_) {
      ReportCu(name_, "cuMemAddressFree", d.mem_address_free(base, bytes));
    }
    granules_.clear();
    reservations_.clear();
  }

  DeviceId device() const override { return device_; }
  Capabilities caps() const override {
    return Capabilities{
        .streams = true, .virtual_memory = vm_.supported, .host_accessible = false};
  }
  DeviceInfo info() const override { return info_; }

  absl::StatusOr<void*> allocate_segment(size_t bytes) override {
    DeviceGuard guard(device_.index);
    void* p = nullptr;
    cudaError_t err = Timed(DriverCall::kMalloc, [&] { return cudaMalloc(&p, bytes); });
    if (err == cudaSuccess) return p;
    // cudaMalloc's failure is also left as the thread's last error; clear it so that
    // the next unrelated cudaGetLastError() does not report this handled OOM.
    cudaGetLastError();
    std::string call =
        absl::StrCat("cudaMalloc(", bytes, " bytes = ", FormatBytes(bytes), ")");
    if (IsSticky(err)) ThrowCuda(name_, call, err);
    return CudaStatus(name_, call, err);
  }

  void free_segment(void* p, size_t bytes) override {
    DeviceGuard guard(device_.index);
    if (cudaError_t err = Timed(DriverCall::kFree, [&] { return cudaFree(p); });
        err != cudaSuccess) {
      if (err == cudaErrorCudartUnloading) {  // process exit: the memory goes with it
        cudaGetLastError();
        return;
      }
      ThrowCuda(name_, absl::StrFormat("cudaFree(%p, %u bytes)", p, bytes), err);
    }
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
      ThrowCuda(name_, "cudaEventCreateWithFlags(cudaEventDisableTiming)", err);
    }
    if (cudaError_t err = cudaEventRecord(event, ToCuda(stream)); err != cudaSuccess) {
      ReportCuda(name_, "cudaEventDestroy (of an event whose record failed)",
                 cudaEventDestroy(event));
      ThrowCuda(name_, "cudaEventRecord", err);
    }
    return Event{reinterpret_cast<uintptr_t>(event)};
  }

  // The CUDA idiom: an event is created once and recorded again for each use.
  bool rerecord_event(Event event, Stream stream) override {
    DeviceGuard guard(device_.index);
    if (cudaError_t err = cudaEventRecord(ToCuda(event), ToCuda(stream)); err != cudaSuccess) {
      ThrowCuda(name_, "cudaEventRecord", err);
    }
    return true;
  }

  bool event_done(Event event) override {
    // Events are not tied to a current device for queries; no guard needed.
    cudaError_t err = cudaEventQuery(ToCuda(event));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) {
      cudaGetLastError();  // NotReady is not an error, but clear it anyway
      return false;
    }
    ThrowCuda(name_, "cudaEventQuery", err);
  }

  void synchronize_event(Event event) override {
    if (cudaError_t err = cudaEventSynchronize(ToCuda(event)); err != cudaSuccess) {
      ThrowCuda(name_, "cudaEventSynchronize", err);
    }
  }

  void release_event(Event event) override {
    ReportCuda(name_, "cudaEventDestroy", cudaEventDestroy(ToCuda(event)));
  }

  void synchronize_stream(Stream stream) override {
    DeviceGuard guard(device_.index);
    if (cudaError_t err = cudaStreamSynchronize(ToCuda(stream)); err != cudaSuccess) {
      ThrowCuda(name_, "cudaStreamSynchronize", err);
    }
  }

  // --- graph capture ------------------------------------------------------------------

  CaptureState capture_state(Stream stream) override {
    DeviceGuard guard(device_.index);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    const cudaError_t err = cudaStreamGetCaptureInfo(ToCuda(stream), &status, &id);
    if (err == cudaErrorStreamCaptureImplicit) {
      // The legacy stream while a blocking stream captures: unusable, as if capturing.
      cudaGetLastError();
      return CaptureState::kActive;
    }
    if (err != cudaSuccess) {
      throw DriverError(
          std::string(CudaStatus(name_, "cudaStreamGetCaptureInfo", err).message()));
    }
    switch (status) {
      case cudaStreamCaptureStatusActive: return CaptureState::kActive;
      case cudaStreamCaptureStatusInvalidated: return CaptureState::kInvalidated;
      default: return CaptureState::kNone;
    }
  }

  absl::StatusOr<void*> allocate_segment_during_capture(size_t bytes) override {
    // Relaxed for this thread only, restored after: cudaMalloc is allowed during a
    // capture then, and the graph keeps the address (PyTorch's cudaMallocMaybeCapturing).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (cudaError_t err = cudaThreadExchangeStreamCaptureMode(&mode); err != cudaSuccess) {
      return CudaStatus(name_, "cudaThreadExchangeStreamCaptureMode(relaxed)", err);
    }
    absl::StatusOr<void*> p = allocate_segment(bytes);
    cudaThreadExchangeStreamCaptureMode(&mode);  // back to the caller's mode
    return p;
  }

  // --- virtual memory -----------------------------------------------------------------

  size_t granularity() const override { return vm_.supported ? vm_.granularity : 0; }

  absl::StatusOr<void*> reserve_address(size_t bytes) override {
    if (!vm_.supported) return NoVirtualMemory();
    if (bytes == 0 || bytes % vm_.granularity != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: reserve_address(%u bytes): the size must be a non-zero multiple of the "
          "granularity (%u bytes)",
          name_, bytes, vm_.granularity));
    }
    DeviceGuard guard(device_.index, DeviceGuard::kBindContext);
    CUdeviceptr base = 0;
    if (CUresult r = Timed(DriverCall::kAddressReserve,
                           [&] {
                             return Driver().mem_address_reserve(&base, bytes,
                                                                 vm_.granularity, 0, 0);
                           });
        r != CUDA_SUCCESS) {
      return CuStatus(name_,
                      absl::StrCat("cuMemAddressReserve(", bytes, " bytes = ",
                                   FormatBytes(bytes), ")"),
                      r);
    }
    MutexLock lock(&vm_mu_);
    reservations_.emplace(base, bytes);
    return reinterpret_cast<void*>(base);
  }

  void release_address(void* p, size_t bytes) override {
    const auto base = reinterpret_cast<CUdeviceptr>(p);
    const std::string call = absl::StrFormat("release_address(%p, %u bytes)", p, bytes);
    MutexLock lock(&vm_mu_);
    auto it = reservations_.find(base);
    if (it == reservations_.end() || it->second != bytes) {
      Report(name_, absl::StrCat(call, ": not a range reserve_address returned; nothing "
                                       "released"));
      return;
    }
    if (const size_t mapped = MappedGranules(base, bytes); mapped > 0) {
      Report(name_, absl::StrFormat("%s: %u granules (%u bytes) of it are still mapped; "
                                    "unmap them first; nothing released",
                                    call, mapped, mapped * vm_.granularity));
      return;
    }
    reservations_.erase(it);
    DeviceGuard guard(device_.index, DeviceGuard::kBindContext);
    ReportCu(name_, absl::StrCat("cuMemAddressFree (", call, ")"),
             Timed(DriverCall::kAddressFree,
                   [&] { return Driver().mem_address_free(base, bytes); }));
  }

  // One cuMemMap per granule, of a handle from the reserve or else a new one
  // (cuMemCreate), then one cuMemSetAccess over the range.
  absl::Status map(void* p, size_t bytes) override {
    if (!vm_.supported) return NoVirtualMemory();
    const auto start = reinterpret_cast<CUdeviceptr>(p);
    const size_t g = vm_.granularity;
    const std::string call = absl::StrFormat("map(%p, %u bytes)", p, bytes);
    if (bytes == 0 || start % g != 0 || bytes % g != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %s: the address and size must be non-zero multiples of the granularity "
          "(%u bytes)",
          name_, call, g));
    }
    const CUdeviceptr end = start + bytes;
    if (end < start) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": ", call, ": the range wraps around"));
    }
    DeviceGuard guard(device_.index, DeviceGuard::kBindContext);
    MutexLock lock(&vm_mu_);
    if (!InsideOneReservation(start, bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name_, ": ", call, ": not inside a range that reserve_address returned"));
    }
    if (auto it = granules_.lower_bound(start);
        it != granules_.end() && it->first < end) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %s: %p is already mapped", name_, call,
                          reinterpret_cast<void*>(it->first)));
    }
    const DriverApi& d = Driver();
    const CUmemAllocationProp prop = PinnedOn(vm_.device);
    Granules made;
    made.reserve(bytes / g);
    for (CUdeviceptr at = start; at < end; at += g) {
      CUmemGenericAllocationHandle handle = 0;
      const bool reused = !spare_.empty();
      if (reused) {
        handle = spare_.back();
        spare_.pop_back();
      } else if (CUresult r = Timed(DriverCall::kCreate,
                                    [&] { return d.mem_create(&handle, g, &prop, 0); });
                 r != CUDA_SUCCESS) {
        Undo(start, made);
        const std::string what =
            absl::StrFormat("cuMemCreate(%u bytes = %s) for granule %u of %u of %s", g,
                            FormatBytes(g), (at - start) / g + 1, bytes / g, call);
        if (IsStickyCu(r)) ThrowCu(name_, what, r);
        return CuStatus(name_, what, r);
      }
      if (CUresult r = Timed(DriverCall::kMap, [&] { return d.mem_map(at, g, 0, handle, 0); });
          r != CUDA_SUCCESS) {
        if (reused) {
          spare_.push_back(handle);
        } else {
          ReportCu(name_, "cuMemRelease (undoing a failed map)",
                   Timed(DriverCall::kRelease, [&] { return d.mem_release(handle); }));
        }
        Undo(start, made);
        return CuStatus(name_,
                        absl::StrFormat("cuMemMap(%p, %u bytes) of %s",
                                        reinterpret_cast<void*>(at), g, call),
                        r);
      }
      made.push_back(MadeGranule{at, handle, reused});
    }
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = vm_.device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (CUresult r = Timed(DriverCall::kSetAccess,
                           [&] { return d.mem_set_access(start, bytes, &access, 1); });
        r != CUDA_SUCCESS) {
      Undo(start, made);
      return CuStatus(name_, absl::StrCat("cuMemSetAccess(read/write) of ", call), r);
    }
    for (const MadeGranule& m : made) granules_.emplace(m.at, m.handle);
    return absl::OkStatus();
  }

  // The caller synchronizes the stream that owns the range before calling this
  // (the segment sources' release calls synchronize_stream first): cuMemUnmap does not
  // wait for kernels that may still use the memory, as cudaFree implicitly does.
  // One cuMemUnmap for the range; its handles go to the reserve.
  void unmap(void* p, size_t bytes) override {
    const auto start = reinterpret_cast<CUdeviceptr>(p);
    const std::string call = absl::StrFormat("unmap(%p, %u bytes)", p, bytes);
    if (!vm_.supported) {
      Report(name_, absl::StrCat(call, ": ", NoVirtualMemory().message()));
      return;
    }
    const size_t g = vm_.granularity;
    if (bytes == 0 || start % g != 0 || bytes % g != 0 || start + bytes < start) {
      Report(name_, absl::StrFormat("%s: the address and size must be non-zero multiples "
                                    "of the granularity (%u bytes); nothing unmapped",
                                    call, g));
      return;
    }
    MutexLock lock(&vm_mu_);
    if (MappedGranules(start, bytes) != bytes / g) {
      Report(name_, absl::StrCat(call, ": the range is not entirely mapped; nothing "
                                       "unmapped"));
      return;
    }
    DeviceGuard guard(device_.index, DeviceGuard::kBindContext);
    const DriverApi& d = Driver();
    // One call for the range. A driver failure throws before the table changes (on a
    // sticky error the driver has changed nothing either); the handles stay mapped.
    if (CUresult r = Timed(DriverCall::kUnmap, [&] { return d.mem_unmap(start, bytes); });
        r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED) {
      ThrowCu(name_, absl::StrCat("cuMemUnmap of ", call), r);
    }
    auto it = granules_.lower_bound(start);
    while (it != granules_.end() && it->first < start + bytes) {
      spare_.push_back(it->second);
      it = granules_.erase(it);
    }
  }

  size_t release_handle_reserve() override {
    MutexLock lock(&vm_mu_);
    if (spare_.empty()) return 0;
    DeviceGuard guard(device_.index, DeviceGuard::kBindContext);
    const DriverApi& d = Driver();
    const size_t bytes = spare_.size() * vm_.granularity;
    for (CUmemGenericAllocationHandle handle : spare_) {
      ReportCu(name_, "cuMemRelease (the handle reserve)",
               Timed(DriverCall::kRelease, [&] { return d.mem_release(handle); }));
    }
    spare_.clear();
    return bytes;
  }

  size_t handle_reserve_bytes() const override {
    MutexLock lock(&vm_mu_);
    return spare_.size() * vm_.granularity;
  }

  DriverCallStats driver_calls() const override {
    DriverCallStats s = calls_.read();
    s.handle_reserve_bytes = static_cast<int64_t>(handle_reserve_bytes());
    return s;
  }

 private:
  absl::Status NoVirtualMemory() const {
    return absl::UnimplementedError(
        absl::StrCat(name_, ": no virtual memory management: ", vm_.unavailable));
  }

  // True when [start, start + bytes) lies inside one range from reserve_address.
  bool InsideOneReservation(CUdeviceptr start, size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(vm_mu_) {
    auto it = reservations_.upper_bound(start);
    if (it == reservations_.begin()) return false;
    --it;
    return start - it->first <= it->second && bytes <= it->second - (start - it->first);
  }

  // How many granules of [start, start + bytes) are mapped.
  size_t MappedGranules(CUdeviceptr start, size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(vm_mu_) {
    return static_cast<size_t>(std::distance(granules_.lower_bound(start),
                                             granules_.lower_bound(start + bytes)));
  }

  // Granules a map call mapped, in address order, and whether each handle came from
  // the reserve.
  struct MadeGranule {
    CUdeviceptr at;
    CUmemGenericAllocationHandle handle;
    bool reused;
  };
  using Granules = std::vector<MadeGranule>;

  // Takes back a failed map's granules (mapped from `start` on, contiguous): one
  // cuMemUnmap; the handles taken from the reserve go back to it, those this map
  // created are released.
  void Undo(CUdeviceptr start, const Granules& made) ABSL_EXCLUSIVE_LOCKS_REQUIRED(vm_mu_) {
    if (made.empty()) return;
    const DriverApi& d = Driver();
    ReportCu(name_, "cuMemUnmap (undoing a failed map)",
             Timed(DriverCall::kUnmap, [&] {
               return d.mem_unmap(start, made.size() * vm_.granularity);
             }));
    for (const MadeGranule& m : made) {
      if (m.reused) {
        spare_.push_back(m.handle);
      } else {
        ReportCu(name_, "cuMemRelease (undoing a failed map)",
                 Timed(DriverCall::kRelease, [&] { return d.mem_release(m.handle); }));
      }
    }
  }

  // Runs the driver call `fn`, counting it as `call` with the time it took.
  template <typename Fn>
  auto Timed(DriverCall call, Fn&& fn) const -> decltype(fn()) {
    const auto t0 = std::chrono::steady_clock::now();
    auto result = fn();
    calls_.add(call, 1,
               std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now() - t0)
                   .count());
    return result;
  }

  const DeviceId device_;
  const std::string name_;  // "cuda:N", for messages
  const DeviceInfo info_;
  const VirtualMemorySupport vm_;

  // Virtual memory: every range reserve_address returned (base -> bytes), and the
  // physical allocation behind each mapped granule (granule address -> handle). Held
  // across the driver calls of map/unmap so a range is never half-mapped to others.
  mutable Mutex vm_mu_;
  std::map<CUdeviceptr, size_t> reservations_ ABSL_GUARDED_BY(vm_mu_);
  std::map<CUdeviceptr, CUmemGenericAllocationHandle> granules_ ABSL_GUARDED_BY(vm_mu_);
  // The physical-handle reserve: granule handles unmapped and not released.
  std::vector<CUmemGenericAllocationHandle> spare_ ABSL_GUARDED_BY(vm_mu_);
  mutable DriverCallCounter calls_;  // thread-safe on its own
};

// The cpu_pinned device's backend (cuda_backend.h, NewCudaPinnedHostBackend).
class PinnedHostBackend final : public Backend {
 public:
  DeviceId device() const override { return DeviceId{DeviceType::kCpuPinned, 0}; }
  Capabilities caps() const override {
    return Capabilities{.streams = true, .virtual_memory = false, .host_accessible = true};
  }
  DeviceInfo info() const override {
    return DeviceInfo{
        .name = "host, page-locked (cudaHostAlloc)", .uuid = "", .backend = "cuda"};
  }

  absl::StatusOr<void*> allocate_segment(size_t bytes) override {
    void* p = nullptr;
    // Portable: pinned for every device and context, not only the current one.
    if (cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
        err != cudaSuccess) {
      return CudaStatus(kName, absl::StrCat("cudaHostAlloc(", bytes, " bytes = ",
                                            FormatBytes(bytes), ")"),
                        err);
    }
    return p;
  }

  void free_segment(void* p, size_t bytes) override {
    if (cudaError_t err = cudaFreeHost(p); err != cudaSuccess) {
      if (err == cudaErrorCudartUnloading) {
        cudaGetLastError();
        return;
      }
      ThrowCuda(kName, absl::StrFormat("cudaFreeHost(%p, %u bytes)", p, bytes), err);
    }
  }

  MemInfo mem_info() override {
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return MemInfo{.free_bytes = static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * page,
                   .total_bytes = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page};
  }

  absl::Status launch_host_fn(Stream stream, std::function<void()> fn) override {
    if (!fn) {
      return absl::InvalidArgumentError(
          absl::StrCat(kName, ": launch_host_fn of an empty function"));
    }
    if (stream == kPinnedHostStream) {  // the host has no queue: now
      StreamCallbackScope scope;
      fn();
      return absl::OkStatus();
    }
    DeviceGuard guard(StreamDevice(stream));
    auto owned = std::make_unique<std::function<void()>>(std::move(fn));
    if (cudaError_t err = cudaLaunchHostFunc(ToCuda(stream), RunHostFn, owned.get());
        err != cudaSuccess) {
      return CudaStatus(kName, "cudaLaunchHostFunc", err);
    }
    owned.release();
    return absl::OkStatus();
  }

  // An event on the GPU stream that used the memory (recorded with that stream's
  // device current, as CUDA requires). On kPinnedHostStream: an event never recorded,
  // which CUDA reports complete (the host's own use is over when it frees).
  Event record_event(Stream stream) override {
    const bool host = stream == kPinnedHostStream;
    DeviceGuard guard(host ? CurrentDevice() : StreamDevice(stream));
    cudaEvent_t event = nullptr;
    if (cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
        err != cudaSuccess) {
      ThrowCuda(kName, "cudaEventCreateWithFlags(cudaEventDisableTiming)", err);
    }
    if (!host) {
      if (cudaError_t err = cudaEventRecord(event, ToCuda(stream)); err != cudaSuccess) {
        ReportCuda(kName, "cudaEventDestroy (of an event whose record failed)",
                   cudaEventDestroy(event));
        ThrowCuda(kName, "cudaEventRecord", err);
      }
    }
    return Event{reinterpret_cast<uintptr_t>(event)};
  }

  bool event_done(Event event) override {
    cudaError_t err = cudaEventQuery(ToCuda(event));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    ThrowCuda(kName, "cudaEventQuery", err);
  }

  void synchronize_event(Event event) override {
    if (cudaError_t err = cudaEventSynchronize(ToCuda(event)); err != cudaSuccess) {
      ThrowCuda(kName, "cudaEventSynchronize", err);
    }
  }

  void release_event(Event event) override {
    ReportCuda(kName, "cudaEventDestroy", cudaEventDestroy(ToCuda(event)));
  }

  void synchronize_stream(Stream stream) override {
    if (stream == kPinnedHostStream) return;
    DeviceGuard guard(StreamDevice(stream));
    if (cudaError_t err = cudaStreamSynchronize(ToCuda(stream)); err != cudaSuccess) {
      ThrowCuda(kName, "cudaStreamSynchronize", err);
    }
  }

 private:
  static constexpr absl::string_view kName = "cpu_pinned";

  static int CurrentDevice() {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return device;
  }
  // The device of a GPU stream (the current one for the legacy default stream).
  static int StreamDevice(Stream stream) {
    if (stream.handle == 0) return CurrentDevice();
    int device = 0;
    if (cudaError_t err = cudaStreamGetDevice(ToCuda(stream), &device); err != cudaSuccess) {
      ThrowCuda(kName, "cudaStreamGetDevice", err);
    }
    return device;
  }
};

// Registers the factory before main(): cuda/ is linked whole-archive, so this object
// file (and this initializer) is always in the program.
[[maybe_unused]] const bool kRegistered = [] {
  RegisterCudaBackendFactory(CudaBackendFactory{
      .device_count = [] { return CudaDeviceCount(); },
      .make = [](const Config&, int index) { return NewCudaBackend(index); },
      .make_pinned_host = [] { return NewCudaPinnedHostBackend(); },
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
  return std::make_unique<CudaBackend>(index, std::move(info),
                                       ProbeVirtualMemory(name, index));
}

absl::StatusOr<std::unique_ptr<Backend>> NewCudaPinnedHostBackend() {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (*count == 0) return absl::UnavailableError("the CUDA driver reports 0 devices");
  return std::make_unique<PinnedHostBackend>();
}

absl::Status CudaMemsetSync(int index, void* device_ptr, int value, size_t bytes) {
  const std::string name = absl::StrCat("cuda:", index);
  DeviceGuard guard(index);
  if (cudaError_t err = cudaMemset(device_ptr, value, bytes); err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(
        name, absl::StrFormat("cudaMemset(%p, %u bytes)", device_ptr, bytes), err);
  }
  if (cudaError_t err = cudaStreamSynchronize(nullptr); err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(name, "cudaStreamSynchronize after cudaMemset", err);
  }
  return absl::OkStatus();
}

absl::Status CudaCopyToHost(int index, void* host, const void* device_ptr, size_t bytes) {
  DeviceGuard guard(index);
  if (cudaError_t err = cudaMemcpy(host, device_ptr, bytes, cudaMemcpyDeviceToHost);
      err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(absl::StrCat("cuda:", index),
                      absl::StrFormat("cudaMemcpy(device %p to host, %u bytes)",
                                      device_ptr, bytes),
                      err);
  }
  return absl::OkStatus();
}

}  // namespace devmem
