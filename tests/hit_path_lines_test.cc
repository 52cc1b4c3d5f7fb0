// tests/hit_path_lines_test.cc: the objects a thread-cache hit writes own their cache
// lines, so that two threads' hits never write one line (docs/architecture.md, "Thread
// caches", what a hit writes). False sharing does not show in a functional test, and
// wall-clock figures on a shared machine are noise; what can be checked is the layout
// that rules it out: each such object starts on a line and fills whole lines, however
// the heap placed it. (Before Block was aligned, `new Block` put Blocks 144 bytes apart
// on 16-byte boundaries under glibc's malloc: every Block's first and last line was
// also a neighbour's, and a two-thread loop writing a hit's fields of interleaved
// Blocks ran about 7x slower per write than one thread.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "allocator/block.h"
#include "allocator/block_map.h"
#include "allocator/cache_line.h"
#include "allocator/device_pool.h"
#include "allocator/free_index.h"
#include "allocator/pool_accounting.h"
#include "allocator/thread_cache.h"
#if DEVMEM_HAVE_TENSOR
#include "tensor/live_storages.h"
#endif

namespace devmem::internal {
namespace {

constexpr size_t kLine = 64;

bool OwnsItsLines(const void* p, size_t size) {
  return reinterpret_cast<uintptr_t>(p) % kLine == 0 && size % kLine == 0;
}

TEST(HitPathLinesTest, BlocksFromNewOwnTheirLines) {
  EXPECT_EQ(alignof(Block) % kLine, 0u);
  // Made one after another: none shares a line with the next. (A pool makes its Blocks
  // in slabs instead: SnapshotWalkTest.APoolsBlocksLieTogether.)
  std::vector<std::unique_ptr<Block>> blocks;
  for (int i = 0; i < 32; ++i) {
    blocks.push_back(std::make_unique<Block>());
    EXPECT_TRUE(OwnsItsLines(blocks.back().get(), sizeof(Block)))
        << "Block " << i << " at " << blocks.back().get() << " (" << sizeof(Block)
        << " bytes) shares a cache line with its neighbours";
  }
}

TEST(HitPathLinesTest, APoolsBlocksNeverShareAPairOfLines) {
  // The adjacent-line prefetcher fetches 128-byte pairs of lines: a line a hit writes
  // (both of a Block's lines: the first through state/requested/site, the second
  // through tc_next and the trace's trace_order) must not share a pair with another
  // Block's, which another thread's cache may own. When trace_order made Block 192
  // bytes (a third line), every even Block's third line paired with the next Block's
  // first: threads2 lost 5-20% whenever the two vCPUs were far apart (a line round
  // trip of 560 ns instead of 120). Blocks as a pool makes them, across slabs.
  PoolAccounting acct(DeviceId{DeviceType::kSim, 0}, /*max_split_size=*/SIZE_MAX);
  FreeIndex free(acct);
  std::vector<Block*> made;
  for (int i = 0; i < 1200; ++i) made.push_back(free.new_block());
  std::sort(made.begin(), made.end());
  constexpr uintptr_t kPair = 2 * kLine;
  for (size_t i = 0; i + 1 < made.size(); ++i) {
    const auto last_pair = (reinterpret_cast<uintptr_t>(made[i]) + sizeof(Block) - 1) / kPair;
    const auto next_first_pair = reinterpret_cast<uintptr_t>(made[i + 1]) / kPair;
    EXPECT_LT(last_pair, next_first_pair)
        << "Blocks at " << made[i] << " and " << made[i + 1] << " (" << sizeof(Block)
        << " bytes each) share a 128-byte pair of lines";
  }
  for (Block* b : made) free.delete_block(b);
}

TEST(HitPathLinesTest, ThreadCachesOwnTheirLines) {
  // The owner writes its cache on every hit; two threads' caches are made next to
  // each other when two threads start at once.
  EXPECT_EQ(alignof(ThreadCache) % kLine, 0u);
  EXPECT_EQ(sizeof(ThreadCache) % kLine, 0u);
}

TEST(HitPathLinesTest, AThreadCachesArraysOwnTheirLines) {
  // Its bins and its counter window are written on every hit, and live on the heap
  // beside whatever the heap put there (another thread's objects, say): they start a
  // line (allocator/cache_line.h also rounds their size up to whole lines).
  const ThreadCacheLimits limits{256 * kKiB, 4 * kMiB, 256};
  for (int i = 0; i < 4; ++i) {
    ThreadCache tc(/*pool=*/nullptr, /*pool_id=*/1000 + i, limits);
    for (int s = 0; s < ThreadCache::kSlots; ++s) {
      const auto& bins = tc.slots()[s].bins;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(bins.data()) % kLine, 0u)
          << "bins of slot " << s << " at " << bins.data();
    }
    tc.reserve_site(300);  // grows the window, as a slow path does
    const CacheCounters& c = tc.counters();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(c.sites.data()) % kLine, 0u) << c.sites.data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(c.dirty.data()) % kLine, 0u) << c.dirty.data();
  }
}

TEST(HitPathLinesTest, DirtySitesListsWhatWasPushedAcrossGrowth) {
  // A hit lists a site with a plain store (no growth on the hit path, see
  // cache_counters.h): the room reserved under the lock must keep what was listed.
  DirtySites d;
  d.reserve(2);
  d.push(7);
  d.push(3);
  d.reserve(300);  // grows with two listed
  d.reserve(10);   // never shrinks
  for (SiteId id = 100; id < 110; ++id) d.push(id);
  std::vector<SiteId> listed(d.begin(), d.end());
  std::vector<SiteId> want = {7, 3};
  for (SiteId id = 100; id < 110; ++id) want.push_back(id);
  EXPECT_EQ(listed, want);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(d.data()) % kLine, 0u);
  d.clear();
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(d.begin(), d.end());
}

TEST(HitPathLinesTest, LineVectorsStartALineAtAnySize) {
  // Small arrays too: a heap's 48-byte class puts most of them off a line boundary.
  std::vector<LineVector<ThreadCache::Bin>> arrays;
  for (int i = 0; i < 16; ++i) {
    arrays.emplace_back(3);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(arrays.back().data()) % kLine, 0u)
        << "array " << i << " at " << arrays.back().data();
  }
}

TEST(HitPathLinesTest, WhatHitsReadIsAwayFromWhatTheLockHolderWrites) {
  // The block map's count (written on every adopt and flush, under the lock) is on
  // another line than its root (read by every hit free); the pool's hit-read fields
  // start a line (so the pool is line-aligned too).
  EXPECT_GE(alignof(BlockMap), kLine);
  EXPECT_GE(sizeof(BlockMap), 2 * kLine);
  EXPECT_GE(alignof(DevicePool), kLine);
}

#if DEVMEM_HAVE_TENSOR
TEST(HitPathLinesTest, TensorLiveStorageShardsOwnTheirLines) {
  // Not the allocator's hit path but the tensor layer's beside it: every tensor
  // creation and destruction writes its thread's shard (lock, list head, count), and
  // threads that start together take neighbouring shards. At 24 bytes a shard, the
  // first two shared a line: creating tensors on two threads at once cost each thread
  // about 25% more per tensor (107 -> 133 ns under chrt -f 1; 103 -> 105 aligned).
  EXPECT_EQ(alignof(LiveStorages::Shard) % kLine, 0u);
  EXPECT_EQ(sizeof(LiveStorages::Shard) % kLine, 0u);
}
#endif

}  // namespace
}  // namespace devmem::internal
