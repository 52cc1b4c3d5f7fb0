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
// Peer access: cuMemSetAccess is the only way another GPU reaches a mapping
// (cudaDeviceEnablePeerAccess covers cudaMalloc'd memory only), so enable_peer_access
// does both: cudaDeviceEnablePeerAccess from the peer, then the peer joins the access
// list that every map grants (this device first), and every mapped range is granted
// it again, one cuMemSetAccess per contiguous range inside a reservation.
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
#include "allocator/ipc.h"
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
  // IPC of mappings (allocator/ipc.h), optional: without them mappings stay private.
  decltype(&::cuMemExportToShareableHandle) mem_export = nullptr;
  decltype(&::cuMemImportFromShareableHandle) mem_import = nullptr;
  std::string ipc_error;  // why IPC is unavailable ("" when both resolved)
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
    std::string ipc_error;
    if (!ResolveDriverSymbol("cuMemExportToShareableHandle", &d->mem_export, &ipc_error) ||
        !ResolveDriverSymbol("cuMemImportFromShareableHandle", &d->mem_import, &ipc_error)) {
      d->mem_export = nullptr;
      d->mem_import = nullptr;
      d->ipc_error = ipc_error.empty() ? "an IPC entry point did not resolve" : ipc_error;
    }
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

// Pinned device memory on `device`: what each granule is made of; `shareable`: with
// POSIX file descriptors requested, so that it can be exported (allocator/ipc.h).
CUmemAllocationProp PinnedOn(CUdevice device, bool shareable = false) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  if (shareable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// What NewCudaBackend found out about the device's virtual memory management.
struct VirtualMemorySupport {
  bool supported = false;
  CUdevice device = 0;
  size_t granularity = 0;  // the recommended granularity, at least 2 MiB
  std::string unavailable;  // why not, when !supported
  // Granules are created exportable (POSIX file descriptors): the driver has the IPC
  // entry points and the device reports
  // CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED.
  bool posix_fd = false;
  std::string no_ipc;  // why not, when !posix_fd
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
  int posix_fd = 0;
  if (!d.ipc_error.empty()) {
    vm.no_ipc = d.ipc_error;
  } else if (CUresult r = d.device_get_attribute(
                 &posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                 vm.device);
             r != CUDA_SUCCESS || posix_fd == 0) {
    vm.no_ipc = r != CUDA_SUCCESS
                    ? std::string(CuStatus(name,
                                           "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_HANDLE_"
                                           "TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)",
                                           r)
                                      .message())
                    : "the device cannot export memory to POSIX file descriptors "
                      "(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED "
                      "is 0)";
  } else {
    vm.posix_fd = true;
  }
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

class CudaBackend final : public Backend, public IpcBackend {
 public:
  CudaBackend(int index, DeviceInfo info, VirtualMemorySupport vm)
      : device_{DeviceType::kCuda, index},
        name_(device_.ToString()),
        info_(std::move(info)),
        vm_(std::move(vm)) {}

  // Gives back what the allocator left mapped or reserved (nothing, normally).
  ~CudaBackend() override {
    MutexLock lock(&vm_mu_);
    if (granules_.empty() && reservations_.empty() && spare_.empty() && imports_.empty()) {
      return;
    }
    DeviceGuard guard(device_.index, DeviceGuard::kBindContext);
    const DriverApi& d = Driver();
    for (const auto& [p, m] : imports_) Forget(m);  // imports never closed
    imports_.clear();
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
    const CUmemAllocationProp prop = PinnedOn(vm_.device, vm_.posix_fd);
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
    // This device and every peer enable_peer_access granted, in one call.
    const std::vector<CUmemAccessDesc> access = AccessList();
    if (CUresult r = Timed(DriverCall::kSetAccess,
                           [&] {
                             return d.mem_set_access(start, bytes, access.data(),
                                                     access.size());
                           });
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

  // --- peer access (backend.h) ---------------------------------------------------------

  // Other GPUs and processes use CUDA memory; mappings get peer access here, and IPC
  // where granules are made exportable (POSIX file descriptors).
  SharingSupport sharing() const override {
    return SharingSupport{
        .needed = true, .vmm_peer_access = vm_.supported, .vmm_ipc = vm_.posix_fd};
  }

  // cudaDeviceEnablePeerAccess from `peer` (regular segments), then, under vm_mu_ (so
  // no map runs meanwhile), one cuMemSetAccess per contiguous mapped range with the
  // whole access list; later maps take the list too (AccessList).
  absl::Status enable_peer_access(int peer) override {
    const std::string call = absl::StrFormat("enable_peer_access(cuda:%d)", peer);
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) return count.status();
    if (peer < 0 || peer >= *count || peer == device_.index) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %s: %s", name_, call,
          peer == device_.index
              ? std::string("a device has access to its own memory")
              : absl::StrFormat("cuda:%d does not exist (the CUDA driver reports %d "
                                "devices)",
                                peer, *count)));
    }
    int can = 0;
    if (cudaError_t err = cudaDeviceCanAccessPeer(&can, peer, device_.index);
        err != cudaSuccess) {
      return CudaStatus(name_, absl::StrCat(call, ": cudaDeviceCanAccessPeer"), err);
    }
    if (can == 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: %s: cuda:%d cannot access this device's memory (cudaDeviceCanAccessPeer "
          "is 0: no NVLink or PCIe peer path)",
          name_, call, peer));
    }
    bool enabled_now = false;
    {
      DeviceGuard guard(peer);
      const cudaError_t err = cudaDeviceEnablePeerAccess(device_.index, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // enabled before (by the program or an earlier call): fine
      } else if (err != cudaSuccess) {
        const std::string what =
            absl::StrFormat("%s: cudaDeviceEnablePeerAccess(%d) on cuda:%d", call,
                            device_.index, peer);
        if (IsSticky(err)) ThrowCuda(name_, what, err);
        return CudaStatus(name_, what, err);
      }
      enabled_now = err == cudaSuccess;
    }
    absl::Status mapped = GrantMappings(peer, call);
    if (!mapped.ok() && enabled_now) {  // as before: the peer had no access
      DeviceGuard guard(peer);
      ReportCuda(name_, "cudaDeviceDisablePeerAccess (undoing a failed enable_peer_access)",
                 cudaDeviceDisablePeerAccess(device_.index));
    }
    return mapped;
  }

  // --- IPC of mappings (allocator/ipc.h) -----------------------------------------------

  // One cuMemExportToShareableHandle per granule the block touches, under vm_mu_ (the
  // granules cannot be unmapped meanwhile).
  absl::StatusOr<IpcHandle> ipc_export(const void* p, size_t bytes) override {
    const std::string call = absl::StrFormat("ipc_export(%p, %u bytes)", p, bytes);
    if (!vm_.supported) {
      return absl::InvalidArgumentError(absl::StrCat(
          name_, ": ", call, ": not mapped memory (no virtual memory management); a "
          "regular segment's block is shared with cudaIpcGetMemHandle of its segment"));
    }
    const size_t g = vm_.granularity;
    const auto start = reinterpret_cast<CUdeviceptr>(p);
    if (bytes == 0 || start + bytes < start) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": ", call, ": an empty or "
                                                                        "wrapping range"));
    }
    const CUdeviceptr first = start / g * g;
    const CUdeviceptr end = (start + bytes + g - 1) / g * g;
    MutexLock lock(&vm_mu_);
    if (MappedGranules(first, end - first) != (end - first) / g) {
      return absl::InvalidArgumentError(absl::StrCat(
          name_, ": ", call, ": not (entirely) mapped memory of this device; a regular "
          "segment's block is shared with cudaIpcGetMemHandle of its segment"));
    }
    if (!vm_.posix_fd) {
      return absl::FailedPreconditionError(
          absl::StrCat(name_, ": ", call, ": mappings are not exportable: ", vm_.no_ipc));
    }
    DeviceGuard guard(device_.index, DeviceGuard::kBindContext);
    IpcHandle h;
    h.kind = IpcHandle::Kind::kPosixFd;
    h.device = device_.index;
    h.offset = start - first;
    h.size = bytes;
    h.granule = g;
    for (auto it = granules_.lower_bound(first); it != granules_.end() && it->first < end;
         ++it) {
      int fd = -1;
      if (CUresult r = Timed(DriverCall::kExport, [&] {
            return Driver().mem_export(&fd, it->second,
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
          });
          r != CUDA_SUCCESS) {
        CloseIpcFds(h);
        const std::string what = absl::StrFormat(
            "%s: cuMemExportToShareableHandle(granule %p, POSIX file descriptor)", call,
            reinterpret_cast<void*>(it->first));
        if (IsStickyCu(r)) ThrowCu(name_, what, r);
        return CuStatus(name_, what, r);
      }
      h.fds.push_back(fd);
    }
    return h;
  }

  // One reservation for the granules, then per granule cuMemImportFromShareableHandle
  // and cuMemMap, and one cuMemSetAccess for this device and its peers.
  absl::StatusOr<void*> ipc_import(const IpcHandle& h) override {
    const std::string call = absl::StrFormat(
        "ipc_import(a block of %u bytes from cuda:%d, %u file descriptors)", h.size,
        h.device, h.fds.size());
    if (!vm_.supported || !vm_.posix_fd) {
      return absl::FailedPreconditionError(absl::StrCat(
          name_, ": ", call, ": cannot map shared memory: ",
          !vm_.supported ? vm_.unavailable : vm_.no_ipc));
    }
    const size_t g = vm_.granularity;
    if (h.kind != IpcHandle::Kind::kPosixFd || h.granule != g || h.fds.empty() ||
        h.size == 0 || h.offset >= g || h.size > h.fds.size() * g - h.offset) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: %s: not a handle ipc_export made for this granularity (%u bytes): "
          "granule %u, offset %u", name_, call, g, h.granule, h.offset));
    }
    const DriverApi& d = Driver();
    DeviceGuard guard(device_.index, DeviceGuard::kBindContext);
    const size_t bytes = h.fds.size() * g;
    CUdeviceptr base = 0;
    if (CUresult r = Timed(DriverCall::kAddressReserve,
                           [&] { return d.mem_address_reserve(&base, bytes, g, 0, 0); });
        r != CUDA_SUCCESS) {
      return CuStatus(name_, absl::StrCat(call, ": cuMemAddressReserve"), r);
    }
    Import imported{.base = base, .bytes = bytes, .handles = {}};
    absl::Status failed;
    for (size_t i = 0; i < h.fds.size() && failed.ok(); ++i) {
      CUmemGenericAllocationHandle handle = 0;
      if (CUresult r = Timed(DriverCall::kImport, [&] {
            return d.mem_import(&handle,
                                reinterpret_cast<void*>(static_cast<intptr_t>(h.fds[i])),
                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
          });
          r != CUDA_SUCCESS) {
        failed = CuStatus(name_, absl::StrFormat("%s: cuMemImportFromShareableHandle(fd %d)",
                                                 call, h.fds[i]), r);
        break;
      }
      if (CUresult r = Timed(DriverCall::kMap,
                             [&] { return d.mem_map(base + i * g, g, 0, handle, 0); });
          r != CUDA_SUCCESS) {
        ReportCu(name_, "cuMemRelease (undoing a failed ipc_import)",
                 Timed(DriverCall::kRelease, [&] { return d.mem_release(handle); }));
        failed = CuStatus(name_, absl::StrFormat("%s: cuMemMap of granule %u", call, i), r);
        break;
      }
      imported.handles.push_back(handle);
    }
    MutexLock lock(&vm_mu_);
    if (failed.ok()) {
      const std::vector<CUmemAccessDesc> access = AccessList();
      if (CUresult r = Timed(DriverCall::kSetAccess, [&] {
            return d.mem_set_access(base, bytes, access.data(), access.size());
          });
          r != CUDA_SUCCESS) {
        failed = CuStatus(name_, absl::StrCat(call, ": cuMemSetAccess"), r);
      }
    }
    if (!failed.ok()) {
      Forget(imported);
      return failed;
    }
    void* block = reinterpret_cast<void*>(base + h.offset);
    imports_.emplace(block, std::move(imported));
    return block;
  }

  absl::Status ipc_close(void* p) override {
    MutexLock lock(&vm_mu_);
    auto it = imports_.find(p);
    if (it == imports_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: ipc_close(%p): not a block ipc_import returned (or closed already)", name_,
          p));
    }
    DeviceGuard guard(device_.index, DeviceGuard::kBindContext);
    Forget(it->second);
    imports_.erase(it);
    return absl::OkStatus();
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

  // A block another process exported, mapped here by ipc_import: its own reservation,
  // the imported handles mapped in order from its start.
  struct Import {
    CUdeviceptr base;
    size_t bytes;
    std::vector<CUmemGenericAllocationHandle> handles;
  };
  // Unmaps and releases what an import mapped, and frees its address range (failures
  // reported on stderr: nothing of the allocator's depends on it).
  void Forget(const Import& m) const {
    const DriverApi& d = Driver();
    if (!m.handles.empty()) {
      ReportCu(name_, "cuMemUnmap (an imported block)",
               Timed(DriverCall::kUnmap, [&] {
                 return d.mem_unmap(m.base, m.handles.size() * vm_.granularity);
               }));
    }
    for (CUmemGenericAllocationHandle handle : m.handles) {
      ReportCu(name_, "cuMemRelease (an imported block)",
               Timed(DriverCall::kRelease, [&] { return d.mem_release(handle); }));
    }
    ReportCu(name_, "cuMemAddressFree (an imported block)",
             Timed(DriverCall::kAddressFree, [&] { return d.mem_address_free(m.base, m.bytes); }));
  }

  // This device and the granted peers, read/write: every mapping's access list.
  std::vector<CUmemAccessDesc> AccessList() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(vm_mu_) {
    std::vector<CUmemAccessDesc> list;
    list.reserve(1 + peers_.size());
    list.push_back(ReadWrite(vm_.device));
    for (CUdevice d : peers_) list.push_back(ReadWrite(d));
    return list;
  }
  static CUmemAccessDesc ReadWrite(CUdevice device) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return access;
  }

  // The mapped ranges, each contiguous and inside one reservation, in address order.
  std::vector<std::pair<CUdeviceptr, size_t>> MappedRanges() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(vm_mu_) {
    std::vector<std::pair<CUdeviceptr, size_t>> ranges;
    for (const auto& [base, bytes] : reservations_) {
      for (auto it = granules_.lower_bound(base);
           it != granules_.end() && it->first < base + bytes; ++it) {
        if (!ranges.empty() && ranges.back().first + ranges.back().second == it->first &&
            ranges.back().first >= base) {
          ranges.back().second += vm_.granularity;
        } else {
          ranges.emplace_back(it->first, vm_.granularity);
        }
      }
    }
    return ranges;
  }

  // enable_peer_access's virtual-memory half: adds `peer` to the access list and grants
  // it every mapped range. On a failure the ranges granted so far are revoked and the
  // list is as before.
  absl::Status GrantMappings(int peer, const std::string& call) ABSL_LOCKS_EXCLUDED(vm_mu_) {
    if (!vm_.supported) return absl::OkStatus();
    const DriverApi& d = Driver();
    DeviceGuard guard(device_.index, DeviceGuard::kBindContext);
    CUdevice peer_device = 0;
    if (CUresult r = d.device_get(&peer_device, peer); r != CUDA_SUCCESS) {
      return CuStatus(name_, absl::StrFormat("%s: cuDeviceGet(%d)", call, peer), r);
    }
    MutexLock lock(&vm_mu_);
    if (std::find(peers_.begin(), peers_.end(), peer_device) != peers_.end()) {
      return absl::OkStatus();
    }
    peers_.push_back(peer_device);
    const std::vector<CUmemAccessDesc> access = AccessList();
    const std::vector<std::pair<CUdeviceptr, size_t>> ranges = MappedRanges();
    for (size_t i = 0; i < ranges.size(); ++i) {
      const auto [start, bytes] = ranges[i];
      const CUresult r = Timed(DriverCall::kSetAccess, [&] {
        return d.mem_set_access(start, bytes, access.data(), access.size());
      });
      if (r == CUDA_SUCCESS) continue;
      peers_.pop_back();
      CUmemAccessDesc none = ReadWrite(peer_device);
      none.flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
      for (size_t j = 0; j < i; ++j) {
        ReportCu(name_, "cuMemSetAccess (revoking a failed enable_peer_access)",
                 Timed(DriverCall::kSetAccess, [&] {
                   return d.mem_set_access(ranges[j].first, ranges[j].second, &none, 1);
                 }));
      }
      const std::string what =
          absl::StrFormat("%s: cuMemSetAccess(%p, %u bytes, %u devices)", call,
                          reinterpret_cast<void*>(start), bytes, access.size());
      if (IsStickyCu(r)) ThrowCu(name_, what, r);
      return CuStatus(name_, what, r);
    }
    return absl::OkStatus();
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
  // The devices enable_peer_access granted: every mapping gives them read/write.
  std::vector<CUdevice> peers_ ABSL_GUARDED_BY(vm_mu_);
  // Blocks of other processes mapped by ipc_import, by the address it returned.
  std::map<void*, Import> imports_ ABSL_GUARDED_BY(vm_mu_);
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
