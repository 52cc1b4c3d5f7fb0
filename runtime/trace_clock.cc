// runtime/trace_clock.cc: TSC ticks mapped onto CLOCK_MONOTONIC, and the publisher of
// the coarse tick that the allocator's coarse ticker runs (see trace_clock.h).
#include "runtime/trace_clock.h"

#include <atomic>
#include <fstream>
#include <string>

#include "allocator/snapshot.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define DEVMEM_HAVE_RDTSC 1
#endif

namespace devmem {

namespace trace_clock_internal {
constinit std::atomic<int64_t> g_coarse_tick{0};
}  // namespace trace_clock_internal
using trace_clock_internal::g_coarse_tick;

namespace {

// True when the kernel keeps time with the TSC: then the counter is invariant (constant
// rate through frequency changes and idle states) and synchronized across CPUs, which
// is what a linear map onto CLOCK_MONOTONIC needs. Read once per process.
bool KernelUsesTsc() {
#ifdef DEVMEM_HAVE_RDTSC
  static const bool uses = [] {
    std::ifstream in("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    std::string name;
    return static_cast<bool>(in >> name) && name == "tsc";
  }();
  return uses;
#else
  return false;
#endif
}

int64_t ReadTsc() {
#ifdef DEVMEM_HAVE_RDTSC
  return static_cast<int64_t>(__rdtsc());
#else
  return 0;
#endif
}

// TraceClock::Now() without an object (every TraceClock ticks alike).
int64_t NowTick() { return KernelUsesTsc() ? ReadTsc() : NowNs(); }

// Whether HoldTickerForTest holds the tick; read by the publisher.
constinit std::atomic<bool> g_hold{false};

// Raises the published tick to `now`, never lowering it: the ticker and a constructor
// may publish at once.
void RaiseTick(int64_t now) {
  int64_t seen = g_coarse_tick.load(std::memory_order_relaxed);
  while (now > seen &&
         !g_coarse_tick.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

// The coarse ticker's publisher (TickPublisherUse), run every period while a
// TraceClock lives.
void PublishTick() {
  if (!g_hold.load(std::memory_order_relaxed)) RaiseTick(NowTick());
}

}  // namespace

TraceClock::TraceClock()
    : use_tsc_(KernelUsesTsc()),
      tick0_(use_tsc_ ? ReadTsc() : 0),
      ns0_(use_tsc_ ? NowNs() : 0),
      // ticker_use_ has started the ticker; from now on it publishes the tick too.
      publisher_use_(&PublishTick) {
  // A first tick now (even while a test holds the ticker), so that Coarse() is current
  // from the start.
  RaiseTick(NowTick());
}

// publisher_use_ unregisters the tick after the last clock, then ticker_use_ stops the
// ticker after the last use.
TraceClock::~TraceClock() = default;

void TraceClock::HoldTickerForTest(bool hold) {
  g_hold.store(hold, std::memory_order_relaxed);
  // Every publish runs under the ticker's mutex: a publish that read the old flag has
  // finished when this returns, and later ones read the new one, so a held tick stands
  // still from here on.
  SyncWithTickPublisher();
  PublishTick();  // as a registration did: released, the tick is current again
}

TraceClock::Mapping TraceClock::Map() const {
  Mapping m;
  if (!use_tsc_) return m;
  m.identity = false;
  m.tick0 = tick0_;
  m.ns0 = ns0_;
  m.tick1 = ReadTsc();
  m.ns1 = NowNs();
  return m;
}

int64_t TraceClock::Mapping::ToNs(int64_t tick) const {
  if (identity) return tick;
  const __int128 dt = tick1 - tick0;
  const __int128 dns = ns1 - ns0;
  if (dt <= 0 || dns <= 0) return ns0;  // no time has passed: cannot calibrate yet
  return ns0 + static_cast<int64_t>(static_cast<__int128>(tick - tick0) * dns / dt);
}

}  // namespace devmem
