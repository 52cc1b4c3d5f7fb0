// runtime/trace_clock.cc: TSC ticks mapped onto CLOCK_MONOTONIC, and the ticker that
// publishes a coarse tick (see trace_clock.h).
#include "runtime/trace_clock.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "allocator/snapshot.h"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define DEVMEM_HAVE_RDTSC 1
#endif

namespace devmem {

namespace trace_clock_internal {
constinit std::atomic<int64_t> g_coarse_tick{0};
constinit std::atomic<bool> g_ticker_running{false};
}  // namespace trace_clock_internal
using trace_clock_internal::g_coarse_tick;
using trace_clock_internal::g_ticker_running;

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

// The process's ticker. Leaked: a detached ticker may still run while static
// destructors do. `mu` guards everything but the two atomics, which only holders of
// `mu` write; fork() takes it first, so a child never inherits it held.
struct Ticker {
  std::mutex mu;
  std::condition_variable wake;  // a user count that fell to 0, or a child's restart
  int users = 0;                 // live TraceClocks
  bool running = false;          // a ticker thread of `generation` runs (or starts)
  bool hold = false;             // HoldTickerForTest
  bool start_failed = false;     // no thread could be made: do not retry per chunk
  uint64_t generation = 0;       // a new one per thread started (and per fork)

  // Raises the published tick to now (it never goes back: the ticker and a
  // constructor may race to publish).
  void PublishLocked() {
    const int64_t now = NowTick();
    if (now > g_coarse_tick.load(std::memory_order_relaxed)) {
      g_coarse_tick.store(now, std::memory_order_relaxed);
    }
  }

  void StartLocked() {
    if (running || users == 0 || start_failed) return;
    PublishLocked();
    const uint64_t gen = ++generation;
    try {
      std::thread([this, gen] { Run(gen); }).detach();
    } catch (const std::system_error& e) {
      // Times then come from chunk claims and locked events only (coarser; the order
      // is as exact as ever): runtime/trace.h.
      std::fprintf(stderr, "devmem: trace clock: cannot start its ticker thread (%s); "
                           "trace times of cache hits will be coarser\n", e.what());
      start_failed = true;
      return;
    }
    running = true;
    g_ticker_running.store(true, std::memory_order_relaxed);
  }

  void Run(uint64_t gen) {
    std::unique_lock<std::mutex> lock(mu);
    while (users > 0 && generation == gen) {
      if (!hold) PublishLocked();
      wake.wait_for(lock, std::chrono::nanoseconds(TraceClock::kTickerPeriodNs));
    }
    if (generation == gen) {  // not replaced (a fork's child replaces none: no thread)
      running = false;
      g_ticker_running.store(false, std::memory_order_relaxed);
    }
  }
};

Ticker& TheTicker() {
  static Ticker* ticker = [] {
    auto* t = new Ticker;
    pthread_atfork([] { TheTicker().mu.lock(); }, [] { TheTicker().mu.unlock(); },
                   [] {
                     // The child has no ticker thread: the next chunk claim starts one.
                     Ticker& c = TheTicker();
                     c.running = false;
                     ++c.generation;
                     g_ticker_running.store(false, std::memory_order_relaxed);
                     c.mu.unlock();
                   });
    return t;
  }();
  return *ticker;
}

}  // namespace

TraceClock::TraceClock() : use_tsc_(KernelUsesTsc()) {
  if (use_tsc_) {
    tick0_ = ReadTsc();
    ns0_ = NowNs();
  }
  Ticker& t = TheTicker();
  std::lock_guard<std::mutex> lock(t.mu);
  ++t.users;
  t.PublishLocked();  // Coarse() is a current tick from the start
  t.StartLocked();
}

TraceClock::~TraceClock() {
  Ticker& t = TheTicker();
  std::lock_guard<std::mutex> lock(t.mu);
  if (--t.users == 0) t.wake.notify_all();
}

void TraceClock::RestartTicker() {
  Ticker& t = TheTicker();
  std::lock_guard<std::mutex> lock(t.mu);
  t.StartLocked();
}

void TraceClock::HoldTickerForTest(bool hold) {
  Ticker& t = TheTicker();
  std::lock_guard<std::mutex> lock(t.mu);
  t.hold = hold;
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
