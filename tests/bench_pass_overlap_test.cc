// tests/bench_pass_overlap_test.cc: devmem-bench's rule for which threads2 passes count
// (tools/bench/pass_overlap.h). The defect it guards against: two workers that did not
// run at once (one woken after the other had finished, or both on one CPU) were timed
// as if they had, and a serial run read as a speedup of 1.0.
#include "tools/bench/pass_overlap.h"

#include <gtest/gtest.h>

#include <chrono>

namespace devmem::devbench {
namespace {

// A pass from `begin_ms` to `end_ms`, with `cpu_ms` of it on a CPU (all of it: -1).
WorkerPass Pass(double begin_ms, double end_ms, double cpu_ms = -1) {
  const auto at = [](double ms) {
    return std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double, std::milli>(1000 + ms)));
  };
  WorkerPass w;
  w.begin = at(begin_ms);
  w.end = at(end_ms);
  w.cpu_ns = static_cast<int64_t>((cpu_ms < 0 ? end_ms - begin_ms : cpu_ms) * 1e6);
  return w;
}

TEST(BenchPassOverlapTest, BothRunningTheWholePassCounts) {
  EXPECT_DOUBLE_EQ(Overlap(Pass(0, 3), Pass(0, 3)), 1.0);
  // A start skew of a microsecond, and the other stream a little longer.
  EXPECT_GT(Overlap(Pass(0, 3), Pass(0.001, 3.06)), 0.97);
  EXPECT_TRUE(RanTogether(Pass(0, 3), Pass(0.001, 3.06)));
}

TEST(BenchPassOverlapTest, OneAfterTheOtherDoesNotCount) {
  // The second worker woke when the first had finished: what the bench used to time.
  EXPECT_DOUBLE_EQ(Overlap(Pass(0, 3), Pass(3, 6)), 0.0);
  EXPECT_DOUBLE_EQ(Overlap(Pass(0, 3), Pass(4, 7)), 0.0);
  EXPECT_FALSE(RanTogether(Pass(0, 3), Pass(3, 6)));
  // Woken 1 ms late: for half of the pass only one of them runs.
  EXPECT_NEAR(Overlap(Pass(0, 3), Pass(1, 4)), 0.5, 1e-9);
  EXPECT_FALSE(RanTogether(Pass(0, 3), Pass(1, 4)));
}

TEST(BenchPassOverlapTest, SharingOneCpuDoesNotCount) {
  // Same intervals, but each on a CPU half the time: they took turns on one CPU.
  EXPECT_DOUBLE_EQ(Overlap(Pass(0, 6, 3), Pass(0, 6, 3)), 0.0);
  // One preempted for a third of the pass.
  EXPECT_NEAR(Overlap(Pass(0, 3, 2), Pass(0, 3)), 2.0 / 3, 1e-9);
  EXPECT_FALSE(RanTogether(Pass(0, 3, 2), Pass(0, 3)));
}

TEST(BenchPassOverlapTest, CpuClockAheadOfTheWallClockIsNotOverOne) {
  EXPECT_DOUBLE_EQ(Overlap(Pass(0, 3, 3.001), Pass(0, 3, 3.002)), 1.0);
  EXPECT_DOUBLE_EQ(Overlap(Pass(0, 0), Pass(0, 0)), 0.0);  // empty: nothing to count
}

TEST(BenchPassOverlapTest, APreemptedOneThreadPassDoesNotCount) {
  EXPECT_TRUE(RanUnpreempted(Pass(0, 3)));
  EXPECT_TRUE(RanUnpreempted(Pass(0, 3, 2.8)));
  EXPECT_FALSE(RanUnpreempted(Pass(0, 6, 3)));  // waited half of it
}

}  // namespace
}  // namespace devmem::devbench
