// tests/types_test.cc: the small vocabulary pieces: device ids (allocator/types.h),
// action and block-state names and the clocks (observer.h, snapshot.h), and the
// DeviceStats table (stats.h).
#include "allocator/types.h"

#include <limits>
#include <string>
#include <vector>

#include "allocator/observer.h"
#include "allocator/snapshot.h"
#include "allocator/stats.h"
#include "gtest/gtest.h"
#include "tests/text_assertions.h"

namespace devmem {
namespace {

TEST(ParseDeviceIdTest, GoodIds) {
  struct Case {
    std::string text;
    DeviceId id;
  };
  for (const Case& tc : std::vector<Case>{
           {"cpu", {DeviceType::kCpu, 0}},
           {"sim", {DeviceType::kSim, 0}},
           {"sim:0", {DeviceType::kSim, 0}},
           {"sim:3", {DeviceType::kSim, 3}},
           {"cuda", {DeviceType::kCuda, 0}},
           {"cuda:0", {DeviceType::kCuda, 0}},
           {"cuda:7", {DeviceType::kCuda, 7}},
           {"cuda:1023", {DeviceType::kCuda, 1023}},
       }) {
    absl::StatusOr<DeviceId> id = ParseDeviceId(tc.text);
    ASSERT_TRUE(id.ok()) << tc.text << ": " << id.status();
    EXPECT_EQ(*id, tc.id) << tc.text;
  }
}

TEST(ParseDeviceIdTest, BadIdsNameTheText) {
  for (std::string text : {"", "gpu", "gpu:0", "CUDA:0", "cpu:0", "sim:-1", "sim:1024",
                           "sim:x", "sim:1x", "cuda:", "sim:+1", "sim: 1", "sim:-0", "cuda:-00", "sim:99999999999",
                           " cuda:0", "sim:007", "cuda:00"}) {
    absl::StatusOr<DeviceId> id = ParseDeviceId(text);
    ASSERT_FALSE(id.ok()) << "\"" << text << "\" parsed as " << id->ToString();
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(id.status().message(), "device \"" + text + "\"");
  }
}

// Found by fuzz_device_id: 72 zeros then "20" was accepted as sim:20, and the message
// of a long bad name quoted all of it.
TEST(ParseDeviceIdTest, LeadingZerosAndLongTextAreRefusedBriefly) {
  absl::StatusOr<DeviceId> id = ParseDeviceId("sim:" + std::string(72, '0') + "20");
  ASSERT_FALSE(id.ok());
  EXPECT_CONTAINS(id.status().message(), "leading zeros (write sim:20)");
  id = ParseDeviceId("sim:" + std::string(10000, '1'));
  ASSERT_FALSE(id.ok());
  EXPECT_LT(id.status().message().size(), 200u) << id.status();
  EXPECT_CONTAINS(id.status().message(), "(10004 bytes)");
}

TEST(DeviceIdTest, ToStringRoundTrips) {
  for (DeviceId id : {DeviceId{DeviceType::kCpu, 0}, DeviceId{DeviceType::kSim, 0},
                      DeviceId{DeviceType::kSim, 12}, DeviceId{DeviceType::kCuda, 1}}) {
    absl::StatusOr<DeviceId> back = ParseDeviceId(id.ToString());
    ASSERT_TRUE(back.ok()) << id.ToString();
    EXPECT_EQ(*back, id);
  }
  EXPECT_EQ((DeviceId{DeviceType::kCuda, 2}).ToString(), "cuda:2");
  EXPECT_EQ((DeviceId{DeviceType::kCpu, 0}).ToString(), "cpu");
  EXPECT_EQ(DeviceTypeName(DeviceType::kSim), "sim");
  EXPECT_EQ(DeviceTypeName(DeviceType::kCuda), "cuda");
  EXPECT_EQ(DeviceTypeName(DeviceType::kCpu), "cpu");
}

TEST(AllocActionTest, Names) {
  const std::vector<std::string> expected = {
      "alloc",        "free",          "free_completed", "segment_alloc", "segment_free",
      "segment_map",  "segment_unmap", "oom",            "arena_open",    "arena_close"};
  ASSERT_EQ(expected.size(), static_cast<size_t>(kNumAllocActions));
  for (int i = 0; i < kNumAllocActions; ++i) {
    EXPECT_EQ(AllocActionName(static_cast<AllocAction>(i)), expected[i]) << i;
  }
}

TEST(BlockStateTest, Names) {
  EXPECT_EQ(BlockStateName(BlockState::kAllocated), "allocated");
  EXPECT_EQ(BlockStateName(BlockState::kFree), "free");
  EXPECT_EQ(BlockStateName(BlockState::kPending), "pending");
}

TEST(ClockTest, MonotonicAndCloseToEachOther) {
  int64_t a = NowNs();
  int64_t coarse = CoarseNowNs();
  int64_t b = NowNs();
  EXPECT_GT(a, 0);
  EXPECT_LE(a, b);
  // The coarse clock lags by at most a tick (a few ms) and never runs ahead.
  EXPECT_LE(coarse, b);
  EXPECT_GT(coarse, a - 50'000'000);
  int64_t last = CoarseNowNs();
  for (int i = 0; i < 1000; ++i) {
    int64_t now = CoarseNowNs();
    EXPECT_GE(now, last);
    last = now;
  }
}

TEST(DeviceStatsTest, ToStringHasEveryRowAndFigure) {
  DeviceStats s;
  s.allocated_bytes[kAggregatePool].increase(3 * kGiB);
  s.allocated_bytes[kLargePool].increase(3 * kGiB - 512 * kKiB);
  s.allocated_bytes[kSmallPool].increase(512 * kKiB);
  s.allocated_bytes[kAggregatePool].decrease(kGiB);
  s.allocated_bytes[kLargePool].decrease(kGiB);
  s.reserved_bytes[kAggregatePool].increase(4 * kGiB);
  s.active_bytes[kAggregatePool].increase(2 * kGiB);
  s.allocation[kAggregatePool].increase(12345);
  s.segment[kAggregatePool].increase(7);
  s.num_ooms = 2;
  s.num_alloc_retries = 5;
  s.num_device_alloc = 11;
  s.num_device_free = 4;
  s.cache_hits = 987654;
  s.cache_misses = 31;
  s.num_frees = 424242;
  s.max_split_size = std::numeric_limits<int64_t>::max();
  const std::string text = s.ToString();
  for (const char* row :
       {"Allocated memory", "Active memory", "Requested memory", "Reserved memory",
        "Inactive split memory", "Pending memory", "Allocations", "Active allocs",
        "Reserved segments", "Inactive split blocks", "Oversize allocations",
        "Oversize segments", "from large pool", "from small pool", "Cur Usage",
        "Peak Usage", "Tot Alloc", "Tot Freed"}) {
    EXPECT_CONTAINS(text, row);
  }
  // Allocated: current 2 GiB, peak 3 GiB, 3 GiB allocated in total, 1 GiB freed.
  EXPECT_CONTAINS(text, "| Allocated memory          |   2.00 GiB |   3.00 GiB |   3.00 GiB |   1.00 GiB |");
  EXPECT_CONTAINS(text, "512.0 KiB");
  EXPECT_CONTAINS(text, "12345");
  EXPECT_CONTAINS(text, "OOMs: 2");
  EXPECT_CONTAINS(text, "alloc retries: 5");
  EXPECT_CONTAINS(text, "device allocs: 11");
  EXPECT_CONTAINS(text, "device frees: 4");
  EXPECT_CONTAINS(text, "cache hits: 987654");
  EXPECT_CONTAINS(text, "cache misses: 31");
  EXPECT_CONTAINS(text, "user frees: 424242");
  EXPECT_CONTAINS(text, "max_split_size: none");
  EXPECT_CONTAINS(text, "cached (reserved - active): 2.00 GiB");
  // Every line of the table has the same width.
  size_t width = text.find('\n');
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    EXPECT_EQ(end - start, width) << text.substr(start, end - start);
    start = end + 1;
  }
}

TEST(DeviceStatsTest, MaxSplitSizeShown) {
  DeviceStats s;
  s.max_split_size = 256 * kMiB;
  EXPECT_CONTAINS(s.ToString(), "max_split_size: 256.0 MiB");
}

}  // namespace
}  // namespace devmem
