// tests/tensor_storage_test.cc: Storage's intrusive refcount and the moment memory is
// freed: exactly when the last handle (StoragePtr or Tensor) viewing it dies, also
// when two threads race copies and destructions; foreign memory.
#include <gtest/gtest.h>

#include <latch>
#include <thread>
#include <vector>

#include "allocator/site.h"
#include "tensor/factories.h"
#include "tensor/storage.h"
#include "tensor/tensor.h"
#include "tests/tensor_test_util.h"

namespace devmem {
namespace {

using tensor_test::kSimDevice;
using tensor_test::SimDeviceTest;

class TensorStorageTest : public SimDeviceTest {};

StoragePtr NewStorage(size_t bytes) {
  return Storage::Allocate(AllocatorFor(kSimDevice), bytes, Stream{},
                           InternSite(std::source_location::current(), SiteKind::kAlloc));
}

TEST_F(TensorStorageTest, CountsReferencesAndFreesAtTheLast) {
  StoragePtr a = NewStorage(4096);
  ASSERT_TRUE(a);
  EXPECT_EQ(a.use_count(), 1u);
  EXPECT_EQ(a->bytes(), 4096u);
  EXPECT_EQ(a->device(), kSimDevice);
  EXPECT_EQ(a->allocator(), &alloc());
  EXPECT_FALSE(a->is_foreign());
  EXPECT_EQ(LiveBlocks(), 1);
  ASSERT_TRUE(alloc().find_allocation(a->data()).has_value());

  StoragePtr b = a;  // copy: shares
  EXPECT_EQ(a.use_count(), 2u);
  EXPECT_EQ(b.get(), a.get());
  StoragePtr c = std::move(b);  // move: no count change
  EXPECT_FALSE(b);
  EXPECT_EQ(c.use_count(), 2u);
  StoragePtr& alias = c;
  c = alias;  // self-assignment keeps it
  EXPECT_EQ(c.use_count(), 2u);

  a.reset();
  EXPECT_EQ(c.use_count(), 1u);
  EXPECT_EQ(LiveBlocks(), 1) << "freed while a reference remained";
  c.reset();
  EXPECT_EQ(LiveBlocks(), 0) << "not freed when the last reference died";
}

TEST_F(TensorStorageTest, AssignmentReleasesTheOldStorage) {
  StoragePtr a = NewStorage(1024);
  StoragePtr b = NewStorage(1024);
  EXPECT_EQ(LiveBlocks(), 2);
  a = b;  // a's old storage has no other reference
  EXPECT_EQ(LiveBlocks(), 1);
  EXPECT_EQ(b.use_count(), 2u);
  b = StoragePtr();
  a = std::move(b);  // a's storage is released by the move-assignment
  EXPECT_EQ(LiveBlocks(), 0);
}

TEST_F(TensorStorageTest, TensorStorageLivesUntilTheLastView) {
  Tensor base = zeros({8, 4}, On());
  Tensor row = base.slice(0, 2, 6);
  Tensor col = row.t().select(0, 1);
  EXPECT_EQ(base.use_count(), 3u);
  EXPECT_EQ(LiveBlocks(), 1);

  base.reset();
  EXPECT_EQ(LiveBlocks(), 1);
  row.reset();
  EXPECT_EQ(LiveBlocks(), 1);
  EXPECT_EQ(col.use_count(), 1u);
  col.fill_(3);  // still usable: the storage is alive
  EXPECT_EQ(col.to_vector<float>(), std::vector<float>(4, 3.0f));
  col.reset();
  EXPECT_EQ(LiveBlocks(), 0);
}

// Two threads copy, view and destroy handles of one storage concurrently; the main
// thread checks the storage survives while any handle exists and is freed once the
// last one (dropped by whichever thread finishes last) is gone.
TEST_F(TensorStorageTest, RacingCopiesAndDestructionsOnTwoThreads) {
  for (int round = 0; round < 20; ++round) {
    Tensor base = zeros({64, 16}, On());
    ASSERT_EQ(LiveBlocks(), 1);
    std::latch start(3);
    std::latch worked(3);
    std::latch release(1);
    auto work = [&](Tensor mine) {
      start.arrive_and_wait();
      std::vector<Tensor> held;
      for (int i = 0; i < 5000; ++i) {
        held.push_back(mine);                          // copy
        held.push_back(mine.slice(0, i % 64, 64, 2));  // view
        Tensor moved = std::move(held.back());         // move
        held.back() = moved.t();
        if (held.size() > 16) held.erase(held.begin(), held.begin() + 8);
      }
      worked.count_down();
      release.wait();
      // `held` and `mine` die here, racing the other thread's.
    };
    std::thread a(work, base);
    std::thread b(work, base);
    base.reset();  // from here on only the threads hold references
    start.arrive_and_wait();
    worked.arrive_and_wait();
    EXPECT_EQ(LiveBlocks(), 1) << "freed while the threads still held views";
    release.count_down();
    a.join();
    b.join();
    EXPECT_EQ(LiveBlocks(), 0) << "not freed after the last view died";
  }
}

TEST_F(TensorStorageTest, RacingCopiesLeaveTheCountExact) {
  Tensor base = ones({32}, On());
  std::latch start(2);
  auto work = [&] {
    start.arrive_and_wait();
    for (int i = 0; i < 100000; ++i) {
      Tensor copy = base;
      Tensor view = copy.slice(0, 1);
    }
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  EXPECT_EQ(base.use_count(), 1u);
  EXPECT_EQ(LiveBlocks(), 1);
}

TEST_F(TensorStorageTest, ForeignMemoryWithoutDeleterIsNeverFreed) {
  std::vector<float> host(16, 2.0f);
  {
    Tensor t = from_blob(host.data(), {4, 4}, DType::kFloat32, DeviceId{});
    EXPECT_TRUE(t.storage()->is_foreign());
    EXPECT_EQ(t.storage()->allocator(), nullptr);
    EXPECT_EQ(t.data_ptr(), host.data());
    t.select(0, 1).fill_(5);
  }
  EXPECT_EQ(host[4], 5.0f);  // written through, still ours
  EXPECT_EQ(LiveBlocks(), 0);
}

TEST_F(TensorStorageTest, ForeignMemoryWithDeleterIsFreedOnceAtTheLastView) {
  int deleted = 0;
  float* buffer = new float[8];
  Tensor view;
  {
    Tensor t = from_blob(buffer, {8}, DType::kFloat32, DeviceId{}, [&deleted](void* p) {
      delete[] static_cast<float*>(p);
      ++deleted;
    });
    view = t.slice(0, 2, 6);
  }
  EXPECT_EQ(deleted, 0);
  view.reset();
  EXPECT_EQ(deleted, 1);
}

TEST_F(TensorStorageTest, StorageKeepsItsAllocatorAliveAfterTheOverrideEnds) {
  std::weak_ptr<CachingAllocator> weak;
  Tensor survivor;
  {
    auto other = tensor_test::MakeSmallSim(tensor_test::kOtherSimDevice.index);
    weak = other;
    ScopedAllocatorOverride use(std::move(other));
    survivor = zeros({16}, {.device = tensor_test::kOtherSimDevice});
  }
  ASSERT_FALSE(weak.expired()) << "the allocator died under a live tensor";
  survivor.add_(1.0);
  EXPECT_EQ(survivor.to_vector<float>(), std::vector<float>(16, 1.0f));
  survivor.reset();
  EXPECT_TRUE(weak.expired());
}

}  // namespace
}  // namespace devmem
