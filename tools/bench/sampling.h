// tools/bench/sampling.h: the cost of sampled stack traces (allocator/stack_sampler.h):
// cache-hit alloc+free pairs with sampling at the default rate over sampling off.
#pragma once

#include <cstdint>
#include <vector>

#include "allocator/config.h"

namespace devmem::devbench {

struct SamplingFigures {
  double off_ns = 0;      // stack_sample_bytes:0
  double sampled_ns = 0;  // at `mean`
  uint64_t mean = 0;
  int64_t timed_segment_allocs = 0;
};

// `sizes` on one allocator (the same memory layout for both), passes alternating
// between sampling off and sampling at `mean` bytes; restores the process's rate.
SamplingFigures MeasureSampling(const std::vector<size_t>& sizes, const Config& base,
                                uint64_t mean);

}  // namespace devmem::devbench
