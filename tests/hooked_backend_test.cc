// tests/hooked_backend_test.cc: the hooks of tests/hooked_backend.h are set only while
// the HookGuard that set them lives: cleared at the guard's end, so that the allocator
// (its destructor, another thread) never runs a hook on the test's dead locals; a clear
// waits for a call in flight; a guard clears only its own function; a guard may
// outlive the backend.
#include "tests/hooked_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <thread>
#include <utility>

#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::Hook;
using testutil::HookedBackend;
using testutil::HookGuard;
using testutil::MakeHookedSimAllocator;
using testutil::SimAllocator;

// A hook set in a scope inside the allocator's does not run after it: the allocator's
// destructor frees the cached segment without it (with a plain std::function left set,
// it ran then, on the scope's dead locals).
TEST(HookGuardTest, AHookSetInAnInnerScopeDoesNotRunAfterIt) {
  int calls = 0;
  {
    HookedBackend* hooks = nullptr;
    SimAllocator t = MakeHookedSimAllocator("sim_capacity:256MiB", &hooks);
    t->free(t->allocate(kMiB));  // a cached segment, which the destructor frees
    {
      HookGuard counting = hooks->free_segment_instead.Set([&](void* p, size_t n) {
        ++calls;
        hooks->inner().free_segment(p, n);
      });
      EXPECT_TRUE(hooks->free_segment_instead);
    }
    EXPECT_FALSE(hooks->free_segment_instead);
  }
  EXPECT_EQ(calls, 0);
}

// A guard declared before the allocator sees the destructor's calls, and outlives the
// backend (its end then clears nothing).
TEST(HookGuardTest, AGuardDeclaredBeforeTheAllocatorCountsItsDestructorsCalls) {
  int frees = 0;
  {
    HookGuard counting;
    HookedBackend* hooks = nullptr;
    SimAllocator t = MakeHookedSimAllocator("sim_capacity:256MiB", &hooks);
    t->free(t->allocate(kMiB));
    counting = hooks->free_segment_instead.Set([&frees, hooks](void* p, size_t n) {
      ++frees;
      hooks->inner().free_segment(p, n);
    });
    EXPECT_EQ(frees, 0);
  }
  EXPECT_GE(frees, 1) << "the destructor's segment free ran without the hook";
}

// A clear returns only once the call in flight of the function it clears has ended, and
// no call begins after it.
TEST(HookGuardTest, AClearWaitsForTheCallInFlight) {
  Hook<void()> hook;
  std::latch entered(1);
  std::latch release(1);
  std::atomic<bool> call_done{false};
  HookGuard guard = hook.Set([&] {
    entered.count_down();
    release.wait();
    call_done = true;
  });
  std::thread caller([&] { hook.Run(); });
  entered.wait();
  std::atomic<bool> cleared{false};
  std::thread clearer([&] {
    guard.reset();
    cleared = true;
  });
  // The clear takes the function away at once (no new call gets it), then waits.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (hook && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_FALSE(hook);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // can only hide a failure
  EXPECT_FALSE(cleared.load()) << "the clear returned while the hook still ran";
  release.count_down();
  clearer.join();
  caller.join();
  EXPECT_TRUE(call_done.load());
  EXPECT_TRUE(cleared.load());
}

// A guard clears its own function only: a later Set's stays until its guard ends; with
// none set the backend's own call runs.
TEST(HookGuardTest, AGuardClearsOnlyTheFunctionItSet) {
  Hook<int(int)> hook;
  auto run = [&](int x) { return hook.RunOr([] { return -1; }, x); };
  HookGuard first = hook.Set([](int x) { return x + 1; });
  EXPECT_EQ(run(1), 2);
  HookGuard second = hook.Set([](int x) { return x + 2; });
  first.reset();
  EXPECT_EQ(run(1), 3) << "the first guard cleared the second's function";
  HookGuard both;
  both += std::move(second);  // `second` guards nothing now
  EXPECT_EQ(run(1), 3);
  both.reset();
  EXPECT_EQ(run(1), -1);
}

}  // namespace
}  // namespace devmem
