// runtime/trace_clock.h: the trace's clock: cheap ticks on the hot path, nanoseconds of
// the monotonic clock when read.
//
// Why: a TraceRing stamps two events per cache-hit alloc+free pair. clock_gettime
// (CLOCK_MONOTONIC) costs ~20 ns even through the vDSO; the x86 time stamp counter a
// few (about 9 ns a read in a loop on the AMD EPYC development VM, 3-4 ns of a pair),
// and a load of a tick another thread published costs nothing measurable. So:
//   - Now(): the exact tick. When the kernel itself keeps time with the TSC
//     (clocksource "tsc": the counter is invariant and synchronized across cores) it is
//     the raw TSC; elsewhere (other CPUs, another clocksource) it is NowNs() itself.
//   - Coarse(): Now() as a background thread (the ticker) last published it, every
//     kTickerPeriodNs while any TraceClock exists: at most that period plus the
//     ticker's scheduling delay behind Now(), never ahead of it. The ticker is the
//     allocator's coarse ticker (allocator/coarse_clock.h), the process's only
//     periodic thread: a TraceClock holds a use of it and a registration of the
//     publisher of this tick (TickPublisherUse), so the trace and the thread caches
//     share one thread, and the ticker stops reading the tick once the last TraceClock
//     is gone (thread caches may keep it running for their own value).
// ToNs() maps ticks onto CLOCK_MONOTONIC (NowNs()) by the straight line through two
// points: one taken at construction and one taken at conversion time (the identity
// when Now() is NowNs()).
//
// Precision of a converted tick: within about the jitter of one clock_gettime call
// (tens of ns) of CLOCK_MONOTONIC, plus NTP slewing between the two points (at most 500
// ppm of the elapsed time); order is exact (the map is increasing), and two
// conversions of one tick at different times may differ by that error. What a trace
// time means (a coarse tick raised for causal order) is in runtime/trace.h.
//
// Thread-safety: Now(), Coarse() and ToNs() may be called from any thread; the object
// is immutable after construction. The ticker is process-wide, started by the first
// TraceClock or thread cache and stopped after the last one is destroyed; a forked
// child has none until EnsureTicker() (called by the trace once per chunk of events)
// or a thread cache's miss restarts it; meanwhile Coarse() stands still and the trace's
// stamps stay ordered (runtime/trace.h raises them past each lane's last).
#pragma once

#include <atomic>
#include <cstdint>

#include "allocator/coarse_clock.h"  // the ticker
#include "allocator/snapshot.h"      // NowNs

namespace devmem {

namespace trace_clock_internal {
// The ticker's last reading of TraceClock::Now() (0 before the first TraceClock).
extern constinit std::atomic<int64_t> g_coarse_tick;
}  // namespace trace_clock_internal

class TraceClock {
 public:
  // How often the ticker publishes Coarse().
  static constexpr int64_t kTickerPeriodNs = kCoarseTickerPeriodNs;

  TraceClock();   // starts the ticker if none runs; publishes a first tick before
  ~TraceClock();  // the last one unregisters the tick's publisher; the ticker parks
  TraceClock(const TraceClock&) = delete;
  TraceClock& operator=(const TraceClock&) = delete;

  // The current tick: raw TSC or NowNs(), see above. A few ns with the TSC.
  // Inline: the trace reads it on every event that holds the device lock.
  int64_t Now() const {
#if defined(__x86_64__) || defined(__i386__)
    if (use_tsc_) [[likely]] return static_cast<int64_t>(__builtin_ia32_rdtsc());
#endif
    return NowNs();
  }
  // The ticker's last Now(): one relaxed load of a line written once per period.
  static int64_t Coarse() {
    return trace_clock_internal::g_coarse_tick.load(std::memory_order_relaxed);
  }
  // Restarts the ticker when it is not running (in a forked child); cheap otherwise.
  static void EnsureTicker() { EnsureCoarseTicker(); }
  // Tests: while held, the ticker publishes no tick (Coarse() stands still), so that
  // events of several threads fall within one coarse tick deterministically.
  static void HoldTickerForTest(bool hold);

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
  CoarseTickerUse ticker_use_;  // the ticker runs while this clock lives
  bool use_tsc_ = false;
  int64_t tick0_ = 0;
  int64_t ns0_ = 0;
  // The ticker publishes Coarse() while any clock lives. Last: registered once the
  // ticker runs, unregistered (no publish in flight) before ticker_use_ ends.
  TickPublisherUse publisher_use_;
};

}  // namespace devmem
