// tools/bench/arena.h: devmem-bench's scoped-arena figures (allocator/arena.h), in a
// file of their own so that devmem_bench.cc only calls MeasureArena and prints.
//
//   arena_pair_ns   alloc+free pairs inside one ArenaScope, sizes log-uniform in
//                   512 B .. 32 KiB (the tcache_pair_ns stream), a window of 8 live
//   pool_pair_ns    the same stream through the same allocator with no scope
//   arena_step_ns   per allocation: open a scope, 200 temporaries of assorted sizes
//                   (log-uniform 512 B .. 1 MiB) all live until the step ends, free
//                   them, close: the demo's step shape
//   pool_step_ns    the same step with no scope
//   step_fragmentation  peak reserved / peak requested of 64 such steps in scopes on a
//                   fresh allocator (requested: the live bytes the steps asked for);
//                   pool_step_fragmentation: the same without scopes
// Medians of 9 passes, after a warm-up, on the sim device (nothing touches memory).
// `devmem-bench --arena-sweep` prints these for a range of chunk sizes (PrintArenaSweep).
// ratio_arena_mimalloc is arena_pair_ns / mimalloc_pair_ns_tcache, which devmem-bench
// computes where it measures mimalloc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "allocator/config.h"

namespace devmem::bench {

struct ArenaFigures {
  double arena_pair_ns = 0;
  double pool_pair_ns = 0;
  double arena_step_ns = 0;
  double pool_step_ns = 0;
  double step_fragmentation = 0;
  double pool_step_fragmentation = 0;  // the same steps with no scope
  // Must be 0: after the warm-up every timed step found its chunks retained, and
  // every timed pool allocation was a cache hit.
  int64_t timed_segment_allocs = 0;
};

// With `chunk_size` as every scope's ArenaOptions::chunk_size.
ArenaFigures MeasureArena(const Config& base, size_t chunk_size);
ArenaFigures MeasureArena(const Config& base);

// The figures above for chunk sizes 64 KiB .. 64 MiB, one row each, on stdout.
void PrintArenaSweep(const Config& base);

}  // namespace devmem::bench
