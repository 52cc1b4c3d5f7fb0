// tools/bench/bare_pairs.h: cache-hit pairs through a bare CachingAllocator on the sim
// device (no runtime, no observer, no site) beside jemalloc (the cost of tracing is
// measured on the shipped path: tools/bench/tracing.h).
//
// Each figure is the median of kRepetitions passes after a warm-up that fills the
// cache (passes until one allocates no segment: WarmUp), devmem and the host allocator interleaved so that drift in machine load hits
// both alike; timed_segment_allocs counts the segments allocated while timing (0: every
// timed devmem allocation was a cache hit).
#pragma once

#include <cstdint>
#include <vector>

#include "allocator/config.h"

namespace devmem::devbench {

struct PairFigures {
  double devmem_ns = 0;
  double jemalloc_ns = 0;
  int64_t timed_segment_allocs = 0;
};

// `sizes` through a CachingAllocator of SimConfig(base) and through jemalloc.
PairFigures MeasurePairs(const std::vector<size_t>& sizes, const Config& base);

}  // namespace devmem::devbench
