// runtime/runtime.h: the process-wide device registry and its services.
//
// Example:
//   Runtime& rt = Runtime::Get();                 // first use reads DEVMEM_CONF
//   std::shared_ptr<CachingAllocator> a = rt.allocator(rt.default_device());
//   void* p = a->allocate(1 << 20, {}, InternSite(loc, SiteKind::kAlloc));
//   RuntimeSnapshot snap = rt.snapshot();          // every device, for JSON / memtrace
//
// One allocator per device: `cuda:N` for each GPU present (else `sim:0`), plus `cpu`,
// each created on first use with the policy keys of the configuration. When
// trace_entries > 0 (the default) every allocator the runtime creates reports to one
// TraceRing (runtime/trace.h). When `http` is configured the HTTP service (runtime/http_server.h)
// starts with the runtime and serves /metrics and /debug/*.
//
// OOMs: every allocator the runtime holds reports its OutOfMemoryErrors to the
// runtime's observer (runtime/device_observer.h): with oom_dump_dir set, a dump file
// is written (at most one per second per device; runtime/oom.h), and every callback
// added with add_oom_callback is called with the report.
//
// Background thread: only when a device can have pending frees (its backend has
// streams) or garbage_collection_threshold is set, one thread calls process_events()
// on every allocator every 5 ms, so memory freed across streams returns to the cache
// while the program is idle. None otherwise. A round in which no allocator of the table
// has work queued (the allocators count themselves in the runtime's counter,
// CachingAllocator::set_poll_counter) takes no lock at all: an idle program pays the
// poller one atomic load per round (and the increment of its round count), and its
// allocation paths never meet the poller on a lock (poller_stats() counts both kinds
// of round).
//
// Lifetime: Get() creates the runtime on first use (thread-safe, once). Shutdown()
// stops the HTTP listener and the background thread (joins them) and is idempotent; it
// runs at exit too (std::atexit, registered when the runtime is created). The Runtime
// object and the registry's allocators are deliberately never destroyed, as PyTorch
// does with its CUDA allocator: static objects (tensors) may still free into them
// during exit, and the CUDA runtime tears itself down from its own exit handler, in an
// order no library controls, so a cudaFree at exit could fail. The process's exit
// returns the memory. An allocator the runtime created stays alive even once replaced
// in the table (exchange_allocator), so that allocator_ref may hand out plain pointers
// to it. Allocators are shared_ptrs: holders keep theirs alive past
// Shutdown, so nothing is freed under a live pointer. After Shutdown the registry still
// works (allocator() creates allocators on demand), but nothing is served and no
// thread is started.
//
// Thread-safety: every method may be called from any thread. The registry's mutex is a
// leaf with respect to allocators: it is never held while an allocator method runs,
// except while creating one and while the background thread polls events (so that
// thread never holds a reference of its own to an allocator). Lock order: registry
// mutex -> device lock. allocator_ref takes no lock once this thread's cache holds the
// device (see there).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/oom_report.h"
#include "allocator/snapshot.h"
#include "allocator/types.h"
#include "runtime/buffer_annotator.h"

namespace devmem {

class TraceRing;
class HttpServer;

// An allocator as Runtime::allocator_ref gives it: `allocator` is never null; `owner`
// is null when the runtime keeps `allocator` for the process's life (it created it),
// else a reference the holder keeps while it uses `allocator` (one installed by
// set_allocator or exchange_allocator, which dies once replaced and unused).
struct AllocatorRef {
  CachingAllocator* allocator = nullptr;
  std::shared_ptr<CachingAllocator> owner;
};

// Everything a snapshot file holds: per device its AllocatorSnapshot, plus the site
// table and, optionally, the trace.
struct RuntimeSnapshot {
  int64_t time_ns = 0;      // monotonic clock when taken
  int64_t unix_time_ns = 0; // wall clock when taken
  std::vector<AllocatorSnapshot> devices;
  // Parallel to `devices`: what the registered BufferAnnotator (the tensor layer) knows
  // about their live buffers. Empty when no annotator is registered.
  std::vector<BufferAnnotations> annotations;
};

class Runtime {
 public:
  // The runtime, created on first use from DEVMEM_CONF (ConfigFromEnv). Throws
  // std::invalid_argument with the configuration error's message when DEVMEM_CONF is
  // bad (executables check ConfigFromEnv first and exit 2).
  static Runtime& Get();
  // Creates the runtime from `config` instead of DEVMEM_CONF. FailedPrecondition when
  // it exists already (with another configuration).
  static absl::Status Init(const Config& config);

  const Config& config() const;
  // cuda:0 when backend auto/cuda finds a GPU, else sim:0; cpu for backend:cpu.
  DeviceId default_device() const;
  // The allocator of `device`, created on first use. Throws std::invalid_argument
  // naming the device when it cannot be had (cuda without a GPU, a bad index).
  std::shared_ptr<CachingAllocator> allocator(DeviceId device);
  // The same allocator, for hot paths (every tensor creation): no lock and no
  // reference count when this thread looked `device` up before and no allocator was
  // exchanged since (a per-thread cache of device -> allocator, tagged with the
  // registry's generation, which every exchange advances). Only allocators the runtime
  // created are cached, and the runtime keeps each of those until exit, so a cached
  // pointer never dangles; an installed one comes with `owner` (see AllocatorRef),
  // through the lock, on every call. Throws as allocator() does.
  AllocatorRef allocator_ref(DeviceId device);
  // The allocators created so far, in device order.
  std::vector<std::shared_ptr<CachingAllocator>> allocators() const;
  // Installs `allocator` for its device (replacing any), attaching the trace. For tests
  // and programs that build their own backend. The runtime's observer replaces any
  // observer the allocator had. InvalidArgumentError for a null allocator.
  void set_allocator(std::shared_ptr<CachingAllocator> allocator);
  // Installs `allocator` (null: none, so the next allocator() call creates one) for
  // `device` and returns the previous one (null if none). Non-null allocators must be
  // of `device`. For scoped overrides (tensor/device_registry.h).
  std::shared_ptr<CachingAllocator> exchange_allocator(
      DeviceId device, std::shared_ptr<CachingAllocator> allocator);

  // OOM callbacks (runtime/oom.h: called on the failing thread before the exception is
  // thrown, for every OOM of every allocator the runtime holds). remove waits for
  // running calls of that callback on other threads; false for an unknown id.
  using OomCallback = std::function<void(const OomReport&)>;
  int add_oom_callback(OomCallback callback);
  bool remove_oom_callback(int id);

  // The event trace, or nullptr when trace_entries is 0.
  TraceRing* trace() const;
  // The HTTP service, or nullptr when `http` is not configured.
  HttpServer* http() const;

  RuntimeSnapshot snapshot() const;

  // The background poller's rounds so far, and how many of them took the registry lock
  // (some allocator had work queued; each allocator's own lock is counted by its
  // CachingAllocator::poll_stats). Both 0 when there is no poller. Lock-free.
  struct PollerStats {
    uint64_t rounds = 0;
    uint64_t registry_locks = 0;
  };
  PollerStats poller_stats() const;

  // Registers the layer that annotates live buffers (at most one; nullptr removes it).
  // The annotator must outlive the runtime or be removed first.
  void set_buffer_annotator(const BufferAnnotator* annotator);

  // Stops the HTTP service and background threads; idempotent.
  void Shutdown();

  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

 private:
  explicit Runtime(const Config& config);
  ~Runtime();
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace devmem
