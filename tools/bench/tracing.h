// tools/bench/tracing.h: devmem-bench's tracing_overhead_ratio, on the shipped path.
//
// The trace is on by default (trace_entries, docs/configuration.md), so what it costs
// is what every program pays: the runtime's allocator for sim:0 (thread caches and
// all, as tcache_pair_ns) with the runtime's observer composition (runtime/
// device_observer.h: the /metrics size histogram, and the trace), passes alternating
// between that observer without the trace and with the runtime's trace. Both intern a
// site per allocation from the 256 call sites in rotation, so the ratio is of the
// trace alone. Each pass is timed in this thread's CPU time and each side's figure is
// its fastest of kRepetitions passes (after a warm-up; bench_util's FastestAlternating,
// shared with flight_recorder.cc) for that file's reason: on a shared machine
// wall-clock medians measure preemption.
//
// Afterwards the allocator keeps the traced observer (the runtime's composition with
// the runtime's trace: what it had); both observers live until exit, as the runtime's
// do. Thread-safety: call from one thread, while no other thread uses `alloc`.
#pragma once

#include <cstdint>
#include <vector>

#include "allocator/caching_allocator.h"

namespace devmem::devbench {

struct TracingFigures {
  double plain_ns = 0;   // untraced_pair_ns
  double traced_ns = 0;  // traced_pair_ns
  size_t trace_entries = 0;  // the trace's capacity (the runtime's, else the default)
  int64_t timed_segment_allocs = 0;
};

TracingFigures MeasureShippedTracing(CachingAllocator& alloc, const std::vector<size_t>& sizes);

}  // namespace devmem::devbench
