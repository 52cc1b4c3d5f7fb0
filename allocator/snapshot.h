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
#include "allocator/stack_sampler.h"
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
  StackId stack = kNoStack;    // allocated and sampled: its stack (see sampled_stacks)
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
  // Sampled stacks (allocator/stack_sampler.h) of the allocated blocks above, grouped by
  // (site, stack), largest estimated live bytes first; each such block's `stack` names
  // its group's. Read after `segments` under the sampler's leaf lock, and only samples
  // of blocks allocated in `segments` are kept, so the two agree. `frames` stay empty
  // here (symbolizing is for the readers: the runtime's JSON writer fills them) unless
  // the snapshot was read from a file that carries them.
  std::vector<SampledStack> sampled_stacks;
  uint64_t stack_sample_bytes = 0;  // the sampling rate then (0: sampling off)
  // True when the stack ids are this process's (AttachSampledStacks): a writer looks
  // their frames up (stack_sampler::StackFrames); false when read from a file.
  bool local_stacks = false;
};

// How long snapshots held the device lock: DevicePool's snapshot critical section, from
// the lock taken to just before its release (CachingAllocator::snapshot_lock_stats).
// Written once per snapshot, after the copy, never on the allocation path; read by
// scripts/bench_snapshot.sh (devmem-bench-snapshot) against its 1 ms target.
struct SnapshotLockStats {
  uint64_t snapshots = 0;  // snapshots taken (validate()'s copies included)
  int64_t last_ns = 0;     // the latest one's hold, wall clock
  int64_t max_ns = 0;      // the longest hold so far, wall clock
  // The same in the holding thread's CPU time: without the time it was preempted while
  // holding the lock (which on a loaded machine is most of the wall time).
  int64_t last_cpu_ns = 0;
  int64_t max_cpu_ns = 0;
  // Page faults the holding thread took while holding it (minor: a page first touched;
  // getrusage(RUSAGE_THREAD), 0 where that is not available). Each costs ~1-2 us in a
  // VM; the arrays the copy fills are touched before the lock, so a hold should take
  // none: one that does names the cause of a long hold.
  int64_t last_faults = 0;
  int64_t max_faults = 0;
};

// Fills `snap`'s sampled_stacks, stack_sample_bytes and its allocated blocks' `stack`
// from `owner`'s live samples (stack_sampler.h); samples of addresses that are not an
// allocated block's in `snap` (allocated or freed since) are left out. No symbols.
void AttachSampledStacks(const void* owner, AllocatorSnapshot* snap);

// The monotonic clock used for ages and traces (CLOCK_MONOTONIC_COARSE: a few ns).
int64_t CoarseNowNs();
// The precise monotonic clock (CLOCK_MONOTONIC).
int64_t NowNs();
// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID: a system call, ~0.1-1 us;
// for figures taken once per snapshot, never on the allocation path).
int64_t ThreadCpuNowNs();
// The page faults (minor and major) the calling thread has taken so far
// (getrusage(RUSAGE_THREAD): a system call, ~0.3-1 us; 0 where not available). For
// figures taken once per snapshot, never on the allocation path.
int64_t ThreadFaults();

}  // namespace devmem
