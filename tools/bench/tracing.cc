// tools/bench/tracing.cc: see tracing.h.
#include "tools/bench/tracing.h"

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
  const AlternatingFigures timed =
      FastestAlternating(alloc, untraced, traced, sizes, allocate, free_fn, kRepetitions);
  TracingFigures f;
  f.plain_ns = timed.a_ns;
  f.traced_ns = timed.b_ns;
  f.trace_entries = ring->capacity();
  f.timed_segment_allocs = alloc.stats().num_device_alloc - before;
  return f;
}

}  // namespace devmem::devbench
