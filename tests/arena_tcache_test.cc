// tests/arena_tcache_test.cc: scoped arenas (allocator/arena.h) together with the
// thread caches (allocator/thread_cache.h): a scope on a thread whose cache holds
// blocks, arena frees from another thread whose cache is on, empty_cache while a scope
// is open, and the staged retry with retained chunks while caches hold memory. An
// arena buffer must never reach a thread cache, and a cached block must never be
// handed out by an arena; validate() recounts both after every step.
#include <gtest/gtest.h>

#include <latch>
#include <thread>
#include <vector>

#include "allocator/arena.h"
#include "allocator/caching_allocator.h"
#include "allocator/errors.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::MakeSimAllocator;
using testutil::SimAllocator;

int64_t Cached(const CachingAllocator& a) {
  return a.stats().thread_cached[kAggregatePool].current;
}

const ArenaStats* Find(const ArenaReport& r, const std::string& name) {
  for (const ArenaStats& s : r.arenas) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// Small blocks through the pool, freed: this thread's cache holds them.
void WarmCache(CachingAllocator& a, int n) {
  std::vector<void*> ps;
  for (int i = 0; i < n; ++i) ps.push_back(a.allocate(4096));
  for (void* p : ps) a.free(p);
}

TEST(ArenaTcache, ScopeOnAThreadWhoseCacheHoldsBlocksBumpsAndLeavesTheCache) {
  SimAllocator t = MakeSimAllocator();
  WarmCache(*t, 8);
  const int64_t cached = Cached(*t);
  ASSERT_GT(cached, 0) << "the test needs a warm thread cache";
  ASSERT_VALID(*t);
  std::vector<void*> ps;
  {
    ArenaScope arena(*t, "step");
    // The same size the cache holds: served by bumps, the cache untouched.
    for (int i = 0; i < 8; ++i) ps.push_back(t->allocate(4096));
    EXPECT_EQ(Cached(*t), cached);
    EXPECT_EQ(arena.summary().allocations, 8);
    for (void* p : ps) EXPECT_NE(t->find_allocation(p), std::nullopt);
    EXPECT_VALID(*t);
    // Freed inside the scope: back to the chunk, not into this thread's cache.
    for (void* p : ps) t->free(p);
    EXPECT_EQ(Cached(*t), cached);
    EXPECT_VALID(*t);
  }
  EXPECT_EQ(t->arena_report().live_bytes, 0);
  // Outside the scope the cache serves again (a hit lowers its count).
  void* p = t->allocate(4096);
  EXPECT_LT(Cached(*t), cached);
  t->free(p);
  EXPECT_VALID(*t);
}

TEST(ArenaTcache, FreesFromAnotherThreadWithAWarmCacheDoNotEnterItsCache) {
  SimAllocator t = MakeSimAllocator();
  std::vector<void*> ps;
  ArenaScope arena(*t, "step");
  for (int i = 0; i < 64; ++i) ps.push_back(t->allocate(512 * (1 + i % 8)));
  std::latch warmed(1), freed(1), done(1);
  int64_t cached_before = -1, cached_after = -1;
  std::thread other([&] {
    WarmCache(*t, 8);  // this thread's cache is on and holds blocks
    cached_before = Cached(*t);
    warmed.count_down();
    for (void* p : ps) t->free(p);  // arena buffers: O(1) decrements, no cache
    cached_after = Cached(*t);
    freed.count_down();
    done.wait();  // keep the thread (and its cache) alive while the owner checks
  });
  warmed.wait();
  freed.wait();
  EXPECT_GT(cached_before, 0);
  EXPECT_EQ(cached_after, cached_before);
  EXPECT_EQ(Find(t->arena_report(), "step")->live_buffers, 0);
  EXPECT_VALID(*t);
  // The chunk emptied under the scope is reused by it: no pool call.
  const int64_t pool_chunks = arena.summary().pool_chunk_allocs;
  void* q = t->allocate(kMinArenaChunkSize / 4);
  EXPECT_EQ(arena.summary().pool_chunk_allocs, pool_chunks);
  t->free(q);
  done.count_down();
  other.join();
  arena.close();
  EXPECT_VALID(*t);
}

TEST(ArenaTcache, EmptyCacheWhileAScopeIsOpenKeepsItsChunksAndBuffers) {
  SimAllocator t = MakeSimAllocator();
  {
    ArenaScope earlier(*t, "earlier");
    t->free(t->allocate(1000));  // leaves a retained chunk
  }
  ASSERT_EQ(t->arena_report().retained_chunks, 1);
  WarmCache(*t, 8);
  ASSERT_GT(Cached(*t), 0);
  ArenaScope arena(*t, "step");
  char* a = static_cast<char*>(t->allocate(2000));
  std::memset(a, 0x5a, 2000);
  t->empty_cache();
  // The caches are drained and nothing is retained; the open scope's chunk and its
  // live buffer are untouched, and it keeps bumping in the same chunk.
  EXPECT_EQ(Cached(*t), 0);
  const ArenaReport r = t->arena_report();
  EXPECT_EQ(r.retained_chunks, 0);
  EXPECT_EQ(Find(r, "step")->chunks_held, 1);
  EXPECT_EQ(Find(r, "step")->live_bytes, 2048);
  EXPECT_VALID(*t);
  char* b = static_cast<char*>(t->allocate(1000));
  EXPECT_EQ(b, a + 2048);
  for (int i = 0; i < 2000; ++i) ASSERT_EQ(a[i], 0x5a) << i;
  t->free(a);
  t->free(b);
  arena.close();
  EXPECT_VALID(*t);
  t->empty_cache();
  EXPECT_EQ(t->arena_report().chunks, 0);
  EXPECT_VALID(*t);
}

TEST(ArenaTcache, StagedRetryTakesRetainedChunksAndCachedBlocksBeforeAnOom) {
  SimAllocator t = MakeSimAllocator("sim_capacity:64MiB");
  // 40 MiB of retained chunks (ten 4 MiB ones) and a warm thread cache.
  {
    ArenaScope arena(*t, "step");
    std::vector<void*> ps;
    for (int i = 0; i < 40; ++i) ps.push_back(t->allocate(kMiB));
    for (void* p : ps) t->free(p);
  }
  WarmCache(*t, 64);
  ASSERT_GE(t->arena_report().retained_bytes, int64_t{40} * kMiB);
  ASSERT_GT(Cached(*t), 0);
  ASSERT_VALID(*t);
  // 60 MiB fits only once the retained chunks are freed, their segments released, and
  // the small pool's segment (held by the cache) given back too.
  void* big = t->allocate(60 * kMiB);
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(t->arena_report().retained_chunks, 0);
  EXPECT_EQ(t->stats().num_ooms, 0);
  EXPECT_VALID(*t);
  // A request that cannot fit whatever is released is an OOM whose report counts what
  // the arenas hold: a live (escaped) buffer and nothing retained.
  void* kept;
  {
    ArenaScope arena(*t, "leaky");
    kept = t->allocate(512 * kKiB);
  }
  try {
    t->allocate(8 * kMiB);
    ADD_FAILURE() << "expected an OOM";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.report().arena_escaped_bytes, 512 * kKiB);
    EXPECT_EQ(e.report().arena_retained_bytes, 0u);
  }
  EXPECT_VALID(*t);
  t->free(kept);
  t->free(big);
  EXPECT_VALID(*t);
}

}  // namespace
}  // namespace devmem
