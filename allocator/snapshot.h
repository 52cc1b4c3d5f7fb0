// allocator/snapshot.h: a consistent picture of one allocator's memory, taken under its
// lock: segments in address order, each tiled exactly by its blocks. The runtime layer
// turns this into JSON (docs/formats.md); memtrace reads that back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/arena.h"
#include "allocator/pool_id.h"
#include "allocator/site.h"
#include "allocator/stats.h"
#include "allocator/types.h"

namespace devmem {

enum class BlockState : uint8_t {
  kAllocated = 0,  // held by the user
  kFree = 1,       // cached: ready for reuse on its stream
  kPending = 2,    // freed by the user, waiting for events on other streams
  // Internal: in a thread cache (allocator/thread_cache.h). Never in a snapshot:
  // snapshot() first gives every thread-cached block back to the pool.
  kThreadCached = 3,
};
std::string_view BlockStateName(BlockState state);

struct BlockInfo {
  uintptr_t addr = 0;
  size_t size = 0;
  size_t requested = 0;        // 0 unless allocated
  BlockState state = BlockState::kFree;
  Stream stream;               // the stream it belongs to
  SiteId site = kUnknownSite;  // unless free
  int64_t alloc_time_ns = 0;   // monotonic (coarse) clock at allocation; 0 if free
};

struct SegmentInfo {
  uintptr_t addr = 0;
  size_t size = 0;       // bytes backed by memory (for expandable: mapped bytes)
  Stream stream;
  bool small_pool = false;
  bool expandable = false;
  // The private pool (graph capture) the segment belongs to; {0, 0}: the shared pool.
  PoolId private_pool;
  std::vector<BlockInfo> blocks;  // address order, tiling [addr, addr + size)
};

struct AllocatorSnapshot {
  DeviceId device;
  DeviceInfo info;
  MemInfo mem_info;  // read just before the lock is taken (a driver call)
  DeviceStats stats;
  std::vector<SegmentInfo> segments;  // address order
  // Live buffers of scoped arenas, by chunk (each chunk is one allocated block above,
  // of an arena site). Read just after `segments`, under the arenas' locks rather than
  // the device lock: with arena frees running meanwhile the two may differ by those.
  std::vector<ArenaBufferInfo> arena_buffers;
  int64_t time_ns = 0;                // monotonic clock when taken
};

// The monotonic clock used for ages and traces (CLOCK_MONOTONIC_COARSE: a few ns).
int64_t CoarseNowNs();
// The precise monotonic clock (CLOCK_MONOTONIC).
int64_t NowNs();

}  // namespace devmem
