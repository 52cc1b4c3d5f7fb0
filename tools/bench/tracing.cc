// tools/bench/tracing.cc: see tracing.h.
#include "tools/bench/tracing.h"

#include <algorithm>

#include "allocator/config.h"
#include "allocator/site.h"
#include "runtime/device_observer.h"
#include "runtime/runtime.h"
#include "runtime/size_histogram.h"
#include "runtime/trace.h"
#include "tools/bench/bench_util.h"

namespace devmem::devbench {

TracingFigures MeasureShippedTracing(CachingAllocator& alloc, const std::vector<size_t>& sizes) {
  // The runtime's trace; a DEVMEM_CONF with trace_entries:0 has none, and then a ring
  // of the default size stands in, so that the figure is still the trace's cost.
  TraceRing* ring = Runtime::Get().trace();
  if (ring == nullptr) ring = new TraceRing(kDefaultTraceEntries);  // lives until exit
  // Leaked: the allocator (kept by the runtime until exit) may call them until then.
  auto* untraced = new DeviceObserver(&alloc, nullptr, nullptr, nullptr, &SizeHistogram::Process());
  auto* traced = new DeviceObserver(&alloc, ring, nullptr, nullptr, &SizeHistogram::Process());
  auto allocate = [&](size_t n, size_t i) {
    return alloc.allocate(n, {}, InternSite(Sites()[i % kNumSites], SiteKind::kAlloc));
  };
  auto free_fn = [&](void* p, size_t) { alloc.free(p); };
  alloc.set_observer(untraced);
  TimePairs(sizes, allocate, free_fn);  // warm-up: the caches, the site index
  alloc.set_observer(traced);
  TimePairs(sizes, allocate, free_fn);
  const int64_t before = alloc.stats().num_device_alloc;
  std::vector<double> plain, with_trace;
  for (int r = 0; r < kRepetitions; ++r) {
    alloc.set_observer(untraced);
    plain.push_back(CpuTimePairs(sizes, allocate, free_fn));
    alloc.set_observer(traced);
    with_trace.push_back(CpuTimePairs(sizes, allocate, free_fn));
  }
  TracingFigures f;
  f.plain_ns = *std::min_element(plain.begin(), plain.end());
  f.traced_ns = *std::min_element(with_trace.begin(), with_trace.end());
  f.trace_entries = ring->capacity();
  f.timed_segment_allocs = alloc.stats().num_device_alloc - before;
  return f;
}

}  // namespace devmem::devbench
