// tests/tensor_pinned_test.cc: the cpu_pinned device as the tensor layer sees it: a
// host-accessible device (host kernels), reached with to(), cached by its own
// allocator. Where no GPU exists (here, usually) it is plain host memory; the pinned
// allocation and event-gated reuse are tested on the fake CUDA runtime
// (tests/fake_cuda/fake_cuda_test.cc, FakeCudaPinnedHostTest), and the staging of to()
// between host and GPU by tests/tensor_cuda_test.cc on a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "tensor/device_registry.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor_test_util.h"

namespace devmem {
namespace {

constexpr DeviceId kPinned{DeviceType::kCpuPinned, 0};

TEST(TensorPinnedTest, ParsesAndNamesTheDevice) {
  absl::StatusOr<DeviceId> d = ParseDeviceId("cpu_pinned");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, kPinned);
  EXPECT_EQ(kPinned.ToString(), "cpu_pinned");
  EXPECT_FALSE(ParseDeviceId("cpu_pinned:1").ok());
  EXPECT_THROW(AllocatorFor(DeviceId{DeviceType::kCpuPinned, 1}), InvalidArgumentError);
}

TEST(TensorPinnedTest, TensorsLiveThereAndCopyToEveryHostDevice) {
  const std::shared_ptr<CachingAllocator> alloc = AllocatorFor(kPinned);
  EXPECT_EQ(alloc->device(), kPinned);
  const int64_t before = alloc->stats().allocation[kAggregatePool].allocated;
  Tensor p = full({3, 4}, 2.5, {DType::kFloat32, kPinned});
  EXPECT_EQ(p.device(), kPinned);
  EXPECT_EQ(alloc->stats().allocation[kAggregatePool].allocated, before + 1);
  Tensor q = add(p, p);  // host kernels serve it
  EXPECT_EQ(q.to_vector<float>(), std::vector<float>(12, 5.0f));
  Tensor c = q.t().to(DeviceId{});
  EXPECT_EQ(c.device(), DeviceId{});
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(12, 5.0f));
  Tensor back = c.to(kPinned);
  EXPECT_EQ(back.device(), kPinned);
  EXPECT_EQ(back.to_vector<float>(), std::vector<float>(12, 5.0f));
}

}  // namespace
}  // namespace devmem
