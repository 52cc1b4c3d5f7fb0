// tests/trace_clock_test.cc: the trace clock's coarse tick (runtime/trace_clock.h)
// publishes only while a TraceClock lives: the last one unregisters its publisher from
// the coarse ticker (which thread caches may keep running), with no publish in flight
// after, and clocks made and destroyed on several threads at once leave the
// registration counted exactly.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <thread>
#include <vector>

#include "allocator/coarse_clock.h"
#include "runtime/trace_clock.h"
#include "tests/coarse_clock_test_util.h"

namespace devmem {
namespace {

using coarse_clock_internal::TickPublisherUsesForTest;

// Waits (up to 10 s) until the coarse ticker has published a value past `t`; false when
// it never did. Then no publish of the period before is in flight any more.
bool TickerPublishedPast(int64_t t) {
  if (!testutil::PublishedPasses(t)) return false;
  SyncWithTickPublisher();  // that period's publisher call has finished too
  return true;
}

TEST(TraceClockTest, TheTickerStopsPublishingTheTickAfterTheLastClock) {
  CoarseTickerUse keep;  // the ticker keeps running, as a thread cache would keep it
  // A clock made elsewhere in this process (the runtime's trace lives forever) keeps
  // its registration; ctest runs this test alone, where there is none.
  const int before = TickPublisherUsesForTest();
  {
    TraceClock a;
    {
      TraceClock b;
      EXPECT_EQ(TickPublisherUsesForTest(), before + 2);
    }
    EXPECT_EQ(TickPublisherUsesForTest(), before + 1);
    // One clock left: the tick still moves.
    const int64_t tick = TraceClock::Coarse();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (TraceClock::Coarse() == tick && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // time passing
    }
    EXPECT_GT(TraceClock::Coarse(), tick) << "the ticker publishes while a clock lives";
  }
  EXPECT_EQ(TickPublisherUsesForTest(), before);
  if (before > 0) GTEST_SKIP() << before << " TraceClock(s) of other tests still live";
  // The last clock is gone: periods pass, and none of them moves the tick.
  const int64_t tick = TraceClock::Coarse();
  for (int period = 0; period < 3; ++period) {
    ASSERT_TRUE(TickerPublishedPast(CoarseNowNs())) << "the ticker runs";
    EXPECT_EQ(TraceClock::Coarse(), tick) << "the ticker read the tick for no clock";
  }
}

// Clocks made and destroyed on two threads at once, while the ticker publishes: every
// registration ends, and the tick is published again by the next clock.
TEST(TraceClockTest, ClocksMadeAndDestroyedConcurrentlyCountExactly) {
  CoarseTickerUse keep;
  const int before = TickPublisherUsesForTest();
  std::latch start{2};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      for (int j = 0; j < 200; ++j) {
        TraceClock c;
        EXPECT_GE(TraceClock::Coarse(), 1) << "published before the constructor returns";
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(TickPublisherUsesForTest(), before);
  const int64_t tick = TraceClock::Coarse();
  TraceClock again;
  EXPECT_GT(TraceClock::Coarse(), tick) << "a new clock publishes a current tick";
}

}  // namespace
}  // namespace devmem
