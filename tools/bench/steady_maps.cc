// tools/bench/steady_maps.cc: see steady_maps.h.
#include "tools/bench/steady_maps.h"

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/types.h"
#include "tools/bench/bench_util.h"

namespace devmem::devbench {
namespace {

// Maps and unmaps so far (num_device_alloc/free count them on expandable segments).
struct DeviceCalls {
  int64_t maps = 0;
  int64_t unmaps = 0;
};
DeviceCalls CallsOf(const CachingAllocator& alloc) {
  const DeviceStats s = alloc.stats();
  return {s.num_device_alloc, s.num_device_free};
}

Stream NewStream(CachingAllocator& alloc) {
  absl::StatusOr<Stream> s = alloc.backend().create_stream();
  if (!s.ok()) {  // the sim backend has streams; a bench bug if not
    std::fprintf(stderr, "devmem-bench: create_stream: %s\n",
                 std::string(s.status().message()).c_str());
    std::abort();
  }
  return *s;
}

// `sizes` through `alloc` on `stream`, a window of kLive live.
void RunStream(CachingAllocator& alloc, Stream stream, const std::vector<size_t>& sizes) {
  TimePairs(
      sizes, [&](size_t n, size_t) { return alloc.allocate(n, stream); },
      [&](void* p, size_t) { alloc.free(p); });
}

}  // namespace

SteadyMapsFigures MeasureSteadyMaps2Streams(const Config& base) {
  const Config config = SimConfig(base);
  const std::vector<size_t> sizes1 = LogUniformSizes(512, 64 * kMiB, 11, kSizes / 4);
  const std::vector<size_t> sizes2 = LogUniformSizes(512, 64 * kMiB, 12, kSizes / 4);
  SteadyMapsFigures f;
  {
    CachingAllocator alloc(MakeSimBackend(config), config);
    const Stream s1 = NewStream(alloc);
    const Stream s2 = NewStream(alloc);
    auto phase = [&](bool two) {
      if (!two) return RunStream(alloc, s1, sizes1);
      std::thread second([&] { RunStream(alloc, s2, sizes2); });
      RunStream(alloc, s1, sizes1);
      second.join();
    };
    // Warm-up: both phases, until a round of them maps and unmaps nothing (WarmUp):
    // the second stream runs in the two-thread phases only, so it settles half as fast
    // as the first. A policy that churns never settles, and its timed passes show it.
    WarmUp(
        [&] {
          phase(true);
          phase(false);
        },
        [&] {
          const DeviceCalls c = CallsOf(alloc);
          return c.maps + c.unmaps;
        });
    const DeviceCalls before = CallsOf(alloc);
    for (int r = 0; r < kRepetitions; ++r) {
      const bool two = r % 2 == 0;
      const DeviceCalls pass_before = CallsOf(alloc);
      phase(two);
      const DeviceCalls pass_after = CallsOf(alloc);
      (two ? f.in_two_thread_passes : f.in_one_thread_passes) +=
          pass_after.maps - pass_before.maps + pass_after.unmaps - pass_before.unmaps;
    }
    const DeviceCalls after = CallsOf(alloc);
    f.maps = after.maps - before.maps;
    f.unmaps = after.unmaps - before.unmaps;
  }
  {
    CachingAllocator alloc(MakeSimBackend(config), config);
    const Stream s1 = NewStream(alloc);
    WarmUp([&] { RunStream(alloc, s1, sizes1); },
           [&] {
             const DeviceCalls c = CallsOf(alloc);
             return c.maps + c.unmaps;
           });
    const DeviceCalls before = CallsOf(alloc);
    for (int r = 0; r < kRepetitions; ++r) RunStream(alloc, s1, sizes1);
    f.one_stream_maps = CallsOf(alloc).maps - before.maps;
  }
  return f;
}

}  // namespace devmem::devbench
