// runtime/trace_clock.h: the trace's clock: cheap ticks on the hot path, nanoseconds of
// the monotonic clock when read.
//
// Why: a TraceRing stamps two events per cache-hit alloc+free pair, under the device
// lock. clock_gettime(CLOCK_MONOTONIC) costs ~20 ns even through the vDSO; the x86 time
// stamp counter costs a few. So, when the kernel itself keeps time with the TSC
// (clocksource "tsc": the counter is invariant and synchronized across cores), Now()
// returns raw TSC ticks and ToNs() maps them onto CLOCK_MONOTONIC (NowNs()) by the
// straight line through two points: one taken at construction and one taken at
// conversion time. Elsewhere (other CPUs, another clocksource) Now() is NowNs() itself
// and ToNs() is the identity.
//
// Precision: with the TSC, a converted time is within about the jitter of one
// clock_gettime call (tens of ns) of CLOCK_MONOTONIC, plus NTP slewing between the two
// points (at most 500 ppm of the elapsed time); order is exact (the map is increasing),
// and two conversions of one tick at different times may differ by that error.
//
// Thread-safety: Now() and ToNs() may be called from any thread; the object is
// immutable after construction.
#pragma once

#include <cstdint>

#include "allocator/snapshot.h"  // NowNs

namespace devmem {

class TraceClock {
 public:
  TraceClock();

  // The current tick: raw TSC or NowNs(), see above. Cheap (a few ns with the TSC).
  // Inline: the trace reads it on every event.
  int64_t Now() const {
#if defined(__x86_64__) || defined(__i386__)
    if (use_tsc_) [[likely]] return static_cast<int64_t>(__builtin_ia32_rdtsc());
#endif
    return NowNs();
  }

  // Converts ticks of this clock to the monotonic clock's nanoseconds.
  struct Mapping {
    int64_t tick0 = 0, ns0 = 0;        // the anchor taken at construction
    int64_t tick1 = 0, ns1 = 0;        // the second point, taken by Map()
    int64_t ToNs(int64_t tick) const;  // exact identity when not using the TSC
    bool identity = true;
  };
  // A mapping valid now; use one per batch of conversions.
  Mapping Map() const;

  bool uses_tsc() const { return use_tsc_; }

 private:
  bool use_tsc_ = false;
  int64_t tick0_ = 0;
  int64_t ns0_ = 0;
};

}  // namespace devmem
