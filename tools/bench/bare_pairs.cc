// tools/bench/bare_pairs.cc: see bare_pairs.h.
#include "tools/bench/bare_pairs.h"

#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/host_allocators.h"

namespace devmem::devbench {

PairFigures MeasurePairs(const std::vector<size_t>& sizes, const Config& base) {
  const Config config = SimConfig(base);
  CachingAllocator alloc(MakeSimBackend(config), config);
  auto dm_alloc = [&](size_t n, size_t) { return alloc.allocate(n); };
  auto dm_free = [&](void* p, size_t) { alloc.free(p); };
  auto je_alloc = [](size_t n, size_t) { return JemallocAlloc(n); };
  // Warm-up: fills devmem's cache and jemalloc's, and the instruction caches.
  auto segments = [&] { return alloc.stats().num_device_alloc; };
  WarmUp([&] { TimePairs(sizes, dm_alloc, dm_free); }, segments);
  TimePairs(sizes, je_alloc, JemallocFree);
  const int64_t segments_before = alloc.stats().num_device_alloc;
  std::vector<double> dm, je;
  for (int r = 0; r < kRepetitions; ++r) {
    dm.push_back(TimePairs(sizes, dm_alloc, dm_free));
    je.push_back(TimePairs(sizes, je_alloc, JemallocFree));
  }
  PairFigures f;
  f.devmem_ns = Median(dm);
  f.jemalloc_ns = Median(je);
  f.timed_segment_allocs = alloc.stats().num_device_alloc - segments_before;
  return f;
}

}  // namespace devmem::devbench
