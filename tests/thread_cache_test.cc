// tests/thread_cache_test.cc: the per-thread caches in front of each device's pool
// (allocator/thread_cache.h, device_pool_tcache.cc): hits without the device lock,
// bounds, streams, record_stream, cross-thread frees, draining at thread exit, on
// empty_cache and before an OOM, exact statistics and the trace.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <latch>
#include <mutex>
#include <thread>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/errors.h"
#include "allocator/observer.h"
#include "tests/hooked_backend.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::MakeSimAllocator;
using testutil::NewStream;

constexpr size_t kKiB4 = 4 * kKiB;

int64_t ThreadCached(const CachingAllocator& a) {
  return a.stats().thread_cached_bytes[kAggregatePool].current;
}

TEST(ThreadCacheTest, AFreedSmallBlockIsReusedFromTheCache) {
  auto t = MakeSimAllocator("expandable_segments:false");
  void* p = t->allocate(kKiB4);
  t->free(p);  // adopted into this thread's cache
  EXPECT_EQ(ThreadCached(*t), static_cast<int64_t>(kKiB4));
  const DeviceStats before = t->stats();
  void* q = t->allocate(kKiB4 - 100);  // same rounded size: the same block
  EXPECT_EQ(q, p);
  const DeviceStats after = t->stats();
  EXPECT_EQ(after.cache_hits, before.cache_hits + 1);
  EXPECT_EQ(after.thread_cached_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(after.allocated_bytes[kAggregatePool].current, static_cast<int64_t>(kKiB4));
  EXPECT_EQ(after.requested_bytes[kAggregatePool].current,
            static_cast<int64_t>(kKiB4 - 100));
  EXPECT_VALID(*t);
  t->free(q);
  EXPECT_EQ(t->stats().allocated_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(t->stats().num_frees, 2);
  EXPECT_VALID(*t);
}

// The one way to show that a hit takes no lock: hits complete while another thread
// holds the device lock (blocked in the backend, allocating a segment).
TEST(ThreadCacheTest, HitsCompleteWhileAnotherThreadHoldsTheDeviceLock) {
  Config config = testutil::MakeSimConfig("expandable_segments:false");
  auto hooked = std::make_unique<testutil::HookedBackend>(MakeSimBackend(config, 0));
  testutil::HookedBackend* hb = hooked.get();
  CachingAllocator a(std::move(hooked), config);
  void* p = a.allocate(kKiB4);
  a.free(p);  // in this thread's cache now

  std::mutex mu;
  std::condition_variable cv;
  bool inside = false, release = false;
  testutil::HookGuard alloc_segment_hook = hb->allocate_segment_instead.Set([&](size_t bytes) {
    std::unique_lock<std::mutex> lock(mu);
    inside = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
    return hb->inner().allocate_segment(bytes);
  });
  std::thread holder([&] { a.free(a.allocate(64 * kMiB)); });  // a new segment: blocks
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return inside; });
  }
  // The device lock is held now. Each pair is a hit; one that took the lock would
  // hang here (and ctest's timeout would fail the test). Half the frees pass the size
  // (as PyTorch's free and the tensor layer's Storage do): neither kind looks the block
  // up in the pool's allocated table, which only the lock holder may read.
  for (int i = 0; i < 1000; ++i) {
    void* q = a.allocate(kKiB4);
    EXPECT_EQ(q, p);
    if (i % 2 == 0) {
      a.free(q);
    } else {
      a.free(q, kKiB4);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  holder.join();
  hb->allocate_segment_instead = nullptr;
  EXPECT_GE(a.stats().cache_hits, 1000);
  EXPECT_VALID(a);
}

TEST(ThreadCacheTest, CountsAndBytesAreBounded) {
  auto t = MakeSimAllocator(
      "expandable_segments:false,thread_cache_max_blocks:4,thread_cache_max_bytes:1MiB,"
      "thread_cache_max_size:256KiB");
  std::vector<void*> ps;
  for (int i = 0; i < 10; ++i) ps.push_back(t->allocate(kKiB4));
  for (void* p : ps) t->free(p);
  const DeviceStats s = t->stats();
  EXPECT_LE(s.thread_cached[kAggregatePool].current, 4);
  EXPECT_GT(s.thread_cached[kAggregatePool].current, 0);
  EXPECT_EQ(s.allocated_bytes[kAggregatePool].current, 0);
  EXPECT_VALID(*t);
  ps.clear();
  for (int i = 0; i < 10; ++i) ps.push_back(t->allocate(256 * kKiB));
  for (void* p : ps) t->free(p);
  EXPECT_LE(t->stats().thread_cached_bytes[kAggregatePool].current,
            static_cast<int64_t>(kMiB));
  EXPECT_VALID(*t);
}

TEST(ThreadCacheTest, LargeRequestsAndRecordStreamBypassTheCache) {
  auto t = MakeSimAllocator("expandable_segments:false,thread_cache_max_size:64KiB");
  void* big = t->allocate(128 * kKiB);
  t->free(big);
  EXPECT_EQ(ThreadCached(*t), 0);

  const Stream other = NewStream(*t);
  void* p = t->allocate(kKiB4);
  t->free(p);  // cached
  void* q = t->allocate(kKiB4);
  ASSERT_EQ(q, p);  // from the cache: cache-owned
  t->record_stream(q, other);
  t->free(q);  // must wait for `other`: pending or free, never in the cache
  EXPECT_EQ(ThreadCached(*t), 0);
  EXPECT_VALID(*t);
  t->backend().synchronize_stream(other);
  t->process_events();
  EXPECT_EQ(t->stats().pending_bytes[kAggregatePool].current, 0);
  EXPECT_VALID(*t);
}

TEST(ThreadCacheTest, OnlyTheTwoMostRecentStreamsAreCached) {
  auto t = MakeSimAllocator("expandable_segments:false");
  const Stream s1 = NewStream(*t);
  const Stream s2 = NewStream(*t);
  void* a = t->allocate(kKiB4, Stream{});
  void* b = t->allocate(kKiB4, s1);
  void* c = t->allocate(kKiB4, s2);
  t->free(a);
  t->free(b);
  EXPECT_EQ(t->stats().thread_cached[kAggregatePool].current, 2);
  t->free(c);  // a third stream takes the least recently used slot (stream 0's)
  EXPECT_EQ(t->stats().thread_cached[kAggregatePool].current, 2);
  EXPECT_VALID(*t);
  // Stream 0's block went back to the pool: allocating there again is a pool hit.
  const int64_t hits = t->stats().cache_hits;
  void* d = t->allocate(kKiB4, Stream{});
  EXPECT_EQ(t->stats().thread_cached[kAggregatePool].current, 2);
  EXPECT_EQ(t->stats().cache_hits, hits + 1);
  t->free(d);
  EXPECT_VALID(*t);
}

TEST(ThreadCacheTest, AFreeOnAnotherThreadIsCorrect) {
  auto t = MakeSimAllocator("expandable_segments:false");
  void* p = t->allocate(kKiB4);
  t->free(p);
  void* q = t->allocate(kKiB4);  // cache-owned
  ASSERT_EQ(q, p);
  // A thread with no cache of its own gives it back to the pool.
  std::thread([&] { t->free(q); }).join();
  EXPECT_EQ(ThreadCached(*t), 0);
  EXPECT_EQ(t->stats().allocated_bytes[kAggregatePool].current, 0);
  EXPECT_VALID(*t);
  // A thread with a cache on that stream keeps it (jemalloc's choice).
  void* r = t->allocate(kKiB4);
  std::thread([&] {
    t->free(t->allocate(kKiB4));  // this thread now has a cache with stream 0's slot
    t->free(r);
    EXPECT_EQ(ThreadCached(*t), static_cast<int64_t>(2 * kKiB4));
    EXPECT_VALID(*t);
  }).join();
  // That thread exited: its cache was drained.
  EXPECT_EQ(ThreadCached(*t), 0);
  EXPECT_EQ(t->stats().allocated_bytes[kAggregatePool].current, 0);
  EXPECT_VALID(*t);
}

TEST(ThreadCacheTest, ThreadExitDrainsItsCache) {
  auto t = MakeSimAllocator("expandable_segments:false");
  std::thread([&] {
    std::vector<void*> ps;
    for (int i = 0; i < 20; ++i) ps.push_back(t->allocate((i + 1) * 1024));
    for (void* p : ps) t->free(p);
    for (int i = 0; i < 20; ++i) t->free(t->allocate((i + 1) * 1024));
    EXPECT_GT(ThreadCached(*t), 0);
  }).join();
  EXPECT_EQ(ThreadCached(*t), 0);
  EXPECT_EQ(t->stats().allocated_bytes[kAggregatePool].current, 0);
  EXPECT_VALID(*t);
  t->empty_cache();
  EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current, 0);
}

TEST(ThreadCacheTest, AThreadMayOutliveItsAllocator) {
  std::latch made(1), destroyed(1);
  std::thread worker;
  {
    auto t = MakeSimAllocator("expandable_segments:false");
    worker = std::thread([&] {
      t->free(t->allocate(kKiB4));  // a cache holding a block of `t`
      made.count_down();
      destroyed.wait();
      // Exiting now must not touch the destroyed allocator.
    });
    made.wait();
  }
  destroyed.count_down();
  worker.join();
}

TEST(ThreadCacheTest, EmptyCacheAndTrimDrainEveryThread) {
  auto t = MakeSimAllocator("expandable_segments:false");
  std::latch cached(1), checked(1);
  std::thread worker([&] {
    t->free(t->allocate(kKiB4));
    t->free(t->allocate(kKiB4));
    cached.count_down();
    checked.wait();
  });
  cached.wait();
  EXPECT_EQ(ThreadCached(*t), static_cast<int64_t>(kKiB4));
  t->empty_cache();
  EXPECT_EQ(ThreadCached(*t), 0);
  EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current, 0);
  EXPECT_VALID(*t);
  checked.count_down();
  worker.join();
  // trim too.
  t->free(t->allocate(kKiB4));
  t->free(t->allocate(kKiB4));
  EXPECT_EQ(ThreadCached(*t), static_cast<int64_t>(kKiB4));
  t->trim(0);
  EXPECT_EQ(ThreadCached(*t), 0);
  EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current, 0);
}

// Another thread's cache holds the memory a request needs: the first stage of the
// retry drains it, so there is no OOM.
TEST(ThreadCacheTest, NoOomWhileAnotherThreadsCacheHoldsEnough) {
  auto t = MakeSimAllocator(
      "sim_capacity:8MiB,expandable_segments:false,thread_cache_max_bytes:8MiB,"
      "thread_cache_max_size:256KiB",
      8 * kMiB);
  std::latch cached(1), done(1);
  std::thread worker([&] {
    std::vector<void*> ps;
    for (int i = 0; i < 16; ++i) ps.push_back(t->allocate(256 * kKiB));  // 2 segments
    for (void* p : ps) t->free(p);
    cached.count_down();
    done.wait();  // alive, its cache full
  });
  cached.wait();
  EXPECT_EQ(ThreadCached(*t), static_cast<int64_t>(4 * kMiB));
  void* big = nullptr;
  try {
    big = t->allocate(6 * kMiB);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
  EXPECT_EQ(ThreadCached(*t), 0);
  EXPECT_VALID(*t);
  t->free(big);
  done.count_down();
  worker.join();
  EXPECT_VALID(*t);
}

TEST(ThreadCacheTest, DoubleFreeOfACachedBlockNamesThePointer) {
  auto t = MakeSimAllocator("expandable_segments:false");
  void* p = t->allocate(kKiB4);
  t->free(p);
  const DeviceStats before = t->stats();
  try {
    t->free(p);
    ADD_FAILURE() << "double free accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(testutil::MentionsPointer(e.what(), p)) << e.what();
    EXPECT_NE(std::string(e.what()).find("double free"), std::string::npos) << e.what();
  }
  EXPECT_EQ(t->stats().thread_cached_bytes[kAggregatePool].current,
            before.thread_cached_bytes[kAggregatePool].current);
  EXPECT_VALID(*t);
  void* q = t->allocate(kKiB4);  // the cache still works
  EXPECT_EQ(q, p);
  EXPECT_THROW(t->record_stream(static_cast<char*>(q) + 512, Stream{}), InvalidArgumentError);
  t->free(q, kKiB4);
  EXPECT_THROW(t->free(q, kKiB4), InvalidArgumentError);
  EXPECT_VALID(*t);
}

// Counting hits per thread and folding them in gives the same statistics as no cache.
TEST(ThreadCacheTest, StatisticsEqualThoseWithoutCaches) {
  auto run = [](const char* conf) {
    auto t = MakeSimAllocator(conf);
    uint64_t x = 12345;
    std::vector<void*> live;
    for (int i = 0; i < 20000; ++i) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      if (live.size() < 50 && (x >> 60) < 9) {
        live.push_back(t->allocate(1 + (x >> 33) % (200 * kKiB)));
      } else if (!live.empty()) {
        const size_t k = (x >> 20) % live.size();
        t->free(live[k]);
        live[k] = live.back();
        live.pop_back();
      }
      if (i == 10000) t->reset_peak_stats();
    }
    EXPECT_VALID(*t);
    DeviceStats s = t->stats();
    for (void* p : live) t->free(p);
    return std::make_pair(s, t->site_stats());
  };
  const auto [on, on_sites] = run("expandable_segments:false,thread_cache:true");
  const auto [off, off_sites] = run("expandable_segments:false,thread_cache:false");
  EXPECT_EQ(on.allocated_bytes, off.allocated_bytes);
  EXPECT_EQ(on.requested_bytes, off.requested_bytes);
  EXPECT_EQ(on.allocation, off.allocation);
  EXPECT_EQ(on.num_frees, off.num_frees);
  EXPECT_EQ(on.cache_hits + on.cache_misses, off.cache_hits + off.cache_misses);
  EXPECT_EQ(off.thread_cached_bytes[kAggregatePool].allocated, 0);
  EXPECT_GT(on.thread_cached_bytes[kAggregatePool].allocated, 0);
  EXPECT_EQ(on_sites, off_sites);
}

struct CountingObserver : AllocatorObserver {
  std::atomic<int> allocs{0}, frees{0};
  void on_event(const AllocEvent& e) override {
    if (e.action == AllocAction::kAlloc) ++allocs;
    if (e.action == AllocAction::kFree) ++frees;
  }
};

TEST(ThreadCacheTest, HitsAreObserved) {
  auto t = MakeSimAllocator("expandable_segments:false");
  CountingObserver obs;
  t->set_observer(&obs);
  for (int i = 0; i < 100; ++i) t->free(t->allocate(kKiB4));
  std::thread([&] {
    for (int i = 0; i < 100; ++i) t->free(t->allocate(kKiB4));
  }).join();
  EXPECT_EQ(obs.allocs, 200);
  EXPECT_EQ(obs.frees, 200);
  t->set_observer(nullptr);
}

TEST(ThreadCacheTest, OffMeansNoThreadCachedBlocks) {
  auto t = MakeSimAllocator("expandable_segments:false,thread_cache:false");
  for (int i = 0; i < 100; ++i) t->free(t->allocate(kKiB4));
  EXPECT_EQ(t->stats().thread_cached_bytes[kAggregatePool].allocated, 0);
  EXPECT_EQ(t->stats().cache_hits, 99);
  EXPECT_VALID(*t);
}

// Several threads, frees on other threads, stats() and validate() racing with hits.
TEST(ThreadCacheTest, ConcurrentHitsFreesElsewhereAndValidate) {
  auto t = MakeSimAllocator("sim_capacity:64MiB,thread_cache_max_blocks:32", 64 * kMiB);
  constexpr int kThreads = 4;
  std::mutex mu;
  std::vector<void*> handoff;  // blocks allocated on one thread, freed on another
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int id = 0; id < kThreads; ++id) {
    threads.emplace_back([&, id] {
      uint64_t x = 777 + id;
      std::vector<void*> live;
      for (int i = 0; i < 20000; ++i) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        const int r = static_cast<int>(x >> 59);  // 0 .. 31
        if (r < 14 && live.size() < 64) {
          try {
            live.push_back(t->allocate(512 + (x >> 30) % (64 * kKiB)));
          } catch (const OutOfMemoryError&) {
          }
        } else if (r < 26 && !live.empty()) {
          t->free(live.back());
          live.pop_back();
        } else if (r < 30 && !live.empty()) {
          std::lock_guard<std::mutex> lock(mu);
          handoff.push_back(live.back());
          live.pop_back();
        } else if (r == 30) {
          std::vector<void*> take;
          {
            std::lock_guard<std::mutex> lock(mu);
            take.swap(handoff);
          }
          for (void* p : take) t->free(p);
        } else if (i % 64 == 0) {
          if (!t->validate().ok()) ++failures;
        }
      }
      for (void* p : live) t->free(p);
    });
  }
  for (auto& th : threads) th.join();
  for (void* p : handoff) t->free(p);
  EXPECT_EQ(failures, 0);
  EXPECT_VALID(*t);
  EXPECT_EQ(t->stats().allocated_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(ThreadCached(*t), 0);  // every worker exited
}

}  // namespace
}  // namespace devmem
