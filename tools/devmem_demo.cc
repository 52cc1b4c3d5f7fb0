// tools/devmem_demo.cc: devmem-demo, the workload scripts/demo.sh runs.
//
//   1. On the default device (cuda:0 when a GPU is present, else sim:0; DEVMEM_CONF may
//      choose), runs an allocation workload in a loop: a steady state of temporaries
//      that are allocated and freed every step, so after the first step every
//      allocation is a cache hit. Prints per-step figures and the allocator's stats.
//   2. Provokes an out-of-memory error on a small simulated device and prints the
//      OomReport that the exception carries.
// Exit status: 0 on success, 2 on a bad command line or DEVMEM_CONF.
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <source_location>
#include <string>
#include <vector>

#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"

namespace devmem {
namespace {

void Usage() {
  std::printf(
      "usage: devmem-demo [--steps N]\n"
      "Runs an allocation workload on the default device, prints the allocator's\n"
      "stats, then provokes an OOM on a small simulated device and prints its report.\n"
      "DEVMEM_CONF (key:value,...) configures the allocator; see docs/configuration.md.\n");
}

// One training-like step: activations grow through a forward pass and are freed in
// reverse, with a few temporaries of assorted sizes in between.
void Step(CachingAllocator& alloc, std::mt19937_64& rng, SiteId act_site, SiteId tmp_site) {
  std::vector<void*> activations;
  size_t bytes = 256 * kKiB;
  for (int layer = 0; layer < 12; ++layer) {
    activations.push_back(alloc.allocate(bytes, {}, act_site));
    void* tmp = alloc.allocate(512 + rng() % (3 * kMiB), {}, tmp_site);
    alloc.free(tmp);
    bytes = bytes * 3 / 2;
  }
  while (!activations.empty()) {
    alloc.free(activations.back());
    activations.pop_back();
  }
}

int Main(int argc, char** argv) {
  int steps = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      Usage();
      return 0;
    }
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
      if (steps <= 0) {
        std::fprintf(stderr, "devmem-demo: --steps \"%s\" must be a positive integer\n",
                     argv[i]);
        return 2;
      }
      continue;
    }
    std::fprintf(stderr, "devmem-demo: unknown argument \"%s\" (try --help)\n", argv[i]);
    return 2;
  }
  absl::StatusOr<Config> config = ConfigFromEnv();
  if (!config.ok()) {
    std::fprintf(stderr, "devmem-demo: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(*config);
  if (!backend.ok()) {
    std::fprintf(stderr, "devmem-demo: %s\n",
                 std::string(backend.status().message()).c_str());
    return 2;
  }
  CachingAllocator alloc(std::move(*backend), *config);
  std::printf("devmem-demo: device %s (%s)\n", alloc.device().ToString().c_str(),
              alloc.backend().info().name.c_str());

  const SiteId act_site = InternSite(std::source_location::current(), SiteKind::kAlloc,
                                     "activations");
  const SiteId tmp_site = InternSite(std::source_location::current(), SiteKind::kAlloc,
                                     "temporaries");
  std::mt19937_64 rng(42);
  for (int step = 0; step < steps; ++step) {
    Step(alloc, rng, act_site, tmp_site);
    const DeviceStats s = alloc.stats();
    if (step < 3 || step == steps - 1) {
      std::printf("step %3d: reserved %s, peak allocated %s, segments allocated %lld, "
                  "cache hits %lld, misses %lld\n",
                  step, FormatBytes(s.reserved_bytes[kAggregatePool].current).c_str(),
                  FormatBytes(s.allocated_bytes[kAggregatePool].peak).c_str(),
                  static_cast<long long>(s.num_device_alloc),
                  static_cast<long long>(s.cache_hits),
                  static_cast<long long>(s.cache_misses));
    } else if (step == 3) {
      std::printf("...\n");
    }
  }
  if (absl::Status st = alloc.validate(); !st.ok()) {
    std::fprintf(stderr, "devmem-demo: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("\n%s\n", alloc.stats().ToString().c_str());

  // Part 2: a small simulated device, filled until it cannot give any more.
  Config small;
  small.backend = BackendKind::kSim;
  small.sim_capacity = 64 * kMiB;
  CachingAllocator sim(MakeSimBackend(small, /*index=*/1), small);
  const SiteId weights = InternSite(std::source_location::current(), SiteKind::kAlloc,
                                    "weights");
  const SiteId copies = InternSite(std::source_location::current(), SiteKind::kClone,
                                   "best_weights");
  std::vector<void*> held;
  try {
    for (int i = 0; i < 4; ++i) held.push_back(sim.allocate(8 * kMiB, {}, weights));
    for (int i = 0; i < 2; ++i) held.push_back(sim.allocate(12 * kMiB, {}, copies));
    held.push_back(sim.allocate(24 * kMiB, {}, weights));
    std::printf("devmem-demo: expected an out-of-memory error on sim:1\n");
    return 1;
  } catch (const OutOfMemoryError& e) {
    std::printf("devmem-demo: provoked an OOM on a 64 MiB simulated device:\n%s\n",
                e.what());
  }
  for (void* p : held) sim.free(p);
  return 0;
}

}  // namespace
}  // namespace devmem

int main(int argc, char** argv) { return devmem::Main(argc, argv); }
