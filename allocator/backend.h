// allocator/backend.h: the whole contract between devmem and a memory driver.
//
// A Backend is the only code that talks to a driver (CUDA, the simulated device,
// jemalloc). It hands out segments, reports memory, and provides streams and events.
// It holds no policy: caching, splitting, rounding and retry live in CachingAllocator.
// One file implements it per driver: allocator/cpu_backend.cc, allocator/sim_backend.cc,
// cuda/cuda_backend.cc.
//
// Contract, for every method:
//   * Thread-safety: every method may be called from any thread concurrently. The
//     CachingAllocator calls segment methods while holding its device lock, so a
//     backend must never call back into an allocator (lock order: allocator, then
//     backend).
//   * Errors: only allocate_segment / map return a failure that means "out of memory":
//     absl::ResourceExhaustedError. Any other failure is a driver error and is
//     returned with another code (and a message naming the driver call). Methods that
//     return no Status (free_segment, unmap, record_event, rerecord_event, event_done,
//     synchronize_event, synchronize_stream, capture_state) report a driver failure by throwing
//     DriverError (allocator/errors.h), naming the device, the call and the driver's
//     error, before changing anything of their own; they never end the process. The
//     allocator then poisons itself (caching_allocator.h). Clean-up of what the
//     allocator owns no more (release_event, release_address, destroy_stream) reports
//     failures on stderr and does not throw. The sim and cpu backends never throw it.
//   * Pointers: allocate_segment returns memory aligned to at least 512 bytes (CUDA
//     gives 256-byte alignment at least; sim and cpu give 2 MiB / page alignment).
//     free_segment receives exactly a pointer and size that allocate_segment returned.
//   * Streams: Stream{0} always exists and is the default stream. Work enqueued on one
//     stream runs in order. Events complete when their stream reaches them.
//   * Virtual memory (only when caps().virtual_memory): reserve_address returns an
//     address range that holds no memory; map() backs [addr, addr+bytes) with physical
//     memory (ResourceExhausted when there is none); unmap() takes it away. Offsets and
//     sizes are multiples of granularity(); an unmap may cover parts of several maps.
//     A backend may keep what unmap() took in a physical-handle reserve
//     (driver_calls.h), from which later maps take memory first; the reserve's bytes
//     are still charged to the device until release_handle_reserve().
//   * Driver calls: driver_calls() reports every driver call made so far by kind
//     (driver_calls.h); backends without a driver report nothing.
//   * Releasing memory (free_segment, unmap) need not wait for queued work: the
//     allocator synchronizes the owning stream first. So a stream must outlive the
//     memory cached for it, or be retired first (CachingAllocator::release_stream
//     before destroy_stream: then the allocator waits for the retirement's event).
//   * Graph capture (CUDA): while a stream captures work into a graph, some driver calls
//     would fail and invalidate the capture (cudaMalloc, cudaFree, map/unmap in the
//     default "global" mode) or are illegal (querying or synchronizing an event
//     recorded in the capture, synchronizing the capturing stream). capture_state says
//     whether a stream captures; allocate_segment_during_capture allocates in a way a
//     capture allows. The allocator makes no other call that could touch a capture
//     while one is under way (docs/architecture.md, "Graph capture and private pools").
//   * Stream callbacks: a function run by launch_host_fn must not call into any
//     CachingAllocator. The allocator holds its device lock while it synchronizes a
//     stream (before memory goes back to the driver), so a callback on that stream that
//     waits for the lock is waited for by the lock's holder: a deadlock (CUDA forbids
//     CUDA calls in host functions for the same reason). Enforced, so that breaking
//     the rule is an error rather than a hang that depends on timing: a backend runs
//     every launch_host_fn function inside a StreamCallbackScope, and every
//     CachingAllocator method called while InStreamCallback() throws
//     InvalidArgumentError (or returns it, where it returns a Status).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "allocator/driver_calls.h"
#include "allocator/types.h"

namespace devmem {

namespace internal {
// The marker behind InStreamCallback (backend.cc). Only its own thread reads or writes it.
extern constinit thread_local bool tls_in_stream_callback;
}  // namespace internal

// True on a thread that is running a launch_host_fn function (see the contract above).
// Inline: every CachingAllocator call checks it (one TLS load, no call).
inline bool InStreamCallback() { return internal::tls_in_stream_callback; }

// Marks the current thread as running a stream callback for its lifetime (nests).
// Backends construct one around each launch_host_fn function they run.
class StreamCallbackScope {
 public:
  StreamCallbackScope();
  ~StreamCallbackScope();
  StreamCallbackScope(const StreamCallbackScope&) = delete;
  StreamCallbackScope& operator=(const StreamCallbackScope&) = delete;

 private:
  bool previous_;
};

// A stream's graph-capture state (cudaStreamCaptureStatus).
enum class CaptureState { kNone, kActive, kInvalidated };

// What a backend's memory can be shared with (Backend::sharing()).
struct SharingSupport {
  // Other devices or processes may use this memory (peer kernels and copies, NCCL,
  // IPC): true on CUDA. Then expandable_segments:auto picks expandable segments only
  // when both of the next two hold (segment_kind_policy.h).
  bool needed = false;
  // enable_peer_access covers mapped (virtual-memory) memory too.
  bool vmm_peer_access = false;
  // Mapped memory can be exported to another process (IPC).
  bool vmm_ipc = false;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual DeviceId device() const = 0;
  virtual Capabilities caps() const = 0;
  virtual DeviceInfo info() const = 0;

  // --- segments -------------------------------------------------------------------
  // Allocates `bytes` (> 0) of device memory. ResourceExhausted when the device (or
  // an injected fault) says there is not enough.
  virtual absl::StatusOr<void*> allocate_segment(size_t bytes) = 0;
  // Returns a segment. `p` and `bytes` are exactly what allocate_segment returned and
  // was asked for. The caller guarantees no stream still uses the memory.
  virtual void free_segment(void* p, size_t bytes) = 0;
  // Free and total bytes as the driver sees them (free includes other processes' use).
  virtual MemInfo mem_info() = 0;

  // --- streams and events -----------------------------------------------------------
  // Creates a new in-order stream. Backends without streams return Unimplemented.
  virtual absl::StatusOr<Stream> create_stream() {
    return absl::UnimplementedError("this backend has only the default stream");
  }
  // Destroys a stream made by create_stream after the work queued on it has run.
  virtual void destroy_stream(Stream) {}
  // Enqueues `fn` to run on the host when `stream` reaches it (cudaLaunchHostFunc).
  // Backends without streams run it at once. `fn` must not block on other streams.
  virtual absl::Status launch_host_fn(Stream stream, std::function<void()> fn) = 0;
  // Records an event on `stream`. Never fails for a valid stream.
  virtual Event record_event(Stream stream) = 0;
  // True once the stream has reached the event. Cheap: called while holding the
  // allocator's lock.
  virtual bool event_done(Event event) = 0;
  // Blocks until the event completes.
  virtual void synchronize_event(Event event) = 0;
  // Releases an event (done or not); the handle must not be used afterwards.
  virtual void release_event(Event event) = 0;
  // Records `event` again, on `stream` (cudaEventRecord on an event made once): what
  // lets an event pool reuse events instead of creating and destroying one per
  // cross-stream free. `event` came from record_event, is not released, and has
  // completed (event_done returned true or synchronize_event returned); afterwards it
  // is as if record_event(stream) had returned it. Returns false, changing nothing,
  // when this backend cannot reuse events (the default): the caller then releases the
  // event and records a new one. Otherwise throws what record_event throws, leaving
  // `event` completed and still the caller's.
  virtual bool rerecord_event(Event /*event*/, Stream /*stream*/) { return false; }
  // Blocks until all work queued on `stream` has run.
  virtual void synchronize_stream(Stream stream) = 0;

  // --- graph capture (see the contract above) ---------------------------------------
  // Whether `stream` is capturing (cudaStreamGetCaptureInfo). Cheap enough for a cache
  // miss. Backends without graphs never capture (the default).
  virtual CaptureState capture_state(Stream /*stream*/) { return CaptureState::kNone; }
  // allocate_segment while a capture may be under way: what CUDA allows then (cudaMalloc
  // with the thread's capture interaction mode relaxed, as PyTorch does: the graph
  // keeps the address, replays allocate nothing). The same errors as allocate_segment.
  virtual absl::StatusOr<void*> allocate_segment_during_capture(size_t bytes) {
    return allocate_segment(bytes);
  }

  // --- virtual memory (caps().virtual_memory) -------------------------------------
  virtual size_t granularity() const { return 0; }
  virtual absl::StatusOr<void*> reserve_address(size_t /*bytes*/) {
    return absl::UnimplementedError("this backend has no virtual memory management");
  }
  virtual void release_address(void* /*p*/, size_t /*bytes*/) {}
  virtual absl::Status map(void* /*p*/, size_t /*bytes*/) {
    return absl::UnimplementedError("this backend has no virtual memory management");
  }
  virtual void unmap(void* /*p*/, size_t /*bytes*/) {}
  // Gives the physical memory of the handle reserve back to the driver (cuMemRelease);
  // returns its bytes. Backends without a reserve return 0.
  virtual size_t release_handle_reserve() { return 0; }
  // The handle reserve's bytes now (cheap: the expandable segments ask on every map).
  virtual size_t handle_reserve_bytes() const { return 0; }

  // --- what the driver was asked (driver_calls.h) ---------------------------------
  virtual DriverCallStats driver_calls() const { return {}; }

  // --- sharing memory with other devices (segment_kind_policy.h) -------------------
  // What other devices and processes can do with this backend's memory; decides what
  // expandable_segments:auto means here (DecideSegmentKind). The default: memory no
  // other device or process can reach (sim, cpu), so nothing is needed.
  virtual SharingSupport sharing() const { return {}; }
  // Lets device `peer` (an index among this backend's kind of device, not this one)
  // read and write all of this device's memory, present and future: regular segments
  // (cudaDeviceEnablePeerAccess from `peer`) and every mapping of the reservations,
  // re-granted now, one access call per contiguous mapped range, and granted to every
  // later map with the others. Idempotent. Errors name the device, the peer and the
  // driver call: InvalidArgument for a peer that is this device or does not exist,
  // FailedPrecondition when the hardware cannot (cudaDeviceCanAccessPeer is 0),
  // Unimplemented for backends without peers (the default); on failure the set of
  // granted peers is as before. Thread-safe with map/unmap (a map made while this
  // runs is granted the peer either way).
  virtual absl::Status enable_peer_access(int /*peer*/) {
    return absl::UnimplementedError(
        absl::StrCat(device().ToString(), ": this backend has no peer devices"));
  }
};

}  // namespace devmem
