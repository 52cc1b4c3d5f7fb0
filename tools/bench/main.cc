// tools/bench/main.cc: devmem-bench, the allocator's speed figures, measured side by
// side with host allocators in the same run.
//
//   build/bin/devmem-bench            a table, each figure beside its target
//   build/bin/devmem-bench --json     one JSON object on stdout
//
// What is measured (the sim device; nothing touches the memory), one concern per file
// of tools/bench/:
//   bare_pairs.cc     cache-hit alloc+free pairs on a bare CachingAllocator beside
//                     jemalloc (mallocx/sdallocx): small (512 B .. 1 MiB, log-uniform)
//                     and mixed (512 B .. 64 MiB).
//   tracing.cc        tracing_overhead_ratio on the shipped path (below): the runtime's
//                     observer with its trace (on by default) over without, 512 B ..
//                     32 KiB, a site per allocation (target <= 1.15).
//   shipped_path.cc   what programs run: the runtime's allocator for sim:0 with its
//                     observer attached, sites from 256 call sites in rotation, sizes
//                     512 B .. 32 KiB: tcache_pair_ns beside mimalloc (mi_malloc/mi_free)
//                     and jemalloc on the same stream, ratio_tcache_mimalloc (target
//                     <= 2.0), instructions_per_pair (perf_event_open; absent where not
//                     allowed), tensor_create_ns (empty({64}) on sim:0;
//                     target <= 100) and intern_256_sites_ns (target <= 15).
//   threads2.cc       threads2_speedup: 2 long-lived threads, each with its own stream
//                     on the shipped path, over 1 of them, from passes in which both
//                     ran at once (overlap checked and reported; target >= 1.8;
//                     --threads2 runs only this).
//   sampling.cc       sampled_stacks_overhead_ratio: mixed pairs with sampled stacks at
//                     the default stack_sample_bytes over sampling off (target <= 1.05).
//   flight_recorder.cc  flight_recorder_overhead_ratio: the same pairs with a flight
//                     recorder attached over plain (the median ratio of alternated
//                     passes in thread CPU time; target <= 1.15).
//   steady_maps.cc    steady_maps_2streams: device maps+unmaps once warm while two
//                     streams alternate between one and two active threads (target 0).
//   tensor/bench_kernels.h  tensor handle copy, 2-D slice and a bare atomic pair.
// A window of kLive allocations stays live in every pair loop (allocate the next, free
// the oldest). Each figure is the median of kRepetitions passes after a warm-up; devmem
// and the host allocators are interleaved per pass so that drift in machine load hits
// both alike (the shipped pair and its mimalloc and jemalloc figures: 3 * kRepetitions
// passes each, in thread CPU time, see shipped_path.h). Absolute numbers depend on the machine; the ratios and the instruction
// count are what to compare.
// Exit status: 0; 1 when a segment was allocated while timing cache-hit pairs (the
// figures are printed, then a message); 2 bad arguments or a malformed DEVMEM_CONF
// (whose policy keys apply; the sim backend and its 1 TiB capacity are the bench's own).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "allocator/config.h"
#include "devmem/devmem_version.h"
#include "runtime/runtime.h"
#include "tensor/bench_kernels.h"
#include "tools/bench/arena.h"
#include "tools/bench/bare_pairs.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/flight_recorder.h"
#include "tools/bench/host_allocators.h"
#include "tools/bench/sampling.h"
#include "allocator/stack_sampler.h"
#include "tools/bench/shipped_path.h"
#include "tools/bench/steady_maps.h"
#include "tools/bench/threads2.h"
#include "tools/bench/tracing.h"

namespace devmem::devbench {
namespace {

// One JSON object, keys in the order added.
class JsonOut {
 public:
  void add(const char* key, double value, const char* format = "%.1f") {
    char buf[64];
    std::snprintf(buf, sizeof(buf), format, value);
    text_ += (text_.empty() ? "{" : ", ") + std::string("\"") + key + "\": " + buf;
  }
  void add_int(const char* key, long long value) { add(key, static_cast<double>(value), "%.0f"); }
  std::string str() const { return text_ + "}"; }

 private:
  std::string text_;
};

// The threads2 rows of the table.
void PrintThreads(const ThreadsFigures& t) {
  if (t.speedup) {
    std::printf("%-36s %12.3f %12s   (%.2f M pairs/s on 1 thread, %.2f M on 2; %lld "
                "segments allocated while timing)\n",
                "threads2_speedup", *t.speedup, ">= 1.8", t.one_thread_pairs_per_s / 1e6,
                t.two_threads_pairs_per_s / 1e6, static_cast<long long>(t.timed_segment_allocs));
    std::printf("%-36s %12.1f %12s   (CPU ns per pair of each thread: %.1f alone)\n",
                "threads2: CPU ns/pair, both running", t.two_threads_cpu_ns_per_pair, "",
                t.one_thread_cpu_ns_per_pair);
  } else {
    std::printf("%-36s %12s %12s   (%s)\n", "threads2_speedup", "n/a", ">= 1.8", t.why.c_str());
  }
  std::printf("%-36s %12.3f %12s   (median of the %d of %d two-thread passes that counted; "
              "of all: %.3f; start skew %.0f ns; %d of %d one-thread passes counted)\n",
              "threads2: overlap", t.overlap.value_or(0), ">= 0.9", t.two_thread_counted,
              t.two_thread_passes, t.overlap_all, t.start_skew_ns, t.one_thread_counted,
              t.one_thread_passes);
  if (!t.mimalloc) return;
  const Scaling& m = *t.mimalloc;
  if (m.speedup) {
    std::printf("%-36s %12.3f %12s   (the machine's reference, same passes: CPU ns per pair "
                "%.1f alone, %.1f both running; %d of %d passes counted)\n",
                "threads2 through mimalloc", *m.speedup, "", m.one_thread_cpu_ns_per_pair,
                m.two_threads_cpu_ns_per_pair, m.two_thread_counted, m.two_thread_passes);
  } else {
    std::printf("%-36s %12s %12s   (%s)\n", "threads2 through mimalloc", "n/a", "",
                m.why.c_str());
  }
}

// The threads2 keys of --json: the speedups and CPU ns only when measured (else a note
// on stderr says why), the passes always.
void AddThreads(JsonOut& out, const ThreadsFigures& t) {
  if (t.speedup) {
    out.add("threads2_speedup", *t.speedup, "%.3f");
    out.add("threads2_cpu_ns_per_pair_1", t.one_thread_cpu_ns_per_pair);
    out.add("threads2_cpu_ns_per_pair_2", t.two_threads_cpu_ns_per_pair);
  } else {
    std::fprintf(stderr, "devmem-bench: note: no threads2_speedup: %s\n", t.why.c_str());
  }
  if (t.overlap) out.add("threads2_overlap", *t.overlap, "%.3f");
  out.add_int("threads2_passes", t.two_thread_passes);
  out.add_int("threads2_passes_counted", t.two_thread_counted);
  if (t.mimalloc && t.mimalloc->speedup) {
    out.add("threads2_speedup_mimalloc", *t.mimalloc->speedup, "%.3f");
    out.add("threads2_cpu_ns_per_pair_1_mimalloc", t.mimalloc->one_thread_cpu_ns_per_pair);
    out.add("threads2_cpu_ns_per_pair_2_mimalloc", t.mimalloc->two_threads_cpu_ns_per_pair);
  } else if (t.mimalloc) {
    std::fprintf(stderr, "devmem-bench: note: no threads2_speedup_mimalloc: %s\n",
                 t.mimalloc->why.c_str());
  }
}

int Main(int argc, char** argv) {
  bool json = false;
  bool arena_sweep = false;  // only the arena figures, per chunk size (tools/bench/arena.h)
  bool threads2_only = false;  // only threads2_speedup (A/B runs of the scaling work)
  bool flight_only = false;    // only flight_recorder_overhead_ratio (A/B runs)
  bool shipped_only = false;   // only the shipped pair (A/B runs, callgrind of its loop)
  bool tracing_only = false;   // only tracing_overhead_ratio (A/B runs of the trace)
  bool tensor_only = false;    // only tensor_create_ns (A/B runs of the tensor layer)
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--arena-sweep") == 0) {
      arena_sweep = true;
    } else if (std::strcmp(argv[i], "--threads2") == 0) {
      threads2_only = true;
    } else if (std::strcmp(argv[i], "--flight") == 0) {
      flight_only = true;
    } else if (std::strcmp(argv[i], "--shipped") == 0) {
      shipped_only = true;
    } else if (std::strcmp(argv[i], "--tracing") == 0) {
      tracing_only = true;
    } else if (std::strcmp(argv[i], "--tensor") == 0) {
      tensor_only = true;
    } else if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("%s %s\n", "devmem-bench", DEVMEM_VERSION);
      return 0;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(
          "usage: devmem-bench [--json] [--arena-sweep | --threads2 | --flight | --shipped |\n"
          "                    --tracing | --tensor]\n"
          "Times cache-hit alloc+free pairs through devmem (sim device: a bare allocator,\n"
          "and the runtime's shipped path) beside jemalloc and mimalloc in the same run,\n"
          "threads, tensors, site interning and steady-state device maps; prints medians\n"
          "of %d passes, each beside its target. --arena-sweep prints only the scoped\n"
          "arena figures, one row per chunk size (64 KiB .. 64 MiB); --threads2 only\n"
          "threads2_speedup (for side-by-side runs of two builds); --flight only\n"
          "flight_recorder_overhead_ratio; --shipped only the shipped pair beside\n"
          "mimalloc and jemalloc, and intern_256_sites_ns (its loop is TimeShipped:\n"
          "callgrind --toggle-collect='*TimeShipped*' counts a pair); --tracing only\n"
          "tracing_overhead_ratio (A/B runs of the trace); --tensor only tensor_create_ns\n"
          "(its loop is MeasureTensorCreateNs: callgrind\n"
          "--toggle-collect='*MeasureTensorCreateNs*lambda*' counts a create+destroy).\n",
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
  if (arena_sweep) {
    bench::PrintArenaSweep(*env);
    return 0;
  }
  if (flight_only) {
    const absl::StatusOr<FlightFigures> f =
        MeasureFlightRecorder(LogUniformSizes(512, kMiB, 1), *env, kRepetitions);
    if (!f.ok()) {
      std::fprintf(stderr, "devmem-bench: flight recorder: %s\n", f.status().ToString().c_str());
      return 1;
    }
    std::printf("flight_plain_pair_ns %.2f\nflight_recorded_pair_ns %.2f\n"
                "flight_minor_faults_per_pass %.2f\nflight_fastest_ratio %.3f\n"
                "flight_recorder_overhead_ratio %.3f\n",
                f->plain_ns, f->recorded_ns, f->minor_faults_per_pass, f->fastest_ratio,
                f->ratio);
    return f->timed_segment_allocs == 0 ? 0 : 1;
  }
  // The shipped path: the runtime, as a program gets it, on the sim device.
  std::shared_ptr<CachingAllocator> shipped;
  try {
    if (absl::Status s = Runtime::Init(SimConfig(*env)); !s.ok()) {
      std::fprintf(stderr, "devmem-bench: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    shipped = Runtime::Get().allocator(DeviceId{DeviceType::kSim, 0});
  } catch (const std::exception& e) {  // the runtime's keys of DEVMEM_CONF (http, ...)
    std::fprintf(stderr, "devmem-bench: DEVMEM_CONF: %s\n", e.what());
    return 2;
  }

  if (threads2_only) {
    // The streams of the full run's threads2_speedup.
    const ThreadsFigures t = MeasureThreads2(*shipped, LogUniformSizes(512, 32 * kKiB, 3),
                                             LogUniformSizes(512, 32 * kKiB, 4));
    if (json) {
      JsonOut out;
      AddThreads(out, t);
      if (t.speedup) {
        out.add("one_thread_pairs_per_s", t.one_thread_pairs_per_s, "%.0f");
        out.add("two_threads_pairs_per_s", t.two_threads_pairs_per_s, "%.0f");
      }
      out.add_int("timed_segment_allocs", t.timed_segment_allocs);
      std::printf("%s\n", out.str().c_str());
    } else {
      PrintThreads(t);
    }
    if (t.timed_segment_allocs == 0) return 0;
    std::fprintf(stderr, "devmem-bench: %lld segments were allocated while timing threads2: "
                 "not every timed pair was a cache hit\n",
                 static_cast<long long>(t.timed_segment_allocs));
    return 1;
  }

  if (tensor_only) {
    JsonOut out;
    out.add("tensor_create_ns", MeasureTensorCreateNs());
    std::printf("%s\n", out.str().c_str());  // one line, table or not
    return 0;
  }

  if (tracing_only) {
    const TracingFigures t = MeasureShippedTracing(*shipped, LogUniformSizes(512, 32 * kKiB, 3));
    JsonOut out;
    out.add("untraced_pair_ns", t.plain_ns);
    out.add("traced_pair_ns", t.traced_ns);
    out.add("tracing_overhead_ratio", t.traced_ns / t.plain_ns, "%.3f");
    out.add_int("trace_entries", static_cast<int64_t>(t.trace_entries));
    out.add_int("timed_segment_allocs", t.timed_segment_allocs);
    std::printf("%s\n", out.str().c_str());  // one line, table or not
    return t.timed_segment_allocs == 0 ? 0 : 1;
  }

  if (shipped_only) {
    const std::vector<size_t> sizes = LogUniformSizes(512, 32 * kKiB, 3);  // as the full run
    const ShippedPairFigures t = MeasureShippedPairs(*shipped, sizes);
    const double intern_ns = MeasureIntern256Ns();
    JsonOut out;
    out.add("tcache_pair_ns", t.devmem_ns);
    if (t.mimalloc_ns) {
      out.add("mimalloc_pair_ns_tcache", *t.mimalloc_ns);
      out.add("ratio_tcache_mimalloc", t.devmem_ns / *t.mimalloc_ns, "%.3f");
    }
    out.add("jemalloc_pair_ns_tcache", t.jemalloc_ns);
    if (t.instructions) out.add("instructions_per_pair", *t.instructions, "%.0f");
    out.add("intern_256_sites_ns", intern_ns, "%.2f");
    out.add_int("timed_segment_allocs", t.timed_segment_allocs);
    std::printf("%s\n", out.str().c_str());  // one line, table or not
    return t.timed_segment_allocs == 0 ? 0 : 1;
  }

  const PairFigures small = MeasurePairs(LogUniformSizes(512, kMiB, 1), *env);
  const PairFigures mixed = MeasurePairs(LogUniformSizes(512, 64 * kMiB, 2), *env);
  const double ratio_small = small.devmem_ns / small.jemalloc_ns;
  const double ratio_mixed = mixed.devmem_ns / mixed.jemalloc_ns;
  const double tensor_copy_ns = bench::TensorCopyNs();
  const double slice_ns = bench::SliceNs();
  const double atomic_pair_ns = bench::AtomicPairNs();
  const SamplingFigures sampling =
      MeasureSampling(LogUniformSizes(512, 64 * kMiB, 2), *env, kDefaultStackSampleBytes);
  const double sampling_ratio = sampling.sampled_ns / sampling.off_ns;
  const absl::StatusOr<FlightFigures> flight =
      MeasureFlightRecorder(LogUniformSizes(512, kMiB, 1), *env, kRepetitions);
  const std::vector<size_t> tcache_sizes = LogUniformSizes(512, 32 * kKiB, 3);
  const ShippedPairFigures tcache = MeasureShippedPairs(*shipped, tcache_sizes);
  const TracingFigures tracing = MeasureShippedTracing(*shipped, tcache_sizes);
  const double tracing_ratio = tracing.traced_ns / tracing.plain_ns;
  const ThreadsFigures threads =
      MeasureThreads2(*shipped, tcache_sizes, LogUniformSizes(512, 32 * kKiB, 4));
  const double tensor_create_ns = MeasureTensorCreateNs();
  const double intern_ns = MeasureIntern256Ns();
  const SteadyMapsFigures maps = MeasureSteadyMaps2Streams(*env);
  const bench::ArenaFigures arena = bench::MeasureArena(*env);  // tools/bench/arena.h
  const long long steady_maps = static_cast<long long>(maps.maps + maps.unmaps);
  const long long timed_segment_allocs = static_cast<long long>(
      small.timed_segment_allocs + mixed.timed_segment_allocs + tracing.timed_segment_allocs +
      tcache.timed_segment_allocs + arena.timed_segment_allocs +
      sampling.timed_segment_allocs);
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
  const char* const no_mimalloc = MimallocProblem();
  if (json) {
    JsonOut out;
    out.add("pair_ns_small", small.devmem_ns);
    out.add("jemalloc_pair_ns_small", small.jemalloc_ns);
    out.add("ratio_small", ratio_small, "%.3f");
    out.add("pair_ns_mixed", mixed.devmem_ns);
    out.add("jemalloc_pair_ns_mixed", mixed.jemalloc_ns);
    out.add("ratio_mixed", ratio_mixed, "%.3f");
    out.add_int("timed_segment_allocs", timed_segment_allocs);
    out.add("tensor_copy_ns", tensor_copy_ns, "%.2f");
    out.add("slice_ns", slice_ns, "%.2f");
    out.add("atomic_pair_ns", atomic_pair_ns, "%.2f");
    out.add("tensor_copy_over_atomic_pair", tensor_copy_ns / atomic_pair_ns, "%.3f");
    out.add("untraced_pair_ns", tracing.plain_ns);
    out.add("traced_pair_ns", tracing.traced_ns);
    out.add("tracing_overhead_ratio", tracing_ratio, "%.3f");
    out.add("unsampled_pair_ns", sampling.off_ns);
    out.add("sampled_pair_ns", sampling.sampled_ns);
    out.add("sampled_stacks_overhead_ratio", sampling_ratio, "%.3f");
    if (flight.ok()) {
      out.add("flight_recorded_pair_ns", flight->recorded_ns);
      out.add("flight_recorder_overhead_ratio", flight->ratio, "%.3f");
    } else {
      std::fprintf(stderr, "devmem-bench: note: flight recorder: %s: no "
                   "flight_recorder_overhead_ratio\n", flight.status().ToString().c_str());
    }
    out.add("tcache_pair_ns", tcache.devmem_ns);
    if (tcache.mimalloc_ns) {
      out.add("mimalloc_pair_ns_tcache", *tcache.mimalloc_ns);
      out.add("ratio_tcache_mimalloc", tcache.devmem_ns / *tcache.mimalloc_ns, "%.3f");
    } else {
      std::fprintf(stderr, "devmem-bench: note: %s: no mimalloc_pair_ns_tcache, "
                           "ratio_tcache_mimalloc\n", no_mimalloc);
    }
    out.add("jemalloc_pair_ns_tcache", tcache.jemalloc_ns);
    if (tcache.instructions) {
      out.add("instructions_per_pair", *tcache.instructions, "%.0f");
    } else {
      std::fprintf(stderr, "devmem-bench: note: %s: no instructions_per_pair\n",
                   tcache.instructions_note.c_str());
    }
    AddThreads(out, threads);
    out.add("tensor_create_ns", tensor_create_ns);
    out.add("intern_256_sites_ns", intern_ns, "%.2f");
    out.add_int("steady_maps_2streams", steady_maps);
    out.add("arena_pair_ns", arena.arena_pair_ns);
    out.add("arena_pool_pair_ns", arena.pool_pair_ns);
    out.add("arena_step_ns", arena.arena_step_ns, "%.2f");
    out.add("pool_step_ns", arena.pool_step_ns, "%.2f");
    if (tcache.mimalloc_ns) {
      out.add("ratio_arena_mimalloc", arena.arena_pair_ns / *tcache.mimalloc_ns, "%.3f");
    }
    std::printf("%s\n", out.str().c_str());
    return check_cache_hits();
  }
  std::printf("devmem-bench: medians of %d passes of %zu alloc+free pairs, %zu live\n",
              kRepetitions, kSizes, kLive);
  std::printf("%-36s %12s %12s %8s %8s\n", "workload", "devmem ns", "jemalloc ns",
              "ratio", "target");
  std::printf("%-36s %12.1f %12.1f %8.3f %8s\n", "small: 512 B .. 1 MiB (log-uniform)",
              small.devmem_ns, small.jemalloc_ns, ratio_small, "<= 3");
  std::printf("%-36s %12.1f %12.1f %8.3f %8s\n", "mixed: 512 B .. 64 MiB (log-uniform)",
              mixed.devmem_ns, mixed.jemalloc_ns, ratio_mixed, "<= 0.5");
  std::printf("%-36s %12.1f %12.1f %8.3f %8s\n", "shipped, traced (vs. untraced)",
              tracing.traced_ns, tracing.plain_ns, tracing_ratio, "<= 1.15");
  std::printf("%-36s %12.1f %12.1f %8.3f %8s\n", "mixed, sampled stacks (vs. off)",
              sampling.sampled_ns, sampling.off_ns, sampling_ratio, "<= 1.05");
  std::printf("%-36s %12.1f %12.1f %8.3f %8s\n", "shipped: 512 B .. 32 KiB, 256 sites",
              tcache.devmem_ns, tcache.jemalloc_ns, tcache.devmem_ns / tcache.jemalloc_ns,
              "");
  if (tcache.mimalloc_ns) {
    std::printf("%-36s %12.1f %12.1f %8.3f %8s   (mimalloc ns in the second column)\n",
                "shipped vs. mimalloc", tcache.devmem_ns, *tcache.mimalloc_ns,
                tcache.devmem_ns / *tcache.mimalloc_ns, "<= 2.0");
  } else {
    std::printf("shipped vs. mimalloc: n/a, %s\n", no_mimalloc);
  }
  std::printf("segments allocated while timing: %lld (0 means every pair was a cache "
              "hit)\n",
              timed_segment_allocs);
  std::printf("%-36s %12s %12s\n", "figure", "measured", "target");
  if (tcache.instructions) {
    std::printf("%-36s %12.0f %12s\n", "instructions per shipped pair", *tcache.instructions,
                "");
  } else {
    std::printf("%-36s %12s %12s   (%s)\n", "instructions per shipped pair", "n/a", "",
                tcache.instructions_note.c_str());
  }
  PrintThreads(threads);
  std::printf("%-36s %12.1f %12s\n", "tensor_create_ns: empty({64}) sim:0", tensor_create_ns,
              "<= 100");
  std::printf("%-36s %12.2f %12s\n", "intern_256_sites_ns", intern_ns, "<= 15");
  std::printf("%-36s %12lld %12s   (%lld maps + %lld unmaps; %lld in passes of one thread, "
              "%lld of two; one stream alone: %lld maps)\n",
              "steady_maps_2streams", steady_maps, "0", static_cast<long long>(maps.maps),
              static_cast<long long>(maps.unmaps),
              static_cast<long long>(maps.in_one_thread_passes),
              static_cast<long long>(maps.in_two_thread_passes),
              static_cast<long long>(maps.one_stream_maps));
  std::printf("%-36s %12.2f %12s   (a bare atomic inc+dec pair, the floor of any "
              "thread-safe refcount here: %.2f ns)\n",
              "tensor handle copy+destroy ns", tensor_copy_ns, "<= 10", atomic_pair_ns);
  std::printf("%-36s %12.2f %12s\n", "2-D slice view ns", slice_ns, "<= 60");
  std::printf("%-36s %12.1f %12s   (the same stream through the pool: %.1f ns)\n",
              "arena_pair_ns: in a scope", arena.arena_pair_ns,
              tcache.mimalloc_ns ? "<= mimalloc" : "", arena.pool_pair_ns);
  if (tcache.mimalloc_ns) {
    std::printf("%-36s %12.3f %12s\n", "ratio_arena_mimalloc",
                arena.arena_pair_ns / *tcache.mimalloc_ns, "<= 1.0");
  }
  std::printf("%-36s %12.2f %12s   (per allocation; through the pool: %.2f ns)\n",
              "arena_step_ns: 200 temporaries", arena.arena_step_ns, "", arena.pool_step_ns);
  return check_cache_hits();
}

}  // namespace
}  // namespace devmem::devbench

int main(int argc, char** argv) { return devmem::devbench::Main(argc, argv); }
