// allocator/cpu_backend.h: host memory through jemalloc, as a Backend (device "cpu").
//
// Segments come from a jemalloc arena of devmem's own (created once per process), so
// devmem's segments never share extents with the program's other malloc traffic and
// can be told apart in jemalloc's statistics. Page-aligned, host accessible.
//
// There are no streams: Stream{0} is the only stream, launch_host_fn runs the function
// at once on the calling thread, record_event returns an event that is already
// complete, and every synchronize is a no-op. There is no virtual-memory support.
//
// Example:
//   std::unique_ptr<Backend> cpu = NewCpuBackend();
//   absl::StatusOr<void*> p = cpu->allocate_segment(2 * kMiB);
//
// Thread-safety: every method may be called from any thread (jemalloc is thread-safe).
#pragma once

#include <memory>

#include "allocator/backend.h"

namespace devmem {

// `device` is what the backend reports: cpu, or cpu_pinned where no CUDA can pin host
// memory (backend_factory.h, MakePinnedHostBackend).
std::unique_ptr<Backend> NewCpuBackend(DeviceId device = DeviceId{});

}  // namespace devmem
