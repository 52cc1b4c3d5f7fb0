// tests/unlocked_release_stream_test.cc: a release's wait for a live stream, with the
// device lock released, against release_stream of that stream.
//
// release_stream(s) is the program's "I am about to destroy s" (device_pool_retire.cc):
// once it returns, the allocator must never name s to the driver again (a destroyed
// handle names no stream, or the next stream created; cudaStreamSynchronize on it
// fails, poisoning the device, or waits for the wrong stream and an unmap then pulls
// memory from under the old stream's queued kernels). A release path that checked s
// live under the lock and then synchronizes it with the lock released breaks that:
// release_stream runs in between and returns. The hook below is the window: it asks
// another thread for release_stream(s) while the allocator is about to synchronize s.
#include <gtest/gtest.h>

#include <chrono>
#include <future>

#include "allocator/caching_allocator.h"
#include "tests/hooked_backend.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::MakeHookedSimAllocator;
using testutil::SimAllocator;

// Bounds a wait that fails the test instead of hanging it; never orders threads.
constexpr auto kBound = std::chrono::seconds(20);

void ExpectNoSynchronizeAfterReleaseStream(const char* conf) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = MakeHookedSimAllocator(conf, &hooks);
  const Stream s = testutil::NewStream(*t);
  t->free(t->allocate(4 * kMiB, s));  // one cached segment (or run) of s, unused
  bool returned_meanwhile = false;
  // Outlives the hook: a fix may hold the device lock here, and release_stream then
  // returns only after empty_cache.
  std::future<void> released;
  hooks->before_synchronize_stream = [&](Stream w) {
    if (w != s || released.valid()) return;
    // The program, on another thread, is done with s.
    released = std::async(std::launch::async, [&] { t->release_stream(s); });
    returned_meanwhile = released.wait_for(kBound) == std::future_status::ready;
  };
  t->empty_cache();
  if (released.valid()) released.get();
  EXPECT_FALSE(returned_meanwhile)
      << "release_stream(s) returned while the allocator was about to synchronize s "
         "with the device lock released: the program may destroy s before that call";
  EXPECT_TRUE(t->validate().ok()) << t->validate();
  EXPECT_FALSE(t->poisoned());
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

TEST(UnlockedReleaseStreamTest, ARegularReleaseDoesNotSynchronizeAStreamReleasedMeanwhile) {
  ExpectNoSynchronizeAfterReleaseStream(
      "sim_capacity:1GiB,expandable_segments:false,thread_cache:false");
}

TEST(UnlockedReleaseStreamTest, AnExpandableReleaseDoesNotSynchronizeAStreamReleasedMeanwhile) {
  ExpectNoSynchronizeAfterReleaseStream(
      "sim_capacity:1GiB,expandable_segments:true,thread_cache:false");
}

}  // namespace
}  // namespace devmem
