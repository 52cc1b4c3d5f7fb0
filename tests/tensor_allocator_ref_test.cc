// tests/tensor_allocator_ref_test.cc: AllocatorRefFor (tensor/device_registry.h), the
// lock-free lookup that tensor creation uses, follows every change of the runtime's
// table: overrides, their end, and replacing the runtime's own allocator, on the
// thread that made the change and on one whose cache was filled before it.
#include <gtest/gtest.h>

#include <latch>
#include <memory>
#include <thread>

#include "runtime/runtime.h"
#include "tensor/device_registry.h"
#include "tensor/factories.h"
#include "tensor/tensor.h"
#include "tests/tensor_test_util.h"

namespace devmem {
namespace {

// A device index no other test uses, so the runtime creates its allocator here.
constexpr DeviceId kDevice{DeviceType::kSim, 61};

int64_t Live(const CachingAllocator& a) {
  return a.stats().allocation[kAggregatePool].current;
}

TEST(AllocatorRefTest, TheRuntimesOwnAllocatorComesWithoutAReference) {
  const AllocatorRef first = AllocatorRefFor(kDevice);
  ASSERT_NE(first.allocator, nullptr);
  EXPECT_EQ(first.owner, nullptr) << "the runtime keeps its own allocators until exit";
  EXPECT_EQ(first.allocator, Runtime::Get().allocator(kDevice).get());
  const AllocatorRef again = AllocatorRefFor(kDevice);  // from this thread's cache
  EXPECT_EQ(again.allocator, first.allocator);
  Tensor t = empty({8}, {.device = kDevice});
  EXPECT_EQ(t.storage()->allocator(), first.allocator);
}

TEST(AllocatorRefTest, FollowsAnOverrideAndItsEnd) {
  CachingAllocator* const runtimes = AllocatorRefFor(kDevice).allocator;  // cached
  {
    ScopedAllocatorOverride use(tensor_test::MakeSmallSim(kDevice.index));
    const AllocatorRef ref = AllocatorRefFor(kDevice);
    EXPECT_EQ(ref.allocator, &use.allocator()) << "a stale cache entry was trusted";
    EXPECT_EQ(ref.owner.get(), &use.allocator()) << "an override is held by reference";
    Tensor t = empty({8}, {.device = kDevice});
    EXPECT_EQ(t.storage()->allocator(), &use.allocator());
  }
  EXPECT_EQ(AllocatorRefFor(kDevice).allocator, runtimes);
}

TEST(AllocatorRefTest, AReplacedRuntimeAllocatorStaysValidForItsTensors) {
  Runtime& rt = Runtime::Get();
  CachingAllocator* const old = AllocatorRefFor(kDevice).allocator;  // cached
  Tensor t = empty({8}, {.device = kDevice});
  const int64_t live = Live(*old);
  // None installed: the next lookup makes a new one; the old one must not be freed
  // under `t`, nor under this thread's cache entry for it.
  std::shared_ptr<CachingAllocator> previous = rt.exchange_allocator(kDevice, nullptr);
  ASSERT_EQ(previous.get(), old);
  previous.reset();  // the table's reference is gone; the runtime still keeps it
  const AllocatorRef fresh = AllocatorRefFor(kDevice);
  EXPECT_NE(fresh.allocator, old);
  EXPECT_EQ(fresh.owner, nullptr);
  EXPECT_EQ(empty({8}, {.device = kDevice}).storage()->allocator(), fresh.allocator);
  t.reset();  // frees into the replaced allocator, still alive
  EXPECT_EQ(Live(*old), live - 1);
  EXPECT_TRUE(old->validate().ok());
}

TEST(AllocatorRefTest, AnotherThreadSeesAnExchangeMadeAfterItsLookup) {
  // The worker fills its cache, then the main thread overrides the device; the worker's
  // next lookup (ordered after the override by the latch) must see the override.
  std::latch cached(1), overridden(1);
  CachingAllocator* before = nullptr;
  CachingAllocator* after = nullptr;
  std::thread worker([&] {
    before = AllocatorRefFor(kDevice).allocator;
    cached.count_down();
    overridden.wait();
    after = empty({8}, {.device = kDevice}).storage()->allocator();
  });
  cached.wait();
  {
    ScopedAllocatorOverride use(tensor_test::MakeSmallSim(kDevice.index));
    overridden.count_down();
    worker.join();
    EXPECT_EQ(after, &use.allocator());
  }
  EXPECT_EQ(before, Runtime::Get().allocator(kDevice).get());
  EXPECT_NE(after, before);
}

}  // namespace
}  // namespace devmem
