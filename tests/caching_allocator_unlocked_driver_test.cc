// tests/caching_allocator_unlocked_driver_test.cc: no driver call under the device
// lock on the allocation path.
//
// Every segment driver call runs with the device lock released (driver_in_flight.h): a
// regular segment's allocate_segment (cudaMalloc), an expandable map, the unmaps of
// recycling, the frees and unmaps of released segments. The intent is registered first
// (its bytes count against the memory limit; what the call works on is out of reach),
// the lock is taken back to link or unlink the result. A HookedBackend holds the driver
// call on a latch so that other threads' calls are ordered by what the allocator does,
// not by sleeps.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/driver_in_flight.h"
#include "allocator/errors.h"
#include "allocator/mutex.h"
#include "tests/hooked_backend.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::MakeHookedSimAllocator;
using testutil::SimAllocator;

// Bounds a wait that fails the test instead of hanging it; never orders threads.
constexpr auto kBound = std::chrono::seconds(20);

TEST(UnlockedDriverTest, CacheHitsAndTheLimitProceedWhileASegmentAllocationIsInFlight) {
  testutil::HookedBackend* hooks = nullptr;
  // A 5 MiB limit: two 2 MiB small-pool segments fit, three do not.
  SimAllocator t = MakeHookedSimAllocator(
      "sim_capacity:100MiB,expandable_segments:false,per_process_memory_fraction:0.05",
      &hooks);
  // One cached segment: [p0: 1 MiB][p2: 512 KiB][free: 512 KiB].
  void* p0 = t->allocate(kMiB);
  void* p2 = t->allocate(512 * kKiB);
  ASSERT_EQ(t->stats().segment[kAggregatePool].current, 1);

  std::latch entered(1);   // the driver call has started
  std::latch release(1);   // the test lets it finish
  std::atomic<int> calls{0};  // the hook runs outside the device lock
  testutil::HookGuard alloc_segment_hook =
      hooks->allocate_segment_instead.Set([&](size_t bytes) -> absl::StatusOr<void*> {
        if (calls++ == 0) {
          entered.count_down();
          release.wait();
        }
        return hooks->inner().allocate_segment(bytes);
      });

  // A: a miss (1 MiB fits in no free block): a second segment, held in the driver.
  std::future<void*> a = std::async(std::launch::async, [&] { return t->allocate(kMiB); });
  entered.wait();

  // C: a cache hit in the first segment completes while A's driver call is in flight.
  std::future<void> c = std::async(std::launch::async, [&] {
    void* q = t->allocate(256 * kKiB);
    t->free(q);
  });
  const bool c_done = c.wait_for(kBound) == std::future_status::ready;
  EXPECT_TRUE(c_done) << "a cache hit waited for another thread's driver call";

  // B: another miss would need a third segment. A's intent counts against the limit
  // (2 MiB reserved + 2 MiB in flight + 2 MiB > 5 MiB), so B is refused at once rather
  // than both overshooting it.
  std::future<bool> b = std::async(std::launch::async, [&] {
    try {
      t->free(t->allocate(kMiB));
      return false;
    } catch (const OutOfMemoryError&) {
      return true;
    }
  });
  const bool b_done = b.wait_for(kBound) == std::future_status::ready;
  EXPECT_TRUE(b_done) << "a refused miss waited for another thread's driver call";
  if (c_done && b_done) {  // else the lock is held: validate() would wait forever
    EXPECT_TRUE(t->validate().ok()) << t->validate();  // consistent while in flight
  }

  release.count_down();
  void* pa = a.get();
  c.wait();
  if (b_done) {
    EXPECT_TRUE(b.get()) << "the in-flight intent did not count against the limit";
  }
  EXPECT_EQ(t->stats().segment[kAggregatePool].current, 2);
  EXPECT_EQ(calls.load(), 1) << "the refused miss called the driver";
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  t->free(pa);
  t->free(p0);
  t->free(p2);
  EXPECT_TRUE(t->validate().ok()) << t->validate();
}

// A failed driver call un-registers its intent: the bytes are free for the next one.
TEST(UnlockedDriverTest, AFailedSegmentAllocationUnregistersItsIntent) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(
      "sim_capacity:100MiB,expandable_segments:false,per_process_memory_fraction:0.05",
      &hooks);
  std::atomic<int> calls{0};
  testutil::HookGuard alloc_segment_hook =
      hooks->allocate_segment_instead.Set([&](size_t bytes) -> absl::StatusOr<void*> {
        if (calls++ == 0) return absl::ResourceExhaustedError("injected");
        return hooks->inner().allocate_segment(bytes);
      });
  // The first attempt fails; the staged retry asks again, and the second one fits
  // within the limit only if the first one's intent was given back.
  void* p = t->allocate(kMiB);
  EXPECT_GE(calls.load(), 2);
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  t->free(p);
  void* q1 = t->allocate(kMiB);
  void* q2 = t->allocate(kMiB);
  void* q3 = t->allocate(kMiB);  // two segments of 2 MiB: the limit's worth
  EXPECT_EQ(t->stats().segment[kAggregatePool].current, 2);
  for (void* x : {q1, q2, q3}) t->free(x);
  EXPECT_TRUE(t->validate().ok()) << t->validate();
}

// Holds the first call of a hooked driver function until the test opens the latch;
// later calls pass straight through. `entered` opens when the first call has started.
struct FirstCallGate {
  std::latch entered{1};
  std::latch release{1};
  std::atomic<int> calls{0};
  // Call at the start of the hook.
  void Pass() {
    if (calls++ == 0) {
      entered.count_down();
      release.wait();
    }
  }
};

bool Disjoint(const void* a, size_t na, const void* b, size_t nb) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x + na <= y || y + nb <= x;
}

constexpr const char* kExpandable =
    "sim_capacity:1GiB,expandable_segments:true,thread_cache:false,"
    "expandable_recycle_threshold:none";

// A map (cuMemCreate + cuMemMap + cuMemSetAccess) runs with the lock released: another
// thread allocates and frees meanwhile, even from the free block the map is to join;
// the map then links with what is left of it and maps the rest.
TEST(UnlockedDriverTest, AnExpandableMapRunsWithTheLockReleased) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(kExpandable, &hooks);
  t->free(t->allocate(4 * kMiB));           // a free 4 MiB run (large pool)
  void* small = t->allocate(256 * kKiB);   // a small-pool run with room for more
  const int64_t reserved = t->stats().reserved_bytes[kAggregatePool].current;
  ASSERT_EQ(reserved, 6 * static_cast<int64_t>(kMiB));

  FirstCallGate gate;
  testutil::HookGuard map_hook = hooks->map_instead.Set([&](void* p, size_t n) {
    gate.Pass();
    return hooks->inner().map(p, n);
  });
  // A: 64 MiB extends the free 4 MiB block by 60 MiB; its map is held.
  std::future<void*> a =
      std::async(std::launch::async, [&] { return t->allocate(64 * kMiB); });
  gate.entered.wait();
  // C: takes 2 MiB of the block A counts on, and a small cache hit.
  std::future<void*> c = std::async(std::launch::async, [&] {
    void* q = t->allocate(2 * kMiB);
    t->free(t->allocate(256 * kKiB));
    return q;
  });
  const bool c_done = c.wait_for(kBound) == std::future_status::ready;
  EXPECT_TRUE(c_done) << "an allocation waited for another thread's map";
  if (c_done) {  // else the lock is held: validate() would wait for the map
    EXPECT_TRUE(t->validate().ok()) << t->validate();  // consistent while in flight
    // Not reserved until linked (the in-flight bytes count against the limit).
    EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current, reserved);
  }
  gate.release.count_down();
  void* pa = a.get();
  void* q = c.get();
  EXPECT_TRUE(Disjoint(pa, 64 * kMiB, q, 2 * kMiB));
  // 60 MiB joined 2 MiB left of the block: 2 MiB more were mapped for the request.
  EXPECT_EQ(gate.calls.load(), 2);
  EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current,
            reserved + static_cast<int64_t>(62 * kMiB));
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  for (void* x : {pa, q, small}) t->free(x);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  EXPECT_TRUE(t->validate().ok()) << t->validate();
}

// Two threads grow the same expandable reservation (one stream, one pool) at once: the
// second map does not wait for the first and does not take its range; the two runs
// merge when both are linked.
TEST(UnlockedDriverTest, TwoThreadsGrowOneExpandableSegmentConcurrently) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(kExpandable, &hooks);
  FirstCallGate gate;
  testutil::HookGuard map_hook = hooks->map_instead.Set([&](void* p, size_t n) {
    gate.Pass();
    return hooks->inner().map(p, n);
  });
  std::future<void*> a =
      std::async(std::launch::async, [&] { return t->allocate(16 * kMiB); });
  gate.entered.wait();
  std::future<void*> b =
      std::async(std::launch::async, [&] { return t->allocate(16 * kMiB); });
  const bool b_done = b.wait_for(kBound) == std::future_status::ready;
  EXPECT_TRUE(b_done) << "a map waited for another thread's map";
  if (b_done) {
    EXPECT_TRUE(t->validate().ok()) << t->validate();
    EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current,
              static_cast<int64_t>(16 * kMiB));
  }
  gate.release.count_down();
  void* pa = a.get();
  void* pb = b.get();
  EXPECT_TRUE(Disjoint(pa, 16 * kMiB, pb, 16 * kMiB));
  EXPECT_EQ(gate.calls.load(), 2);
  EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current,
            static_cast<int64_t>(32 * kMiB));
  EXPECT_EQ(t->stats().segment[kAggregatePool].current, 1) << "adjacent runs not merged";
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  t->free(pa);
  t->free(pb);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

// A recycle's unmap runs with the lock released: the granules being unmapped are
// neither a free block nor a gap meanwhile, so another thread's allocation maps
// elsewhere, and reserved_bytes no longer counts them.
TEST(UnlockedDriverTest, ARecycleUnmapRunsWithTheLockReleased) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(kExpandable, &hooks);
  void* keep = t->allocate(2 * kMiB);
  void* big = t->allocate(16 * kMiB);  // one run: [keep][big]
  void* small = t->allocate(256 * kKiB);
  t->free(big);
  FirstCallGate gate;
  testutil::HookGuard unmap_hook = hooks->unmap_instead.Set([&](void* p, size_t n) {
    gate.Pass();
    hooks->inner().unmap(p, n);
  });
  std::future<void> a = std::async(std::launch::async, [&] { t->trim(0); });
  gate.entered.wait();  // unmapping big's 16 MiB (the run stays: keep is in use)
  std::future<void*> c = std::async(std::launch::async, [&] {
    t->free(t->allocate(256 * kKiB));
    return t->allocate(4 * kMiB);  // a map: not into the range being unmapped
  });
  const bool c_done = c.wait_for(kBound) == std::future_status::ready;
  EXPECT_TRUE(c_done) << "an allocation waited for another thread's unmap";
  if (c_done) {
    EXPECT_TRUE(t->validate().ok()) << t->validate();
    EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current,
              static_cast<int64_t>(8 * kMiB));  // keep, small's run, the new 4 MiB
  }
  gate.release.count_down();
  a.get();
  void* q = c.get();
  EXPECT_TRUE(Disjoint(q, 4 * kMiB, static_cast<char*>(keep) + 2 * kMiB, 16 * kMiB))
      << "mapped into granules being unmapped";
  EXPECT_EQ(gate.calls.load(), 1);
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  for (void* x : {keep, small, q}) t->free(x);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

// A released segment's free (cudaFree) runs with the lock released; an allocation that
// needs the memory on its way back waits for it in the staged retry's last stage
// instead of failing.
TEST(UnlockedDriverTest, AReleaseRunsWithTheLockReleasedAndTheRetryWaitsForIt) {
  testutil::HookedBackend* hooks = nullptr;
  // A 5 MiB limit: two 2 MiB small-pool segments fit, three do not.
  SimAllocator t = MakeHookedSimAllocator(
      "sim_capacity:100MiB,expandable_segments:false,thread_cache:false,"
      "per_process_memory_fraction:0.05",
      &hooks);
  void* p0 = t->allocate(kMiB);
  void* p1 = t->allocate(768 * kKiB);  // S1: 1.75 MiB used
  t->free(t->allocate(768 * kKiB));    // S2: unused
  ASSERT_EQ(t->stats().segment[kAggregatePool].current, 2);
  FirstCallGate gate;
  testutil::HookGuard free_segment_hook = hooks->free_segment_instead.Set([&](void* p, size_t n) {
    gate.Pass();
    hooks->inner().free_segment(p, n);
  });
  std::future<void> a = std::async(std::launch::async, [&] { t->empty_cache(); });
  gate.entered.wait();  // S2's free is held
  std::future<void> c = std::async(std::launch::async, [&] {
    t->free(t->allocate(128 * kKiB));  // a hit in S1
  });
  const bool c_done = c.wait_for(kBound) == std::future_status::ready;
  EXPECT_TRUE(c_done) << "a cache hit waited for another thread's segment free";
  if (c_done) {
    EXPECT_TRUE(t->validate().ok()) << t->validate();
    EXPECT_EQ(t->stats().segment[kAggregatePool].current, 1);
  }
  // B needs a second segment: 2 MiB reserved + 2 MiB on their way back + 2 MiB are over
  // the limit, so it gets to the retry's last stage and waits there.
  const int64_t retries = t->stats().num_alloc_retries;
  std::future<void*> b =
      std::async(std::launch::async, [&] { return t->allocate(768 * kKiB); });
  if (c_done) {
    const auto deadline = std::chrono::steady_clock::now() + kBound;
    while (t->stats().num_alloc_retries == retries &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();  // polls what B did; orders nothing by time
    }
    EXPECT_EQ(t->stats().num_alloc_retries, retries + 1);
  }
  gate.release.count_down();
  a.get();
  void* pb = nullptr;
  EXPECT_NO_THROW(pb = b.get()) << "memory on its way back made an allocation fail";
  EXPECT_EQ(gate.calls.load(), 1);
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  for (void* x : {p0, p1, pb}) t->free(x);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

// A driver error in the middle of a batch of unmaps: what was unmapped stays unmapped,
// the rest is cached and counted again, the pool is poisoned and consistent.
TEST(UnlockedDriverTest, AnUnmapErrorInTheMiddleOfARecyclePutsTheRestBack) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(kExpandable, &hooks);
  void* keep1 = t->allocate(2 * kMiB);
  void* big1 = t->allocate(8 * kMiB);
  void* keep2 = t->allocate(2 * kMiB);
  void* big2 = t->allocate(8 * kMiB);  // one run: [keep1][big1][keep2][big2]
  ASSERT_TRUE(keep1 != nullptr && keep2 != nullptr);  // in use: the run stays
  t->free(big1);
  t->free(big2);
  const DeviceStats before = t->stats();
  std::atomic<int> calls{0};
  testutil::HookGuard unmap_hook = hooks->unmap_instead.Set([&](void* p, size_t n) {
    if (calls++ == 1) throw DriverError("test: cuMemUnmap failed");
    hooks->inner().unmap(p, n);
  });
  EXPECT_THROW(t->trim(0), DriverError);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_TRUE(t->poisoned());
  const DeviceStats after = t->stats();
  EXPECT_EQ(after.reserved_bytes[kAggregatePool].current,
            before.reserved_bytes[kAggregatePool].current - static_cast<int64_t>(8 * kMiB));
  EXPECT_EQ(after.num_device_free, before.num_device_free + 1);
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  // keep1 and keep2 go with the allocator (a poisoned pool gives nothing back).
}

// A proactive recycle on a busy stream is decided without waiting (an event); the poll
// that sees the event complete unmaps with the lock released, so another thread
// allocates and frees meanwhile.
TEST(UnlockedDriverTest, ADeferredRecycleUnmapsOnThePollWithTheLockReleased) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(
      "sim_capacity:1GiB,expandable_segments:true,thread_cache:false,"
      "expandable_recycle_threshold:0",
      &hooks);
  const Stream s = testutil::NewStream(*t);
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(t->allocate(16 * kMiB, s));
  void* big = nullptr;
  {
    testutil::StreamBlocker busy(t->backend(), s);
    t->free(blocks[0]);
    t->free(blocks[2]);
    big = t->allocate(32 * kMiB, s);  // decides to recycle the two holes, later
    EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current,
              static_cast<int64_t>(96 * kMiB))
        << "the stream is busy: nothing may be unmapped yet";
  }
  t->backend().synchronize_stream(s);  // the stream passed the decision's event
  FirstCallGate gate;
  testutil::HookGuard unmap_hook = hooks->unmap_instead.Set([&](void* p, size_t n) {
    gate.Pass();
    hooks->inner().unmap(p, n);
  });
  std::future<void> a = std::async(std::launch::async, [&] { t->process_events(); });
  gate.entered.wait();
  std::future<void> c = std::async(std::launch::async, [&] { t->free(t->allocate(kMiB)); });
  const bool c_done = c.wait_for(kBound) == std::future_status::ready;
  EXPECT_TRUE(c_done) << "an allocation waited for a deferred recycle's unmap";
  if (c_done) {
    EXPECT_TRUE(t->validate().ok()) << t->validate();
  }
  gate.release.count_down();
  a.get();
  EXPECT_EQ(gate.calls.load(), 2);  // both holes
  EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current,
            static_cast<int64_t>((64 + 2) * kMiB));  // blocks 1, 3, big; 1 MiB's run
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  for (void* x : {blocks[1], blocks[3], big}) t->free(x);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

// --- the waits before memory goes back (allocator/release_fence.h) --------------------
//
// A release waits for the streams of the memory it gives back, and stage 2 of the
// staged retry and empty_cache wait for every cross-stream free. Each such wait records
// an event of the pool's own on the stream under the lock and waits for it with the
// lock released, so the gate below (on the first wait the backend sees, of a stream or
// of an event) holds no one else: another thread allocates and frees on the device
// meanwhile. (Waited for under the lock, the other thread blocks on it and the test
// fails after kBound.)

// The first stream or event wait the backend sees is held until the test opens it, for
// as long as the guard lives (declare it after *gate).
testutil::HookGuard GateFirstWait(testutil::HookedBackend* hooks, FirstCallGate* gate) {
  testutil::HookGuard guard =
      hooks->before_synchronize_stream.Set([gate](Stream) { gate->Pass(); });
  guard += hooks->before_synchronize_event.Set([gate](Event) { gate->Pass(); });
  return guard;
}

struct WaitCase {
  const char* name;
  const char* conf;
  // Leaves what `act` gives back (after its wait) cached; returns what stays in use.
  std::function<std::vector<void*>(CachingAllocator&, Stream)> setup;
  std::function<void(CachingAllocator&)> act;
};

class UnlockedDriverWaitTest : public ::testing::TestWithParam<WaitCase> {};

TEST_P(UnlockedDriverWaitTest, AnotherThreadAllocatesAndFreesWhileAReleaseWaits) {
  const WaitCase& wc = GetParam();
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(wc.conf, &hooks);
  const Stream s = testutil::NewStream(*t);
  std::vector<void*> live = wc.setup(*t, s);
  // B's memory: a cached small block on the default stream (a hit, no driver call).
  void* other = t->allocate(kMiB);
  t->free(t->allocate(256 * kKiB));
  FirstCallGate gate;
  testutil::HookGuard gated = GateFirstWait(hooks, &gate);
  std::future<void> a = std::async(std::launch::async, [&] { wc.act(*t); });
  gate.entered.wait();
  std::future<void> b = std::async(std::launch::async, [&] {
    void* q = t->allocate(256 * kKiB);
    t->free(q);
  });
  const bool b_done = b.wait_for(kBound) == std::future_status::ready;
  EXPECT_TRUE(b_done) << wc.name << ": an allocation waited for another thread's stream "
                      << "wait before a release";
  if (b_done) {
    EXPECT_TRUE(t->validate().ok()) << t->validate();  // consistent while it waits
  }
  gate.release.count_down();
  a.get();
  b.wait();
  hooks->before_synchronize_stream = nullptr;
  hooks->before_synchronize_event = nullptr;
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  EXPECT_FALSE(t->poisoned());
  for (void* x : live) t->free(x);
  t->free(other);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

std::vector<void*> CachedSegmentOn(CachingAllocator& a, Stream s) {
  a.free(a.allocate(4 * kMiB, s));  // one unused segment (or run) of s
  return {};
}

INSTANTIATE_TEST_SUITE_P(
    Waits, UnlockedDriverWaitTest,
    ::testing::Values(
        WaitCase{"ReleaseOfARegularSegment",
                 "sim_capacity:1GiB,expandable_segments:false,thread_cache:false",
                 CachedSegmentOn, [](CachingAllocator& a) { a.empty_cache(); }},
        WaitCase{"ReleaseOfAnExpandableRun", kExpandable, CachedSegmentOn,
                 [](CachingAllocator& a) { a.empty_cache(); }},
        // A pressure recycle (trim): the free granules of a run still in use.
        WaitCase{"RecycleUnderPressure", kExpandable,
                 [](CachingAllocator& a, Stream s) -> std::vector<void*> {
                   void* keep = a.allocate(2 * kMiB, s);
                   a.free(a.allocate(16 * kMiB, s));  // one run: [keep][free 16 MiB]
                   return {keep};
                 },
                 [](CachingAllocator& a) { a.trim(0); }},
        // empty_cache waits for a cross-stream free (record_stream) before it polls.
        WaitCase{"CrossStreamFrees",
                 "sim_capacity:1GiB,expandable_segments:false,thread_cache:false",
                 [](CachingAllocator& a, Stream s) -> std::vector<void*> {
                   void* p = a.allocate(4 * kMiB);
                   a.record_stream(p, s);
                   a.free(p);  // pending on an event on s
                   return {};
                 },
                 [](CachingAllocator& a) { a.empty_cache(); }}),
    [](const ::testing::TestParamInfo<WaitCase>& info) { return info.param.name; });

// The waits still come before the memory goes: the release waits for work queued on
// the stream before the free (the event recorded under the lock completes after it),
// even when another thread frees and allocates on that stream meanwhile.
TEST(UnlockedDriverTest, AReleaseWaitsForWorkQueuedBeforeItsEvent) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(
      "sim_capacity:1GiB,expandable_segments:false,thread_cache:false", &hooks);
  const Stream s = testutil::NewStream(*t);
  char* p = static_cast<char*>(t->allocate(8 * kMiB, s));
  std::atomic<bool> wrote{false};
  testutil::StreamBlocker work(t->backend(), s);
  ASSERT_TRUE(t->backend()
                  .launch_host_fn(s, [p, &wrote] {
                    std::memset(p, 0x3c, 8 * kMiB);  // the "kernel" still using p
                    wrote = true;
                  })
                  .ok());
  t->free(p);
  std::atomic<int> waits{0};
  testutil::HookGuard sync_event_hook = hooks->before_synchronize_event.Set([&](Event) {
    ++waits;
    work.Release();  // the stream runs its work while the release waits
  });
  // (A stream wait would be the old way: it must not hang the test.)
  testutil::HookGuard sync_stream_hook =
      hooks->before_synchronize_stream.Set([&](Stream) { work.Release(); });
  t->empty_cache();
  EXPECT_TRUE(wrote.load()) << "the segment was freed before its stream's work ran";
  EXPECT_EQ(waits.load(), 1);
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  hooks->before_synchronize_event = nullptr;
  hooks->before_synchronize_stream = nullptr;
  EXPECT_TRUE(t->validate().ok()) << t->validate();
}

// A driver error in the middle of a release's waits (the second stream's event): no
// segment was given back yet, so every one is cached and counted again, the pool is
// poisoned and consistent, and the error propagates.
TEST(UnlockedDriverTest, AWaitErrorInTheMiddleOfAReleasePutsEverySegmentBack) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(
      "sim_capacity:1GiB,expandable_segments:false,thread_cache:false", &hooks);
  const Stream s1 = testutil::NewStream(*t);
  const Stream s2 = testutil::NewStream(*t);
  t->free(t->allocate(4 * kMiB, s1));
  t->free(t->allocate(4 * kMiB, s2));  // two unused segments on two streams
  const DeviceStats before = t->stats();
  std::atomic<int> waits{0};
  testutil::HookGuard sync_event_hook = hooks->before_synchronize_event.Set([&](Event) {
    if (waits++ == 1) throw DriverError("test: cudaEventSynchronize failed");
  });
  EXPECT_THROW(t->empty_cache(), DriverError);
  EXPECT_EQ(waits.load(), 2);
  EXPECT_TRUE(t->poisoned());
  const DeviceStats after = t->stats();
  EXPECT_EQ(after.reserved_bytes[kAggregatePool].current,
            before.reserved_bytes[kAggregatePool].current);
  EXPECT_EQ(after.segment[kAggregatePool].current, 2);
  EXPECT_EQ(after.num_device_free, before.num_device_free);
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  hooks->before_synchronize_event = nullptr;
}

// A whole run's unmap fails while another thread mapped right next to it (the range
// being unmapped is no gap, so that map starts a run of its own beside it). The run
// not given back joins that neighbour when it is put back: runs of a reservation are
// never adjacent, and validate() holds on the poisoned pool.
TEST(UnlockedDriverTest, AFailedRunUnmapJoinsARunMappedNextToItMeanwhile) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(kExpandable, &hooks);
  t->free(t->allocate(4 * kMiB));  // an unused 4 MiB run at the reservation's base
  ASSERT_EQ(t->stats().segment[kAggregatePool].current, 1);
  std::atomic<int> calls{0};
  void* other = nullptr;
  testutil::HookGuard unmap_hook = hooks->unmap_instead.Set([&](void* p, size_t n) {
    if (calls++ == 0) {
      // The lock is released: another thread maps 4 MiB, right above the run.
      other = std::async(std::launch::async, [&] { return t->allocate(4 * kMiB); }).get();
      throw DriverError("test: cuMemUnmap failed");
    }
    hooks->inner().unmap(p, n);
  });
  EXPECT_THROW(t->empty_cache(), DriverError);
  EXPECT_EQ(calls.load(), 1);
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(t->poisoned());
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  EXPECT_EQ(t->stats().segment[kAggregatePool].current, 1) << "adjacent runs not joined";
  EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current,
            static_cast<int64_t>(8 * kMiB));
  hooks->unmap_instead = nullptr;
  // `other` goes with the allocator (a poisoned pool gives nothing back).
}

// The memory limit's recycle releases the lock (its unmap) before the proactive
// recycle runs, and another thread frees the block just below the placement
// meanwhile: the proactive recycle must keep that block (the map extends it), judged
// from the blocks as they are then, not as they were before the lock was released.
TEST(UnlockedDriverTest, AProactiveRecycleKeepsTheBlockTheMapExtendsAfterTheLockWasReleased) {
  testutil::HookedBackend* hooks = nullptr;
  // A 24 MiB limit; every map past the stream's need recycles (threshold 0).
  SimAllocator t = MakeHookedSimAllocator(
      "sim_capacity:1GiB,expandable_segments:true,thread_cache:false,"
      "expandable_recycle_threshold:0,per_process_memory_fraction:0.0234375",
      &hooks);
  void* a = t->allocate(8 * kMiB);
  void* h = t->allocate(8 * kMiB);
  void* x = t->allocate(2 * kMiB);  // one run: [a 8][h 8][x 2], 18 MiB in use at peak
  t->free(h);
  ASSERT_EQ(t->stats().reserved_bytes[kAggregatePool].current,
            static_cast<int64_t>(18 * kMiB));
  std::atomic<int> calls{0};
  testutil::HookGuard unmap_hook = hooks->unmap_instead.Set([&](void* p, size_t n) {
    if (calls++ == 0) {
      // The limit's recycle (6 MiB of h) has the lock released: x, just below where
      // the request maps, is freed.
      std::async(std::launch::async, [&] { t->free(x); }).get();
    }
    hooks->inner().unmap(p, n);
  });
  // 12 MiB: mapped above x; 18 + 12 > 24 recycles 6 MiB of h first, then the stream's
  // cap (in use 8 + 12 = 20) asks 4 MiB more of the proactive recycle: the 2 MiB left
  // of h, but not x, which the new 12 MiB joins.
  void* q = t->allocate(12 * kMiB);
  EXPECT_EQ(calls.load(), 2) << "the proactive recycle unmapped the block the map extends";
  EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current,
            static_cast<int64_t>(22 * kMiB));
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  hooks->unmap_instead = nullptr;
  t->free(q);
  t->free(a);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

}  // namespace
}  // namespace devmem

namespace devmem {
namespace {

// empty_cache waits for a cross-stream free with the lock released, and the block's
// own stream is released (release_stream) meanwhile: the block now also waits for that
// stream's retirement event, recorded after the wait's fence. The poll after the wait
// must wait for that event too (as it would had release_stream come first), or the
// block stays pending and empty_cache gives nothing back (as no order of the two calls
// would). The stream's work is held until the retirement's event is waited for.
TEST(UnlockedDriverTest, AStreamReleasedWhileEmptyCacheWaitsHasItsMemoryGivenBack) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(
      "sim_capacity:1GiB,expandable_segments:false,thread_cache:false", &hooks);
  const Stream x = testutil::NewStream(*t);
  const Stream y = testutil::NewStream(*t);
  void* p = t->allocate(4 * kMiB, x);
  t->record_stream(p, y);
  t->free(p);  // pending on an event on y
  testutil::StreamBlocker work(t->backend(), x);  // x's retirement event stays open
  std::atomic<int> waits{0};
  testutil::HookGuard sync_event_hook = hooks->before_synchronize_event.Set([&](Event) {
    if (waits++ == 0) {
      // The fence on y, the lock released: the program releases x.
      std::async(std::launch::async, [&] { t->release_stream(x); }).get();
    } else {
      work.Release();  // x's work runs once something waits for it
    }
  });
  t->empty_cache();
  EXPECT_GE(waits.load(), 2) << "the retirement's event was not waited for";
  EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current, 0)
      << "the block stayed pending on x's retirement";
  work.Release();
  hooks->before_synchronize_event = nullptr;
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

}  // namespace
}  // namespace devmem

// --- private pools' releases (release_pool, graph pools) -------------------------------
namespace devmem {
namespace {

constexpr PoolId kGraphPool{9, 1};
constexpr const char* kRegularNoCache =
    "sim_capacity:1GiB,expandable_segments:false,thread_cache:false";

// Allocations of `sizes` into kGraphPool (12 MiB: a regular segment each), the
// allocation to the pool ended; the blocks are returned, not freed.
std::vector<void*> AllocateToGraphPool(CachingAllocator& a, const std::vector<size_t>& sizes) {
  a.begin_allocate_to_pool(kGraphPool, [](Stream) { return true; });
  std::vector<void*> ptrs;
  for (const size_t n : sizes) ptrs.push_back(a.allocate(n));
  a.end_allocate_to_pool(kGraphPool);
  return ptrs;
}

// A free fails in the middle of a private pool's release: the segment given back is
// gone, the other is the pool's again (in its list, its free set, its statistics), the
// pool is poisoned and consistent. (It was left out of the pool's list: validate()
// failed, and a later release could never find it.)
TEST(UnlockedDriverTest, APrivatePoolReleaseErrorPutsTheRestBackIntoThePool) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(kRegularNoCache, &hooks);
  for (void* p : AllocateToGraphPool(*t, {12 * kMiB, 12 * kMiB})) t->free(p);
  const DeviceStats before = t->stats();
  ASSERT_EQ(before.segment[kAggregatePool].current, 2);
  ASSERT_EQ(before.private_reserved_bytes, before.reserved_bytes[kAggregatePool].current);
  std::atomic<int> calls{0};
  int64_t freed = 0;  // the first call's (the hook runs on this thread only)
  testutil::HookGuard free_segment_hook = hooks->free_segment_instead.Set([&](void* p, size_t n) {
    if (calls++ == 1) throw DriverError("test: cudaFree failed");
    hooks->inner().free_segment(p, n);
    freed = static_cast<int64_t>(n);
  });
  EXPECT_THROW(t->release_pool(kGraphPool), DriverError);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_TRUE(t->poisoned());
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  const DeviceStats after = t->stats();
  EXPECT_EQ(after.private_pools, 1);
  ASSERT_GT(freed, 0);
  EXPECT_EQ(after.private_reserved_bytes, before.private_reserved_bytes - freed);
  EXPECT_EQ(after.reserved_bytes[kAggregatePool].current,
            before.reserved_bytes[kAggregatePool].current - freed);
  EXPECT_EQ(after.segment[kAggregatePool].current, 1);
  EXPECT_EQ(after.num_device_free, before.num_device_free + 1);
  // A poisoned pool refuses another release without reaching the driver.
  EXPECT_THROW(t->release_pool(kGraphPool), DriverError);
  EXPECT_EQ(calls.load(), 2);
  hooks->free_segment_instead = nullptr;
}

// A private pool's release frees with the lock released (its fence wait and its
// cudaFree): held in the driver, another thread allocates, misses and frees on the
// device, is refused a second release of the pool, frees the pool's last busy block
// and releases that segment in an empty_cache of its own; a capture cannot begin
// until the held free is done; the last release to finish forgets the pool.
TEST(UnlockedDriverTest, APrivatePoolReleaseRunsWithTheLockReleased) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(kRegularNoCache, &hooks);
  const std::vector<void*> graph = AllocateToGraphPool(*t, {12 * kMiB, 12 * kMiB});
  t->free(graph[0]);  // one unused segment; graph[1]'s stays busy
  void* other = t->allocate(kMiB);
  t->free(t->allocate(256 * kKiB));  // a cached small block: B's hit
  FirstCallGate gate;
  std::atomic<bool> held_free_done{false};
  testutil::HookGuard free_segment_hook = hooks->free_segment_instead.Set([&](void* p, size_t n) {
    const bool first = gate.calls == 0;
    gate.Pass();
    hooks->inner().free_segment(p, n);
    if (first) held_free_done = true;
  });
  std::future<void> a = std::async(std::launch::async, [&] { t->release_pool(kGraphPool); });
  gate.entered.wait();
  std::future<void> b = std::async(std::launch::async, [&] {
    t->free(t->allocate(256 * kKiB));  // a hit
    t->free(t->allocate(4 * kMiB));    // a miss: a new segment, allocated meanwhile
    EXPECT_THROW(t->release_pool(kGraphPool), InvalidArgumentError);
    t->free(graph[1]);  // into the pool's free set: its segment is unused now
    t->empty_cache();   // releases it (a free of its own), and the shared ones
  });
  const bool b_done = b.wait_for(kBound) == std::future_status::ready;
  EXPECT_TRUE(b_done) << "another thread waited for a private pool's release";
  if (b_done) {
    b.get();
    EXPECT_TRUE(t->validate().ok()) << t->validate();  // consistent while it frees
    const DeviceStats st = t->stats();
    EXPECT_EQ(st.private_pools, 1) << "the pool was forgotten while its release runs";
    EXPECT_EQ(st.private_reserved_bytes, 0);
  }
  // A capture beginning now waits until the held free is done.
  std::future<bool> capture = std::async(std::launch::async, [&] {
    t->begin_allocate_to_pool(PoolId{9, 2}, [](Stream) { return true; });
    return held_free_done.load();
  });
  gate.release.count_down();
  a.get();
  if (!b_done) b.get();
  EXPECT_TRUE(capture.get()) << "a capture began while a release's free was in flight";
  t->end_allocate_to_pool(PoolId{9, 2});
  t->release_pool(PoolId{9, 2});
  EXPECT_EQ(gate.calls.load(), 3);  // the two graph segments, B's 4 MiB miss
  const DeviceStats st = t->stats();
  EXPECT_EQ(st.private_pools, 0) << "the pool left empty was not forgotten";
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  t->free(other);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  hooks->free_segment_instead = nullptr;
}

// The pin: while a release's free is held, another thread's empty_cache finds the pool
// with an empty list (its one segment is on its way back) and must not forget it, for
// the free then fails and the segment goes back into the pool.
TEST(UnlockedDriverTest, APrivatePoolStaysKnownWhileItsReleaseMayPutSegmentsBack) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(kRegularNoCache, &hooks);
  for (void* p : AllocateToGraphPool(*t, {12 * kMiB})) t->free(p);
  const DeviceStats before = t->stats();
  FirstCallGate gate;
  testutil::HookGuard free_segment_hook = hooks->free_segment_instead.Set([&](void* p, size_t n) {
    gate.Pass();
    if (gate.calls == 1) throw DriverError("test: cudaFree failed");
    hooks->inner().free_segment(p, n);
  });
  std::future<void> a = std::async(std::launch::async, [&] { t->release_pool(kGraphPool); });
  gate.entered.wait();
  std::future<void> b = std::async(std::launch::async, [&] {
    t->empty_cache();
    EXPECT_THROW(t->release_pool(kGraphPool), InvalidArgumentError);
  });
  const bool b_done = b.wait_for(kBound) == std::future_status::ready;
  EXPECT_TRUE(b_done) << "empty_cache waited for a private pool's release";
  if (b_done) {
    EXPECT_EQ(t->stats().private_pools, 1) << "the pool was forgotten while pinned";
  }
  gate.release.count_down();
  EXPECT_THROW(a.get(), DriverError);
  b.get();
  EXPECT_TRUE(t->poisoned());
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  const DeviceStats after = t->stats();
  EXPECT_EQ(after.private_pools, 1);
  EXPECT_EQ(after.private_reserved_bytes, before.private_reserved_bytes);
  EXPECT_EQ(after.segment[kAggregatePool].current, before.segment[kAggregatePool].current);
  hooks->free_segment_instead = nullptr;
}

// An allocation routed to a private pool is in the driver (its grow runs with the lock
// released) when another thread ends the capture and releases the pool. The end waits
// for the grow, so its segment joins a pool still known, and the pool goes back once
// that block is freed. (Before, the end and the release ran meanwhile and forgot the
// empty pool; the grow then linked its segment into the freed PrivatePool: a use after
// free, and validate() found a segment in no pool.)
TEST(UnlockedDriverTest, ACaptureEndWaitsForAGrowIntoItsPool) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(kRegularNoCache, &hooks);
  FirstCallGate gate;
  testutil::HookGuard alloc_segment_hook = hooks->allocate_segment_instead.Set([&](size_t n) {
    gate.Pass();
    return hooks->inner().allocate_segment_during_capture(n);
  });
  t->begin_allocate_to_pool(kGraphPool, [](Stream) { return true; });
  std::future<void*> a = std::async(std::launch::async, [&] { return t->allocate(12 * kMiB); });
  gate.entered.wait();
  std::future<void> b = std::async(std::launch::async, [&] {
    t->end_allocate_to_pool(kGraphPool);
    t->release_pool(kGraphPool);
  });
  // Unfixed, B finishes while A is held; fixed, its end waits for A. Either way A goes
  // on after this bounded wait, which only gives the unfixed code its chance.
  const bool b_done_early = b.wait_for(std::chrono::milliseconds(200)) == std::future_status::ready;
  gate.release.count_down();
  void* p = a.get();
  b.get();
  EXPECT_FALSE(b_done_early) << "the capture ended while an allocation into it was growing";
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  DeviceStats st = t->stats();
  EXPECT_EQ(st.private_pools, 1) << "the released pool was forgotten while it grew";
  EXPECT_EQ(st.private_reserved_bytes, static_cast<int64_t>(12 * kMiB));
  t->free(p);
  t->empty_cache();
  st = t->stats();
  EXPECT_EQ(st.private_pools, 0);
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  hooks->allocate_segment_instead = nullptr;
}

// Stage 2 of the staged retry releases the lock before its grow (here: the fence wait
// for a cross-stream free), and another thread's trim starts a give-back then. The grow
// must wait for that memory rather than report an OOM while it is on its way back.
// Ordering without sleeps: the pending block becomes free only in the retry's poll
// after its fence wait, and the retry holds the lock from there to its grow; so once
// stats() shows no pending bytes, the retry has released the lock after that poll:
// waiting for give-backs (fixed) or having reported the OOM (the defect).
TEST(UnlockedDriverTest, TheRetryWaitsForAGiveBackBegunDuringItsEventWait) {
  testutil::HookedBackend* hooks = nullptr;
  // A 5 MiB limit: two 2 MiB small-pool segments fit, three do not.
  SimAllocator t = MakeHookedSimAllocator(
      "sim_capacity:100MiB,expandable_segments:false,thread_cache:false,"
      "per_process_memory_fraction:0.05",
      &hooks);
  const Stream y = testutil::NewStream(*t);   // the cross-stream use
  const Stream sa = testutil::NewStream(*t);  // A's: no cached block serves it
  void* p0 = t->allocate(kMiB);
  void* p1 = t->allocate(768 * kKiB);  // S1: [p0][p1][256 KiB free]
  void* q1 = t->allocate(kMiB);
  void* q2 = t->allocate(768 * kKiB);  // S2: [q1][q2][256 KiB free]
  ASSERT_EQ(t->stats().segment[kAggregatePool].current, 2);
  testutil::StreamBlocker busy(t->backend(), y);
  t->record_stream(p1, y);
  t->free(p1);  // pending on an event on y, which stays open until the retry waits
  FirstCallGate gate;  // C's free of S2
  testutil::HookGuard free_segment_hook = hooks->free_segment_instead.Set([&](void* p, size_t n) {
    gate.Pass();
    hooks->inner().free_segment(p, n);
  });
  std::future<void> c;
  std::atomic<int> waits{0};
  testutil::HookGuard sync_event_hook = hooks->before_synchronize_event.Set([&](Event) {
    if (waits++ != 0) return;  // C's own fence (S2's stream) passes
    // A's fence for the cross-stream free, the lock released: C frees S2's blocks and
    // trims; S2's free is held in the driver.
    c = std::async(std::launch::async, [&] {
      t->free(q1);
      t->free(q2);
      t->trim(0);
    });
    gate.entered.wait();
    busy.Release();  // A's fence completes
  });
  std::future<void*> a = std::async(std::launch::async, [&] { return t->allocate(768 * kKiB, sa); });
  const auto deadline = std::chrono::steady_clock::now() + kBound;
  while (t->stats().pending_bytes[kAggregatePool].current != 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();  // polls what A did; orders nothing by time
  }
  EXPECT_EQ(t->stats().pending_bytes[kAggregatePool].current, 0);
  gate.release.count_down();
  void* pa = nullptr;
  EXPECT_NO_THROW(pa = a.get()) << "memory on its way back made an allocation fail";
  if (c.valid()) c.get();
  EXPECT_EQ(gate.calls.load(), 1);
  hooks->before_synchronize_event = nullptr;
  hooks->free_segment_instead = nullptr;
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  t->free(p0);
  if (pa != nullptr) t->free(pa);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

// Stage 2's wait for give-backs is for those begun before it, not until none is in
// flight: a steady stream of other threads' give-backs, each begun before the last one
// ended, must not hold a waiter off. DriverInFlight alone, ordered by its lock: the
// waiter holds it from before `waiting` until its wait releases it, so the main thread
// takes it only once the waiter waits.
TEST(UnlockedDriverTest, AGiveBackWaitEndsWithTheGiveBacksBegunBeforeIt) {
  Mutex mu;
  internal::DriverInFlight f;
  internal::DriverInFlight::Ticket ticket = 0;
  {
    MutexLock lock(&mu);
    ticket = f.begin_give_back(100);  // begun before the waiter
  }
  std::latch waiting{1};
  std::future<void> waiter = std::async(std::launch::async, [&] {
    MutexLock lock(&mu);
    waiting.count_down();
    f.wait_for_give_backs(&mu);
  });
  waiting.wait();
  // Each round begins a give-back before it ends the previous one: one is always in
  // flight. The waiter must be done once the first one (begun before it) ended.
  constexpr int kRounds = 8;
  bool done_while_others_in_flight = false;
  for (int i = 0; i < kRounds; ++i) {
    MutexLock lock(&mu);
    const internal::DriverInFlight::Ticket next = f.begin_give_back(100);
    f.end_give_back(100, ticket);
    ticket = next;
    ASSERT_TRUE(f.validate().ok()) << f.validate();
    if (i == 0) {
      // The waiter needs the lock to return: wait for it without holding it.
      internal::ScopedUnlock unlocked(&mu);
      done_while_others_in_flight = waiter.wait_for(kBound) == std::future_status::ready;
    }
  }
  EXPECT_TRUE(done_while_others_in_flight)
      << "give-backs begun after the waiter held it off";
  {
    MutexLock lock(&mu);
    EXPECT_EQ(f.give_back_bytes(), 100u);
    f.end_give_back(100, ticket);
    EXPECT_EQ(f.give_back_bytes(), 0u);
    EXPECT_TRUE(f.validate().ok()) << f.validate();
  }
  waiter.get();
}

// The same through the allocator: B's allocation waits in stage 2 for S2's free (A's
// empty_cache, held in the driver); meanwhile C frees S3's blocks and trims, and S3's
// free is held too. Once S2's free is done B's grow fits (S3's bytes in flight
// included), so B must succeed while S3's free is still held. With `fail_first_grow`
// the device refuses B's first grow (S3's memory still the device's), and S3's free
// ends during that driver call (`back_during_the_call`) or only after it returned:
// memory came back or is on its way, so B grows again instead of reporting an OOM.
struct GiveBackStreamCase {
  bool fail_first_grow;
  bool back_during_the_call;
};
class UnlockedDriverGiveBackStreamTest : public ::testing::TestWithParam<GiveBackStreamCase> {};

TEST_P(UnlockedDriverGiveBackStreamTest, LaterGiveBacksDoNotHoldOffTheRetry) {
  const GiveBackStreamCase param = GetParam();
  testutil::HookedBackend* hooks = nullptr;
  // A 7 MiB limit: three 2 MiB small-pool segments fit, four do not.
  SimAllocator t = MakeHookedSimAllocator(
      "sim_capacity:100MiB,expandable_segments:false,thread_cache:false,"
      "per_process_memory_fraction:0.07",
      &hooks);
  void* p0 = t->allocate(kMiB);
  void* p1 = t->allocate(768 * kKiB);  // S1: busy
  void* s2a = t->allocate(kMiB);
  void* s2b = t->allocate(768 * kKiB);  // S2: unused once freed
  void* q0 = t->allocate(kMiB);
  void* q1 = t->allocate(768 * kKiB);  // S3: busy until C frees it
  t->free(s2a);
  t->free(s2b);
  ASSERT_EQ(t->stats().segment[kAggregatePool].current, 3);
  FirstCallGate s2_free;
  FirstCallGate s3_free;
  std::atomic<int> frees{0};
  testutil::HookGuard free_segment_hook = hooks->free_segment_instead.Set([&](void* p, size_t n) {
    (frees++ == 0 ? s2_free : s3_free).Pass();
    hooks->inner().free_segment(p, n);
  });
  std::latch grow_entered{1};
  std::latch grow_release{1};
  std::atomic<int> grows{0};
  testutil::HookGuard alloc_segment_hook;
  if (param.fail_first_grow) {
    alloc_segment_hook =
        hooks->allocate_segment_instead.Set([&](size_t n) -> absl::StatusOr<void*> {
          if (grows++ == 0) {
            grow_entered.count_down();
            grow_release.wait();
            return absl::ResourceExhaustedError("injected: S3's memory is not back yet");
          }
          return hooks->inner().allocate_segment(n);
        });
  }
  std::future<void> a = std::async(std::launch::async, [&] { t->empty_cache(); });
  s2_free.entered.wait();  // S2's free is held: 4 MiB reserved, 2 MiB on their way back
  // B needs a fourth segment: it gets to stage 2 and waits there for S2's free.
  const int64_t retries = t->stats().num_alloc_retries;
  std::future<void*> b =
      std::async(std::launch::async, [&] { return t->allocate(768 * kKiB); });
  const auto deadline = std::chrono::steady_clock::now() + kBound;
  while (t->stats().num_alloc_retries == retries &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();  // polls what B did; orders nothing by time
  }
  // stats() took the lock, which B holds from counting the retry to its wait.
  ASSERT_EQ(t->stats().num_alloc_retries, retries + 1);
  std::future<void> c = std::async(std::launch::async, [&] {
    t->free(q0);
    t->free(q1);
    t->trim(0);  // S3 goes back, begun after B's wait began
  });
  s3_free.entered.wait();
  s2_free.release.count_down();
  a.get();
  if (param.fail_first_grow) {
    const bool entered = grow_entered.try_wait() ||
                         [&] {
                           // Bounded: the defect never gets here while S3's free is held.
                           const auto until = std::chrono::steady_clock::now() + kBound;
                           while (!grow_entered.try_wait()) {
                             if (std::chrono::steady_clock::now() > until) return false;
                             std::this_thread::yield();
                           }
                           return true;
                         }();
    EXPECT_TRUE(entered) << "a give-back begun after the retry's wait held it off";
    if (param.back_during_the_call) {
      s3_free.release.count_down();
      c.get();  // S3 is back (C took the lock B released for its driver call)
      grow_release.count_down();
    } else {
      grow_release.count_down();
      s3_free.release.count_down();
    }
  } else {
    EXPECT_EQ(b.wait_for(kBound), std::future_status::ready)
        << "a give-back begun after the retry's wait held it off";
    s3_free.release.count_down();
  }
  void* pb = nullptr;
  EXPECT_NO_THROW(pb = b.get()) << "memory on its way back made an allocation fail";
  if (c.valid()) c.get();
  hooks->free_segment_instead = nullptr;
  hooks->allocate_segment_instead = nullptr;
  EXPECT_EQ(grows.load(), param.fail_first_grow ? 2 : 0);
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  for (void* x : {p0, p1, pb}) t->free(x);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, UnlockedDriverGiveBackStreamTest,
    ::testing::Values(GiveBackStreamCase{false, false}, GiveBackStreamCase{true, true},
                      GiveBackStreamCase{true, false}),
    [](const ::testing::TestParamInfo<GiveBackStreamCase>& info) {
      if (!info.param.fail_first_grow) return std::string("GrowFits");
      return std::string(info.param.back_during_the_call ? "BackDuringAFailedGrow"
                                                         : "InFlightAfterAFailedGrow");
    });

}  // namespace
}  // namespace devmem
