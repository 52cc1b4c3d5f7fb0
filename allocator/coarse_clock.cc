// allocator/coarse_clock.cc: the coarse ticker (see coarse_clock.h).
#include "allocator/coarse_clock.h"

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>

namespace devmem {

namespace coarse_clock_internal {
constinit std::atomic<int64_t> g_published_ns{0};
}  // namespace coarse_clock_internal
using coarse_clock_internal::g_published_ns;

namespace {

// The process's ticker. Leaked: a ticker thread may still run while static destructors
// do. `mu` guards everything but g_published_ns, which only holders of `mu` write;
// fork() takes `mu` first, so a child never inherits it held.
//
// fork() also waits until a ticker thread that is starting has started (taken `mu` in
// Run): a thread's start may allocate (glibc's pthread_getattr_np, which
// AddressSanitizer's thread start calls, reallocs a CPU set), and a heap without fork
// handlers of its own (GCC 12's ASan allocator) then hands the child its lock held: the
// child's own ticker thread blocked on its first allocation of that size class, and
// never published (CoarseClockTest.AForkedChild..., exit 5, under ASan).
//
// Once started, the thread never exits: when the last use ends it parks (waits on
// `wake` with no timeout, publishing nothing) until a use starts it again. An exit
// would have the start's hazard at the other end, with nothing to wait for: a thread
// leaving Run has released `mu` but still runs the thread library's and the
// sanitizer's exit code (libstdc++ frees the thread's state; ASan's thread teardown
// drains its allocator cache into the shared size classes under their locks), so a
// fork() meeting it there could hand the child a heap lock held. So at any fork the
// ticker thread is starting (waited for), parked or between publishes on `wake` (holding
// nothing), or publishing with `mu` held (which fork() holds instead): the loop
// allocates nothing. A parked thread also makes a use after a pause cost no thread
// start (a program whose short-lived threads each make a thread cache started and
// stopped one per thread).
struct Ticker {
  std::mutex mu;
  std::condition_variable wake;     // the use count fell to 0, or a use woke it parked
  std::condition_variable started;  // a ticker thread started, or gave up
  int users = 0;                    // live CoarseTickerUses
  bool running = false;             // a ticker thread of `generation` exists (or starts)
  bool run_started = false;         // ... and has taken `mu` in Run (its start is over)
  bool started_at_fork = true;      // in a child: no thread was starting at the fork
  bool parked = false;              // ... and waits for a use (users == 0), not publishing
  bool start_failed = false;     // no thread could be made: read the clock, do not retry
  uint64_t generation = 0;       // a new one per thread started (and per fork)
  TickPublisher extra = nullptr; // TickPublisherUse's; nullptr while none lives
  int extra_uses = 0;            // live TickPublisherUses

  // Raises the published value to now (never lowers it: a use's constructor and the
  // ticker may both publish), then runs the registered publisher.
  void PublishLocked() {
    const int64_t now = CoarseNowNs();
    if (now > g_published_ns.load(std::memory_order_relaxed)) {
      g_published_ns.store(now, std::memory_order_relaxed);
    }
    if (extra != nullptr) extra();
  }

  void StartLocked() {
    if (users == 0 || start_failed) return;
    PublishLocked();
    if (running) {
      if (parked) wake.notify_all();  // the parked thread publishes again
      return;
    }
    const uint64_t gen = ++generation;
    try {
      std::thread([this, gen] { Run(gen); }).detach();
    } catch (const std::system_error& e) {
      std::fprintf(stderr, "devmem: coarse clock: cannot start its ticker thread (%s); "
                           "thread-cache hits read the clock instead, and trace times "
                           "of cache hits will be coarser\n", e.what());
      start_failed = true;
      g_published_ns.store(0, std::memory_order_relaxed);  // nobody would refresh it
      return;
    }
    running = true;
    run_started = false;
    parked = false;
  }

  void Run(uint64_t gen) {
    std::unique_lock<std::mutex> lock(mu);
    if (generation == gen) {
      run_started = true;
      started.notify_all();
    }
    // `generation` changes only in a forked child, where this thread does not exist:
    // the loop never ends (see above).
    while (generation == gen) {
      if (users > 0) {
        PublishLocked();
        wake.wait_for(lock, std::chrono::nanoseconds(kCoarseTickerPeriodNs));
      } else {
        parked = true;
        wake.wait(lock);  // a use's start notifies; a spurious wake-up parks again
        parked = false;
      }
    }
  }

  // fork()'s prepare handler: takes `mu` and keeps it through the fork, once no ticker
  // thread is starting (see above). Bounded: should a start never finish, the fork
  // goes ahead as it did before this wait.
  void LockForFork() {
    std::unique_lock<std::mutex> lock(mu);
    started.wait_for(lock, std::chrono::seconds(1), [this] { return !running || run_started; });
    lock.release();  // unlocked by the parent and child handlers
  }
};

Ticker& TheTicker() {
  static Ticker* ticker = [] {
    auto* t = new Ticker;
    pthread_atfork([] { TheTicker().LockForFork(); }, [] { TheTicker().mu.unlock(); },
                   [] {
                     // The child has no ticker thread: withdraw the value (hits read
                     // the clock) until EnsureCoarseTicker starts one.
                     Ticker& c = TheTicker();
                     c.started_at_fork = !c.running || c.run_started;
                     c.running = false;
                     c.run_started = false;
                     c.parked = false;
                     ++c.generation;
                     g_published_ns.store(0, std::memory_order_relaxed);
                     // Fresh condition variables: the parent's ticker thread waited on
                     // `wake` (parked, or between publishes), and a concurrent fork on
                     // `started`; the copies still count those waiters, which no
                     // thread here will ever remove, and glibc's notify_all waits for
                     // a waiter group's last waiter to leave before it reuses the
                     // group: the child's second notify hung, holding `mu`
                     // (CoarseClockTest.AForkedChildOfAParkedTicker...). Not destroyed
                     // first: pthread_cond_destroy waits for those waiters too. Neither
                     // constructor allocates, nor can throw.
                     new (&c.wake) std::condition_variable;
                     new (&c.started) std::condition_variable;
                     c.mu.unlock();
                   });
    return t;
  }();
  return *ticker;
}

}  // namespace

namespace coarse_clock_internal {
void RestartTicker() {
  Ticker& t = TheTicker();
  std::lock_guard<std::mutex> lock(t.mu);
  t.StartLocked();
}
}  // namespace coarse_clock_internal

TickPublisherUse::TickPublisherUse(TickPublisher publish) {
  Ticker& t = TheTicker();
  std::lock_guard<std::mutex> lock(t.mu);
  ++t.extra_uses;
  t.extra = publish;
  publish();  // a current value before this returns
}

TickPublisherUse::~TickPublisherUse() {
  Ticker& t = TheTicker();
  std::lock_guard<std::mutex> lock(t.mu);
  // Under the mutex every publish runs under: none is in flight, and none comes.
  if (--t.extra_uses == 0) t.extra = nullptr;
}

void SyncWithTickPublisher() {
  Ticker& t = TheTicker();
  std::lock_guard<std::mutex> lock(t.mu);
}

namespace coarse_clock_internal {
int TickPublisherUsesForTest() {
  Ticker& t = TheTicker();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.extra_uses;
}

bool TickerStartedAtForkForTest() {
  Ticker& t = TheTicker();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.started_at_fork;
}

void TickerStateForTest(char* out, size_t size) {
  Ticker& t = TheTicker();
  std::unique_lock<std::mutex> lock(t.mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    std::snprintf(out, size, "the ticker's mutex is held");
    return;
  }
  std::snprintf(out, size,
                "users=%d running=%d parked=%d start_failed=%d generation=%llu "
                "publishers=%d published_ns=%lld",
                t.users, t.running ? 1 : 0, t.parked ? 1 : 0, t.start_failed ? 1 : 0,
                static_cast<unsigned long long>(t.generation), t.extra_uses,
                static_cast<long long>(g_published_ns.load(std::memory_order_relaxed)));
}
}  // namespace coarse_clock_internal

CoarseTickerUse::CoarseTickerUse() {
  Ticker& t = TheTicker();
  std::lock_guard<std::mutex> lock(t.mu);
  ++t.users;
  t.StartLocked();  // publishes first: a current value from the start
}

CoarseTickerUse::~CoarseTickerUse() {
  Ticker& t = TheTicker();
  std::lock_guard<std::mutex> lock(t.mu);
  if (--t.users == 0) {
    // Nobody keeps it fresh once the thread parks: withdraw it now.
    g_published_ns.store(0, std::memory_order_relaxed);
    t.wake.notify_all();  // park now, not a period later
  }
}

}  // namespace devmem
