// allocator/coarse_clock.h: CoarseNowNs() as a background thread (the coarse ticker)
// last published it, so that a thread-cache hit stamps a block's allocation time with
// one relaxed load instead of a clock read.
//
// Why: a hit allocation writes Block::alloc_time_ns (the age snapshots show). Reading
// CLOCK_MONOTONIC_COARSE through the vDSO costs ~3.5 ns on the development VM (a call,
// a sequence-counted read of the kernel's time page), about a twelfth of a shipped
// alloc+free pair; the clock itself only moves once per scheduler tick (1-4 ms), so a
// value published every period by one thread is as good for ages.
//
//   CoarseTickerUse use;                      // the ticker runs while a use lives
//   b->alloc_time_ns = PublishedCoarseNowNs();
//
// Precision: PublishedCoarseNowNs() is a CoarseNowNs() reading taken at most one period
// (kCoarseTickerPeriodNs) plus the ticker's scheduling delay before the call, never
// after it: a later CoarseNowNs() (a snapshot's time_ns) is >= it, so ages are never
// negative. It never decreases. With no ticker running (no use alive, its thread could
// not be made, or a forked child before EnsureCoarseTicker) it is CoarseNowNs() itself.
//
// The ticker is the process's only periodic thread: a layer above that needs a value
// published each period registers one publisher (TickPublisherUse; the trace clock's
// coarse tick, runtime/trace_clock.cc) instead of starting a thread of its own, for as
// long as it needs it: after the last registration ends the ticker runs it no more.
//
// Thread-safety: every function may be called from any thread. The ticker is
// process-wide: started by the first CoarseTickerUse; after the last one is destroyed
// its thread parks (blocked, no wake-ups, nothing published) until the next use, and
// never exits; a forked child has none (its published value is withdrawn at the fork)
// until EnsureCoarseTicker() restarts it (the thread caches' slow paths call it).
// fork() waits (at most a second) for a ticker thread that is still starting: its
// start may hold a heap lock that a child would inherit held, as its exit could, which
// is why it never exits (coarse_clock.cc).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocator/snapshot.h"  // CoarseNowNs

namespace devmem {

// How often the ticker publishes (1 ms: the finest scheduler tick).
inline constexpr int64_t kCoarseTickerPeriodNs = 1'000'000;

namespace coarse_clock_internal {
// The ticker's last CoarseNowNs() reading; 0 while no ticker runs.
extern constinit std::atomic<int64_t> g_published_ns;
void RestartTicker();
}  // namespace coarse_clock_internal

// See above: one relaxed load (a line written once per period) while the ticker runs.
inline int64_t PublishedCoarseNowNs() {
  const int64_t t = coarse_clock_internal::g_published_ns.load(std::memory_order_relaxed);
  if (t != 0) [[likely]] return t;
  return CoarseNowNs();
}

// Restarts the ticker where uses are alive but none runs (in a forked child). A
// relaxed load when it runs.
inline void EnsureCoarseTicker() {
  if (coarse_clock_internal::g_published_ns.load(std::memory_order_relaxed) == 0)
      [[unlikely]] {
    coarse_clock_internal::RestartTicker();
  }
}

// A second value the ticker publishes: while a TickPublisherUse of `publish` lives,
// `publish` runs on the ticker's thread every period, whenever a use (re)starts the
// ticker, and once before each TickPublisherUse's constructor returns, always with the
// ticker's mutex held (so publishes never race each other, nor a registration's start
// or end). One publisher per process: a use of another one replaces it for the uses
// still alive. It must be short and must not make or destroy a CoarseTickerUse or a
// TickPublisherUse. The ticker runs while any CoarseTickerUse lives, so a registrant
// holds one too. After the last use is destroyed no publish runs, nor one in flight:
// the destructor takes the ticker's mutex.
using TickPublisher = void (*)();
class TickPublisherUse {
 public:
  explicit TickPublisherUse(TickPublisher publish);
  ~TickPublisherUse();
  TickPublisherUse(const TickPublisherUse&) = delete;
  TickPublisherUse& operator=(const TickPublisherUse&) = delete;
};

// Returns once a publish in flight, if any, has finished (takes and releases the
// ticker's mutex): a flag a publisher reads, changed before this call, is seen by
// every publish after it.
void SyncWithTickPublisher();

namespace coarse_clock_internal {
// Tests: how many TickPublisherUses live.
int TickPublisherUsesForTest();
// Tests' diagnostics: writes the ticker's state in one line ("users=1 running=1
// parked=0 ...": running, a ticker thread exists; parked, it waits for a use)
// into `out` (NUL-terminated, cut to `size`), or that its mutex is held (it does not
// wait for it). Allocates nothing: a forked child may call it whatever its heap's state.
void TickerStateForTest(char* out, size_t size);
// Tests, in a forked child: whether the parent's ticker thread, if one was running, had
// finished starting when fork() copied the process (see coarse_clock.cc's fork handler).
bool TickerStartedAtForkForTest();
}  // namespace coarse_clock_internal

// Keeps the ticker running while alive (a ThreadCache holds one). The constructor
// publishes a current value before it returns and starts the ticker thread if none
// exists, or wakes the parked one (a failure to make the thread is reported on stderr
// once and leaves PublishedCoarseNowNs() reading the clock); it takes a process-wide
// mutex, so make uses off the hot path and outside the device lock.
class CoarseTickerUse {
 public:
  CoarseTickerUse();
  ~CoarseTickerUse();
  CoarseTickerUse(const CoarseTickerUse&) = delete;
  CoarseTickerUse& operator=(const CoarseTickerUse&) = delete;
};

}  // namespace devmem
