// tools/bench/flight_recorder.cc: devmem-bench's flight_recorder_overhead_ratio
// (declared in tools/bench/flight_recorder.h).
//
// The small workload (cache-hit alloc+free pairs, 512 B .. 1 MiB) on one allocator,
// passes alternating between plain (no observer) and recorded (a FlightDevice of a
// recorder on a temporary file attached: the ring slot, the live-site entry and the
// stats written on every event). Both intern a call site per allocation, so the ratio
// is of the recorder alone. One allocator for both, as MeasureShippedTracing (tracing.cc) does, so that
// both see the same memory layout. The file is made in $TMPDIR (else /tmp) and
// removed at once (the mapping keeps it). Each pass is timed in this thread's CPU time
// and the figure of each side is its fastest pass (bench_util's FastestAlternating): on a shared machine (the 2-core
// development VM runs builds beside the bench) wall-clock medians of passes of a few
// milliseconds measured preemption, not the recorder (ratios from 0.2 to 8 between
// runs); the fastest CPU-time pass of each side is what the code costs when it runs.
#include "tools/bench/flight_recorder.h"

#include <unistd.h>

#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <source_location>
#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/site.h"
#include "runtime/flight_recorder.h"
#include "tools/bench/bench_util.h"

namespace devmem::devbench {
absl::StatusOr<FlightFigures> MeasureFlightRecorder(const std::vector<size_t>& sizes,
                                                    const Config& base, int repetitions) {
  Config config = base;
  config.backend = BackendKind::kSim;
  config.sim_capacity = size_t{1} << 40;
  CachingAllocator alloc(MakeSimBackend(config), config);
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                        "/devmem-bench-", getpid(), ".flight");
  absl::StatusOr<std::unique_ptr<FlightRecorder>> recorder = FlightRecorder::Create(path);
  if (!recorder.ok()) return recorder.status();
  unlink(path.c_str());
  FlightDevice* device = (*recorder)->AddAllocator(alloc.device());
  auto with_site = [&](size_t n, size_t) {
    return alloc.allocate(n, {}, InternSite(std::source_location::current(), SiteKind::kAlloc));
  };
  auto free_fn = [&](void* p, size_t) { alloc.free(p); };
  // CPU-time passes (bench_util's CpuTimePairs): a preempted pass does not count the wait.
  auto pass = [&] { return CpuTimePairs(sizes, with_site, free_fn); };
  pass();  // warm-up: the cache, and the file's pages
  alloc.set_observer(device);
  pass();
  const int64_t before = alloc.stats().num_device_alloc;
  const AlternatingFigures timed =
      FastestAlternating(alloc, nullptr, device, sizes, with_site, free_fn, repetitions);
  alloc.set_observer(nullptr);
  FlightFigures f;
  f.plain_ns = timed.a_ns;
  f.recorded_ns = timed.b_ns;
  f.timed_segment_allocs = alloc.stats().num_device_alloc - before;
  return f;
}

}  // namespace devmem::devbench
