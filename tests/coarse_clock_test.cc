// tests/coarse_clock_test.cc: the coarse ticker (allocator/coarse_clock.h) and the
// allocation time a thread-cache hit stamps with it: published before the first use
// returns, never ahead of CoarseNowNs(), never decreasing, advancing while used, and
// withdrawn in a forked child until EnsureCoarseTicker restarts the ticker.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <thread>

#include "allocator/caching_allocator.h"
#include "allocator/coarse_clock.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using coarse_clock_internal::g_published_ns;

// Waits (up to 10 s) until the published value passes `t`; false when it never did.
bool PublishedPasses(int64_t t) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (g_published_ns.load(std::memory_order_relaxed) <= t) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // time passing, no order
  }
  return true;
}

TEST(CoarseClockTest, PublishedWhileUsedNeverAheadNeverBackAndAdvances) {
  CoarseTickerUse use;
  EXPECT_NE(g_published_ns.load(), 0) << "published before the first use returns";
  int64_t last = 0;
  for (int i = 0; i < 10000; ++i) {
    const int64_t p = PublishedCoarseNowNs();
    const int64_t c = CoarseNowNs();
    ASSERT_LE(p, c) << "never ahead of the clock (ages stay >= 0)";
    ASSERT_GE(p, last) << "never decreases";
    last = p;
  }
  EXPECT_TRUE(PublishedPasses(CoarseNowNs())) << "the ticker keeps publishing";
}

// A hit (allocate from this thread's cache) stamps the block with the published time:
// not ahead of the clock read after it, and current to within the ticker's delay.
TEST(CoarseClockTest, ACacheHitsAllocationTimeComesFromTheTicker) {
  auto t = testutil::MakeSimAllocator("expandable_segments:false");
  t->free(t->allocate(4096));  // makes this thread's cache (a ticker use) and fills it
  ASSERT_TRUE(PublishedPasses(CoarseNowNs()));  // the ticker runs
  const int64_t before = g_published_ns.load();
  const DeviceStats stats_before = t->stats();
  void* p = t->allocate(4000);
  const int64_t after = CoarseNowNs();
  ASSERT_EQ(t->stats().cache_hits, stats_before.cache_hits + 1) << "a hit";
  std::optional<BlockInfo> b = t->find_allocation(p);
  ASSERT_TRUE(b.has_value());
  EXPECT_GE(b->alloc_time_ns, before);
  EXPECT_LE(b->alloc_time_ns, after);
  t->free(p);
}

// fork(): the child has no ticker thread, so the parent's last value would stand still
// there; it is withdrawn (hits read the clock) until EnsureCoarseTicker starts one.
TEST(CoarseClockTest, AForkedChildReadsTheClockUntilRestarted) {
  CoarseTickerUse use;
  ASSERT_NE(g_published_ns.load(), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (g_published_ns.load() != 0) _exit(2);
    const int64_t c0 = CoarseNowNs();
    if (PublishedCoarseNowNs() < c0) _exit(3);  // the clock itself
    EnsureCoarseTicker();
    if (g_published_ns.load() == 0) _exit(4);
    if (!PublishedPasses(CoarseNowNs())) _exit(5);  // a ticker runs in the child
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace devmem
