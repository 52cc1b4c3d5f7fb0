// tools/bench/shipped_path.cc: see shipped_path.h.
#include "tools/bench/shipped_path.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "allocator/site.h"
#include "tensor/factories.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/host_allocators.h"
#include "tools/bench/perf_counter.h"

namespace devmem::devbench {
namespace {

using Clock = std::chrono::steady_clock;

[[gnu::noinline]] double TimeShipped(const ShippedOps& ops, const std::vector<size_t>& sizes) {
  return TimePairs(
      sizes, [&](size_t n, size_t i) { return ops.allocate(n, i); },
      [&](void* p, size_t) { ops.free(p); });
}

}  // namespace

ShippedPairFigures MeasureShippedPairs(CachingAllocator& alloc, const std::vector<size_t>& sizes) {
  const ShippedOps ops{alloc};
  auto je_alloc = [](size_t n, size_t) { return JemallocAlloc(n); };
  const MimallocApi mi_api = Mimalloc();  // the pointers, so the loop does not reload
  auto mi_alloc = [&](size_t n, size_t) { return mi_api.malloc(n); };
  auto mi_free = [&](void* p, size_t) { mi_api.free(p); };
  TimeShipped(ops, sizes);  // warm-up: the cache, the site index, the instruction caches
  TimePairs(sizes, je_alloc, JemallocFree);
  if (HaveMimalloc()) TimePairs(sizes, mi_alloc, mi_free);
  InstructionCounter counter;
  const int64_t before = alloc.stats().num_device_alloc;
  std::vector<double> dm, mi, je, instructions;
  for (int r = 0; r < kRepetitions; ++r) {
    dm.push_back(TimeShipped(ops, sizes));
    if (HaveMimalloc()) mi.push_back(TimePairs(sizes, mi_alloc, mi_free));
    je.push_back(TimePairs(sizes, je_alloc, JemallocFree));
    if (counter.ok()) {  // a pass of its own: reading the counter is not timed
      counter.start();
      TimeShipped(ops, sizes);
      instructions.push_back(static_cast<double>(counter.stop()) /
                             static_cast<double>(sizes.size()));
    }
  }
  ShippedPairFigures f;
  f.timed_segment_allocs = alloc.stats().num_device_alloc - before;
  f.devmem_ns = Median(dm);
  if (HaveMimalloc()) f.mimalloc_ns = Median(mi);
  f.jemalloc_ns = Median(je);
  if (counter.ok()) {
    f.instructions = Median(instructions);
  } else {
    f.instructions_note = counter.why();
  }
  return f;
}

double MeasureTensorCreateNs() {
  constexpr int64_t kIterations = int64_t{1} << 18;
  const TensorOptions options{DType::kFloat32, DeviceId{DeviceType::kSim, 0}};
  auto pass = [&] {
    int64_t sink = 0;
    const Clock::time_point start = Clock::now();
    for (int64_t i = 0; i < kIterations; ++i) {
      Tensor t = empty({64}, options);
      sink += t.numel();
    }
    const Clock::time_point stop = Clock::now();
    if (sink != 64 * kIterations) std::abort();  // keeps the loop; cannot happen
    return std::chrono::duration<double, std::nano>(stop - start).count() / kIterations;
  };
  pass();  // warm-up
  std::vector<double> ns;
  for (int r = 0; r < kRepetitions; ++r) ns.push_back(pass());
  return Median(ns);
}

double MeasureIntern256Ns() {
  constexpr size_t kIterations = size_t{1} << 20;
  const auto& sites = Sites();
  auto pass = [&] {
    uint64_t sink = 0;
    const Clock::time_point start = Clock::now();
    for (size_t i = 0; i < kIterations; ++i) {
      sink += InternSite(sites[i % kNumSites], SiteKind::kAlloc);
    }
    const Clock::time_point stop = Clock::now();
    if (sink == 0) std::abort();  // keeps the loop; ids are >= 1
    return std::chrono::duration<double, std::nano>(stop - start).count() /
           static_cast<double>(kIterations);
  };
  pass();  // warm-up: every site interned once
  std::vector<double> ns;
  for (int r = 0; r < kRepetitions; ++r) ns.push_back(pass());
  return Median(ns);
}

}  // namespace devmem::devbench
