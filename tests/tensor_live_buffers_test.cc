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

}  // namespace
}  // namespace devmem
