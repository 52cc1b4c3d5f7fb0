// tools/demo/devmem_demo.cc: devmem-demo, the workload scripts/demo.sh runs.
//
//   1. The seed's training loop (tensor/training_loop.h) on the default device
//      (cuda:0 when a GPU is present, else sim:0; DEVMEM_CONF may choose): batches are
//      views of the data set (no copy), the SGD update is in place, and the best
//      weights are kept with one explicit clone(). Sized like a real step by default
//      (--batch 2048 x --width 4096 float32 activations: 32 MiB each, a few hundred MiB
//      of temporaries per step). Each step runs in an ArenaScope (allocator/arena.h);
//      one epoch without it first gives the comparison the demo prints (pool
//      allocations avoided, peak reserved with and without the arena). Prints
//      per-epoch loss and memory, then the allocator's stats and the bytes created per
//      copy site, largest first.
//   2. Provokes an out-of-memory error on a small simulated device and prints the
//      OomReport that the exception carries (and, with oom_dump_dir in DEVMEM_CONF,
//      writes a dump file).
//   3. With --snapshot FILE / --trace FILE, writes the runtime's snapshot and the event
//      trace (docs/formats.md); with --serve ADDRESS (or http in DEVMEM_CONF) serves
//      /metrics and /debug/* while it trains, and --linger SECONDS keeps serving after.
// Exit status: 0 on success, 1 if a check fails or a file cannot be written, 2 on a bad
// command line or DEVMEM_CONF, 3 when training runs out of device memory (a valid but
// small sim_capacity, say): the OOM report goes to stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <source_location>
#include <string>
#include <thread>
#include <vector>

#include "devmem/devmem_version.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/errors.h"
#include "runtime/http_server.h"
#include "runtime/json.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"
#include "tensor/device_registry.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"
#include "tensor/training_loop.h"

namespace devmem {
namespace {

// Trace entries the demo asks for when --trace is given and DEVMEM_CONF turned the
// trace off (trace_entries:0; it is on by default).
constexpr size_t kDemoTraceEntries = size_t{1} << 20;

void Usage() {
  std::printf(
      "usage: devmem-demo [--epochs N] [--batch N] [--width N] [--arena-chunk-size SIZE]\n"
      "                   [--snapshot FILE] [--trace FILE] [--serve ADDRESS:PORT]\n"
      "                   [--linger SECONDS]\n"
      "Trains the seed's two-layer network on the default device (a GPU if present,\n"
      "else the simulated device), printing loss and memory per epoch, the allocator's\n"
      "stats and the bytes created per explicit-copy site; then provokes an OOM on a\n"
      "small simulated device and prints its report.\n"
      "  --batch N         samples per step (default 2048)\n"
      "  --width N         hidden units (default 4096); activations are batch x width\n"
      "  --arena-chunk-size SIZE  the step arena's largest chunk (default 4MiB; 64KiB..1GiB,\n"
      "                    a multiple of 512; units as in DEVMEM_CONF)\n"
      "  --snapshot FILE   write the runtime's snapshot (JSON) at the end\n"
      "  --trace FILE      write the event trace (JSON Lines) at the end (the trace is\n"
      "                    on by default; %zu entries if DEVMEM_CONF turned it off)\n"
      "  --serve ADDR:PORT serve /metrics and /debug/* while training (port 0: any)\n"
      "  --linger SECONDS  keep serving that long after the loop (needs --serve or http)\n"
      "DEVMEM_CONF (key:value,...) configures the allocator; see docs/configuration.md.\n",
      kDemoTraceEntries);
}

// Writes `text` to `path`; false (with a message) on failure.
bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::out | std::ios::trunc);
  out << text << '\n';
  out.flush();
  if (!out) {
    std::fprintf(stderr, "devmem-demo: cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

// Parses an integer flag value in [lo, hi]; false (with a message) otherwise.
bool ParseIntFlag(const char* flag, const char* text, long lo, long hi, int* out) {
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || n < lo || n > hi) {
    std::fprintf(stderr, "devmem-demo: %s \"%s\" is not an integer in %ld..%ld\n", flag,
                 text, lo, hi);
    return false;
  }
  *out = static_cast<int>(n);
  return true;
}

int Main(int argc, char** argv) {
  int epochs = 8;
  int batch = 2048, width = 4096;
  std::string snapshot_path, trace_path, serve;
  size_t arena_chunk_size = kDefaultArenaChunkSize;
  long linger_s = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("%s %s\n", "devmem-demo", DEVMEM_VERSION);
      return 0;
    }
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      Usage();
      return 0;
    }
    std::string* text_flag = std::strcmp(argv[i], "--snapshot") == 0 ? &snapshot_path
                             : std::strcmp(argv[i], "--trace") == 0  ? &trace_path
                             : std::strcmp(argv[i], "--serve") == 0  ? &serve
                                                                     : nullptr;
    if (text_flag != nullptr && i + 1 < argc) {
      *text_flag = argv[++i];
      if (text_flag->empty()) {
        std::fprintf(stderr, "devmem-demo: %s needs a non-empty value\n", argv[i - 1]);
        return 2;
      }
      continue;
    }
    if (std::strcmp(argv[i], "--linger") == 0 && i + 1 < argc) {
      char* end = nullptr;
      linger_s = std::strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || linger_s < 0 || linger_s > 86400) {
        std::fprintf(stderr, "devmem-demo: --linger \"%s\" is not an integer in 0..86400\n",
                     argv[i]);
        return 2;
      }
      continue;
    }
    if ((std::strcmp(argv[i], "--batch") == 0 || std::strcmp(argv[i], "--width") == 0) &&
        i + 1 < argc) {
      int* target = argv[i][2] == 'b' ? &batch : &width;
      if (!ParseIntFlag(argv[i], argv[i + 1], 1, 1 << 20, target)) return 2;
      ++i;
      continue;
    }
    if (std::strcmp(argv[i], "--arena-chunk-size") == 0 && i + 1 < argc) {
      const absl::StatusOr<size_t> size = ParseSize(argv[++i]);
      if (!size.ok() || *size % 512 != 0 || *size < kMinArenaChunkSize ||
          *size > kMaxArenaChunkSize) {
        std::fprintf(stderr,
                     "devmem-demo: --arena-chunk-size \"%s\" is not a size in 64KiB..1GiB "
                     "that is a multiple of 512%s%s\n",
                     argv[i], size.ok() ? "" : ": ",
                     size.ok() ? "" : std::string(size.status().message()).c_str());
        return 2;
      }
      arena_chunk_size = *size;
      continue;
    }
    if (std::strcmp(argv[i], "--epochs") == 0 && i + 1 < argc) {
      char* end = nullptr;
      const long n = std::strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || n <= 0 || n > 100000) {
        std::fprintf(stderr, "devmem-demo: --epochs \"%s\" is not an integer in 1..100000\n",
                     argv[i]);
        return 2;
      }
      epochs = static_cast<int>(n);
      continue;
    }
    std::fprintf(stderr, "devmem-demo: unknown argument \"%s\" (try --help)\n", argv[i]);
    return 2;
  }
  // Checked here so that a bad DEVMEM_CONF is a clear message and exit status 2, before
  // the device registry reads it.
  absl::StatusOr<Config> config = ConfigFromEnv();
  if (!config.ok()) {
    std::fprintf(stderr, "devmem-demo: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  // The runtime, configured from DEVMEM_CONF plus the flags, before its first use.
  Config runtime_config = *config;
  if (!trace_path.empty() && runtime_config.trace_entries == 0) {
    runtime_config.trace_entries = kDemoTraceEntries;
  }
  if (!serve.empty()) runtime_config.http = serve;
  if (linger_s > 0 && runtime_config.http.empty()) {
    std::fprintf(stderr, "devmem-demo: --linger needs --serve ADDRESS (or http in DEVMEM_CONF)\n");
    return 2;
  }
  if (absl::Status st = Runtime::Init(runtime_config); !st.ok()) {
    std::fprintf(stderr, "devmem-demo: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  Runtime& runtime = Runtime::Get();
  if (HttpServer* http = runtime.http()) {
    std::printf("devmem-demo: serving %s/metrics and %s/debug/ while training\n",
                http->url().c_str(), http->url().c_str());
    std::fflush(stdout);
  }
  const DeviceId device = DefaultDevice();
  std::shared_ptr<CachingAllocator> alloc = AllocatorFor(device);
  std::printf("devmem-demo: training the seed's network on %s (%s)\n",
              device.ToString().c_str(), alloc->backend().info().name.c_str());
  TrainingOptions options;
  options.epochs = epochs;
  options.device = device;
  options.batch_size = batch;
  options.hidden = width;
  options.batches_per_epoch = 4;
  // The seed's 0.5 is for 3 hidden units: the output layer's update grows with the
  // width (a mean gradient per weight, summed over `width` weights), so scale it down.
  options.learning_rate = 0.5 * std::min(1.0, 32.0 / width);
  const size_t activation_bytes = size_t{static_cast<size_t>(batch)} * width * sizeof(float);
  std::printf("devmem-demo: %d steps per epoch of batch %d x width %d: %s per activation\n",
              options.batches_per_epoch, batch, width, FormatBytes(activation_bytes).c_str());
  TrainingResult result;
  try {
    // The comparison first: one epoch through the pool alone, then its cache emptied.
    TrainingOptions plain = options;
    plain.epochs = 1;
    alloc->reset_peak_stats();
    const DeviceStats before = alloc->stats();
    RunTrainingLoop(plain);
    const DeviceStats pool_only = alloc->stats();
    alloc->empty_cache();
    alloc->reset_peak_stats();

    // The default chunk (allocator/arena.h): the step's many small temporaries are
    // bumps, its batch x width activations (larger than a quarter chunk) take the
    // pool's path, whose best fit hands each step the blocks the last one freed. A
    // chunk sized to hold the activations (4x the largest, say) doubles the peak: the
    // fourth activation plus the step's small temporaries overflow the first chunk, and
    // the second chunk is a whole one (allocator/arena.h, "Chunk size").
    options.step_arena =
        ArenaOptions{.chunk_size = arena_chunk_size, .stream = {}, .max_waste_fraction = {}};
    std::printf("%5s %9s %9s %12s %12s %8s %7s\n", "epoch", "loss", "best", "allocated",
                "reserved", "allocs", "slices");
    result = RunTrainingLoop(options, [](const EpochReport& e) {
      std::printf("%5d %9.5f %9.5f %12s %12s %8lld %7lld%s\n", e.epoch, e.loss,
                  e.best_loss, FormatBytes(e.stats.allocated_bytes[kAggregatePool].current).c_str(),
                  FormatBytes(e.stats.reserved_bytes[kAggregatePool].current).c_str(),
                  static_cast<long long>(e.allocations),
                  static_cast<long long>(e.slice_allocations),
                  e.improved ? "  (best: weights cloned)" : "");
    });
    const ArenaReport arenas = alloc->arena_report();
    for (const ArenaStats& a : arenas.arenas) {
      if (a.name != "step" || a.scopes_closed == 0) continue;
      const int64_t plain_allocs = pool_only.allocation[kAggregatePool].allocated -
                                   before.allocation[kAggregatePool].allocated;
      std::printf(
          "\nstep arena (chunks up to %s): %lld steps, %lld allocations by bump (%lld per "
          "step; one epoch without the arena made %lld pool allocations), %lld free-list "
          "operations avoided (an allocation and a free each), %lld chunks from the pool "
          "and %lld reused, %s escaped\n",
          FormatBytes(options.step_arena->chunk_size).c_str(),
          static_cast<long long>(a.scopes_closed), static_cast<long long>(a.allocations),
          static_cast<long long>(a.allocations / a.scopes_closed),
          static_cast<long long>(plain_allocs), static_cast<long long>(2 * a.allocations),
          static_cast<long long>(a.pool_chunk_allocs), static_cast<long long>(a.chunk_reuses),
          FormatBytes(static_cast<size_t>(a.escaped_bytes)).c_str());
      const size_t with_arena = result.stats.reserved_bytes[kAggregatePool].peak;
      const size_t without = pool_only.reserved_bytes[kAggregatePool].peak;
      std::printf(
          "peak reserved: %s with the arena, %s without (one epoch through the pool): "
          "%.2fx\n",
          FormatBytes(with_arena).c_str(), FormatBytes(without).c_str(),
          without > 0 ? static_cast<double>(with_arena) / static_cast<double>(without) : 0.0);
      // The program's own requests are the same in both runs; with the arena the pool's
      // requested figure counts chunks, so the run without it gives the denominator.
      const size_t requested = pool_only.requested_bytes[kAggregatePool].peak;
      if (requested > 0) {
        std::printf("fragmentation (peak reserved / peak requested %s): %.3f with the "
                    "arena, %.3f without\n",
                    FormatBytes(requested).c_str(),
                    static_cast<double>(with_arena) / static_cast<double>(requested),
                    static_cast<double>(without) / static_cast<double>(requested));
      }
    }
  } catch (const OutOfMemoryError& e) {
    // The device is too small for the workload: a result to report, not a crash.
    std::fflush(stdout);
    std::fprintf(stderr, "devmem-demo: training ran out of memory on %s:\n%s\n",
                 device.ToString().c_str(), e.what());
    return 3;
  }
  if (absl::Status st = alloc->validate(); !st.ok()) {
    std::fprintf(stderr, "devmem-demo: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("\n%s\n", result.stats.ToString().c_str());
  std::printf("bytes created per explicit-copy site, largest first:\n");
  std::printf("  %-48s %8s %12s %12s\n", "site", "copies", "total", "live");
  for (const CopySite& c : result.copy_sites) {
    std::printf("  %-48s %8lld %12s %12s\n", c.info.ToString().c_str(),
                static_cast<long long>(c.stats.total_count),
                FormatBytes(c.stats.total_bytes).c_str(),
                FormatBytes(c.stats.live_bytes).c_str());
  }
  if (result.copy_sites.empty()) std::printf("  (none)\n");

  // Part 2: a small simulated device and a program that keeps a clone of its weights
  // every step (a "history" nobody reads): the OOM report names that line.
  Config small = *config;
  small.backend = BackendKind::kSim;
  small.sim_capacity = 64 * kMiB;
  const DeviceId small_device{DeviceType::kSim, 1};
  ScopedAllocatorOverride use_small(
      std::make_shared<CachingAllocator>(MakeSimBackend(small, small_device.index), small));
  try {
    Tensor weights = zeros({1024, 1024}, {.device = small_device});  // 4 MiB of float32
    std::vector<Tensor> history;
    for (int step = 0; step < 1000; ++step) {
      history.push_back(weights.clone());  // the leak: one 4 MiB copy per step
    }
    std::printf("devmem-demo: expected an out-of-memory error on %s\n",
                small_device.ToString().c_str());
    return 1;
  } catch (const OutOfMemoryError& e) {
    std::printf("\ndevmem-demo: provoked an OOM on a 64 MiB simulated device:\n%s\n",
                e.what());
  }
  if (absl::Status st = use_small.allocator().validate(); !st.ok()) {
    std::fprintf(stderr, "devmem-demo: %s\n", std::string(st.message()).c_str());
    return 1;
  }

  // Part 3: the files, then lingering.
  if (!snapshot_path.empty()) {
    if (!WriteFile(snapshot_path, SnapshotToJson(runtime.snapshot()))) return 1;
    std::printf("devmem-demo: snapshot written to %s\n", snapshot_path.c_str());
  }
  if (!trace_path.empty()) {
    uint64_t missed = 0;
    const std::vector<TraceEvent> events = runtime.trace()->since(0, SIZE_MAX, &missed);
    if (absl::Status st = WriteTraceFile(trace_path, events); !st.ok()) {
      std::fprintf(stderr, "devmem-demo: %s\n", std::string(st.message()).c_str());
      return 1;
    }
    std::printf("devmem-demo: %zu trace events written to %s (%llu older ones dropped)\n",
                events.size(), trace_path.c_str(), static_cast<unsigned long long>(missed));
  }
  if (linger_s > 0 && runtime.http() != nullptr) {
    std::printf("devmem-demo: serving %s for %ld more seconds\n", runtime.http()->url().c_str(),
                linger_s);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::seconds(linger_s));
  }
  return 0;
}

}  // namespace
}  // namespace devmem

int main(int argc, char** argv) {
  // No exception ends the demo with abort(): what escapes Main is reported, status 1.
  try {
    return devmem::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "devmem-demo: %s\n", e.what());
    return 1;
  }
}
