// tests/caching_allocator_unlocked_driver_test.cc: no driver call under the device
// lock on the allocation path.
//
// A regular segment's allocate_segment (cudaMalloc) runs with the device lock released:
// the intent is registered first (its bytes count against the memory limit), the lock
// is taken back to link the result. A HookedBackend holds the driver call on a latch
// so that other threads' calls are ordered by what the allocator does, not by sleeps.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <latch>
#include <memory>
#include <thread>

#include "allocator/caching_allocator.h"
#include "allocator/errors.h"
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
  hooks->allocate_segment_instead = [&](size_t bytes) -> absl::StatusOr<void*> {
    if (calls++ == 0) {
      entered.count_down();
      release.wait();
    }
    return hooks->inner().allocate_segment(bytes);
  };

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
  hooks->allocate_segment_instead = [&](size_t bytes) -> absl::StatusOr<void*> {
    if (calls++ == 0) return absl::ResourceExhaustedError("injected");
    return hooks->inner().allocate_segment(bytes);
  };
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

}  // namespace
}  // namespace devmem
