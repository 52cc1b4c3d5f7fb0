// tests/tensor_storage_test.cc: Storage's intrusive refcount and the moment memory is
// freed: exactly when the last handle (StoragePtr or Tensor) viewing it dies, also
// when two threads race copies and destructions; foreign memory.
#include <gtest/gtest.h>

#include <latch>
#include <thread>
#include <vector>

#include "allocator/errors.h"
#include "allocator/site.h"
#include "tensor/factories.h"
#include "tensor/storage.h"
#include "tensor/tensor.h"
#include "tests/tensor_test_util.h"
#include "tests/test_util.h"

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

// A storage frees with the size it asked for (CachingAllocator::free(ptr, size)):
// small blocks through the freeing thread's cache, large ones straight to the pool.
// Storages made on one thread and dropped on another, small and large: every block is
// freed exactly once, the freeing thread's cache holds the small ones until it exits,
// and the books balance.
TEST_F(TensorStorageTest, StoragesDroppedOnAnotherThreadAreFreedExactly) {
  const std::vector<size_t> sizes = {512, 4096, 100 * 1024, 256 * 1024, 2 * kMiB, 12 * kMiB};
  std::vector<StoragePtr> made;
  for (int round = 0; round < 3; ++round) {
    for (size_t n : sizes) made.push_back(NewStorage(n));
  }
  ASSERT_EQ(LiveBlocks(), static_cast<int64_t>(made.size()));
  for (const StoragePtr& m : made) ASSERT_TRUE(alloc().find_allocation(m->data()).has_value());
  std::latch dropped(1);
  std::latch checked(1);
  std::thread other([&] {
    NewStorage(512).reset();  // this thread's cache exists from its first allocation
    made.clear();             // every last reference dies here, on this thread
    dropped.count_down();
    checked.wait();
  });
  dropped.wait();
  DeviceStats st = alloc().stats();
  EXPECT_EQ(st.allocation[kAggregatePool].current, 0);
  EXPECT_EQ(st.allocated_bytes[kAggregatePool].current, 0);
  EXPECT_GT(st.thread_cached[kSmallPool].current, 0) << "small frees went to its cache";
  EXPECT_EQ(st.thread_cached[kLargePool].current, 0);
  const absl::Status valid = alloc().validate();
  EXPECT_TRUE(valid.ok()) << valid;
  checked.count_down();
  other.join();  // its cache drains at exit
  st = alloc().stats();
  EXPECT_EQ(st.thread_cached[kAggregatePool].current, 0);
  EXPECT_EQ(st.reserved_bytes[kAggregatePool].current,
            st.free_bytes[kAggregatePool] + st.pending_bytes[kAggregatePool].current);
  // A double free through the sized path is still refused, naming the pointer.
  StoragePtr again = NewStorage(4096);
  void* p = again->data();
  again.reset();
  EXPECT_THROW(alloc().free(p, 4096), InvalidArgumentError);
}

// A storage whose memory another stream used (record_stream) is not reused on its own
// stream until that stream has passed the free, whichever path the free takes.
TEST_F(TensorStorageTest, ARecordStreamedStorageWaitsForTheOtherStream) {
  absl::StatusOr<Stream> other = alloc().backend().create_stream();
  ASSERT_TRUE(other.ok()) << other.status();
  for (size_t n : {size_t{4096}, size_t{4 * kMiB}}) {
    SCOPED_TRACE(n);
    StoragePtr s = NewStorage(n);
    void* p = s->data();
    auto blocker = std::make_unique<testutil::StreamBlocker>(alloc().backend(), *other);
    s->record_stream(*other);
    s.reset();  // the free records an event on `other`, which is blocked
    EXPECT_EQ(alloc().stats().pending_bytes[kAggregatePool].current,
              static_cast<int64_t>((n + 511) / 512 * 512));
    StoragePtr t = NewStorage(n);
    EXPECT_NE(t->data(), p) << "reused before the other stream passed the free";
    t.reset();
    blocker->Release();
    alloc().backend().synchronize_stream(*other);
    alloc().process_events();
    EXPECT_EQ(alloc().stats().pending_bytes[kAggregatePool].current, 0);
  }
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
