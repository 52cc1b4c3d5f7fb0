// capi/devmem.cc: the C ABI of devmem.h over the runtime's allocators.
//
// Structure:
//   * Guard() runs the body of every entry point inside one try block and turns each
//     exception into an error code and this thread's last error (tls_error): no C++
//     exception crosses the ABI. OutOfMemoryError -> DEVMEM_ERR_OOM with its report;
//     InvalidArgumentError (and std::invalid_argument) -> DEVMEM_ERR_INVALID;
//     CapiError carries this file's own code; anything else -> DEVMEM_ERR_INTERNAL.
//   * Devices: index N is DeviceId{runtime's default type, N}. The allocator of each
//     index below kCachedDevices is cached in an atomic table, so the allocation path
//     takes no registry lock. The runtime never destroys its allocators and nothing in
//     this library replaces them (its C++ symbols are hidden by libdevmem.map), so the
//     cached pointers stay valid; the table also keeps a shared_ptr to each.
//   * devmem_free/devmem_record_stream get no device: while a single allocator has
//     been handed out (the usual case) they go straight to it; with several, the one
//     whose live allocation starts at the pointer (find_allocation) is used.
//   * Sites: one per (entry point, tag): file "capi", "capi/torch" or "capi/cupy",
//     line 0, the entry point as function, kind alloc, the tag (InternNamedSite takes
//     the tag literally, so the thread's ScopedSiteTag plays no part). The tag stack is
//     per thread; each entry caches its three site ids, interned on first use, so an
//     allocation interns nothing once its site is known.
//
// Thread-safety: the allocator table is guarded by a mutex for insertion and read with
// acquire loads; the tag stack and the last error are thread_local.
#include "capi/devmem.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/errors.h"
#include "allocator/ipc.h"
#include "allocator/mutex.h"
#include "allocator/oom_report.h"
#include "allocator/site.h"
#include "allocator/types.h"
#include "runtime/json.h"
#include "runtime/runtime.h"
#include "devmem/devmem_version.h"

namespace devmem {
namespace {

// An error of this file's own, with its code.
class CapiError : public std::runtime_error {
 public:
  CapiError(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

thread_local std::string tls_error;

int Fail(int code, const char* message) noexcept {
  try {
    tls_error.assign(message);
  } catch (...) {
    tls_error.clear();  // no memory for the message: the code still says what failed
  }
  return code;
}

// Runs `body` (returning an error code) and turns every exception into a code and the
// last error.
template <typename Body>
int Guard(Body&& body) noexcept {
  try {
    return body();
  } catch (const CapiError& e) {
    return Fail(e.code(), e.what());
  } catch (const OutOfMemoryError& e) {
    return Fail(DEVMEM_ERR_OOM, e.what());
  } catch (const std::invalid_argument& e) {  // InvalidArgumentError among them
    return Fail(DEVMEM_ERR_INVALID, e.what());
  } catch (const std::bad_alloc&) {
    return Fail(DEVMEM_ERR_INTERNAL, "devmem: host memory exhausted");
  } catch (const std::exception& e) {
    return Fail(DEVMEM_ERR_INTERNAL, e.what());
  } catch (...) {
    return Fail(DEVMEM_ERR_INTERNAL, "devmem: unknown exception");
  }
}

// PyTorch and CuPy ignore what their allocation functions report, so those entry
// points also say it on stderr.
void ReportOnStderr(const char* function) noexcept {
  std::fprintf(stderr, "%s failed: %s\n", function, tls_error.c_str());
}

// The runtime; CapiError(DEVMEM_ERR_CONFIG) when it cannot be created.
Runtime& GetRuntime() {
  try {
    return Runtime::Get();
  } catch (const std::exception& e) {
    throw CapiError(DEVMEM_ERR_CONFIG,
                    absl::StrCat("devmem: the runtime could not start: ", e.what()));
  }
}

// --- allocators ----------------------------------------------------------------------

constexpr int kCachedDevices = 64;

struct AllocatorTable {
  std::array<std::atomic<CachingAllocator*>, kCachedDevices> by_index{};
  // The only allocator handed out while there is one; `several` once there are more.
  std::atomic<CachingAllocator*> single{nullptr};
  std::atomic<bool> several{false};
  Mutex mu;
  std::vector<std::shared_ptr<CachingAllocator>> held ABSL_GUARDED_BY(mu);
};

AllocatorTable& Allocators() {
  static AllocatorTable* table = new AllocatorTable;  // never destroyed: exit races
  return *table;
}

// The allocator of device index `device`, created on first use.
CachingAllocator& AllocatorFor(int device) {
  if (device < 0) {
    throw CapiError(DEVMEM_ERR_INVALID,
                    absl::StrCat("devmem: device ", device,
                                 " does not exist (device indices are >= 0)"));
  }
  AllocatorTable& t = Allocators();
  if (device < kCachedDevices) {
    if (CachingAllocator* a = t.by_index[device].load(std::memory_order_acquire)) return *a;
  }
  Runtime& runtime = GetRuntime();
  const DeviceId id{runtime.default_device().type, device};
  std::shared_ptr<CachingAllocator> a = runtime.allocator(id);  // throws naming `id`
  MutexLock lock(&t.mu);
  bool known = false;
  for (const auto& h : t.held) known = known || h == a;
  if (!known) {
    t.held.push_back(a);
    if (t.held.size() == 1) {
      t.single.store(a.get(), std::memory_order_release);
    } else {
      t.several.store(true, std::memory_order_release);
    }
  }
  if (device < kCachedDevices) t.by_index[device].store(a.get(), std::memory_order_release);
  return *a;
}

std::vector<CachingAllocator*> HeldAllocators() {
  AllocatorTable& t = Allocators();
  MutexLock lock(&t.mu);
  std::vector<CachingAllocator*> out;
  for (const auto& h : t.held) out.push_back(h.get());
  return out;
}

// The allocator that `ptr` must belong to: the only one there is, or the one holding a
// live allocation that starts at `ptr`. CapiError(INVALID) naming `ptr` when none.
CachingAllocator& OwnerOf(const char* op, void* ptr) {
  AllocatorTable& t = Allocators();
  if (!t.several.load(std::memory_order_acquire)) {
    if (CachingAllocator* a = t.single.load(std::memory_order_acquire)) return *a;
    throw CapiError(DEVMEM_ERR_INVALID,
                    absl::StrFormat("devmem: %s(%p): not a pointer allocated by devmem "
                                    "(nothing has been allocated yet)",
                                    op, ptr));
  }
  std::vector<CachingAllocator*> all = HeldAllocators();
  std::string devices;
  for (CachingAllocator* a : all) {
    if (a->find_allocation(ptr).has_value()) return *a;
    absl::StrAppend(&devices, devices.empty() ? "" : ", ", a->device().ToString());
  }
  throw CapiError(DEVMEM_ERR_INVALID,
                  absl::StrFormat("devmem: %s(%p): not a live allocation on any device "
                                  "devmem allocated on (%s): never allocated, interior, "
                                  "or already freed (double free?)",
                                  op, ptr, devices));
}

// The devmem stream of a caller's stream pointer, for `allocator`'s device.
Stream ToStream(const CachingAllocator& allocator, void* stream) {
  if (stream == nullptr) return Stream{};
  const DeviceId device = allocator.device();
  if (device.type == DeviceType::kCuda) return Stream{reinterpret_cast<uintptr_t>(stream)};
  throw CapiError(DEVMEM_ERR_INVALID,
                  absl::StrFormat("devmem: stream %p on %s: the %s device knows only the "
                                  "streams it created, so through the C API only NULL "
                                  "(the default stream) is valid there",
                                  stream, device.ToString(),
                                  std::string(DeviceTypeName(device.type))));
}

// --- sites ---------------------------------------------------------------------------

enum EntryPoint : int { kGeneral = 0, kTorch = 1, kCupy = 2 };
constexpr int kNumEntryPoints = 3;
constexpr const char* kSiteFile[kNumEntryPoints] = {"capi", "capi/torch", "capi/cupy"};
constexpr const char* kSiteFunction[kNumEntryPoints] = {"devmem_alloc", "devmem_torch_alloc",
                                                        "devmem_cupy_malloc"};

SiteId InternEntrySite(EntryPoint entry, std::string_view tag) {
  return InternNamedSite(kSiteFile[entry], 0, kSiteFunction[entry], SiteKind::kAlloc, tag);
}

struct TagEntry {
  std::string tag;
  std::array<SiteId, kNumEntryPoints> sites{};  // kUnknownSite until first used
};
// Bounded: kMaxTagDepth entries of at most kMaxSiteTagBytes each (the site table cuts
// tags there anyway), so a push without a pop in a loop gets an error, not +1 GB.
constexpr size_t kMaxTagDepth = 1024;
thread_local std::vector<TagEntry> tls_tags;

SiteId CurrentSite(EntryPoint entry) {
  if (tls_tags.empty()) {
    static const std::array<SiteId, kNumEntryPoints> untagged = [] {
      std::array<SiteId, kNumEntryPoints> ids{};
      for (int e = 0; e < kNumEntryPoints; ++e) {
        ids[e] = InternEntrySite(static_cast<EntryPoint>(e), "");
      }
      return ids;
    }();
    return untagged[entry];
  }
  TagEntry& top = tls_tags.back();
  if (top.sites[entry] == kUnknownSite) top.sites[entry] = InternEntrySite(entry, top.tag);
  return top.sites[entry];
}

void* Allocate(size_t size, int device, void* stream, EntryPoint entry) {
  CachingAllocator& a = AllocatorFor(device);
  const Stream s = ToStream(a, stream);
  return a.allocate(size, s, CurrentSite(entry));
}

// devmem_arena_push/pop: this thread's scopes, innermost last. Closed innermost first
// when the thread exits (a vector would destroy them outer first: a nesting misuse).
constexpr size_t kMaxArenaDepth = 64;
struct ArenaStack {
  std::vector<std::unique_ptr<ArenaScope>> scopes;
  ~ArenaStack() {
    while (!scopes.empty()) scopes.pop_back();
  }
};
thread_local ArenaStack tls_arenas;

char* MallocCopy(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) throw std::bad_alloc();
  std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

}  // namespace
}  // namespace devmem

using devmem::Guard;

extern "C" {

void* devmem_torch_alloc(ssize_t size, int device, void* stream) {
  void* out = nullptr;
  const int rc = Guard([&] {
    if (size < 0) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              absl::StrCat("devmem_torch_alloc: negative size ", size));
    }
    out = devmem::Allocate(static_cast<size_t>(size), device, stream, devmem::kTorch);
    return DEVMEM_OK;
  });
  if (rc != DEVMEM_OK) devmem::ReportOnStderr("devmem_torch_alloc");
  return out;
}

void devmem_torch_free(void* ptr, ssize_t size, int device, void* stream) {
  if (ptr == nullptr) return;
  const int rc = Guard([&] {
    // PyTorch passes the size it asked for: a hint that skips the thread caches'
    // lookup for large blocks (a negative one means unknown).
    devmem::AllocatorFor(device).free(ptr, size > 0 ? static_cast<size_t>(size) : 0);
    return DEVMEM_OK;
  });
  if (rc != DEVMEM_OK) devmem::ReportOnStderr("devmem_torch_free");
}

void devmem_torch_record_stream(void* ptr, void* stream) {
  if (devmem_record_stream(ptr, stream) != DEVMEM_OK) {
    devmem::ReportOnStderr("devmem_torch_record_stream");
  }
}

void* devmem_cupy_malloc(void* param, size_t size, int device_id) {
  void* out = nullptr;
  const int rc = Guard([&] {
    out = devmem::Allocate(size, device_id, nullptr, devmem::kCupy);
    return DEVMEM_OK;
  });
  if (rc != DEVMEM_OK) devmem::ReportOnStderr("devmem_cupy_malloc");
  return out;
}

void devmem_cupy_free(void* param, void* ptr, int device_id) {
  if (ptr == nullptr) return;
  const int rc = Guard([&] {
    devmem::AllocatorFor(device_id).free(ptr);
    return DEVMEM_OK;
  });
  if (rc != DEVMEM_OK) devmem::ReportOnStderr("devmem_cupy_free");
}

int devmem_alloc(void** out, size_t size, int device, void* stream) {
  return Guard([&] {
    if (out == nullptr) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID, "devmem_alloc: `out` is NULL");
    }
    *out = nullptr;
    *out = devmem::Allocate(size, device, stream, devmem::kGeneral);
    return DEVMEM_OK;
  });
}

int devmem_free(void* ptr) {
  if (ptr == nullptr) return DEVMEM_OK;
  return Guard([&] {
    devmem::OwnerOf("free", ptr).free(ptr);
    return DEVMEM_OK;
  });
}

int devmem_record_stream(void* ptr, void* stream) {
  return Guard([&] {
    devmem::CachingAllocator& a = devmem::OwnerOf("record_stream", ptr);
    a.record_stream(ptr, devmem::ToStream(a, stream));
    return DEVMEM_OK;
  });
}

int devmem_release_stream(int device, void* stream) {
  return Guard([&] {
    if (device < 0) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              absl::StrCat("devmem_release_stream: device ", device,
                                           " does not exist (device indices are >= 0)"));
    }
    if (stream == nullptr) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              absl::StrCat("devmem_release_stream(", device,
                                           ", NULL): the default stream is never "
                                           "destroyed, so it cannot be released"));
    }
    // Only an allocator that exists can hold memory of the stream (as for
    // devmem_empty_cache: no allocator, and no CUDA context, made just for this).
    devmem::Runtime& runtime = devmem::GetRuntime();
    const devmem::DeviceId id{runtime.default_device().type, device};
    if (id.type != devmem::DeviceType::kCuda) {
      throw devmem::CapiError(
          DEVMEM_ERR_INVALID,
          absl::StrFormat("devmem_release_stream(%d, %p): %s has no streams but the "
                          "default one, so there is none to release",
                          device, stream, id.ToString()));
    }
    for (const auto& a : runtime.allocators()) {
      if (a->device() == id) a->release_stream(devmem::ToStream(*a, stream));
    }
    return DEVMEM_OK;
  });
}

int devmem_empty_cache(int device) {
  return Guard([&] {
    if (device < -1) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              absl::StrCat("devmem_empty_cache: device ", device,
                                           " does not exist (-1 means every device)"));
    }
    // Only allocators that exist: making one just to empty it would create a CUDA
    // context on a GPU the program never used.
    devmem::Runtime& runtime = devmem::GetRuntime();
    const devmem::DeviceId id{runtime.default_device().type, device};
    for (const auto& a : runtime.allocators()) {
      if (device == -1 || a->device() == id) a->empty_cache();
    }
    return DEVMEM_OK;
  });
}

const char* devmem_last_error(void) { return devmem::tls_error.c_str(); }

const char* devmem_error_name(int code) {
  switch (code) {
    case DEVMEM_OK: return "DEVMEM_OK";
    case DEVMEM_ERR_OOM: return "DEVMEM_ERR_OOM";
    case DEVMEM_ERR_INVALID: return "DEVMEM_ERR_INVALID";
    case DEVMEM_ERR_CONFIG: return "DEVMEM_ERR_CONFIG";
    case DEVMEM_ERR_INTERNAL: return "DEVMEM_ERR_INTERNAL";
    default: return "unknown";
  }
}

char* devmem_snapshot_json(void) {
  char* out = nullptr;
  Guard([&] {
    out = devmem::MallocCopy(devmem::SnapshotToJson(devmem::GetRuntime().snapshot()));
    return DEVMEM_OK;
  });
  return out;
}

char* devmem_stats_json(int device) {
  char* out = nullptr;
  Guard([&] {
    devmem::CachingAllocator& a = devmem::AllocatorFor(device);
    out = devmem::MallocCopy(devmem::DeviceStatsToJson(a.device(), a.stats(), a.site_stats()));
    return DEVMEM_OK;
  });
  return out;
}

void devmem_string_free(char* s) { std::free(s); }

int devmem_push_tag(const char* tag) {
  return Guard([&] {
    if (tag == nullptr) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID, "devmem_push_tag: the tag is NULL");
    }
    if (devmem::tls_tags.size() >= devmem::kMaxTagDepth) {
      throw devmem::CapiError(
          DEVMEM_ERR_INVALID,
          absl::StrCat("devmem_push_tag: this thread's tag stack is full (",
                       devmem::kMaxTagDepth,
                       " tags pushed and not popped); pop a tag for each one pushed"));
    }
    const std::string_view text(tag, strnlen(tag, devmem::kMaxSiteTagBytes));
    devmem::tls_tags.push_back(devmem::TagEntry{std::string(text), {}});
    return DEVMEM_OK;
  });
}

int devmem_pop_tag(void) {
  return Guard([&] {
    if (devmem::tls_tags.empty()) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              "devmem_pop_tag: this thread has no tag pushed");
    }
    devmem::tls_tags.pop_back();
    return DEVMEM_OK;
  });
}

int devmem_arena_push(int device, const char* name) {
  return Guard([&] {
    if (name == nullptr || *name == '\0') {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              "devmem_arena_push: the name is NULL or empty");
    }
    if (devmem::tls_arenas.scopes.size() >= devmem::kMaxArenaDepth) {
      throw devmem::CapiError(
          DEVMEM_ERR_INVALID,
          absl::StrCat("devmem_arena_push: this thread's arena stack is full (",
                       devmem::kMaxArenaDepth,
                       " scopes pushed and not popped); pop a scope for each one pushed"));
    }
    devmem::CachingAllocator& a = devmem::AllocatorFor(device);
    const std::string_view text(name, strnlen(name, devmem::kMaxArenaNameBytes));
    devmem::tls_arenas.scopes.reserve(devmem::tls_arenas.scopes.size() + 1);
    devmem::tls_arenas.scopes.push_back(std::make_unique<devmem::ArenaScope>(a, text));
    return DEVMEM_OK;
  });
}

int devmem_arena_pop(void) {
  return Guard([&] {
    if (devmem::tls_arenas.scopes.empty()) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              "devmem_arena_pop: this thread has no arena scope pushed");
    }
    devmem::tls_arenas.scopes.back()->close();  // throws on misuse: nothing changes
    devmem::tls_arenas.scopes.pop_back();
    return DEVMEM_OK;
  });
}

}  // extern "C"

// --- version, and PyTorch's torch.cuda memory functions (python/devmem) ---------------

namespace devmem {
namespace {

// Runs `fn` on the allocator of `device` when it exists, or on every existing one for
// -1: as devmem_empty_cache, an unused device gets no allocator (nor CUDA context).
template <typename Fn>
int ForExistingAllocators(const char* function, int device, Fn&& fn) {
  return Guard([&] {
    if (device < -1) {
      throw CapiError(DEVMEM_ERR_INVALID,
                      absl::StrCat(function, ": device ", device,
                                   " does not exist (-1 means every device)"));
    }
    Runtime& runtime = GetRuntime();
    const DeviceId id{runtime.default_device().type, device};
    for (const auto& a : runtime.allocators()) {
      if (device == -1 || a->device() == id) fn(*a);
    }
    return DEVMEM_OK;
  });
}

// The C ABI code of an IPC failure: the caller's mistake or the machine's lack
// (DEVMEM_ERR_INVALID), or the driver's (DEVMEM_ERR_INTERNAL).
int IpcErrorCode(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
      return DEVMEM_ERR_INVALID;
    case absl::StatusCode::kResourceExhausted:
      return DEVMEM_ERR_OOM;
    default:
      return DEVMEM_ERR_INTERNAL;
  }
}

}  // namespace
}  // namespace devmem

extern "C" {

const char* devmem_version(void) { return DEVMEM_VERSION; }

int devmem_reset_peak_stats(int device) {
  return devmem::ForExistingAllocators("devmem_reset_peak_stats", device,
                                       [](devmem::CachingAllocator& a) { a.reset_peak_stats(); });
}

int devmem_reset_accumulated_stats(int device) {
  return devmem::ForExistingAllocators(
      "devmem_reset_accumulated_stats", device,
      [](devmem::CachingAllocator& a) { a.reset_accumulated_stats(); });
}

int devmem_set_memory_fraction(double fraction, int device) {
  return Guard([&] {
    // Checked before the allocator is made, so a bad fraction changes nothing.
    if (!(fraction > 0.0 && fraction <= 1.0)) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              absl::StrFormat("devmem_set_memory_fraction: fraction %g is "
                                              "not in (0, 1]",
                                              fraction));
    }
    const absl::Status st = devmem::AllocatorFor(device).set_memory_fraction(fraction);
    if (!st.ok()) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              absl::StrCat("devmem_set_memory_fraction: ", st.message()));
    }
    return DEVMEM_OK;
  });
}

int devmem_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes) {
  return Guard([&] {
    if (free_bytes == nullptr || total_bytes == nullptr) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              "devmem_mem_get_info: `free_bytes` or `total_bytes` is NULL");
    }
    const devmem::MemInfo info = devmem::AllocatorFor(device).backend().mem_info();
    *free_bytes = info.free_bytes;
    *total_bytes = info.total_bytes;
    return DEVMEM_OK;
  });
}

int devmem_begin_allocate_to_pool(int device, uint64_t id_first, uint64_t id_second,
                                  devmem_stream_filter filter, void* filter_ctx) {
  return Guard([&] {
    devmem::CachingAllocator& a = devmem::AllocatorFor(device);
    devmem::StreamFilter f;
    if (filter != nullptr) {
      f = [filter, filter_ctx](devmem::Stream s) {
        return filter(filter_ctx, reinterpret_cast<void*>(s.handle)) != 0;
      };
    } else {
      devmem::Backend* backend = &a.backend();  // lives as long as the allocator
      f = [backend](devmem::Stream s) {
        return backend->capture_state(s) != devmem::CaptureState::kNone;
      };
    }
    a.begin_allocate_to_pool(devmem::PoolId{id_first, id_second}, std::move(f));
    return DEVMEM_OK;
  });
}

int devmem_end_allocate_to_pool(int device, uint64_t id_first, uint64_t id_second) {
  return Guard([&] {
    devmem::AllocatorFor(device).end_allocate_to_pool(devmem::PoolId{id_first, id_second});
    return DEVMEM_OK;
  });
}

int devmem_release_pool(int device, uint64_t id_first, uint64_t id_second) {
  return Guard([&] {
    devmem::AllocatorFor(device).release_pool(devmem::PoolId{id_first, id_second});
    return DEVMEM_OK;
  });
}

void devmem_torch_begin_allocate_to_pool(
    int device, std::pair<unsigned long long, unsigned long long> pool,
    std::function<bool(CUstream_st*)> filter) {
  const int rc = Guard([&] {
    devmem::StreamFilter f;
    if (filter) {
      f = [filter = std::move(filter)](devmem::Stream s) {
        return filter(reinterpret_cast<CUstream_st*>(s.handle));
      };
    }
    devmem::AllocatorFor(device).begin_allocate_to_pool(
        devmem::PoolId{pool.first, pool.second}, std::move(f));
    return DEVMEM_OK;
  });
  if (rc != DEVMEM_OK) devmem::ReportOnStderr("devmem_torch_begin_allocate_to_pool");
}

void devmem_torch_end_allocate_to_pool(int device,
                                       std::pair<unsigned long long, unsigned long long> pool) {
  if (devmem_end_allocate_to_pool(device, pool.first, pool.second) != DEVMEM_OK) {
    devmem::ReportOnStderr("devmem_torch_end_allocate_to_pool");
  }
}

void devmem_torch_release_pool(int device,
                               std::pair<unsigned long long, unsigned long long> pool) {
  if (devmem_release_pool(device, pool.first, pool.second) != DEVMEM_OK) {
    devmem::ReportOnStderr("devmem_torch_release_pool");
  }
}

char* devmem_memory_summary(int device) {
  char* out = nullptr;
  Guard([&] {
    devmem::CachingAllocator& a = devmem::AllocatorFor(device);
    std::string text = absl::StrCat(a.device().ToString(), "\n", a.stats().ToString());
    const std::vector<devmem::SiteUsage> top = a.top_sites(10);
    absl::StrAppend(&text, top.empty() ? "No live allocations.\n"
                                       : "Largest live holders by site:\n");
    for (const devmem::SiteUsage& u : top) {
      absl::StrAppendFormat(&text, "  %10s in %6d blocks  %s\n", devmem::FormatBytes(u.live_bytes),
                            u.live_count, devmem::GetSite(u.site).ToString());
    }
    out = devmem::MallocCopy(text);
    return DEVMEM_OK;
  });
  return out;
}

int devmem_enable_peer_access(int device, int peer) {
  return Guard([&] {
    const std::string call = absl::StrCat("devmem_enable_peer_access(device ", device,
                                          ", peer ", peer, ")");
    if (device == peer) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              absl::StrCat(call, ": a device has access to its own memory"));
    }
    if (device < 0) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              absl::StrCat(call, ": device ", device, " does not exist"));
    }
    const absl::Status st = devmem::AllocatorFor(peer).enable_peer_access(device);
    if (!st.ok()) {
      const bool invalid = st.code() == absl::StatusCode::kInvalidArgument ||
                           st.code() == absl::StatusCode::kFailedPrecondition ||
                           st.code() == absl::StatusCode::kUnimplemented;
      throw devmem::CapiError(invalid ? DEVMEM_ERR_INVALID : DEVMEM_ERR_INTERNAL,
                              absl::StrCat(call, ": ", st.message()));
    }
    return DEVMEM_OK;
  });
}

int devmem_ipc_export(const void* ptr, devmem_ipc_handle* out) {
  if (out != nullptr) *out = devmem_ipc_handle{};
  return Guard([&] {
    if (out == nullptr) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID, "devmem_ipc_export: `out` is NULL");
    }
    devmem::CachingAllocator& a = devmem::OwnerOf("ipc_export", const_cast<void*>(ptr));
    absl::StatusOr<devmem::IpcHandle> h = devmem::IpcExport(a, ptr);
    if (!h.ok()) {
      throw devmem::CapiError(devmem::IpcErrorCode(h.status()),
                              absl::StrCat("devmem_ipc_export: ", h.status().message()));
    }
    auto* fds = static_cast<int*>(std::malloc(sizeof(int) * h->fds.size()));
    if (fds == nullptr) {
      devmem::CloseIpcFds(*h);
      throw std::bad_alloc();
    }
    std::copy(h->fds.begin(), h->fds.end(), fds);
    *out = devmem_ipc_handle{.kind = static_cast<uint32_t>(h->kind),
                             .device = h->device,
                             .offset = h->offset,
                             .size = h->size,
                             .granule = h->granule,
                             .num_fds = h->fds.size(),
                             .fds = fds};
    return DEVMEM_OK;
  });
}

int devmem_ipc_import(int device, const devmem_ipc_handle* handle, void** out) {
  if (out != nullptr) *out = nullptr;
  return Guard([&] {
    if (handle == nullptr || out == nullptr || (handle->num_fds > 0 && handle->fds == nullptr)) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              "devmem_ipc_import: `handle`, `out` or `handle->fds` is NULL");
    }
    devmem::CachingAllocator& a = devmem::AllocatorFor(device);
    absl::StatusOr<devmem::IpcBackend*> ipc = devmem::IpcOf(a);
    if (!ipc.ok()) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              absl::StrCat("devmem_ipc_import: ", ipc.status().message()));
    }
    devmem::IpcHandle h;
    h.kind = static_cast<devmem::IpcHandle::Kind>(handle->kind);
    h.device = handle->device;
    h.offset = handle->offset;
    h.size = handle->size;
    h.granule = handle->granule;
    h.fds.assign(handle->fds, handle->fds + handle->num_fds);
    absl::StatusOr<void*> p = (*ipc)->ipc_import(h);
    if (!p.ok()) {
      throw devmem::CapiError(devmem::IpcErrorCode(p.status()),
                              absl::StrCat("devmem_ipc_import: ", p.status().message()));
    }
    *out = *p;
    return DEVMEM_OK;
  });
}

int devmem_ipc_close(int device, void* ptr) {
  return Guard([&] {
    absl::StatusOr<devmem::IpcBackend*> ipc = devmem::IpcOf(devmem::AllocatorFor(device));
    const absl::Status st = ipc.ok() ? (*ipc)->ipc_close(ptr) : ipc.status();
    if (!st.ok()) {
      throw devmem::CapiError(DEVMEM_ERR_INVALID,
                              absl::StrCat("devmem_ipc_close: ", st.message()));
    }
    return DEVMEM_OK;
  });
}

void devmem_ipc_handle_close(devmem_ipc_handle* handle) {
  if (handle == nullptr) return;
  for (uint64_t i = 0; i < handle->num_fds && handle->fds != nullptr; ++i) {
    if (handle->fds[i] >= 0) close(handle->fds[i]);
  }
  std::free(handle->fds);
  *handle = devmem_ipc_handle{};
}

}  // extern "C"
