// tools/devmem_demo.cc: devmem-demo, the workload scripts/demo.sh runs.
//
//   1. The seed's training loop (tensor/training_loop.h) on the default device
//      (cuda:0 when a GPU is present, else sim:0; DEVMEM_CONF may choose): batches are
//      views of the data set (no copy), the SGD update is in place, and the best
//      weights are kept with one explicit clone(). Prints per-epoch loss and memory,
//      then the allocator's stats and the bytes created per copy site, largest first.
//   2. Provokes an out-of-memory error on a small simulated device and prints the
//      OomReport that the exception carries.
// Exit status: 0 on success, 1 if a check fails, 2 on a bad command line or DEVMEM_CONF.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "tensor/device_registry.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"
#include "tensor/training_loop.h"

namespace devmem {
namespace {

void Usage() {
  std::printf(
      "usage: devmem-demo [--epochs N]\n"
      "Trains the seed's two-layer network on the default device (a GPU if present,\n"
      "else the simulated device), printing loss and memory per epoch, the allocator's\n"
      "stats and the bytes created per explicit-copy site; then provokes an OOM on a\n"
      "small simulated device and prints its report.\n"
      "DEVMEM_CONF (key:value,...) configures the allocator; see docs/configuration.md.\n");
}

int Main(int argc, char** argv) {
  int epochs = 8;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      Usage();
      return 0;
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
  const DeviceId device = DefaultDevice();
  std::shared_ptr<CachingAllocator> alloc = AllocatorFor(device);
  std::printf("devmem-demo: training the seed's network on %s (%s)\n",
              device.ToString().c_str(), alloc->backend().info().name.c_str());
  std::printf("%5s %9s %9s %12s %12s %8s %7s\n", "epoch", "loss", "best", "allocated",
              "reserved", "allocs", "slices");
  TrainingOptions options;
  options.epochs = epochs;
  options.device = device;
  TrainingResult result = RunTrainingLoop(options, [](const EpochReport& e) {
    std::printf("%5d %9.5f %9.5f %12s %12s %8lld %7lld%s\n", e.epoch, e.loss, e.best_loss,
                FormatBytes(e.stats.allocated_bytes[kAggregatePool].current).c_str(),
                FormatBytes(e.stats.reserved_bytes[kAggregatePool].current).c_str(),
                static_cast<long long>(e.allocations),
                static_cast<long long>(e.slice_allocations),
                e.improved ? "  (best: weights cloned)" : "");
  });
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
  return 0;
}

}  // namespace
}  // namespace devmem

int main(int argc, char** argv) { return devmem::Main(argc, argv); }
