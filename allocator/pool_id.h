// allocator/pool_id.h: the names of private pools (CUDA graph capture).
//
// A private pool is memory that only the allocations routed to it use: between
// CachingAllocator::begin_allocate_to_pool(id, filter) and end_allocate_to_pool(id),
// allocations on streams for which filter(stream) is true come from the pool's own
// segments, and what is freed there goes back to the pool, never to other work, until
// release_pool(id) (docs/architecture.md, "Graph capture and private pools"). This is
// what a CUDA graph needs: its replays reuse the addresses it was captured with, so no
// other work may be handed them while the graph lives. The semantics are PyTorch's
// (CUDACachingAllocator's beginAllocateToPool / endAllocateToPool / releasePool, which
// CUDAPluggableAllocator forwards): PoolId is its MempoolId_t, a pair of 64-bit ids.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/strings/str_format.h"
#include "allocator/types.h"

namespace devmem {

struct PoolId {
  uint64_t first = 0;
  uint64_t second = 0;
  // {0, 0} is PyTorch's "no pool" (the default, shared one); it names no private pool.
  bool is_default() const { return first == 0 && second == 0; }
  // "(1, 0)", as errors and snapshots print it.
  std::string ToString() const { return absl::StrFormat("(%u, %u)", first, second); }
  friend bool operator==(const PoolId&, const PoolId&) = default;
  friend auto operator<=>(const PoolId&, const PoolId&) = default;
};

// Which streams' allocations go to a private pool. Called under the device lock on
// every allocation while the pool is being allocated to, so it must be quick and must
// not call the allocator.
using StreamFilter = std::function<bool(Stream)>;

}  // namespace devmem
