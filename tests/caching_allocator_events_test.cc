// tests/caching_allocator_events_test.cc: the events of cross-stream frees, counted
// through a HookedBackend around the sim:
//   * they come from the device's event pool (allocator/event_pool.h): a completed
//     event is recorded again rather than a new one created, at most the pool's
//     capacity is kept, and every event goes back to the backend by the end;
//   * the allocation path polls at most kAllocationEventPollBudget of them per call,
//     takes turns between streams, and still frees every block in the end
//     (allocator/event_queues.h); process_events() polls them all.
#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "allocator/event_pool.h"
#include "allocator/event_queues.h"
#include "tests/hooked_backend.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using internal::EventPool;
using internal::kAllocationEventPollBudget;
using testutil::HookedBackend;
using testutil::MakeHookedSimAllocator;
using testutil::NewStream;
using testutil::SimAllocator;
using testutil::StreamBlocker;

// What the allocator asked of the backend's events. The tests are single-threaded
// where they read these (the allocator calls the hooks under its lock).
struct EventCounts {
  int created = 0;     // record_event: a new event
  int rerecorded = 0;  // rerecord_event: a kept one reused
  int queried = 0;     // event_done
  int released = 0;    // release_event
};

// Counts the allocator's event calls into *counts until the guard dies: declare the
// guard before the allocator to count its destructor's releases too.
testutil::HookGuard CountEvents(HookedBackend* hooks, EventCounts* counts) {
  testutil::HookGuard guard =
      hooks->before_record_event.Set([counts](Stream) { ++counts->created; });
  guard += hooks->before_rerecord_event.Set([counts](Event, Stream) { ++counts->rerecorded; });
  guard += hooks->before_event_done.Set([counts](Event) { ++counts->queried; });
  guard += hooks->before_release_event.Set([counts](Event) { ++counts->released; });
  return guard;
}

int64_t Pending(const SimAllocator& t, StatPool pool = kAggregatePool) {
  return t->stats().pending_bytes[pool].current;
}

// A 4 KiB block used on `side` and freed, its event completed and processed: the block
// is free again and its event back in the pool.
void FreeUsedOn(SimAllocator& t, Stream side) {
  void* p = t->allocate(4096);
  t->record_stream(p, side);
  t->free(p);
  t->backend().synchronize_stream(side);
  t->process_events();
}

TEST(EventPoolTest, CrossStreamFreesReuseOneEventWhenEachCompletesBeforeTheNext) {
  EventCounts counts;  // outlives the allocator, whose destructor releases events
  constexpr int kFrees = 100;
  {
    testutil::HookGuard counting;  // set below; outlives the allocator
    HookedBackend* hooks = nullptr;
    SimAllocator t = MakeHookedSimAllocator("sim_capacity:256MiB", &hooks);
    counting = CountEvents(hooks, &counts);
    const Stream side = NewStream(*t);
    for (int i = 0; i < kFrees; ++i) {
      FreeUsedOn(t, side);  // the event completed: back to the pool
      ASSERT_EQ(Pending(t), 0);
    }
    // One event made, recorded again for every later free (not one made and destroyed
    // per free), and none released while the pool keeps it.
    EXPECT_EQ(counts.created, 1);
    EXPECT_EQ(counts.rerecorded, kFrees - 1);
    EXPECT_EQ(counts.released, 0);
    EXPECT_VALID(*t);
  }
  EXPECT_EQ(counts.released, counts.created) << "the pool's events went back on destruction";
}

TEST(EventPoolTest, KeepsAtMostItsCapacityOfCompletedEvents) {
  EventCounts counts;
  constexpr int kInFlight = static_cast<int>(EventPool::kDefaultCapacity) + 36;
  {
    testutil::HookGuard counting;  // set below; outlives the allocator
    HookedBackend* hooks = nullptr;
    SimAllocator t = MakeHookedSimAllocator("sim_capacity:256MiB", &hooks);
    counting = CountEvents(hooks, &counts);
    const Stream side = NewStream(*t);
    auto blocker = std::make_unique<StreamBlocker>(t->backend(), side);
    std::vector<void*> ptrs;
    for (int i = 0; i < kInFlight; ++i) ptrs.push_back(t->allocate(4096));
    for (void* p : ptrs) {
      t->record_stream(p, side);
      t->free(p);
    }
    EXPECT_EQ(counts.created, kInFlight);  // all in flight at once: each needs its own
    blocker->Release();
    t->backend().synchronize_stream(side);
    t->process_events();
    EXPECT_EQ(Pending(t), 0);
    EXPECT_EQ(counts.released, kInFlight - static_cast<int>(EventPool::kDefaultCapacity));
    // The next frees reuse kept events.
    void* p = t->allocate(4096);
    t->record_stream(p, side);
    t->free(p);
    EXPECT_EQ(counts.created, kInFlight);
    EXPECT_EQ(counts.rerecorded, 1);
    t->empty_cache();
    EXPECT_VALID(*t);
  }
  EXPECT_EQ(counts.released, counts.created);
}

// empty_cache gives the kept events back too, those of cross-stream frees and those
// its own releases waited for (the release fences): a C-ABI program that emptied the
// cache before exiting left one event behind, which the fake CUDA's leak check
// reported (fake_cuda.ipc_peer_check.*).
TEST(EventPoolTest, EmptyCacheGivesTheKeptEventsBack) {
  EventCounts counts;
  testutil::HookGuard counting;  // set below; outlives the allocator
  HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator("sim_capacity:256MiB", &hooks);
  counting = CountEvents(hooks, &counts);
  const Stream side = NewStream(*t);
  FreeUsedOn(t, side);  // completed: kept by the pool
  ASSERT_GE(counts.created, 1);
  t->empty_cache();  // the segment's release fence records (and keeps) one more
  EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(counts.released, counts.created) << "events kept after empty_cache";
  // The pool still works after it.
  FreeUsedOn(t, side);
  EXPECT_EQ(Pending(t), 0);
  EXPECT_VALID(*t);
}

// A record that throws while the pool keeps events leaves the free undone (the block
// allocated) and the kept event usable.
TEST(EventPoolTest, AFailedRerecordChangesNothing) {
  EventCounts counts;
  {
    testutil::HookGuard counting;  // set below; outlives the allocator
    HookedBackend* hooks = nullptr;
    SimAllocator t = MakeHookedSimAllocator("sim_capacity:256MiB", &hooks);
    counting = CountEvents(hooks, &counts);
    const Stream side = NewStream(*t);
    FreeUsedOn(t, side);  // one event kept
    void* p = t->allocate(4096);
    t->record_stream(p, side);
    t.sim->set_event_failure_injection(1);
    EXPECT_THROW(t->free(p), std::runtime_error);
    t.sim->set_event_failure_injection(0);
    ASSERT_TRUE(t->find_allocation(p).has_value());
    EXPECT_VALID(*t);
    t->free(p);  // the kept event, recorded again this time
    EXPECT_EQ(counts.created, 1);
    t->backend().synchronize_stream(side);
    t->process_events();
    EXPECT_EQ(Pending(t), 0);
    EXPECT_VALID(*t);
  }
  EXPECT_EQ(counts.released, counts.created);
}

// `n` blocks of `bytes` freed across to `side` while it is blocked; their events all
// complete before this returns. The blocks stay pending until polled.
void PendingFrees(SimAllocator& t, Stream side, int n, size_t bytes) {
  StreamBlocker blocker(t->backend(), side);
  std::vector<void*> ptrs;
  for (int i = 0; i < n; ++i) ptrs.push_back(t->allocate(bytes));
  for (void* p : ptrs) {
    t->record_stream(p, side);
    t->free(p);
  }
  blocker.Release();
  t->backend().synchronize_stream(side);
}

TEST(EventPollingTest, AnAllocationPollsAtMostTheBudgetAndProcessEventsTheRest) {
  HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator("sim_capacity:256MiB", &hooks);
  EventCounts counts;
  testutil::HookGuard counting = CountEvents(hooks, &counts);
  const Stream side = NewStream(*t);
  constexpr int kBlocks = 100;
  PendingFrees(t, side, kBlocks, 4096);
  ASSERT_EQ(Pending(t), kBlocks * 4096);

  counts.queried = 0;
  void* p = t->allocate(4096);
  EXPECT_EQ(counts.queried, static_cast<int>(kAllocationEventPollBudget));
  EXPECT_EQ(Pending(t), (kBlocks - static_cast<int>(kAllocationEventPollBudget)) * 4096);
  t->free(p);

  // The poller's call takes the rest (and asks once per event).
  counts.queried = 0;
  t->process_events();
  EXPECT_EQ(Pending(t), 0);
  EXPECT_EQ(counts.queried, kBlocks - static_cast<int>(kAllocationEventPollBudget));
  EXPECT_VALID(*t);
}

// Retirement events (release_stream of a stream with work still queued) share the
// allocation path's budget with cross-stream frees: with three budgets' worth of
// streams retiring, one allocation still queries at most kAllocationEventPollBudget
// events (docs/architecture.md, "Thread safety and lock order": the event queries left
// under the device lock are bounded in count).
TEST(EventPollingTest, AnAllocationQueriesAtMostTheBudgetWithManyStreamsRetiring) {
  EventCounts counts;  // outlives the allocator, whose destructor releases events
  testutil::HookGuard counting;  // set below; outlives the allocator
  HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator("sim_capacity:256MiB,thread_cache:false", &hooks);
  counting = CountEvents(hooks, &counts);
  constexpr int kStreams = 3 * static_cast<int>(kAllocationEventPollBudget);
  std::vector<std::unique_ptr<StreamBlocker>> busy;
  std::vector<Stream> streams;
  for (int i = 0; i < kStreams; ++i) {
    const Stream s = NewStream(*t);
    streams.push_back(s);
    busy.push_back(std::make_unique<StreamBlocker>(t->backend(), s));
    t->free(t->allocate(4096, s));  // cached on s: pending on its retirement
    t->release_stream(s);           // its work is held: the retirement stays open
  }
  // Every segment's one free block waits for its stream's retirement.
  ASSERT_EQ(Pending(t), t->stats().reserved_bytes[kAggregatePool].current);
  counts.queried = 0;
  void* p = t->allocate(4096);
  EXPECT_GT(counts.queried, 0) << "the allocation polled no retirement";
  EXPECT_LE(counts.queried, static_cast<int>(kAllocationEventPollBudget));
  t->free(p);
  for (auto& b : busy) b->Release();
  for (const Stream s : streams) t->backend().synchronize_stream(s);  // the test's own
  t->process_events();
  EXPECT_EQ(Pending(t), 0);
  EXPECT_VALID(*t);
}

TEST(EventPollingTest, AllocationsAloneFreeEveryCompletedBlockInTheEnd) {
  HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator("sim_capacity:256MiB,thread_cache:false", &hooks);
  const Stream side = NewStream(*t);
  constexpr int kBlocks = 100;
  PendingFrees(t, side, kBlocks, 4096);
  constexpr int kCalls =
      (kBlocks + static_cast<int>(kAllocationEventPollBudget) - 1) /
      static_cast<int>(kAllocationEventPollBudget);
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_GT(Pending(t), 0) << "drained before call " << i << ": the budget is not what it says";
    t->free(t->allocate(4096));
  }
  EXPECT_EQ(Pending(t), 0);
  EXPECT_VALID(*t);
}

// Two streams with completed backlogs (one in the small pool, one in the large, so that
// pending_bytes per pool tells which was polled): consecutive allocations take turns.
TEST(EventPollingTest, ABoundedPollTakesTurnsBetweenStreams) {
  HookedBackend* hooks = nullptr;
  // The pool's own polling is pinned: thread-cache hits take no lock and poll nothing.
  SimAllocator t = MakeHookedSimAllocator("sim_capacity:1GiB,thread_cache:false", &hooks);
  const Stream a = NewStream(*t);
  const Stream b = NewStream(*t);
  constexpr int kEach = static_cast<int>(kAllocationEventPollBudget) + 2;
  constexpr size_t kSmall = 4096;
  constexpr size_t kLarge = 2 * kMiB;
  // Everything allocated before anything is pending, so that no allocation here polls.
  std::vector<void*> small_ptrs;
  std::vector<void*> large_ptrs;
  for (int i = 0; i < kEach; ++i) {
    small_ptrs.push_back(t->allocate(kSmall));
    large_ptrs.push_back(t->allocate(kLarge));
  }
  {
    StreamBlocker block_a(t->backend(), a);
    StreamBlocker block_b(t->backend(), b);
    for (void* p : small_ptrs) {
      t->record_stream(p, a);
      t->free(p);
    }
    for (void* p : large_ptrs) {
      t->record_stream(p, b);
      t->free(p);
    }
  }
  t->backend().synchronize_stream(a);
  t->backend().synchronize_stream(b);
  const int64_t small_before = Pending(t, kSmallPool);
  const int64_t large_before = Pending(t, kLargePool);
  ASSERT_EQ(small_before, kEach * static_cast<int64_t>(kSmall));
  ASSERT_EQ(large_before, kEach * static_cast<int64_t>(kLarge));

  t->free(t->allocate(512));  // polls a full budget on one of the streams
  const bool first_small = Pending(t, kSmallPool) < small_before;
  EXPECT_NE(first_small, Pending(t, kLargePool) < large_before) << "one stream, all budget";
  t->free(t->allocate(512));  // the other stream's turn, though the first has 2 left
  constexpr int64_t kLeft = kEach - static_cast<int64_t>(kAllocationEventPollBudget);
  EXPECT_EQ(Pending(t, kSmallPool), kLeft * static_cast<int64_t>(kSmall));
  EXPECT_EQ(Pending(t, kLargePool), kLeft * static_cast<int64_t>(kLarge));
  t->process_events();
  EXPECT_EQ(Pending(t), 0);
  EXPECT_VALID(*t);
}

}  // namespace
}  // namespace devmem
