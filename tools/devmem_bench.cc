// tools/devmem_bench.cc: devmem-bench, the allocator's speed figures, measured side by
// side with jemalloc in the same run.
//
//   build/bin/devmem-bench            a table
//   build/bin/devmem-bench --json     one JSON object on stdout
//
// What is measured (single thread, the sim device, nothing touches the memory):
//   small  cache-hit alloc+free pairs, sizes log-uniform in 512 B .. 1 MiB
//   mixed  the same, sizes log-uniform in 512 B .. 64 MiB
// Each size stream goes through devmem (after a warm-up that fills the cache, so every
// timed allocation is a cache hit: the run checks that no segment was allocated while
// timing) and through jemalloc's mallocx/sdallocx. A window of kLive allocations stays
// live (allocate the next, free the oldest), so the free lists hold real neighbours.
// ns per pair is the median of kRepetitions timed passes; ratio = devmem / jemalloc.
// Tensor handles: tensor_copy_ns (copy and destroy a Tensor), slice_ns (make a 2-D
// batch view), and atomic_pair_ns (one relaxed increment + one acq_rel decrement, the
// floor any thread-safe reference count pays), medians of 9 passes of 2^21.
// Tracing: tracing_overhead_ratio is traced_pair_ns over untraced_pair_ns: the small
// workload on one allocator, passes alternating between a TraceRing attached (two
// events per pair) with a call site interned per allocation (InternSite), and neither;
// the ratio is of the medians. Target <= 1.25.
// Absolute numbers depend on the machine; the ratios are what to compare.
// Exit status: 0; 1 when a segment was allocated while timing (the figures are printed,
// then a message); 2 bad arguments or a malformed DEVMEM_CONF (whose policy keys apply;
// the sim backend and its 1 TiB capacity are the bench's own).
#include <jemalloc/jemalloc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <source_location>
#include <string>
#include <vector>

#include "devmem/devmem_version.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/site.h"
#include "runtime/trace.h"
#include "tools/bench_flight.h"
#include "tensor/bench_kernels.h"

namespace devmem {
namespace {

constexpr int kRepetitions = 9;
constexpr size_t kSizes = 1 << 14;
constexpr size_t kLive = 8;

std::vector<size_t> LogUniformSizes(size_t lo, size_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(std::log(static_cast<double>(lo)),
                                           std::log(static_cast<double>(hi)));
  std::vector<size_t> sizes(kSizes);
  for (size_t& s : sizes) s = static_cast<size_t>(std::exp(u(rng)));
  return sizes;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs the size stream through alloc/free with a window of kLive live pointers and
// returns ns per alloc+free pair.
template <typename Alloc, typename Free>
double TimePairs(const std::vector<size_t>& sizes, Alloc alloc, Free free_fn) {
  void* live[kLive] = {};
  size_t live_size[kLive] = {};
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t slot = i % kLive;
    if (live[slot] != nullptr) free_fn(live[slot], live_size[slot]);
    live[slot] = alloc(sizes[i]);
    live_size[slot] = sizes[i];
  }
  for (size_t slot = 0; slot < kLive; ++slot) {
    if (live[slot] != nullptr) free_fn(live[slot], live_size[slot]);
  }
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(end - start).count() /
         static_cast<double>(sizes.size());
}

struct PairFigures {
  double devmem_ns = 0;
  double jemalloc_ns = 0;
  int64_t timed_segment_allocs = 0;  // must be 0: every timed devmem allocation hit
};

PairFigures MeasurePairs(const std::vector<size_t>& sizes, const Config& base) {
  Config config = base;
  config.backend = BackendKind::kSim;
  config.sim_capacity = size_t{1} << 40;  // address space only: nothing is touched
  CachingAllocator alloc(MakeSimBackend(config), config);
  auto dm_alloc = [&](size_t n) { return alloc.allocate(n); };
  auto dm_free = [&](void* p, size_t) { alloc.free(p); };
  auto je_alloc = [](size_t n) { return mallocx(n, 0); };
  auto je_free = [](void* p, size_t n) { sdallocx(p, n, 0); };
  // Warm-up: fills devmem's cache and jemalloc's, and the instruction caches.
  TimePairs(sizes, dm_alloc, dm_free);
  TimePairs(sizes, je_alloc, je_free);
  const int64_t segments_before = alloc.stats().num_device_alloc;
  std::vector<double> dm, je;
  for (int r = 0; r < kRepetitions; ++r) {
    // Interleaved, so that drift in machine load hits both alike.
    dm.push_back(TimePairs(sizes, dm_alloc, dm_free));
    je.push_back(TimePairs(sizes, je_alloc, je_free));
  }
  PairFigures f;
  f.devmem_ns = Median(dm);
  f.jemalloc_ns = Median(je);
  f.timed_segment_allocs = alloc.stats().num_device_alloc - segments_before;
  return f;
}

struct TracingFigures {
  double plain_ns = 0;
  double traced_ns = 0;
  int64_t timed_segment_allocs = 0;
};

// The small workload on one allocator, passes alternating between plain (no observer,
// no site) and traced (a TraceRing attached, a site interned per allocation). One
// allocator, so that both see the same memory layout: two allocators of one process
// can differ by more than tracing costs (hash-table and address layout).
TracingFigures MeasureTracing(const std::vector<size_t>& sizes, const Config& base) {
  Config config = base;
  config.backend = BackendKind::kSim;
  config.sim_capacity = size_t{1} << 40;
  CachingAllocator alloc(MakeSimBackend(config), config);
  TraceRing ring(size_t{1} << 16);  // 4 MiB: larger than L2, as a real trace is
  auto plain_alloc = [&](size_t n) { return alloc.allocate(n); };
  auto traced_alloc = [&](size_t n) {
    return alloc.allocate(n, {}, InternSite(std::source_location::current(), SiteKind::kAlloc));
  };
  auto dm_free = [&](void* p, size_t) { alloc.free(p); };
  TimePairs(sizes, plain_alloc, dm_free);
  alloc.set_observer(&ring);
  TimePairs(sizes, traced_alloc, dm_free);
  const int64_t before = alloc.stats().num_device_alloc;
  std::vector<double> p, t;
  for (int r = 0; r < kRepetitions; ++r) {
    alloc.set_observer(nullptr);
    p.push_back(TimePairs(sizes, plain_alloc, dm_free));
    alloc.set_observer(&ring);
    t.push_back(TimePairs(sizes, traced_alloc, dm_free));
  }
  alloc.set_observer(nullptr);
  TracingFigures f;
  f.plain_ns = Median(p);
  f.traced_ns = Median(t);
  f.timed_segment_allocs = alloc.stats().num_device_alloc - before;
  return f;
}

int Main(int argc, char** argv) {
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("%s %s\n", "devmem-bench", DEVMEM_VERSION);
      return 0;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(
          "usage: devmem-bench [--json]\n"
          "Times cache-hit alloc+free pairs through devmem (sim device) and jemalloc\n"
          "in the same run; prints medians of %d passes and the ratios.\n",
          kRepetitions);
      return 0;
    } else {
      std::fprintf(stderr, "devmem-bench: unknown argument \"%s\" (try --help)\n",
                   argv[i]);
      return 2;
    }
  }
  // DEVMEM_CONF is read and validated like every devmem executable does: its policy
  // keys apply; the backend (sim) and its capacity (1 TiB of address space) are the
  // bench's own, so that nothing is touched and nothing runs out.
  const absl::StatusOr<Config> env = ConfigFromEnv();
  if (!env.ok()) {
    std::fprintf(stderr, "devmem-bench: %s\n", std::string(env.status().message()).c_str());
    return 2;
  }
  const PairFigures small = MeasurePairs(LogUniformSizes(512, kMiB, 1), *env);
  const PairFigures mixed = MeasurePairs(LogUniformSizes(512, 64 * kMiB, 2), *env);
  const double ratio_small = small.devmem_ns / small.jemalloc_ns;
  const double ratio_mixed = mixed.devmem_ns / mixed.jemalloc_ns;
  const double tensor_copy_ns = bench::TensorCopyNs();
  const double slice_ns = bench::SliceNs();
  const double atomic_pair_ns = bench::AtomicPairNs();
  const TracingFigures tracing = MeasureTracing(LogUniformSizes(512, kMiB, 1), *env);
  const double tracing_ratio = tracing.traced_ns / tracing.plain_ns;
  const absl::StatusOr<bench::FlightFigures> flight =
      bench::MeasureFlightRecorder(LogUniformSizes(512, kMiB, 1), *env, kRepetitions);
  const long long timed_segment_allocs = static_cast<long long>(
      small.timed_segment_allocs + mixed.timed_segment_allocs + tracing.timed_segment_allocs);
  // The figures are of cache hits only: a segment allocated while timing means some
  // timed pairs went to the device, and the run is not a measurement of the cache.
  // Printed anyway (to see how far off), then exit status 1.
  auto check_cache_hits = [&] {
    if (timed_segment_allocs == 0) return 0;
    std::fprintf(stderr,
                 "devmem-bench: %lld segments were allocated while timing: not every timed "
                 "pair was a cache hit, so these figures do not measure the cache%s\n",
                 timed_segment_allocs,
                 std::getenv("DEVMEM_CONF") != nullptr ? " (DEVMEM_CONF's policy keys apply)" : "");
    return 1;
  };
  if (json) {
    std::printf("{\"pair_ns_small\": %.1f, \"jemalloc_pair_ns_small\": %.1f, "
                "\"ratio_small\": %.3f, \"pair_ns_mixed\": %.1f, "
                "\"jemalloc_pair_ns_mixed\": %.1f, \"ratio_mixed\": %.3f, "
                "\"timed_segment_allocs\": %lld",
                small.devmem_ns, small.jemalloc_ns, ratio_small, mixed.devmem_ns,
                mixed.jemalloc_ns, ratio_mixed, timed_segment_allocs);
    std::printf(", \"tensor_copy_ns\": %.2f, \"slice_ns\": %.2f, \"atomic_pair_ns\": %.2f, "
                "\"tensor_copy_over_atomic_pair\": %.3f",
                tensor_copy_ns, slice_ns, atomic_pair_ns, tensor_copy_ns / atomic_pair_ns);
    std::printf(", \"untraced_pair_ns\": %.1f, \"traced_pair_ns\": %.1f, "
                "\"tracing_overhead_ratio\": %.3f",
                tracing.plain_ns, tracing.traced_ns, tracing_ratio);
    if (flight.ok()) {
      std::printf(", \"flight_recorded_pair_ns\": %.1f, \"flight_recorder_overhead_ratio\": %.3f",
                  flight->recorded_ns, flight->recorded_ns / flight->plain_ns);
    } else {
      std::fprintf(stderr, "devmem-bench: flight recorder: %s\n", flight.status().ToString().c_str());
    }
    std::printf("}\n");
    return check_cache_hits();
  }
  std::printf("devmem-bench: medians of %d passes of %zu alloc+free pairs, %zu live\n",
              kRepetitions, kSizes, kLive);
  std::printf("%-34s %12s %12s %8s %8s\n", "workload", "devmem ns", "jemalloc ns",
              "ratio", "target");
  std::printf("%-34s %12.1f %12.1f %8.3f %8s\n", "small: 512 B .. 1 MiB (log-uniform)",
              small.devmem_ns, small.jemalloc_ns, ratio_small, "<= 3");
  std::printf("%-34s %12.1f %12.1f %8.3f %8s\n", "mixed: 512 B .. 64 MiB (log-uniform)",
              mixed.devmem_ns, mixed.jemalloc_ns, ratio_mixed, "<= 0.5");
  std::printf("%-34s %12.1f %12.1f %8.3f %8s\n", "small, traced + sites (vs. plain)",
              tracing.traced_ns, tracing.plain_ns, tracing_ratio, "<= 1.25");
  std::printf("segments allocated while timing: %lld (0 means every pair was a cache "
              "hit)\n",
              timed_segment_allocs);
  std::printf("tensor handle copy+destroy: %.2f ns (target <= 10); a bare atomic "
              "inc+dec pair, the floor of any thread-safe refcount here: %.2f ns "
              "(ratio %.2f)\n",
              tensor_copy_ns, atomic_pair_ns, tensor_copy_ns / atomic_pair_ns);
  std::printf("2-D slice view: %.2f ns (target <= 60)\n", slice_ns);
  return check_cache_hits();
}

}  // namespace
}  // namespace devmem

int main(int argc, char** argv) { return devmem::Main(argc, argv); }
