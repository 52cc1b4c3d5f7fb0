// tools/bench/sampling.cc: see sampling.h.
#include "tools/bench/sampling.h"

#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/stack_sampler.h"
#include "tools/bench/bench_util.h"

namespace devmem::devbench {

SamplingFigures MeasureSampling(const std::vector<size_t>& sizes, const Config& base,
                                uint64_t mean) {
  const uint64_t previous = stack_sampler::MeanBytes();
  const Config config = SimConfig(base);
  CachingAllocator alloc(MakeSimBackend(config), config);
  auto dm_alloc = [&](size_t n, size_t) { return alloc.allocate(n); };
  auto dm_free = [&](void* p, size_t) { alloc.free(p); };
  // Warm-up at both rates: fills the cache and the stack table (a stack is interned
  // once; later samples of it only look it up, as in a long-running program).
  stack_sampler::SetMeanBytes(0);
  WarmUp([&] { TimePairs(sizes, dm_alloc, dm_free); },
         [&] { return alloc.stats().num_device_alloc; });
  stack_sampler::SetMeanBytes(mean);
  TimePairs(sizes, dm_alloc, dm_free);
  const int64_t before = alloc.stats().num_device_alloc;
  std::vector<double> off, on;
  for (int r = 0; r < kRepetitions; ++r) {
    stack_sampler::SetMeanBytes(0);
    off.push_back(TimePairs(sizes, dm_alloc, dm_free));
    stack_sampler::SetMeanBytes(mean);
    on.push_back(TimePairs(sizes, dm_alloc, dm_free));
  }
  stack_sampler::SetMeanBytes(previous);
  SamplingFigures f;
  f.off_ns = Median(off);
  f.sampled_ns = Median(on);
  f.mean = mean;
  f.timed_segment_allocs = alloc.stats().num_device_alloc - before;
  return f;
}

}  // namespace devmem::devbench
