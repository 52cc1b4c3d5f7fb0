// tests/arena_test.cc: scoped step arenas (allocator/arena.h): bumps, escapes,
// nesting, several devices, cross-thread frees, scope-exit semantics, misuse, the
// normal-path cases, OOM with retained chunks, validate(), and a randomized model test
// with scopes opened and closed at random and frees from another thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "allocator/arena.h"
#include "allocator/arena_internal.h"
#include "allocator/caching_allocator.h"
#include "allocator/errors.h"
#include "allocator/oom_report.h"
#include "allocator/site.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::MakeSimAllocator;
using testutil::SimAllocator;

SiteId Site(const char* tag) {
  return InternNamedSite("arena_test.cc", 1, "test", SiteKind::kAlloc, tag);
}

const ArenaStats* Find(const ArenaReport& r, const std::string& name) {
  for (const ArenaStats& s : r.arenas) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// Which arena holds `p` ("" when none).
std::string ArenaOf(const CachingAllocator& a, const void* p) {
  for (const ArenaBufferInfo& b : a.arena_buffers()) {
    if (b.addr == reinterpret_cast<uintptr_t>(p)) return b.arena;
  }
  return "";
}

TEST(Arena, BumpsInOneChunkAndFreesDecrement) {
  SimAllocator t = MakeSimAllocator();
  const int64_t blocks_before = t->stats().allocation[kAggregatePool].current;
  std::vector<void*> ps;
  {
    ArenaScope arena(*t, "step");
    for (size_t n : {1, 512, 513, 4000, 10000}) ps.push_back(t->allocate(n, {}, Site("bump")));
    // Consecutive bumps, 512-aligned, in one chunk: one pool block (the chunk).
    for (size_t i = 1; i < ps.size(); ++i) {
      EXPECT_GT(reinterpret_cast<uintptr_t>(ps[i]), reinterpret_cast<uintptr_t>(ps[i - 1]));
    }
    for (void* p : ps) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 512, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ps[1]) - reinterpret_cast<uintptr_t>(ps[0]), 512u);
    EXPECT_EQ(t->stats().allocation[kAggregatePool].current, blocks_before + 1);
    const ArenaReport r = t->arena_report();
    ASSERT_NE(Find(r, "step"), nullptr);
    EXPECT_EQ(Find(r, "step")->live_buffers, 5);
    EXPECT_EQ(Find(r, "step")->live_bytes, 512 + 512 + 1024 + 4096 + 10240);
    EXPECT_EQ(Find(r, "step")->open_scopes, 1);
    EXPECT_EQ(ArenaOf(*t, ps[2]), "step");
    auto info = t->find_allocation(ps[3]);
    ASSERT_TRUE(info.has_value());
    EXPECT_EQ(info->size, 4096u);
    EXPECT_EQ(info->site, Site("bump"));
    EXPECT_VALID(*t);
    for (void* p : ps) t->free(p);
    EXPECT_EQ(Find(t->arena_report(), "step")->live_bytes, 0);
    EXPECT_VALID(*t);
    EXPECT_EQ(arena.summary().allocations, 5);
  }
  const ArenaReport r = t->arena_report();
  EXPECT_EQ(r.retained_chunks, 1);  // kept for the next scope (mi_heap_delete-like)
  EXPECT_EQ(r.live_bytes, 0);
  EXPECT_EQ(Find(r, "step")->scopes_closed, 1);
  EXPECT_EQ(Find(r, "step")->allocations, 5);
  // The chunk is a pool block of the arena's site (kind arena).
  bool saw_chunk = false;
  for (const SegmentInfo& s : t->snapshot().segments) {
    for (const BlockInfo& b : s.blocks) {
      if (b.state != BlockState::kAllocated) continue;
      EXPECT_EQ(GetSite(b.site).kind, SiteKind::kArena);
      EXPECT_EQ(GetSite(b.site).tag, "step");
      EXPECT_EQ(b.size, kMinArenaChunkSize);  // a scope's first chunk: the smallest
      saw_chunk = true;
    }
  }
  EXPECT_TRUE(saw_chunk);
  EXPECT_VALID(*t);
  t->empty_cache();
  EXPECT_EQ(t->arena_report().retained_chunks, 0);
  EXPECT_EQ(t->stats().allocation[kAggregatePool].current, blocks_before);
  EXPECT_VALID(*t);
}

TEST(Arena, NextScopeReusesRetainedChunksWithoutThePool) {
  SimAllocator t = MakeSimAllocator();
  int64_t device_allocs = 0;
  for (int step = 0; step < 5; ++step) {
    ArenaScope arena(*t, "step");
    std::vector<void*> ps;
    // 10 MiB: chunks of 1 MiB (four requests' worth), 2 MiB, 4 MiB and 4 MiB.
    for (int i = 0; i < 40; ++i) ps.push_back(t->allocate(256 * kKiB));
    for (void* p : ps) t->free(p);
    if (step == 0) {
      EXPECT_EQ(arena.summary().pool_chunk_allocs, 4);
      device_allocs = t->stats().num_device_alloc;
    } else {
      EXPECT_EQ(arena.summary().pool_chunk_allocs, 0) << "step " << step;
      EXPECT_EQ(t->stats().num_device_alloc, device_allocs);
    }
  }
  EXPECT_EQ(Find(t->arena_report(), "step")->chunk_reuses, 4 * 4);
  EXPECT_VALID(*t);
}

// A scope's chunks start small and double up to chunk_size, so that a step of a few
// KiB does not reserve a whole chunk_size (the demo's step reserved twice the pool's
// peak when every chunk was chunk_size), and a request gets a chunk of at least four
// times its size.
TEST(Arena, ChunksGrowFromTheSmallestUpToChunkSize) {
  SimAllocator t = MakeSimAllocator();
  {
    ArenaScope arena(*t, "small");
    std::vector<void*> ps;
    for (int i = 0; i < 8; ++i) ps.push_back(t->allocate(1000));
    const ArenaReport report = t->arena_report();  // outlives s, which points into it
    const ArenaStats* s = Find(report, "small");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->chunks_held, 1);
    EXPECT_EQ(s->chunk_bytes, static_cast<int64_t>(kMinArenaChunkSize));
    for (void* p : ps) t->free(p);
  }
  t->empty_cache();
  {
    ArenaScope arena(*t, "growing");
    std::vector<void*> ps;
    // A 64 KiB chunk holds 128 buffers of 512 B, the next one 256, and so on.
    for (int i = 0; i < 40000; ++i) ps.push_back(t->allocate(512));
    std::vector<size_t> sizes;
    for (const SegmentInfo& seg : t->snapshot().segments) {
      for (const BlockInfo& b : seg.blocks) {
        if (b.state == BlockState::kAllocated && GetSite(b.site).kind == SiteKind::kArena) {
          sizes.push_back(b.size);
        }
      }
    }
    std::sort(sizes.begin(), sizes.end());
    // 40000 * 512 B = 19.5 MiB: 64 KiB, 128 KiB, ..., 2 MiB (4 MiB - 64 KiB), then
    // 4 MiB chunks (4 of them hold the remaining 15.5 MiB).
    const std::vector<size_t> expect = {64 * kKiB, 128 * kKiB, 256 * kKiB, 512 * kKiB,
                                        kMiB,      2 * kMiB,   4 * kMiB,   4 * kMiB,
                                        4 * kMiB,  4 * kMiB};
    EXPECT_EQ(sizes, expect);
    EXPECT_VALID(*t);
    for (void* p : ps) t->free(p);
  }
  t->empty_cache();
  {
    ArenaScope arena(*t, "large");
    void* p = t->allocate(kMiB);  // the largest request: a chunk_size chunk at once
    EXPECT_EQ(Find(t->arena_report(), "large")->chunk_bytes,
              static_cast<int64_t>(kDefaultArenaChunkSize));
    t->free(p);
  }
  EXPECT_VALID(*t);
}

TEST(Arena, ChunksWhoseBuffersDiedAreReusedInsideTheScope) {
  SimAllocator t = MakeSimAllocator();
  ArenaScope arena(*t, "loop");
  // 100 rounds of 1 MiB each, freed at once: the footprint stays one chunk or two.
  for (int i = 0; i < 100; ++i) t->free(t->allocate(kMiB));
  EXPECT_LE(arena.summary().pool_chunk_allocs, 2);
  EXPECT_VALID(*t);
}

// The size of the chunk (pool block) that arena buffer `p` sits in (0 when none).
size_t ChunkSizeOf(const CachingAllocator& a, const void* p) {
  uintptr_t chunk = 0;
  for (const ArenaBufferInfo& b : a.arena_buffers()) {
    if (b.addr == reinterpret_cast<uintptr_t>(p)) chunk = b.chunk;
  }
  for (const SegmentInfo& seg : a.snapshot().segments) {
    for (const BlockInfo& b : seg.blocks) {
      if (b.addr == chunk) return b.size;
    }
  }
  return 0;
}

// A scope whose chunks grew (64 KiB, 128 KiB, ...) and emptied reuses the largest of
// them at its next chunk change, not the first: going back to the 64 KiB one made a
// steady stream of 8 KiB pairs change chunks every few bumps (arena_pair_ns 19 -> 9 ns).
TEST(Arena, AScopeWhoseChunksGrewReusesItsLargestEmptyChunk) {
  SimAllocator t = MakeSimAllocator();
  ArenaScope arena(*t, "step",
                   ArenaOptions{.chunk_size = 256 * kKiB, .stream = {}, .max_waste_fraction = {}});
  std::vector<void*> ps;
  // 500 KiB: chunks of 64, 128 and 256 KiB, then 52 KiB of a second 256 KiB one.
  for (int i = 0; i < 1000; ++i) ps.push_back(t->allocate(512));
  ASSERT_EQ(arena.summary().pool_chunk_allocs, 4);
  for (void* p : ps) t->free(p);
  ps.clear();
  // Six 32 KiB requests fit the current chunk's 204 KiB; the seventh needs a chunk:
  // every other one is empty, and the largest is the first 256 KiB one.
  for (int i = 0; i < 7; ++i) ps.push_back(t->allocate(32 * kKiB));
  EXPECT_EQ(ChunkSizeOf(*t, ps[5]), 256 * kKiB);
  EXPECT_EQ(ChunkSizeOf(*t, ps[6]), 256 * kKiB);
  EXPECT_EQ(arena.summary().pool_chunk_allocs, 4);  // no new chunk
  EXPECT_EQ(arena.summary().spills, 0);
  EXPECT_VALID(*t);
  for (void* p : ps) t->free(p);
  EXPECT_VALID(*t);
}

// A window of live buffers across a chunk change (allocate the next, free the oldest):
// the owner's frees of the buffers left in its previous chunk are local frees like
// those of its current chunk (owner_live: no chunk table lookup, no lock, no
// read-modify-write), and a second free there is still caught.
TEST(Arena, OwnerFreesInItsEarlierChunksAreLocal) {
  SimAllocator t = MakeSimAllocator();
  ArenaScope arena(*t, "step",
                   ArenaOptions{.chunk_size = 64 * kKiB, .stream = {}, .max_waste_fraction = {}});
  const int64_t lookups = t->arena_report().table_lookups;
  std::deque<void*> window;  // 8 KiB buffers: eight to a 64 KiB chunk
  for (int i = 0; i < 1003; ++i) {  // the last three in a fresh chunk
    if (window.size() == 8) {
      t->free(window.front());
      window.pop_front();
    }
    window.push_back(t->allocate(8 * kKiB));
  }
  EXPECT_EQ(t->arena_report().table_lookups, lookups);
  EXPECT_EQ(arena.summary().pool_chunk_allocs, 2);  // the two chunks take turns
  EXPECT_EQ(arena.summary().allocations, 1003);
  EXPECT_VALID(*t);
  // window.front() sits in the chunk before the current one: free it twice.
  ASSERT_EQ(ArenaOf(*t, window.front()), "step");
  ASSERT_FALSE(internal::t_arena_top->current->contains(
      reinterpret_cast<uintptr_t>(window.front())));
  t->free(window.front());
  try {
    t->free(window.front());
    FAIL() << "second free accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("arena 'step'"), std::string::npos) << e.what();
  }
  window.pop_front();
  EXPECT_EQ(Find(t->arena_report(), "step")->live_buffers, 7);
  EXPECT_VALID(*t);
  for (void* p : window) t->free(p);
  EXPECT_EQ(t->arena_report().table_lookups, lookups);
  EXPECT_EQ(Find(t->arena_report(), "step")->live_buffers, 0);
  EXPECT_VALID(*t);
}

// Long-lived buffers interleaved with short ones: every 64 KiB chunk keeps one 512 B
// buffer live among 64 KiB of dead temporaries, so without the waste bound the scope
// holds a chunk per round. With it (arena.h, "Waste"), a request that needs a new chunk
// takes the pool's path once the dead bytes exceed max(chunk_size, 0.1 x live), and the
// chunks stay within live + that bound + the current chunk + the tail a request did not
// fit (under chunk_size / 4).
TEST(Arena, WasteBoundSpillsInterleavedLifetimesToThePool) {
  constexpr size_t kChunk = 64 * kKiB;
  constexpr int kRounds = 64;
  auto run = [](double fraction, int64_t* max_excess, int64_t* spills) {
    SimAllocator t = MakeSimAllocator("sim_capacity:256MiB");
    std::vector<void*> kept;
    int64_t kept_bumped = 0;  // bytes of kept buffers the arena serves
    int64_t spill_bytes = 0;
    *max_excess = 0;
    {
      ArenaScope arena(*t, "step",
                       ArenaOptions{.chunk_size = kChunk, .stream = {},
                                    .max_waste_fraction = fraction});
      // One request; a spilled one is an ordinary pool block, a bump an arena buffer.
      auto allocate = [&](size_t n, const char* tag) {
        const int64_t before = arena.summary().spills;
        void* p = t->allocate(n, {}, Site(tag));
        const bool spilled = arena.summary().spills != before;
        EXPECT_EQ(ArenaOf(*t, p), spilled ? "" : "step");
        if (spilled) spill_bytes += static_cast<int64_t>(n);
        return std::pair{p, !spilled};
      };
      for (int i = 0; i < kRounds; ++i) {
        auto [keep, bumped] = allocate(512, "long");
        kept.push_back(keep);
        kept_bumped += bumped ? 512 : 0;
        for (int j = 0; j < 4; ++j) t->free(allocate(16 * kKiB, "short").first);
        const ArenaReport r = t->arena_report();
        const ArenaStats* s = Find(r, "step");
        ASSERT_NE(s, nullptr);
        EXPECT_EQ(s->live_bytes, kept_bumped);
        const int64_t bound =
            std::max<int64_t>(kChunk, static_cast<int64_t>(fraction * s->live_bytes));
        *max_excess = std::max(*max_excess, s->chunk_bytes - s->live_bytes - bound);
      }
      EXPECT_VALID(*t);
      *spills = arena.summary().spills;
      EXPECT_EQ(arena.summary().spill_bytes, spill_bytes);
    }
    const ArenaReport r = t->arena_report();
    const ArenaStats* s = Find(r, "step");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->spills, *spills);  // counted per name at close
    EXPECT_EQ(s->spill_bytes, spill_bytes);
    for (void* p : kept) t->free(p);
    EXPECT_VALID(*t);
    t->empty_cache();
    EXPECT_EQ(t->stats().allocated_bytes[kAggregatePool].current, 0);
  };
  int64_t excess = 0, spills = 0;
  run(0.1, &excess, &spills);
  EXPECT_GT(spills, kRounds);
  EXPECT_LE(excess, static_cast<int64_t>(kChunk + kChunk / 4)) << "the bound did not hold";
  run(0, &excess, &spills);  // off: a chunk per round
  EXPECT_EQ(spills, 0);
  EXPECT_GT(excess, static_cast<int64_t>(kRounds / 2 * kChunk)) << "nothing to bound";
}

TEST(Arena, EscapedBufferStaysValidAndPinsItsChunkUntilFreed) {
  SimAllocator t = MakeSimAllocator();
  void* kept;
  {
    ArenaScope arena(*t, "step");
    void* tmp = t->allocate(1000, {}, Site("temporary"));
    kept = t->allocate(3000, {}, Site("logging"));
    std::memset(kept, 0x5a, 3000);
    t->free(tmp);
    arena.close();
    EXPECT_EQ(arena.summary().escaped_buffers, 1);
    EXPECT_EQ(arena.summary().escaped_bytes, 3072);
  }
  ArenaReport r = t->arena_report();
  const ArenaStats* s = Find(r, "step");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->escaped_bytes, 3072);
  EXPECT_EQ(s->escaped_buffers, 1);
  EXPECT_EQ(s->chunks_held, 1);
  EXPECT_EQ(r.retained_chunks, 0);
  ASSERT_EQ(s->escape_sites.size(), 1u);
  EXPECT_EQ(s->escape_sites[0].site, Site("logging"));
  EXPECT_EQ(s->escape_sites[0].bytes, 3072);
  EXPECT_EQ(static_cast<unsigned char*>(kept)[2999], 0x5a);
  // Outside any scope now: a new allocation takes the normal path.
  void* normal = t->allocate(1000);
  EXPECT_EQ(ArenaOf(*t, normal), "");
  t->free(normal);
  auto buffers = t->arena_buffers();
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_TRUE(buffers[0].escaped);
  EXPECT_VALID(*t);
  t->free(kept);
  r = t->arena_report();
  EXPECT_EQ(r.escaped_bytes, 0);
  EXPECT_EQ(r.retained_chunks, 1);
  EXPECT_EQ(Find(r, "step")->escapes, 1);  // the total stays
  EXPECT_VALID(*t);
}

TEST(Arena, InnermostScopeWinsAndOuterResumes) {
  SimAllocator t = MakeSimAllocator();
  ArenaScope outer(*t, "outer");
  void* a = t->allocate(100);
  void* b;
  {
    ArenaScope inner(*t, "inner");
    b = t->allocate(100);
    EXPECT_EQ(ArenaOf(*t, b), "inner");
    t->free(b);
  }
  void* c = t->allocate(100);
  EXPECT_EQ(ArenaOf(*t, a), "outer");
  EXPECT_EQ(ArenaOf(*t, c), "outer");
  t->free(a);
  t->free(c);
  EXPECT_VALID(*t);
}

TEST(Arena, ScopesOnSeveralDevices) {
  SimAllocator d0 = MakeSimAllocator();
  SimAllocator d1 = MakeSimAllocator();
  ArenaScope s0(*d0, "step0");
  ArenaScope s1(*d1, "step1");  // innermost, but of another allocator
  void* p0 = d0->allocate(100);
  void* p1 = d1->allocate(100);
  EXPECT_EQ(ArenaOf(*d0, p0), "step0");
  EXPECT_EQ(ArenaOf(*d1, p1), "step1");
  // A pointer of one device is not an arena buffer of the other.
  EXPECT_THROW(d1->free(p0), InvalidArgumentError);
  d0->free(p0);
  d1->free(p1);
  EXPECT_VALID(*d0);
  EXPECT_VALID(*d1);
}

TEST(Arena, OtherStreamsLargeRequestsAndOtherThreadsTakeTheNormalPath) {
  SimAllocator t = MakeSimAllocator();
  const Stream other = testutil::NewStream(*t);
  ArenaScope arena(*t, "step");
  void* big = t->allocate(kDefaultArenaChunkSize / 4 + 1);
  void* on_other = t->allocate(100, other);
  void* from_thread = nullptr;
  std::thread([&] { from_thread = t->allocate(100); }).join();
  void* zero = t->allocate(0);
  EXPECT_EQ(zero, nullptr);
  EXPECT_EQ(ArenaOf(*t, big), "");
  EXPECT_EQ(ArenaOf(*t, on_other), "");
  EXPECT_EQ(ArenaOf(*t, from_thread), "");
  EXPECT_EQ(t->arena_report().chunks, 0);
  for (void* p : {big, on_other, from_thread}) t->free(p);
  EXPECT_VALID(*t);
}

TEST(Arena, FreesFromOtherThreadsAfterTheScopeClosed) {
  SimAllocator t = MakeSimAllocator();
  std::vector<void*> ps;
  {
    ArenaScope arena(*t, "step");
    for (int i = 0; i < 64; ++i) ps.push_back(t->allocate(64 * kKiB));
  }
  EXPECT_EQ(t->arena_report().escaped_bytes, 64 * 64 * 1024);
  // Four threads free a quarter each, concurrently; the last free of each chunk
  // retains it.
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (size_t i = static_cast<size_t>(k); i < ps.size(); i += 4) t->free(ps[i]);
    });
  }
  for (std::thread& th : threads) th.join();
  const ArenaReport r = t->arena_report();
  EXPECT_EQ(r.live_bytes, 0);
  EXPECT_EQ(r.escaped_bytes, 0);
  EXPECT_EQ(r.retained_chunks, r.chunks);
  EXPECT_VALID(*t);
}

// Once any chunk exists (a retained one is enough), frees, record_streams and finds
// of ordinary blocks on any thread must not search the chunk table under its lock:
// that lock's reader side is a shared read-modify-write on every free of the shipped
// path. Arena buffers of a closed scope are still found (under the lock).
TEST(Arena, OrdinaryBlocksAreToldApartWithoutTheChunkTable) {
  SimAllocator t = MakeSimAllocator();
  void* escaped = nullptr;
  {
    ArenaScope arena(*t, "step");
    t->free(t->allocate(4096));   // a chunk that will be retained
    ArenaScope inner(*t, "inner",
                     ArenaOptions{.chunk_size = 64 * kKiB, .stream = {}, .max_waste_fraction = {}});
    escaped = t->allocate(8192);  // a chunk pinned by an escape
  }
  ASSERT_EQ(t->arena_report().chunks, 2);
  const int64_t before = t->arena_report().table_lookups;
  std::thread other([&] {
    for (int i = 0; i < 100; ++i) {
      // Beside the chunks in the small pool, and in the large one.
      void* small = t->allocate(4096);
      void* large = t->allocate(4 * kMiB);
      EXPECT_TRUE(t->find_allocation(small).has_value());
      t->record_stream(small, Stream{});
      t->free(small);
      t->free(large);
    }
  });
  other.join();
  EXPECT_EQ(t->arena_report().table_lookups, before);
  // The escaped buffer, freed on another thread: found in the table.
  std::thread freer([&] { t->free(escaped); });
  freer.join();
  EXPECT_EQ(t->arena_report().table_lookups, before + 1);
  EXPECT_EQ(t->arena_report().live_bytes, 0);
  EXPECT_VALID(*t);
}

TEST(Arena, DoubleAndInteriorFreesAreErrorsThatChangeNothing) {
  SimAllocator t = MakeSimAllocator();
  ArenaScope arena(*t, "step");
  char* p = static_cast<char*>(t->allocate(4096));
  void* q = t->allocate(100);
  try {
    t->free(p + 512);
    FAIL() << "interior free accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("arena 'step'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("interior"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t->free(p + 1), InvalidArgumentError);
  EXPECT_VALID(*t);
  t->free(p);
  EXPECT_THROW(t->free(p), InvalidArgumentError);
  EXPECT_EQ(Find(t->arena_report(), "step")->live_buffers, 1);
  EXPECT_VALID(*t);
  t->free(q);
}

TEST(Arena, CloseOnAnotherThreadIsAnErrorNamingTheScope) {
  SimAllocator t = MakeSimAllocator();
  ArenaScope arena(*t, "mine");
  std::string message;
  std::thread([&] {
    try {
      arena.close();
    } catch (const InvalidArgumentError& e) {
      message = e.what();
    }
  }).join();
  EXPECT_NE(message.find("arena 'mine' on sim:0"), std::string::npos) << message;
  EXPECT_NE(message.find("opened on thread"), std::string::npos) << message;
  // Nothing changed: the scope is open and serves this thread.
  EXPECT_TRUE(arena.is_open());
  void* p = t->allocate(10);
  EXPECT_EQ(ArenaOf(*t, p), "mine");
  t->free(p);
  arena.close();
  EXPECT_FALSE(arena.is_open());
  arena.close();  // twice: a no-op
  EXPECT_VALID(*t);
}

TEST(Arena, NonNestedCloseIsAnErrorNamingBothScopes) {
  SimAllocator t = MakeSimAllocator();
  ArenaScope outer(*t, "outer");
  ArenaScope inner(*t, "inner");
  try {
    outer.close();
    FAIL() << "non-nested close accepted";
  } catch (const InvalidArgumentError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("arena 'outer'"), std::string::npos) << m;
    EXPECT_NE(m.find("arena 'inner'"), std::string::npos) << m;
  }
  EXPECT_TRUE(outer.is_open());
  void* p = t->allocate(10);
  EXPECT_EQ(ArenaOf(*t, p), "inner");
  t->free(p);
  inner.close();
  outer.close();
  EXPECT_EQ(Find(t->arena_report(), "outer")->open_scopes, 0);
}

TEST(Arena, OutOfOrderDestructionAbandonsAndClosesWithTheInnerScope) {
  SimAllocator t = MakeSimAllocator();
  auto outer = std::make_unique<ArenaScope>(*t, "outer");
  auto inner = std::make_unique<ArenaScope>(*t, "inner");
  ::testing::internal::CaptureStderr();
  outer.reset();  // misuse: says so, abandons "outer" (no throw from a destructor)
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("arena 'outer' on sim:0"), std::string::npos) << err;
  EXPECT_EQ(Find(t->arena_report(), "outer")->open_scopes, 1);
  inner.reset();  // closes "inner", then the abandoned "outer" below it
  EXPECT_EQ(Find(t->arena_report(), "outer")->open_scopes, 0);
  void* p = t->allocate(10);
  EXPECT_EQ(ArenaOf(*t, p), "");
  t->free(p);
  EXPECT_VALID(*t);
}

TEST(Arena, DestructionOnAnotherThreadAbandonsAndTheOwnerClosesItLater) {
  SimAllocator t = MakeSimAllocator();
  auto scope = std::make_unique<ArenaScope>(*t, "moved");
  void* p = t->allocate(10);
  ::testing::internal::CaptureStderr();
  std::thread([&] { scope.reset(); }).join();
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("arena 'moved'"), std::string::npos);
  // Abandoned: serves no more allocations on the owner thread.
  void* q = t->allocate(10);
  EXPECT_EQ(ArenaOf(*t, q), "");
  t->free(q);
  // The owner closes it at its next scope operation.
  { ArenaScope next(*t, "next"); }
  EXPECT_EQ(Find(t->arena_report(), "moved")->open_scopes, 0);
  EXPECT_EQ(t->arena_report().escaped_bytes, 512);
  t->free(p);
  EXPECT_VALID(*t);
}

TEST(Arena, BadOptionsNameTheOption) {
  SimAllocator t = MakeSimAllocator();
  try {
    ArenaScope bad(*t, "x",
                   ArenaOptions{.chunk_size = 1000, .stream = {}, .max_waste_fraction = {}});
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("chunk_size 1000"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ArenaScope(*t, ""), InvalidArgumentError);
  for (double bad_fraction : {-0.5, std::nan(""), 2e6}) {
    try {
      ArenaScope bad(*t, "x", ArenaOptions{.chunk_size = kDefaultArenaChunkSize, .stream = {},
                                          .max_waste_fraction = bad_fraction});
      FAIL() << bad_fraction;
    } catch (const InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("max_waste_fraction"), std::string::npos) << e.what();
    }
  }
  // Nothing was opened.
  void* p = t->allocate(10);
  EXPECT_EQ(ArenaOf(*t, p), "");
  t->free(p);
}

TEST(Arena, RecordStreamKeepsTheChunkOutOfArenaReuse) {
  SimAllocator t = MakeSimAllocator();
  const Stream other = testutil::NewStream(*t);
  {
    ArenaScope arena(*t, "step");
    void* p = t->allocate(1000);
    t->record_stream(p, other);
    t->free(p);
  }
  // Not retained: handed back to the pool, whose free waits for `other`.
  ArenaReport r = t->arena_report();
  EXPECT_EQ(r.retained_chunks, 0);
  EXPECT_EQ(r.chunks, 0);
  EXPECT_EQ(r.chunks_returned, 1);
  EXPECT_VALID(*t);
  t->backend().synchronize_stream(other);
  t->process_events();
  EXPECT_EQ(t->stats().pending_bytes[kAggregatePool].current, 0);
}

TEST(Arena, StagedRetryTakesBackRetainedChunks) {
  SimAllocator t = MakeSimAllocator("sim_capacity:64MiB");
  {
    ArenaScope arena(*t, "step");
    std::vector<void*> ps;
    for (int i = 0; i < 40; ++i) ps.push_back(t->allocate(kMiB));  // 40 MiB of chunks
    for (void* p : ps) t->free(p);
  }
  ASSERT_GE(t->arena_report().retained_bytes, int64_t{40} * kMiB);
  // 48 MiB fits only once the retained chunks' segments are released.
  void* big = t->allocate(48 * kMiB);
  EXPECT_NE(big, nullptr);
  EXPECT_EQ(t->arena_report().retained_chunks, 0);
  EXPECT_EQ(t->stats().num_ooms, 0);
  t->free(big);
  EXPECT_VALID(*t);
}

TEST(Arena, OomReportSaysWhatArenasHold) {
  SimAllocator t = MakeSimAllocator("sim_capacity:64MiB");
  std::vector<void*> escaped;
  {
    ArenaScope arena(*t, "leaky");
    for (int i = 0; i < 30; ++i) escaped.push_back(t->allocate(kMiB));
  }
  try {
    t->allocate(48 * kMiB);
    FAIL() << "expected an OOM";
  } catch (const OutOfMemoryError& e) {
    const OomReport& r = e.report();
    EXPECT_EQ(r.arena_live_bytes, 30 * kMiB);
    EXPECT_EQ(r.arena_escaped_bytes, 30 * kMiB);
    EXPECT_NE(std::string(e.what()).find("scoped arenas hold"), std::string::npos);
    ASSERT_FALSE(r.top_sites.empty());
    EXPECT_EQ(GetSite(r.top_sites[0].site).kind, SiteKind::kArena);
    EXPECT_EQ(GetSite(r.top_sites[0].site).tag, "leaky");
  }
  for (void* p : escaped) t->free(p);
  EXPECT_VALID(*t);
}

TEST(Arena, TraceSeesOpenAndClose) {
  struct Recorder : AllocatorObserver {
    std::vector<AllocEvent> events;
    void on_event(const AllocEvent& e) override { events.push_back(e); }
  } rec;
  SimAllocator t = MakeSimAllocator();
  t->set_observer(&rec);
  {
    ArenaScope arena(*t, "traced");
    t->free(t->allocate(1000));
  }
  t->set_observer(nullptr);
  ASSERT_GE(rec.events.size(), 2u);
  EXPECT_EQ(rec.events.front().action, AllocAction::kArenaOpen);
  EXPECT_EQ(rec.events.back().action, AllocAction::kArenaClose);
  EXPECT_EQ(rec.events.back().size, 1024u);  // bytes bumped
  EXPECT_EQ(GetSite(rec.events.back().site).tag, "traced");
}

TEST(Arena, NamesAreBoundedForLabels) {
  SimAllocator t = MakeSimAllocator();
  ::testing::internal::CaptureStderr();
  for (size_t i = 0; i < kMaxArenaNames + 5; ++i) {
    ArenaScope s(*t, "name" + std::to_string(i));
  }
  ::testing::internal::GetCapturedStderr();
  const ArenaReport r = t->arena_report();
  EXPECT_EQ(r.arenas.size(), kMaxArenaNames + 1);
  EXPECT_EQ(r.arenas.back().name, "other");
  EXPECT_EQ(r.arenas.back().scopes_closed, 5);
}

TEST(Arena, ValidateNoticesLiveCountsAndSideTablesThatDisagree) {
  SimAllocator t = MakeSimAllocator();
  ArenaScope arena(*t, "step");
  void* a = t->allocate(1000);
  void* b = t->allocate(1000);
  ASSERT_VALID(*t);
  // Reach the chunk as the owning thread sees it (the internal header's thread-local).
  internal::ArenaChunk* c = internal::t_arena_top->current;
  ASSERT_NE(c, nullptr);
  c->live.fetch_add(internal::LivePack(1, 0));  // one buffer too many
  absl::Status s = t->validate();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("live count"), std::string::npos) << s;
  c->live.fetch_sub(internal::LivePack(1, 0));
  ASSERT_VALID(*t);
  // A slot claiming 3 units at +0 overlaps the buffer at +1024.
  const uint64_t saved = c->slots[0].load();
  c->slots[0].store((uint64_t{3} << 32) | (saved & 0xffffffffu));
  c->live.fetch_add(1);  // keep the units in step, so the overlap is what is caught
  s = t->validate();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.ToString().find("overlaps"), std::string::npos) << s;
  c->slots[0].store(saved);
  c->live.fetch_sub(1);
  ASSERT_VALID(*t);
  t->free(a);
  t->free(b);
}

// --- randomized model test -------------------------------------------------------------

// One thread opens and closes scopes at random (nesting up to 4 deep, two names,
// several chunk sizes), allocates sizes 1 B .. 2 MiB, frees some itself and hands
// others to a second thread that frees them. Every buffer carries a pattern checked at
// its free; live buffers never overlap; validate() passes whenever the freeing thread
// is idle; at the end nothing is live and empty_cache returns everything.
TEST(ArenaRandom, ScopesAtRandomWithFreesFromAnotherThread) {
  const uint64_t seed = testutil::TestSeed(20261201);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const uint64_t ops = testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", 20000);
  SimAllocator t = MakeSimAllocator("sim_capacity:256MiB");
  std::mt19937_64 rng(seed);

  struct Buf {
    char* p;
    size_t n;
    uint8_t tag;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Buf> queue;
  bool done = false;
  size_t in_flight = 0;  // queued or being freed by the worker
  std::atomic<int> bad{0};
  auto check_and_free = [&](const Buf& b) {
    if (b.p[0] != static_cast<char>(b.tag) || b.p[b.n - 1] != static_cast<char>(b.tag)) ++bad;
    t->free(b.p);
  };
  std::thread worker([&] {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return done || !queue.empty(); });
      if (queue.empty()) return;
      Buf b = queue.front();
      queue.pop_front();
      lock.unlock();
      check_and_free(b);
      lock.lock();
      --in_flight;
      cv.notify_all();
    }
  });
  auto drain = [&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return in_flight == 0; });
  };

  std::map<uintptr_t, Buf> live;  // by address: overlap check
  std::vector<std::unique_ptr<ArenaScope>> scopes;
  const size_t chunk_sizes[] = {64 * kKiB, kMiB, 4 * kMiB};
  for (uint64_t i = 0; i < ops; ++i) {
    const uint64_t op = rng() % 100;
    if (op < 5 && scopes.size() < 4) {
      scopes.push_back(std::make_unique<ArenaScope>(
          *t, rng() % 2 ? "fwd" : "bwd",
          ArenaOptions{.chunk_size = chunk_sizes[rng() % 3], .stream = {}, .max_waste_fraction = {}}));
    } else if (op < 10 && !scopes.empty()) {
      scopes.pop_back();
    } else if (op < 55) {
      const size_t n = 1 + static_cast<size_t>(std::exp2(static_cast<double>(rng() % 2100) / 100.0));
      char* p = nullptr;
      try {
        p = static_cast<char*>(t->allocate(n));
      } catch (const OutOfMemoryError&) {
        continue;
      }
      const Buf b{p, n, static_cast<uint8_t>(rng())};
      p[0] = static_cast<char>(b.tag);
      p[n - 1] = static_cast<char>(b.tag);
      auto next = live.lower_bound(reinterpret_cast<uintptr_t>(p));
      if (next != live.end()) {
        EXPECT_GE(next->first, reinterpret_cast<uintptr_t>(p) + n);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        EXPECT_LE(prev->first + prev->second.n, reinterpret_cast<uintptr_t>(p));
      }
      live.emplace(reinterpret_cast<uintptr_t>(p), b);
    } else if (!live.empty()) {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      const Buf b = it->second;
      live.erase(it);
      if (op < 80) {
        check_and_free(b);
      } else {
        std::lock_guard<std::mutex> lock(mu);
        queue.push_back(b);
        ++in_flight;
        cv.notify_all();
      }
    }
    if (i % 2000 == 0) {
      drain();
      ASSERT_VALID(*t);
    }
  }
  while (!scopes.empty()) scopes.pop_back();  // innermost first
  for (auto& [addr, b] : live) check_and_free(b);
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  }
  worker.join();
  EXPECT_EQ(bad.load(), 0);
  ASSERT_VALID(*t);
  const ArenaReport r = t->arena_report();
  EXPECT_EQ(r.live_bytes, 0);
  EXPECT_EQ(r.escaped_bytes, 0);
  t->empty_cache();
  EXPECT_EQ(t->arena_report().chunks, 0);
  EXPECT_EQ(t->stats().allocated_bytes[kAggregatePool].current, 0);
  ASSERT_VALID(*t);
}

}  // namespace
}  // namespace devmem
