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

#include "absl/status/statusor.h"
#include "allocator/backend.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/types.h"
#include "cuda/cuda_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_cuda/fake_cuda.h"

namespace devmem {
namespace {

constexpr size_t kDevice = size_t{1} << 30;  // the fake's default capacity

std::unique_ptr<Backend> Cuda(int index) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = NewCudaBackend(index);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

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
  Config base;
  base.backend = BackendKind::kCuda;
  absl::StatusOr<Config> config = ParseConfig(GetParam(), base);
  ASSERT_TRUE(config.ok()) << config.status();
  auto b0 = Cuda(0);
  auto b1 = Cuda(1);
  ASSERT_TRUE(b0 && b1);
  CachingAllocator a0(std::move(b0), *config);
  CachingAllocator a1(std::move(b1), *config);
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

INSTANTIATE_TEST_SUITE_P(Segments, FakeCudaMultiDeviceTest,
                         ::testing::Values("expandable_segments:false",
                                           "expandable_segments:true"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param) == "expandable_segments:true"
                                      ? std::string("expandable")
                                      : std::string("regular");
                         });

}  // namespace
}  // namespace devmem
