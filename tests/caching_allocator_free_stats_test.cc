// tests/caching_allocator_free_stats_test.cc: DeviceStats' free-set figures
// (free_bytes, free_blocks, largest_free_block), which FreeIndex keeps incrementally
// for metrics and OOM reports, against a recount over a snapshot's blocks after every
// step of a random mix of allocations and frees on two streams and both pools, with
// regular and expandable segments (where the largest block leaves often, so the stale
// recomputation runs often too).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/snapshot.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::MakeSimAllocator;
using testutil::NewStream;
using testutil::SimAllocator;

// Empty when the stats' free-set figures equal a recount over `snap`; else the first
// difference.
std::string CompareWithRecount(const DeviceStats& st, const AllocatorSnapshot& snap) {
  std::array<int64_t, kNumStatPools> bytes{}, blocks{}, largest{};
  for (const SegmentInfo& seg : snap.segments) {
    for (const BlockInfo& b : seg.blocks) {
      if (b.state != BlockState::kFree) continue;
      for (int p : {static_cast<int>(kAggregatePool),
                    static_cast<int>(seg.small_pool ? kSmallPool : kLargePool)}) {
        bytes[p] += static_cast<int64_t>(b.size);
        ++blocks[p];
        largest[p] = std::max(largest[p], static_cast<int64_t>(b.size));
      }
    }
  }
  for (int p = 0; p < kNumStatPools; ++p) {
    if (st.free_bytes[p] != bytes[p] || st.free_blocks[p] != blocks[p] ||
        st.largest_free_block[p] != largest[p]) {
      return "pool " + std::to_string(p) + ": stats say " + std::to_string(st.free_bytes[p]) +
             " bytes in " + std::to_string(st.free_blocks[p]) + " blocks, largest " +
             std::to_string(st.largest_free_block[p]) + "; a recount gives " +
             std::to_string(bytes[p]) + " in " + std::to_string(blocks[p]) + ", largest " +
             std::to_string(largest[p]);
    }
  }
  return "";
}

class FreeStatsTest : public ::testing::TestWithParam<const char*> {};

TEST_P(FreeStatsTest, EqualARecountAfterEveryStep) {
  SimAllocator t = MakeSimAllocator(std::string("sim_capacity:1GiB,") + GetParam());
  const std::array<Stream, 2> streams = {Stream{}, NewStream(*t)};
  std::mt19937_64 rng(testutil::TestSeed(20261201));
  struct Live {
    void* p;
    Stream stream;
  };
  std::vector<Live> live;
  for (int step = 0; step < 1500; ++step) {
    // At most 40 live (at most 640 MiB, about 60 MiB on average): no OOM.
    if (live.empty() || (live.size() < 40 && rng() % 2 == 0)) {
      // Log-uniform-ish sizes over both pools: 512 B to 8 MiB.
      const size_t bytes = size_t{512} << (rng() % 15);
      const Stream s = streams[rng() % 2];
      live.push_back({t->allocate(bytes + rng() % bytes, s), s});
    } else {
      const size_t i = rng() % live.size();
      t->free(live[i].p);
      live[i] = live.back();
      live.pop_back();
    }
    if (step % 97 == 0) t->trim(64 * kMiB);
    const std::string diff = CompareWithRecount(t->stats(), t->snapshot());
    ASSERT_EQ(diff, "") << "after step " << step;
  }
  for (const Live& l : live) t->free(l.p);
  EXPECT_EQ(CompareWithRecount(t->stats(), t->snapshot()), "");
  t->empty_cache();
  const DeviceStats st = t->stats();
  EXPECT_EQ(st.free_bytes[kAggregatePool], 0);
  EXPECT_EQ(st.largest_free_block[kAggregatePool], 0);
  EXPECT_VALID(*t);
}

INSTANTIATE_TEST_SUITE_P(Segments, FreeStatsTest,
                         ::testing::Values("expandable_segments:false",
                                           "expandable_segments:true"));

}  // namespace
}  // namespace devmem
