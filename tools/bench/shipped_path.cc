// tools/bench/shipped_path.cc: see shipped_path.h.
#include "tools/bench/shipped_path.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "allocator/site.h"
#include "tensor/factories.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/host_allocators.h"
#include "tools/bench/perf_counter.h"

namespace devmem::devbench {
namespace {

using Clock = std::chrono::steady_clock;

// The shipped path's pair: a site interned per allocation, from kNumSites in rotation.
struct ShippedOps {
  CachingAllocator& alloc;
  void* allocate(size_t n, size_t i) const {
    return alloc.allocate(n, {}, InternSite(Sites()[i % kNumSites], SiteKind::kAlloc));
  }
  void free(void* p) const { alloc.free(p); }
};

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

ThreadsFigures MeasureThreads2(CachingAllocator& alloc, const std::vector<size_t>& a,
                               const std::vector<size_t>& b) {
  const ShippedOps ops{alloc};
  // Two worker threads live for the whole measurement, as a program's threads do: each
  // keeps its thread cache (and its trace lane, histogram shard) from pass to pass, so a
  // pass times the steady state and not thread start, cache creation and refill (a
  // pass is under a millisecond, and a fresh thread's first misses, each under the
  // device lock, were a good part of it: the speedup read 0.9 with threads started per
  // pass where it reads 1.9 with these, on the same tree with the threads running at
  // once). Worker t
  // runs its own stream (`a` or `b`) with its own window of live pointers; nothing but
  // the allocator is shared. A pass starts both workers (or worker 0 alone) at once
  // and times from the first start to the last end.
  const std::vector<const std::vector<size_t>*> streams = {&a, &b};
  std::mutex mu;
  std::condition_variable cv;
  uint64_t generation = 0;  // a new pass (or the end, with `stop`)
  size_t active = 0;        // workers 0 .. active-1 run this pass
  size_t done = 0;
  bool stop = false;
  Clock::time_point begin[2], end[2];
  int64_t cpu_ns[2] = {};  // each worker's thread CPU time in the pass
  auto worker = [&](size_t t) {
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || (generation != seen && t < active); });
        if (stop) return;
        seen = generation;
      }
      const int64_t cpu_start = ThreadCpuNs();
      begin[t] = Clock::now();
      TimeShipped(ops, *streams[t]);
      end[t] = Clock::now();
      cpu_ns[t] = ThreadCpuNs() - cpu_start;
      {
        std::lock_guard<std::mutex> lock(mu);
        ++done;
      }
      cv.notify_all();
    }
  };
  // Runs one pass on workers 0 .. n-1: pairs per second, all of them together; adds
  // the workers' CPU ns per pair (their mean) to `cpu`.
  auto pass = [&](size_t n, std::vector<double>* cpu = nullptr) {
    {
      std::lock_guard<std::mutex> lock(mu);
      active = n;
      done = 0;
      ++generation;
    }
    cv.notify_all();
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done == n; });
    size_t pairs = 0;
    double cpu_per_pair = 0;
    for (size_t t = 0; t < n; ++t) {
      pairs += streams[t]->size();
      cpu_per_pair += static_cast<double>(cpu_ns[t]) / static_cast<double>(streams[t]->size()) /
                      static_cast<double>(n);
    }
    if (cpu != nullptr) cpu->push_back(cpu_per_pair);
    const Clock::time_point first = *std::min_element(begin, begin + n);
    const Clock::time_point last = *std::max_element(end, end + n);
    return static_cast<double>(pairs) / std::chrono::duration<double>(last - first).count();
  };
  std::thread workers[2] = {std::thread(worker, 0), std::thread(worker, 1)};
  // Warm-up: both caches filled at once, until a pass allocates no segment.
  WarmUp([&] { pass(2); }, [&] { return alloc.stats().num_device_alloc; });
  const int64_t before = alloc.stats().num_device_alloc;
  std::vector<double> one, two, one_cpu, two_cpu;
  for (int r = 0; r < kRepetitions; ++r) {
    one.push_back(pass(1, &one_cpu));
    two.push_back(pass(2, &two_cpu));
  }
  ThreadsFigures f;
  f.timed_segment_allocs = alloc.stats().num_device_alloc - before;
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
  }
  cv.notify_all();
  for (std::thread& w : workers) w.join();
  f.one_thread_pairs_per_s = Median(one);
  f.two_threads_pairs_per_s = Median(two);
  f.speedup = f.two_threads_pairs_per_s / f.one_thread_pairs_per_s;
  f.one_thread_cpu_ns_per_pair = Median(one_cpu);
  f.two_threads_cpu_ns_per_pair = Median(two_cpu);
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
