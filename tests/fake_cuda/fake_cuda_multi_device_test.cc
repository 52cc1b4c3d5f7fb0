// tests/fake_cuda/fake_cuda_multi_device_test.cc: one allocator per GPU on a host with
// two (fake) devices, driven from a thread whose current device is the other one. Every
// backend call must act on its allocator's device (DeviceGuard in cuda_backend.cc) and
// give the caller's current device back: segments are charged to the right device's
// memory, events are recorded on the right device's streams (the fake aborts on an
// event of one device recorded on another's stream), and the legacy default stream
// that Stream{} names is the allocator's device's, not the caller's.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/backend.h"
#include "allocator/caching_allocator.h"
#include "allocator/types.h"
#include "cuda/cuda_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/fake_cuda/fake_cuda_test_util.h"

namespace devmem {
namespace {

constexpr size_t kDevice = size_t{1} << 30;  // the fake's default capacity

int Current() {
  int d = -1;
  EXPECT_EQ(cudaGetDevice(&d), cudaSuccess);
  return d;
}

size_t Reserved(const CachingAllocator& a) {
  return static_cast<size_t>(a.stats().reserved_bytes[kAggregatePool].current);
}

class FakeCudaMultiDeviceTest : public ::testing::TestWithParam<const char*> {
 protected:
  void TearDown() override { cudaSetDevice(0); }  // for the tests after this one
};

TEST_P(FakeCudaMultiDeviceTest, EachAllocatorUsesItsDeviceWhateverIsCurrent) {
  auto allocator0 = fake_cuda_test::CudaAllocator(0, GetParam());
  auto allocator1 = fake_cuda_test::CudaAllocator(1, GetParam());
  ASSERT_TRUE(allocator0 && allocator1);
  CachingAllocator& a0 = *allocator0;
  CachingAllocator& a1 = *allocator1;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);

  absl::StatusOr<Stream> side = a0.backend().create_stream();  // a stream of device 0
  ASSERT_TRUE(side.ok()) << side.status();
  void* p = a0.allocate(30 * kMiB, *side);
  void* q = a1.allocate(10 * kMiB);
  EXPECT_EQ(Current(), 1);
  // Each device's memory holds exactly its own allocator's segments.
  EXPECT_EQ(a0.backend().mem_info().free_bytes, kDevice - Reserved(a0));
  EXPECT_EQ(a1.backend().mem_info().free_bytes, kDevice - Reserved(a1));
  EXPECT_EQ(a0.device().index, 0);
  EXPECT_EQ(a1.device().index, 1);
  // Device work on p runs on device 0 (the fake aborts on memory it does not know).
  ASSERT_EQ(CudaMemsetSync(0, p, 0x11, 30 * kMiB), absl::OkStatus());
  EXPECT_EQ(Current(), 1);

  // A cross-stream free: the event goes on device 0's legacy default stream, which
  // Stream{} names only while device 0 is current; then waits, polls and releases.
  a0.record_stream(p, Stream{});
  a0.free(p);
  a0.process_events();
  void* again = a0.allocate(30 * kMiB, *side);
  a0.free(again);
  a1.free(q);
  a0.empty_cache();
  a1.empty_cache();
  EXPECT_EQ(Current(), 1);
  EXPECT_EQ(Reserved(a0), 0u);
  EXPECT_EQ(Reserved(a1), 0u);
  EXPECT_EQ(a0.backend().mem_info().free_bytes, kDevice);
  EXPECT_EQ(a1.backend().mem_info().free_bytes, kDevice);
  EXPECT_TRUE(a0.validate().ok()) << a0.validate();
  EXPECT_TRUE(a1.validate().ok()) << a1.validate();
  a0.backend().destroy_stream(*side);
  EXPECT_EQ(Current(), 1);
}

INSTANTIATE_TEST_SUITE_P(Segments, FakeCudaMultiDeviceTest, fake_cuda_test::SegmentKinds(),
                         fake_cuda_test::SegmentKindName);

}  // namespace
}  // namespace devmem
