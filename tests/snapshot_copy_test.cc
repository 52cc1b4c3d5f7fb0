// tests/snapshot_copy_test.cc: DevicePool's snapshot copy (device_pool_introspection.cc):
// each segment's blocks come back whole and in address order whatever their number
// (the lists are walked in chains cut at allocated blocks: allocator/snapshot_walk.h),
// and every snapshot records how long it held the device lock (SnapshotLockStats).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/snapshot.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::MakeSimAllocator;

// 1 .. 9 allocations in one small segment (plus its free tail, so 2 .. 10 blocks: odd
// and even counts, where the two ends of the walk meet on a block or between two), and
// one with every other buffer freed (free blocks between live ones).
TEST(SnapshotCopy, EverySegmentComesBackWholeInAddressOrder) {
  for (int n = 1; n <= 9; ++n) {
    for (bool holes : {false, true}) {
      auto t = MakeSimAllocator("expandable_segments:false");
      std::vector<void*> ptrs;
      for (int i = 0; i < n; ++i) ptrs.push_back(t->allocate(4096));
      std::vector<uintptr_t> live;
      for (int i = 0; i < n; ++i) {
        if (holes && i % 2 == 1) {
          t->free(ptrs[i]);
          ptrs[i] = nullptr;
        } else {
          live.push_back(reinterpret_cast<uintptr_t>(ptrs[i]));
        }
      }
      const AllocatorSnapshot snap = t->snapshot();
      ASSERT_TRUE(testutil::SnapshotWellFormed(snap)) << n << " holes " << holes;
      ASSERT_EQ(snap.segments.size(), 1u);
      std::vector<uintptr_t> allocated;
      for (const BlockInfo& b : snap.segments[0].blocks) {
        if (b.state == BlockState::kAllocated) {
          allocated.push_back(b.addr);
          EXPECT_EQ(b.requested, 4096u);
        }
      }
      EXPECT_EQ(allocated, live) << n << " holes " << holes;
      for (void* p : ptrs) {
        if (p != nullptr) t->free(p);
      }
    }
  }
}

// One expandable segment of thousands of blocks, more allocated ones than the walk takes
// entry points (SnapshotWalk::kMaxEntries): cut into hundreds of chains, it comes back
// as the allocator holds it.
TEST(SnapshotCopy, ALongListComesBackWholeInAddressOrder) {
  auto t = MakeSimAllocator("expandable_segments:true");
  std::vector<void*> ptrs;
  for (int i = 0; i < 3000; ++i) ptrs.push_back(t->allocate(512 * (1 + i % 4)));
  std::vector<uintptr_t> live;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (i % 3 == 1) {
      t->free(ptrs[i]);
      ptrs[i] = nullptr;
    } else {
      live.push_back(reinterpret_cast<uintptr_t>(ptrs[i]));
    }
  }
  std::sort(live.begin(), live.end());
  const AllocatorSnapshot snap = t->snapshot();
  ASSERT_TRUE(testutil::SnapshotWellFormed(snap));
  std::vector<uintptr_t> allocated;
  for (const SegmentInfo& s : snap.segments) {
    for (const BlockInfo& b : s.blocks) {
      if (b.state == BlockState::kAllocated) allocated.push_back(b.addr);
    }
  }
  EXPECT_EQ(allocated, live);
  for (void* p : ptrs) {
    if (p != nullptr) t->free(p);
  }
}

// A snapshot is what the pool held at one moment, even while other threads allocate
// and free (through their thread caches and the pool) and other snapshots are taken at
// the same time (each pool keeps one walk object between snapshots: a concurrent one
// makes its own): its blocks tile its segments, and they add up to the statistics read
// in the same hold.
TEST(SnapshotCopy, SnapshotsTakenWhileOtherThreadsAllocateAreConsistentCuts) {
  auto t = MakeSimAllocator("expandable_segments:false");
  std::atomic<int> snapshotters_left{2};
  auto churn = [&](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<void*> live;
    while (snapshotters_left.load() > 0) {
      if (live.size() < 300 && rng() % 3 != 0) {
        live.push_back(t->allocate(512 * (1 + rng() % 64)));
      } else if (!live.empty()) {
        const size_t i = rng() % live.size();
        t->free(live[i]);
        live[i] = live.back();
        live.pop_back();
      }
    }
    for (void* p : live) t->free(p);
  };
  std::vector<std::string> failures[2];
  auto snapshots = [&](int who) {
    for (int i = 0; i < 40; ++i) {
      const AllocatorSnapshot snap = t->snapshot();
      int64_t allocated = 0, allocated_bytes = 0, bytes = 0;
      for (const SegmentInfo& s : snap.segments) {
        for (const BlockInfo& b : s.blocks) {
          bytes += static_cast<int64_t>(b.size);
          if (b.state == BlockState::kAllocated) {
            ++allocated;
            allocated_bytes += static_cast<int64_t>(b.size);
          }
        }
      }
      const std::string what = "snapshot " + std::to_string(i) + " of thread " +
                               std::to_string(who);
      if (!testutil::SnapshotWellFormed(snap)) failures[who].push_back(what + ": ill formed");
      if (allocated != snap.stats.allocation[kAggregatePool].current ||
          allocated_bytes != snap.stats.allocated_bytes[kAggregatePool].current ||
          bytes != snap.stats.reserved_bytes[kAggregatePool].current) {
        failures[who].push_back(what + ": blocks " + std::to_string(allocated) + " (" +
                                std::to_string(allocated_bytes) + " B of " +
                                std::to_string(bytes) + ") against the stats' " +
                                std::to_string(snap.stats.allocation[kAggregatePool].current) +
                                " (" +
                                std::to_string(snap.stats.allocated_bytes[kAggregatePool].current) +
                                " B of " +
                                std::to_string(snap.stats.reserved_bytes[kAggregatePool].current) +
                                ")");
      }
    }
    snapshotters_left.fetch_sub(1);
  };
  std::thread a(churn, 1), b(churn, 2), s0(snapshots, 0), s1(snapshots, 1);
  s0.join();
  s1.join();
  a.join();
  b.join();
  for (const auto& f : failures) {
    for (const std::string& m : f) ADD_FAILURE() << m;
  }
  EXPECT_GE(t->snapshot_lock_stats().snapshots, 80u);
  EXPECT_VALID(*t);
}

TEST(SnapshotCopy, EachSnapshotRecordsItsLockHold) {
  auto t = MakeSimAllocator();
  EXPECT_EQ(t->snapshot_lock_stats().snapshots, 0u);
  std::vector<void*> ptrs;
  for (int i = 0; i < 100; ++i) ptrs.push_back(t->allocate(512 * (i + 1)));
  (void)t->snapshot();
  const SnapshotLockStats one = t->snapshot_lock_stats();
  EXPECT_EQ(one.snapshots, 1u);
  EXPECT_GT(one.last_ns, 0);
  EXPECT_EQ(one.max_ns, one.last_ns);
  EXPECT_GE(one.last_cpu_ns, 0);
  EXPECT_EQ(one.max_cpu_ns, one.last_cpu_ns);
  EXPECT_GE(one.last_faults, 0);
  EXPECT_EQ(one.max_faults, one.last_faults);
  (void)t->snapshot();
  const SnapshotLockStats two = t->snapshot_lock_stats();
  EXPECT_EQ(two.snapshots, 2u);
  EXPECT_GE(two.max_ns, two.last_ns);
  EXPECT_GE(two.max_ns, one.last_ns);
  EXPECT_GE(two.max_cpu_ns, one.last_cpu_ns);
  EXPECT_GE(two.max_faults, std::max(one.last_faults, two.last_faults));
  for (void* p : ptrs) t->free(p);
}

// The hold's fault count (SnapshotLockStats::last_faults) is ThreadFaults() before
// and after: it counts the calling thread's page faults, here 64 pages first touched.
TEST(SnapshotCopy, ThreadFaultsCountsPagesFirstTouched) {
#ifdef RUSAGE_THREAD
  constexpr size_t kPages = 64;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* m = mmap(nullptr, kPages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  const int64_t before = ThreadFaults();
  for (size_t i = 0; i < kPages; ++i) static_cast<volatile char*>(m)[i * page] = 1;
  const int64_t after = ThreadFaults();
  munmap(m, kPages * page);
  // One fault a page, or fewer where the kernel maps a huge page at once. Under
  // AddressSanitizer each store first reads its shadow byte (one per 8 bytes), so the
  // 64 pages' shadow, 8 pages or 9 where it straddles a page boundary, faults too
  // (seen: 73 = 64 + 9 in a CI run).
#if defined(__SANITIZE_ADDRESS__)
  constexpr int64_t kShadowPages = kPages / 8 + 1;
#else
  constexpr int64_t kShadowPages = 0;
#endif
  EXPECT_GT(after, before);
  // The test's own faults (its stack, getrusage's code), at most 8.
  EXPECT_LE(after - before, static_cast<int64_t>(kPages) + kShadowPages + 8);
#else
  EXPECT_EQ(ThreadFaults(), 0);
#endif
}

}  // namespace
}  // namespace devmem
