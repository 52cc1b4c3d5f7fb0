// runtime/trace_clock.cc: TSC ticks mapped onto CLOCK_MONOTONIC (see trace_clock.h).
#include "runtime/trace_clock.h"

#include <fstream>
#include <string>

#include "allocator/snapshot.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define DEVMEM_HAVE_RDTSC 1
#endif

namespace devmem {
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

}  // namespace

TraceClock::TraceClock() : use_tsc_(KernelUsesTsc()) {
  if (use_tsc_) {
    tick0_ = ReadTsc();
    ns0_ = NowNs();
  }
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
