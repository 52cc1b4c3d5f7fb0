// allocator/sim_backend.h: the simulated device.
//
// Memory comes from one large mmap reservation (MAP_NORESERVE, PROT_NONE until a
// segment is handed out), so pages nothing writes cost nothing and a replay of a
// 100 GiB workload runs on a laptop; the capacity is a number this backend enforces,
// not memory it holds. Segment addresses are chosen first-fit inside the reservation,
// so the same sequence of calls gives the same addresses every run.
//
// Streams are in-order queues worked by one host thread each (created on first use);
// events complete when their stream's thread reaches them, or at once when recorded on
// an idle stream (nothing queued or running). The default stream has a worker too. Segment allocation and free sleep for the configured latency (emulating
// cudaMalloc/cudaFree). Failure injection is seeded: the Nth memory request (segment
// allocation or map) fails, and/or each fails with probability p.
//
// Virtual memory is emulated: reserve_address carves an address range without
// charging capacity; map charges and makes the range accessible; unmap makes it
// inaccessible and keeps its granules in the physical-handle reserve (still charged)
// until release_handle_reserve(); map takes granules from the reserve first.
//
// Driver calls are counted as the CUDA backend makes them (cuda/cuda_backend.cc): a
// map of n granules is n cuMemMap, one cuMemSetAccess, and one cuMemCreate per
// granule the reserve did not have; an unmap is one cuMemUnmap; each granule released
// from the reserve one cuMemRelease; segments one cudaMalloc / cudaFree. Each call
// costs what SimOptions::driver_costs says (estimated, not slept).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "allocator/backend.h"
#include "allocator/driver_calls.h"

namespace devmem {

struct SimOptions {
  int index = 0;
  size_t capacity = size_t{16} << 30;
  uint64_t alloc_latency_ns = 0;
  uint64_t free_latency_ns = 0;
  uint64_t fail_nth = 0;          // 1-based; 0 = off
  double fail_probability = 0;
  uint64_t seed = 0;
  size_t granularity = size_t{2} << 20;  // for the virtual-memory emulation
  // The driver cost model (driver_calls.h): what each emulated driver call would cost
  // on a GPU, accumulated in driver_calls().ns, never slept.
  SimDriverCosts driver_costs = A100Costs();
};

// Extra controls that tests and tools use on a sim backend.
class SimBackend : public Backend {
 public:
  // Changes the failure injection at run time (counts restart from now). It applies to
  // every memory request: segment allocations and maps (expandable segments).
  virtual void set_failure_injection(uint64_t fail_nth, double probability,
                                     uint64_t seed) = 0;
  // Makes the fail_nth-th record_event or rerecord_event from now (0: none) throw
  // std::runtime_error, as a real one may when the event or its queue entry cannot be
  // allocated; for testing that callers stay consistent when it does.
  virtual void set_event_failure_injection(uint64_t fail_nth) = 0;
  // Bytes charged against the capacity right now (segments, mapped ranges and the
  // physical-handle reserve).
  virtual size_t used_bytes() const = 0;
  // Number of memory requests (segment allocations and maps) attempted, and of
  // failures injected (those and record_event's) so far.
  virtual uint64_t segment_alloc_attempts() const = 0;
  virtual uint64_t injected_failures() const = 0;
};

// The simulated device of `options`. InvalidArgument for a granularity that is not a
// power-of-two multiple of the page size; ResourceExhausted when its address space
// cannot be reserved (too many simulated devices, an address-space limit).
absl::StatusOr<std::unique_ptr<SimBackend>> CreateSimBackend(const SimOptions& options);
// CreateSimBackend for tests and tools that treat failure as fatal: throws
// std::runtime_error with the error's message.
std::unique_ptr<SimBackend> NewSimBackend(const SimOptions& options);

}  // namespace devmem
