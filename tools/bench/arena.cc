// tools/bench/arena.cc: see arena.h.
#include "tools/bench/arena.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <vector>

#include "allocator/arena.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "tools/bench/bench_util.h"

namespace devmem::bench {
namespace {

constexpr int kPasses = 9;
constexpr size_t kPairs = 1 << 14;
constexpr size_t kWindow = 8;
constexpr size_t kStepTemporaries = 200;
constexpr int kStepsPerPass = 64;

double Since(std::chrono::steady_clock::time_point start, size_t ops) {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
             .count() /
         static_cast<double>(ops);
}

// ns per pair, a window of kWindow live pointers (allocate the next, free the oldest).
double Pairs(CachingAllocator& a, const std::vector<size_t>& sizes) {
  void* live[kWindow] = {};
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < sizes.size(); ++i) {
    void*& slot = live[i % kWindow];
    if (slot != nullptr) a.free(slot);
    slot = a.allocate(sizes[i]);
  }
  for (void*& p : live) {
    if (p != nullptr) a.free(p);
    p = nullptr;
  }
  return Since(start, sizes.size());
}

// ns per allocation of kStepsPerPass steps, each with or without a scope. With
// `peak_requested`, the largest sum of live requested bytes goes there.
double Steps(CachingAllocator& a, const std::vector<size_t>& sizes, bool arena,
             const ArenaOptions& options, size_t* peak_requested = nullptr) {
  std::vector<void*> live(kStepTemporaries);
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < kStepsPerPass; ++step) {
    std::optional<ArenaScope> scope;
    if (arena) scope.emplace(a, "bench_step", options);
    const size_t* s = &sizes[(static_cast<size_t>(step) * 37) % (sizes.size() - kStepTemporaries)];
    for (size_t i = 0; i < kStepTemporaries; ++i) live[i] = a.allocate(s[i]);
    if (peak_requested != nullptr) {
      size_t sum = 0;
      for (size_t i = 0; i < kStepTemporaries; ++i) sum += s[i];
      *peak_requested = std::max(*peak_requested, sum);
    }
    for (void* p : live) a.free(p);
  }
  return Since(start, kStepsPerPass * kStepTemporaries);
}

Config SimBenchConfig(const Config& base) {
  Config config = base;
  config.backend = BackendKind::kSim;
  config.sim_capacity = size_t{1} << 40;  // address space only
  return config;
}

}  // namespace

ArenaFigures MeasureArena(const Config& base) {
  return MeasureArena(base, kDefaultArenaChunkSize);
}

ArenaFigures MeasureArena(const Config& base, size_t chunk_size) {
  const Config config = SimBenchConfig(base);
  const ArenaOptions options{.chunk_size = chunk_size, .stream = {}, .max_waste_fraction = {}};
  const std::vector<size_t> pair_sizes = devbench::LogUniformSizes(512, 32 * kKiB, 11, kPairs);
  const std::vector<size_t> step_sizes = devbench::LogUniformSizes(512, kMiB, 12, 4096);
  ArenaFigures f;
  // Fragmentation first, each on a fresh allocator: what the steps reserve, with and
  // without scopes.
  for (const bool arena : {true, false}) {
    CachingAllocator fresh(MakeSimBackend(config), config);
    size_t peak_requested = 0;
    Steps(fresh, step_sizes, arena, options, &peak_requested);
    (arena ? f.step_fragmentation : f.pool_step_fragmentation) =
        static_cast<double>(fresh.stats().reserved_bytes[kAggregatePool].peak) /
        static_cast<double>(peak_requested);
  }
  CachingAllocator alloc(MakeSimBackend(config), config);
  std::vector<double> arena_pair, pool_pair, arena_step, pool_step;
  // Warm-up: every phase, until a round of them allocates no segment (devbench::WarmUp:
  // the free lists' layout after a round depends on the one before it).
  devbench::WarmUp(
      [&] {
        {
          // One scope for every pair pass: after the warm-up its chunks are its own.
          ArenaScope scope(alloc, "bench_pairs", options);
          Pairs(alloc, pair_sizes);
          scope.close();
        }
        Pairs(alloc, pair_sizes);
        Steps(alloc, step_sizes, true, options);
        Steps(alloc, step_sizes, false, options);
      },
      [&] { return alloc.stats().num_device_alloc; });
  const int64_t segments_before = alloc.stats().num_device_alloc;
  for (int r = 0; r < kPasses; ++r) {
    {
      ArenaScope scope(alloc, "bench_pairs", options);
      arena_pair.push_back(Pairs(alloc, pair_sizes));
    }
    pool_pair.push_back(Pairs(alloc, pair_sizes));
    arena_step.push_back(Steps(alloc, step_sizes, true, options));
    pool_step.push_back(Steps(alloc, step_sizes, false, options));
  }
  f.timed_segment_allocs = alloc.stats().num_device_alloc - segments_before;
  f.arena_pair_ns = devbench::Median(arena_pair);
  f.pool_pair_ns = devbench::Median(pool_pair);
  f.arena_step_ns = devbench::Median(arena_step);
  f.pool_step_ns = devbench::Median(pool_step);
  return f;
}

void PrintArenaSweep(const Config& base) {
  std::printf("%-10s %14s %14s %14s %14s %18s %14s %14s\n", "chunk", "arena_pair_ns",
              "pool_pair_ns", "arena_step_ns", "pool_step_ns", "step_fragmentation",
              "(pool alone)", "timed_segments");
  for (size_t chunk = 64 * kKiB; chunk <= 64 * kMiB; chunk *= 4) {
    const ArenaFigures f = MeasureArena(base, chunk);
    std::printf("%-10s %14.1f %14.1f %14.2f %14.2f %18.3f %14.3f %14lld\n",
                FormatBytes(chunk).c_str(), f.arena_pair_ns, f.pool_pair_ns,
                f.arena_step_ns, f.pool_step_ns, f.step_fragmentation,
                f.pool_step_fragmentation, static_cast<long long>(f.timed_segment_allocs));
  }
}

}  // namespace devmem::bench
