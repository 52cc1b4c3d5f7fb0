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

// The shipped pair's passes, and those of mimalloc and jemalloc beside it: each pass is
// under a millisecond, so three times the usual count costs little and steadies the
// medians.
constexpr int kShippedRepetitions = 3 * kRepetitions;

// One pass of the shipped pair in the calling thread's CPU time (CpuTimePairs: a pass
// preempted on a loaded machine does not count the time it waited). The loop callgrind
// counts (--toggle-collect='*TimeShipped*').
[[gnu::noinline]] double TimeShipped(const ShippedOps& ops, const std::vector<size_t>& sizes) {
  return CpuTimePairs(
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
  // The three alternate pass by pass, each pass in thread CPU time, and each figure is
  // the median of its passes: drift in machine load hits all three alike, and a pass
  // that was preempted does not count the wait (wall-clock passes did: on a loaded
  // machine the ratio read anywhere from 1.9 to 16 with the CPU-time ratio at 1.7-2.0 in
  // the same runs).
  std::vector<double> dm, mi, je, instructions;
  for (int r = 0; r < kShippedRepetitions; ++r) {
    dm.push_back(TimeShipped(ops, sizes));
    if (HaveMimalloc()) mi.push_back(CpuTimePairs(sizes, mi_alloc, mi_free));
    je.push_back(CpuTimePairs(sizes, je_alloc, JemallocFree));
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
