// tests/tensor_live_buffers_test.cc: snapshots say what a live buffer is when the
// tensor layer owns it: how many tensors share it, and the dtype and shape it was
// created with (tensor/live_storages.h, runtime/buffer_annotator.h).
#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <thread>
#include <vector>

#include "runtime/json.h"
#include "runtime/runtime.h"
#include "tensor/factories.h"
#include "tensor/live_storages.h"
#include "tensor/tensor.h"
#include "tests/tensor_test_util.h"
#include "tests/text_assertions.h"

namespace devmem {
namespace {

using tensor_test::kSimDevice;
using tensor_test::SimDeviceTest;

class LiveBuffersTest : public SimDeviceTest {};

// The annotation of the live buffer at `ptr` on kSimDevice, if the snapshot has one.
const BufferAnnotation* Find(const RuntimeSnapshot& snap, const void* ptr) {
  for (size_t i = 0; i < snap.devices.size() && i < snap.annotations.size(); ++i) {
    if (snap.devices[i].device != kSimDevice) continue;
    auto it = snap.annotations[i].find(reinterpret_cast<uintptr_t>(ptr));
    return it == snap.annotations[i].end() ? nullptr : &it->second;
  }
  return nullptr;
}

TEST_F(LiveBuffersTest, SnapshotCountsTheTensorsSharingABufferAndItsShape) {
  Tensor t = zeros({4, 8}, On());
  {
    const RuntimeSnapshot snap = Runtime::Get().snapshot();
    const BufferAnnotation* a = Find(snap, t.data_ptr());
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->refcount, 1u);
    EXPECT_EQ(a->dtype, "float32");
    EXPECT_EQ(a->shape, (std::vector<int64_t>{4, 8}));
  }
  Tensor view = t.slice(0, 1, 3);  // shares the storage
  Tensor copy = t;                 // shares the storage
  const RuntimeSnapshot snap = Runtime::Get().snapshot();
  const BufferAnnotation* a = Find(snap, t.data_ptr());
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->refcount, 3u);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{4, 8}));  // the shape it was created with

  // The JSON carries it, and reads back equal.
  const std::string json = SnapshotToJson(snap);
  EXPECT_CONTAINS(json, "\"tensor\":{\"refcount\":3,\"dtype\":\"float32\",\"shape\":[4,8]}");
  absl::StatusOr<RuntimeSnapshot> back = SnapshotFromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  const BufferAnnotation* b = Find(*back, t.data_ptr());
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(*b, *a);

  // So does /debug/buffers' document.
  BufferFilter filter;
  filter.device = kSimDevice;
  EXPECT_CONTAINS(LiveBuffersToJson(snap, filter), "\"refcount\":3");
}

TEST_F(LiveBuffersTest, AStorageIsUnlistedWhenItsLastTensorDies) {
  const size_t before = LiveStorages::Get().size();
  void* data = nullptr;
  {
    Tensor t = ones({16}, On());
    data = t.data_ptr();
    EXPECT_EQ(LiveStorages::Get().size(), before + 1);
  }
  EXPECT_EQ(LiveStorages::Get().size(), before);
  EXPECT_EQ(Find(Runtime::Get().snapshot(), data), nullptr);
}

TEST_F(LiveBuffersTest, ForeignMemoryIsNotListed) {
  std::vector<float> host(8);
  const size_t before = LiveStorages::Get().size();
  Tensor t = from_blob(host.data(), {8}, DType::kFloat32, DeviceId{});
  EXPECT_EQ(LiveStorages::Get().size(), before);
}

TEST_F(LiveBuffersTest, ConcurrentSnapshotsWhileTensorsComeAndGo) {
  // Two threads create and drop tensors (and views) until a third has taken 50
  // snapshots: every annotation seen must describe a live storage of one of the shapes
  // made here. Not vacuous: a tensor held throughout must be in every snapshot, and the
  // snapshots start only once both workers have made a tensor (a latch).
  constexpr int kSnapshots = 50;
  const Tensor held = zeros({3, 16}, On());
  std::atomic<int> snapshots{0};
  std::latch started(2);
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      for (int i = 0; i < 1000000 && snapshots.load() < kSnapshots; ++i) {
        Tensor t = zeros({4 + w, 16}, On());
        Tensor v = t.slice(0, 0, 2);
        if (i == 0) started.count_down();
      }
    });
  }
  int held_seen = 0;
  size_t annotations_seen = 0;
  std::thread snapper([&] {
    started.wait();
    for (int i = 0; i < kSnapshots; ++i) {
      const RuntimeSnapshot snap = Runtime::Get().snapshot();
      const BufferAnnotation* h = Find(snap, held.data_ptr());
      if (h != nullptr && h->refcount == 1 && h->shape == std::vector<int64_t>{3, 16}) {
        ++held_seen;
      }
      for (const BufferAnnotations& per_device : snap.annotations) {
        for (const auto& [addr, a] : per_device) {
          ++annotations_seen;
          EXPECT_GE(a.refcount, 1u);
          EXPECT_EQ(a.dtype, "float32");
          ASSERT_EQ(a.shape.size(), 2u);
          EXPECT_TRUE(a.shape[0] >= 3 && a.shape[0] <= 5 && a.shape[1] == 16)
              << a.shape[0] << "x" << a.shape[1];
        }
      }
      snapshots.fetch_add(1);
    }
  });
  snapper.join();
  for (std::thread& t : workers) t.join();
  EXPECT_EQ(snapshots.load(), kSnapshots);
  EXPECT_EQ(held_seen, kSnapshots) << "a snapshot missed the tensor held throughout";
  EXPECT_GE(annotations_seen, static_cast<size_t>(kSnapshots));
}

TEST_F(LiveBuffersTest, StoragesFreedOnAnotherThreadAreUnlistedWhileSnapshotsRun) {
  // Storages are listed in the shard of the thread that creates them and unlisted by
  // whichever thread drops the last reference: four threads create, one other thread
  // frees them all while a third takes snapshots. Every storage is seen while all are
  // live, and none is left listed (nor annotated) once they are gone.
  constexpr int kThreads = 4;
  constexpr int kPerThread = 100;
  const size_t before = LiveStorages::Get().size();
  std::vector<std::vector<Tensor>> made(kThreads);
  {
    std::vector<std::thread> makers;
    for (int w = 0; w < kThreads; ++w) {
      makers.emplace_back([&, w] {
        for (int i = 0; i < kPerThread; ++i) made[w].push_back(zeros({2, 8 + w}, On()));
      });
    }
    for (std::thread& t : makers) t.join();
  }
  EXPECT_EQ(LiveStorages::Get().size(), before + kThreads * kPerThread);
  const RuntimeSnapshot all = Runtime::Get().snapshot();
  for (int w = 0; w < kThreads; ++w) {
    for (const Tensor& t : made[w]) {
      const BufferAnnotation* a = Find(all, t.data_ptr());
      ASSERT_NE(a, nullptr) << "thread " << w << "'s storage is not listed";
      EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 8 + w}));
    }
  }
  // The freer starts once the snapper has taken one snapshot, so that frees and
  // snapshots overlap (a latch, no sleep).
  std::latch snapping(1);
  std::atomic<bool> done{false};
  std::thread snapper([&] {
    for (bool first = true; first || !done.load(); first = false) {
      const RuntimeSnapshot snap = Runtime::Get().snapshot();
      for (const BufferAnnotations& per_device : snap.annotations) {
        for (const auto& [addr, a] : per_device) EXPECT_GE(a.refcount, 1u);
      }
      if (first) snapping.count_down();
    }
  });
  std::thread freer([&] {
    snapping.wait();
    for (std::vector<Tensor>& list : made) list.clear();
    done.store(true);
  });
  freer.join();
  snapper.join();
  EXPECT_EQ(LiveStorages::Get().size(), before);
  const RuntimeSnapshot after = Runtime::Get().snapshot();
  for (size_t i = 0; i < after.devices.size() && i < after.annotations.size(); ++i) {
    if (after.devices[i].device == kSimDevice) {
      EXPECT_TRUE(after.annotations[i].empty());
    }
  }
}

}  // namespace
}  // namespace devmem
