// tests/unlocked_driver_window_test.cc: what may happen while a release path has the
// device lock released: release_stream of the stream it waits for, a capture beginning.
//
// release_stream(s) is the program's "I am about to destroy s" (device_pool_retire.cc):
// once it returns, the allocator must never name s to the driver again (a destroyed
// handle names no stream, or the next stream created; cudaStreamSynchronize on it
// fails, poisoning the device, or waits for the wrong stream and an unmap then pulls
// memory from under the old stream's queued kernels). A release path that checked s
// live under the lock and then synchronized it with the lock released broke that:
// release_stream ran in between and returned. Now the release names s once, under the
// lock (an event of the pool's own, allocator/release_fence.h), and waits for that
// event with the lock released: the hook below is that wait; it asks another thread
// for release_stream(s), which must return (the lock is free), and from then on no
// call may name s.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>

#include "allocator/caching_allocator.h"
#include "tests/hooked_backend.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::MakeHookedSimAllocator;
using testutil::SimAllocator;

// How long the capture window below stays open: a racer that does not wait returns
// well within it, and a correct allocator makes it wait all of it. Never orders threads.
constexpr auto kWindow = std::chrono::milliseconds(200);
// Bounds a wait that fails the test instead of hanging it; never orders threads.
constexpr auto kBound = std::chrono::seconds(20);

void ExpectNoCallOnAStreamReleasedDuringTheWait(const char* conf) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(conf, &hooks);
  const Stream s = testutil::NewStream(*t);
  t->free(t->allocate(4 * kMiB, s));  // one cached segment (or run) of s, unused
  std::atomic<bool> released{false};     // release_stream(s) returned
  std::atomic<int> named_after{0};       // driver calls naming s after that
  std::atomic<int> waits{0};
  bool returned_meanwhile = false;
  std::future<void> release;
  auto names = [&](Stream w) {
    if (w == s && released) ++named_after;
  };
  testutil::HookGuard sync_stream_hook = hooks->before_synchronize_stream.Set(names);
  testutil::HookGuard record_hook = hooks->before_record_event.Set(names);
  testutil::HookGuard rerecord_hook =
      hooks->before_rerecord_event.Set([&](Event, Stream w) { names(w); });
  testutil::HookGuard sync_event_hook = hooks->before_synchronize_event.Set([&](Event) {
    if (waits++ != 0) return;  // the release's wait (empty_cache's thread)
    // The program, on another thread, is done with s: the device lock is free.
    release = std::async(std::launch::async, [&] {
      t->release_stream(s);
      released = true;
    });
    returned_meanwhile = release.wait_for(kBound) == std::future_status::ready;
  });
  t->empty_cache();
  if (release.valid()) release.get();
  EXPECT_TRUE(returned_meanwhile)
      << "release_stream waited for another thread's release: the release's stream "
         "wait held the device lock";
  EXPECT_EQ(named_after.load(), 0)
      << "the allocator named s to the driver after release_stream(s) returned";
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  EXPECT_FALSE(t->poisoned());
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  EXPECT_EQ(named_after.load(), 0);
  // The allocator outlives this function's locals: its destructor must not reach them.
  hooks->before_synchronize_stream = nullptr;
  hooks->before_record_event = nullptr;
  hooks->before_rerecord_event = nullptr;
  hooks->before_synchronize_event = nullptr;
}

TEST(UnlockedDriverWindowTest, ARegularReleaseNamesNoStreamReleasedDuringItsWait) {
  ExpectNoCallOnAStreamReleasedDuringTheWait(
      "sim_capacity:1GiB,expandable_segments:false,thread_cache:false");
}

TEST(UnlockedDriverWindowTest, AnExpandableReleaseNamesNoStreamReleasedDuringItsWait) {
  ExpectNoCallOnAStreamReleasedDuringTheWait(
      "sim_capacity:1GiB,expandable_segments:true,thread_cache:false");
}

// The same window against a graph capture: empty_cache (and trim, the retry) check
// that no capture is under way once, under the lock, and then give memory back with the
// lock released; begin_allocate_to_pool may run in between, and the capture that
// follows it (cudaStreamBeginCapture comes after it, as in PyTorch) must see no free,
// unmap or stream wait of the allocator ("during a capture nothing may be waited for or
// given back", device_pool.cc).
TEST(UnlockedDriverWindowTest, NoSegmentIsFreedOnceAPoolCaptureBegan) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(
      "sim_capacity:1GiB,expandable_segments:false,thread_cache:false", &hooks);
  void* a = t->allocate(12 * kMiB);
  void* b = t->allocate(12 * kMiB);  // two 20 MiB segments
  t->free(a);
  t->free(b);
  ASSERT_EQ(t->stats().segment[kAggregatePool].current, 2);
  std::atomic<bool> began{false};
  bool began_meanwhile = false;
  bool freed_after_begin = false;
  std::future<void> capture;
  int calls = 0;  // the hook runs on empty_cache's thread only
  testutil::HookGuard free_segment_hook = hooks->free_segment_instead.Set([&](void* p, size_t n) {
    if (calls++ == 0) {
      capture = std::async(std::launch::async, [&] {
        t->begin_allocate_to_pool(PoolId{7, 1}, [](Stream) { return true; });
        began = true;
      });
      began_meanwhile = capture.wait_for(kWindow) == std::future_status::ready;
    } else if (began) {
      freed_after_begin = true;
    }
    hooks->inner().free_segment(p, n);
  });
  t->empty_cache();
  if (capture.valid()) capture.get();
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(began_meanwhile && freed_after_begin)
      << "empty_cache freed a segment after begin_allocate_to_pool returned (a capture "
         "may be under way by then)";
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  t->end_allocate_to_pool(PoolId{7, 1});
  t->release_pool(PoolId{7, 1});
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

}  // namespace
}  // namespace devmem
