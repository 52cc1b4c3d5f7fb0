// tests/pool_policy_test.cc: the caching policy's pure decisions (allocator/pool_policy.h),
// one table per decision. The rows are the numbers of docs/architecture.md
// ("Allocation policy", "Expandable segments"); the allocator tests check that the pool
// applies them.
#include "allocator/pool_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace devmem::internal {
namespace {

constexpr size_t kKiB = size_t{1} << 10;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kNoLimit = SIZE_MAX;

TEST(PoolPolicyTest, RoundingPoolChoiceAndSegmentSize) {
  struct Row {
    size_t request;
    size_t rounded;
    bool small;
    size_t segment;
  };
  const std::vector<Row> rows = {
      {1, 512, true, 2 * kMiB},
      {512, 512, true, 2 * kMiB},
      {513, 1024, true, 2 * kMiB},
      {kMiB, kMiB, true, 2 * kMiB},
      {kMiB + 1, kMiB + 512, false, 20 * kMiB},
      {10 * kMiB - 512, 10 * kMiB - 512, false, 20 * kMiB},
      {10 * kMiB, 10 * kMiB, false, 10 * kMiB},
      {10 * kMiB + 1, 10 * kMiB + 512, false, 12 * kMiB},
      {33 * kMiB, 33 * kMiB, false, 34 * kMiB},
  };
  for (const Row& r : rows) {
    size_t rounded = 0;
    size_t segment = 0;
    ASSERT_TRUE(RoundSize(r.request, &rounded)) << r.request;
    EXPECT_EQ(rounded, r.rounded) << r.request;
    EXPECT_EQ(IsSmall(rounded), r.small) << r.request;
    ASSERT_TRUE(SegmentSizeFor(rounded, &segment)) << r.request;
    EXPECT_EQ(segment, r.segment) << r.request;
  }
  size_t out = 0;
  EXPECT_FALSE(RoundSize(SIZE_MAX, &out));
  EXPECT_FALSE(RoundSize(SIZE_MAX - 510, &out));
  ASSERT_TRUE(RoundSize(SIZE_MAX - 511, &out));
  EXPECT_FALSE(SegmentSizeFor(out, &out));  // rounding to 2 MiB overflows
}

TEST(PoolPolicyTest, ExactSegmentOnlyInTheLargePoolAndWhenSmaller) {
  struct Row {
    size_t rounded, standard, exact;
  };
  const std::vector<Row> rows = {
      {4 * kKiB, 2 * kMiB, 0},                 // small pool: never
      {kMiB + 512, 20 * kMiB, 2 * kMiB},       // 1 MiB + 512 -> 2 MiB < 20 MiB
      {9 * kMiB, 20 * kMiB, 10 * kMiB},
      {10 * kMiB, 10 * kMiB, 0},               // already the request's size
      {11 * kMiB, 12 * kMiB, 0},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(ExactSegmentSize(r.rounded, r.standard), r.exact) << r.rounded;
  }
}

TEST(PoolPolicyTest, OversizeRule) {
  struct Row {
    size_t block, size, max_split;
    bool oversize_request, serves;
  };
  const std::vector<Row> rows = {
      {64 * kMiB, 40 * kMiB, 32 * kMiB, true, false},   // wastes 24 MiB
      {64 * kMiB, 50 * kMiB, 32 * kMiB, true, true},    // wastes 14 MiB
      {64 * kMiB, 44 * kMiB, 32 * kMiB, true, false},   // wastes exactly 20 MiB
      {64 * kMiB, 8 * kMiB, 32 * kMiB, false, false},   // below max_split_size
      {32 * kMiB, 32 * kMiB, 32 * kMiB, true, true},    // exactly max_split_size
      {20 * kMiB, 4 * kMiB, kNoLimit, false, false},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(IsOversizeRequest(r.size, r.max_split), r.oversize_request) << r.size;
    EXPECT_EQ(OversizeBlockServes(r.block, r.size, r.max_split), r.serves) << r.size;
  }
}

TEST(PoolPolicyTest, SplitRule) {
  struct Row {
    size_t block, size;
    bool small, expandable;
    size_t max_split;
    bool split;
  };
  const std::vector<Row> rows = {
      {2 * kMiB, 2 * kMiB, true, false, kNoLimit, false},       // nothing left
      {2 * kMiB, 2 * kMiB - 512, true, false, kNoLimit, true},  // 512 B is worth a block
      {20 * kMiB, 19 * kMiB, false, false, kNoLimit, false},    // 1 MiB is not
      {20 * kMiB, 19 * kMiB - 512, false, false, kNoLimit, true},
      {20 * kMiB, 2 * kMiB, false, false, 2 * kMiB, false},     // oversize takes it all
      {20 * kMiB, 2 * kMiB, false, false, 4 * kMiB, true},
      {4 * kMiB, 4 * kMiB - 512, false, true, kNoLimit, true},  // expandable: as small
      {4 * kMiB, 4 * kMiB - 512, false, true, kMiB, true},      // ... and no oversize rule
  };
  for (const Row& r : rows) {
    EXPECT_EQ(ShouldSplit(r.block, r.size, r.small, r.expandable, r.max_split), r.split)
        << r.block << " for " << r.size;
  }
}

TEST(PoolPolicyTest, ReservationSize) {
  const size_t g = 2 * kMiB;
  EXPECT_EQ(ReservationSize(1024 * kMiB, g, /*small_pool=*/true), 256 * kMiB);
  EXPECT_EQ(ReservationSize(1024 * kMiB, g, /*small_pool=*/false), 2048 * kMiB);
  EXPECT_EQ(ReservationSize(3 * kMiB, g, /*small_pool=*/true), g);  // at least a granule
  EXPECT_EQ(ReservationSize(9 * kMiB, g, /*small_pool=*/false), 18 * kMiB);
  EXPECT_EQ(ReservationSize(5 * kMiB, g, /*small_pool=*/false), 10 * kMiB);
  // Twice a huge total would overflow: the total itself.
  const size_t huge = SIZE_MAX / 2 / g * g;
  EXPECT_EQ(ReservationSize(huge, g, /*small_pool=*/false), huge);
}

TEST(PoolPolicyTest, RecycleTrigger) {
  const double inf = std::numeric_limits<double>::infinity();
  struct Row {
    double threshold;
    StreamFootprint stream;  // in use, its peak, mapped, deferred
    size_t size, mapping, recycle;
  };
  const std::vector<Row> rows = {
      {inf, {10 * kMiB, 10 * kMiB, 1000 * kMiB, 0}, kMiB, 2 * kMiB, 0},  // "none"
      {0.25, {50 * kMiB, 100 * kMiB, 100 * kMiB, 0}, kMiB, 2 * kMiB, 0},  // under the cap
      // cap 1.25 x 100 = 125 MiB, after 126: 1 MiB over
      {0.25, {50 * kMiB, 100 * kMiB, 124 * kMiB, 0}, kMiB, 2 * kMiB, kMiB},
      // far over: never more than is being mapped
      {0.25, {50 * kMiB, 100 * kMiB, 400 * kMiB, 0}, kMiB, 2 * kMiB, 2 * kMiB},
      // in use + size above the peak sets the need: 1.25 x 120 = 150
      {0.25, {110 * kMiB, 100 * kMiB, 146 * kMiB, 0}, 10 * kMiB, 6 * kMiB, 2 * kMiB},
      {0.0, {8 * kMiB, 8 * kMiB, 8 * kMiB, 0}, 0, 2 * kMiB, 2 * kMiB},
      // bytes already decided for a deferred recycle count as given back: 124 - 4
      {0.25, {50 * kMiB, 100 * kMiB, 124 * kMiB, 4 * kMiB}, kMiB, 2 * kMiB, 0},
      {0.25, {50 * kMiB, 100 * kMiB, 2 * kMiB, 4 * kMiB}, kMiB, 2 * kMiB, 0},  // no wrap
  };
  for (const Row& r : rows) {
    EXPECT_EQ(ProactiveRecycleBytes(r.threshold, r.stream, r.size, r.mapping), r.recycle)
        << r.threshold << " mapped " << r.stream.mapped;
  }
}

// Two streams whose peaks do not coincide (devmem-bench's steady_maps_2streams): each
// stream maps about 1.1 x its own peak of 100 MiB, 220 MiB in all, while the device's
// bytes in use never passed 120 MiB. Judged per stream, neither is fragmented; judged
// against the device's peak (1.25 x 120 = 150 MiB), every map was 70 MiB over and
// unmapped the stream's idle granules, which its next peak mapped again.
TEST(PoolPolicyTest, RecycleTriggerJudgesEachStreamByItsOwnPeak) {
  struct Row {
    StreamFootprint stream;
    size_t recycle;
  };
  const std::vector<Row> rows = {
      {{20 * kMiB, 100 * kMiB, 110 * kMiB, 0}, 0},   // stream 1 between its peaks
      {{90 * kMiB, 100 * kMiB, 110 * kMiB, 0}, 0},   // stream 2 at its peak
      {{20 * kMiB, 100 * kMiB, 124 * kMiB, 0}, kMiB},  // a stream's own fragmentation
  };
  for (const Row& r : rows) {
    EXPECT_EQ(ProactiveRecycleBytes(0.25, r.stream, kMiB, 2 * kMiB), r.recycle)
        << "in use " << r.stream.in_use << " mapped " << r.stream.mapped;
  }
  // The device-wide figures of the same moment would recycle all that is mapped.
  const StreamFootprint device{110 * kMiB, 120 * kMiB, 220 * kMiB, 0};
  EXPECT_EQ(ProactiveRecycleBytes(0.25, device, kMiB, 2 * kMiB), 2 * kMiB);
}

TEST(PoolPolicyTest, DeferredRecycleTakesOnlyWhatIsStillOverTheCap) {
  const double kNone = std::numeric_limits<double>::infinity();
  struct Row {
    double threshold;
    StreamFootprint stream;  // in use, its peak, mapped (deferred: not subtracted)
    size_t decided, recycle;
  };
  const std::vector<Row> rows = {
      {0.25, {32 * kMiB, 64 * kMiB, 100 * kMiB, 0}, 32 * kMiB, 20 * kMiB},  // cap 80
      {0.25, {32 * kMiB, 64 * kMiB, 140 * kMiB, 0}, 32 * kMiB, 32 * kMiB},  // <= decided
      {0.25, {32 * kMiB, 64 * kMiB, 80 * kMiB, 0}, 32 * kMiB, 0},  // back under: nothing
      {0.0, {64 * kMiB, 16 * kMiB, 72 * kMiB, 0}, 32 * kMiB, 8 * kMiB},  // in use dominates
      {0.25, {32 * kMiB, 64 * kMiB, 100 * kMiB, 50 * kMiB}, 32 * kMiB, 20 * kMiB},
      {kNone, {0, 0, 100 * kMiB, 0}, 32 * kMiB, 0},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(DeferredRecycleBytes(r.threshold, r.stream, r.decided), r.recycle)
        << r.threshold << " mapped " << r.stream.mapped;
  }
}

TEST(PoolPolicyTest, LimitsAndGcThreshold) {
  EXPECT_EQ(MemoryLimit(1.0, 1000), kNoLimit);
  EXPECT_EQ(MemoryLimit(0.5, 1000), 500u);
  EXPECT_EQ(GcThresholdBytes(0.8, 1000), 800u);
  EXPECT_EQ(GcThresholdBytes(0.0, 1000), 0u);
  struct Row {
    size_t threshold, reserved, incoming, reclaim;
  };
  const std::vector<Row> rows = {
      {800, 500, 300, 0},    // fits exactly
      {800, 500, 301, 1},
      {800, 900, 20, 120},   // already over: back under, with room for the new one
      {0, 0, 2 * kMiB, 2 * kMiB},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(GcReclaimBytes(r.threshold, r.reserved, r.incoming), r.reclaim)
        << r.threshold << " " << r.reserved << " " << r.incoming;
  }
}

TEST(PoolPolicyTest, RetryOrder) {
  const std::vector<RetryStage> expected = {
      RetryStage::kGrow, RetryStage::kReleaseForSegment, RetryStage::kWaitAndReleaseAll,
      RetryStage::kExactSegment};
  EXPECT_EQ(std::vector<RetryStage>(kRetryOrder.begin(), kRetryOrder.end()), expected);
}

}  // namespace
}  // namespace devmem::internal
