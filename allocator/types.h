// allocator/types.h: the vocabulary shared by every layer of devmem.
//
// Glossary (docs/architecture.md has the long form):
//   device   a memory space: cuda:N (a GPU), sim:N (a simulated device), cpu (host
//            memory through jemalloc), cpu_pinned (page-locked host memory for copies
//            to and from GPUs: cudaHostAlloc, or plain host memory without CUDA).
//   stream   an in-order queue of device work. Stream{0} is the device's default
//            stream. Memory handed out on stream S may be used by work on S at once;
//            use on any other stream must be announced with record_stream().
//   event    a marker recorded on a stream; it completes when the stream reaches it.
//
// Everything here is a plain value type: cheap to copy, no ownership.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace devmem {

inline constexpr size_t kKiB = size_t{1} << 10;
inline constexpr size_t kMiB = size_t{1} << 20;
inline constexpr size_t kGiB = size_t{1} << 30;

enum class DeviceType : uint8_t { kCpu = 0, kSim = 1, kCuda = 2, kCpuPinned = 3 };

std::string_view DeviceTypeName(DeviceType type);

// Identifies a memory space. `index` is 0 for cpu and cpu_pinned.
struct DeviceId {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  friend bool operator==(const DeviceId&, const DeviceId&) = default;
  friend auto operator<=>(const DeviceId&, const DeviceId&) = default;
  // "cuda:0", "sim:1", "cpu", "cpu_pinned".
  std::string ToString() const;
  template <typename H>
  friend H AbslHashValue(H h, const DeviceId& d) {
    return H::combine(std::move(h), d.type, d.index);
  }
};

// Parses "cpu", "cpu_pinned", "sim:N", "cuda:N" (and "sim"/"cuda" meaning index 0). The error names
// the text that was given.
absl::StatusOr<DeviceId> ParseDeviceId(std::string_view text);

// An opaque stream handle owned by the backend that created it. For cuda it is the
// cudaStream_t; for sim, an index into the backend's stream table. 0 is the default
// stream on every backend.
struct Stream {
  uintptr_t handle = 0;
  friend bool operator==(const Stream&, const Stream&) = default;
  friend auto operator<=>(const Stream&, const Stream&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const Stream& s) {
    return H::combine(std::move(h), s.handle);
  }
};

// An opaque event handle owned by the backend that recorded it (released with
// Backend::release_event). 0 is never a valid event.
struct Event {
  uintptr_t handle = 0;
  friend bool operator==(const Event&, const Event&) = default;
};

// What the driver says about the device's memory.
struct MemInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};

// What a backend can do; the allocator adapts its policy to these.
struct Capabilities {
  bool streams = false;          // more than the default stream exists
  bool virtual_memory = false;   // reserve/map/unmap/granularity are implemented
  bool host_accessible = false;  // the host may read and write device pointers
};

// Descriptive facts for metrics and snapshots (devmem_device_info).
struct DeviceInfo {
  std::string name;     // "NVIDIA H200", "devmem simulated device", "host (jemalloc)"
  std::string uuid;     // "GPU-..." for cuda, a stable made-up one for sim, "" for cpu
  std::string backend;  // "cuda", "sim", "cpu"
};

}  // namespace devmem
