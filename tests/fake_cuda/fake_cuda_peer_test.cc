// tests/fake_cuda/fake_cuda_peer_test.cc: peer access on two fake devices
// (fake_cuda_peer.h models it: a mapping reaches only the devices cuMemSetAccess
// granted; device work that reaches memory its device may not faults that device).
//   FakeCudaPeerModelTest   the fake: a peer copy into an expandable block that only
//                           its own device may access faults the copying device
//                           (cudaErrorIllegalAddress), as a GPU does;
//   FakeCudaPeerTest        CachingAllocator::enable_peer_access: device 1's copies
//                           and kernels reach every block of device 0's allocator,
//                           those allocated before the call (re-granted, one
//                           cuMemSetAccess per mapped range) and after (every map
//                           grants the peer); regular and expandable segments;
//   FakeCudaPeerErrorsTest  bad peers are errors naming the device and the peer.
// A fault lasts as long as the process, so the cases that can fault run in a child
// process (EXPECT_EXIT, threadsafe style), which exits 0 only if no expectation failed.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "allocator/backend.h"
#include "allocator/caching_allocator.h"
#include "allocator/driver_calls.h"
#include "allocator/types.h"
#include "cuda/cuda_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/fake_cuda/fake_cuda_test_util.h"

namespace devmem {
namespace {

using fake_cuda_test::CudaAllocator;
using fake_cuda_test::InChild;
using fake_cuda_test::ScopedEnv;

int64_t SetAccessCalls(const CachingAllocator& a) {
  return a.backend().driver_calls().calls[static_cast<int>(DriverCall::kSetAccess)];
}

// Every byte of device 0's [p, p + n) is `value`.
void ExpectBytes(void* p, size_t n, unsigned char value) {
  std::vector<unsigned char> host(n);
  ASSERT_EQ(CudaCopyToHost(0, host.data(), p, n), absl::OkStatus());
  size_t wrong = 0;
  for (unsigned char c : host) wrong += c != value ? 1 : 0;
  EXPECT_EQ(wrong, 0u) << n << " bytes at " << p << " should all be " << int{value};
}

TEST(FakeCudaPeerModelTest, PeerCopyIntoAnExpandableBlockWithoutAccessFaults) {
  InChild([] {
    {
      auto a0 = CudaAllocator(0, "expandable_segments:true");
      auto a1 = CudaAllocator(1, "expandable_segments:false");
      ASSERT_TRUE(a0 && a1);
      void* p = a0->allocate(4 * kMiB);
      void* q = a1->allocate(4 * kMiB);
      ASSERT_EQ(CudaMemsetSync(1, q, 0x5a, 4 * kMiB), absl::OkStatus());
      ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
      // Device 1 copies into device 0's mapping, which only device 0 may access.
      EXPECT_EQ(cudaMemcpyPeer(p, 0, q, 1, 4 * kMiB), cudaErrorIllegalAddress);
      EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);  // sticky: stays
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      ExpectBytes(p, 4 * kMiB, 0);  // nothing was written (the fake zero-fills)
      a0->free(p);
      a1->free(q);  // device 1 is broken: its allocator is poisoned on the way out
    }
  });
}

class FakeCudaPeerTest : public ::testing::TestWithParam<const char*> {};

TEST_P(FakeCudaPeerTest, PeerCopiesAndKernelsReachEveryBlockOnceEnabled) {
  const bool expandable = std::string(GetParam()) == "expandable_segments:true";
  InChild([&] {
    {
      auto a0 = CudaAllocator(0, GetParam());
      auto a1 = CudaAllocator(1, "expandable_segments:false");
      ASSERT_TRUE(a0 && a1);
      // Before: a large block and a small one (two reservations when expandable).
      void* before = a0->allocate(6 * kMiB);
      void* small = a0->allocate(64 * kKiB);
      const int64_t calls = SetAccessCalls(*a0);
      ASSERT_EQ(a0->enable_peer_access(1), absl::OkStatus());
      // One cuMemSetAccess per mapped range: the two reservations' runs.
      EXPECT_EQ(SetAccessCalls(*a0) - calls, expandable ? 2 : 0);
      ASSERT_EQ(a0->enable_peer_access(1), absl::OkStatus());  // idempotent
      EXPECT_EQ(SetAccessCalls(*a0) - calls, expandable ? 2 : 0);
      // After: a new map (or segment) must grant the peer by itself.
      void* after = a0->allocate(30 * kMiB);

      void* q = a1->allocate(30 * kMiB);
      ASSERT_EQ(CudaMemsetSync(1, q, 0x5a, 30 * kMiB), absl::OkStatus());
      ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
      EXPECT_EQ(cudaMemcpyPeer(before, 0, q, 1, 6 * kMiB), cudaSuccess);
      EXPECT_EQ(cudaMemcpyPeer(after, 0, q, 1, 30 * kMiB), cudaSuccess);
      // A kernel of device 1 (a memset on its legacy stream) on device 0's memory.
      EXPECT_EQ(cudaMemset(small, 0x33, 64 * kKiB), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
      ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
      ExpectBytes(before, 6 * kMiB, 0x5a);
      ExpectBytes(after, 30 * kMiB, 0x5a);
      ExpectBytes(small, 64 * kKiB, 0x33);
      for (void* p : {before, small, after}) a0->free(p);
      a1->free(q);
      EXPECT_TRUE(a0->validate().ok()) << a0->validate();
      a0->empty_cache();
    }
    EXPECT_EQ(devmem_fake_cuda_live("mappings"), 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(Segments, FakeCudaPeerTest, fake_cuda_test::SegmentKinds(),
                         fake_cuda_test::SegmentKindName);

TEST(FakeCudaPeerErrorsTest, BadPeersAreErrorsNamingTheDeviceAndThePeer) {
  auto a0 = CudaAllocator(0, "expandable_segments:true");
  ASSERT_TRUE(a0);
  void* p = a0->allocate(4 * kMiB);
  const int64_t calls = SetAccessCalls(*a0);
  absl::Status self = a0->enable_peer_access(0);
  EXPECT_EQ(self.code(), absl::StatusCode::kInvalidArgument) << self;
  EXPECT_TRUE(absl::StrContains(self.message(), "cuda:0: enable_peer_access(cuda:0)"))
      << self;
  absl::Status none = a0->enable_peer_access(7);
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument) << none;
  EXPECT_TRUE(absl::StrContains(none.message(), "cuda:7 does not exist")) << none;
  {
    ScopedEnv no_peer("DEVMEM_FAKE_CUDA_NO_PEER", "1");
    absl::Status cannot = a0->enable_peer_access(1);
    EXPECT_EQ(cannot.code(), absl::StatusCode::kFailedPrecondition) << cannot;
    EXPECT_TRUE(absl::StrContains(cannot.message(), "cudaDeviceCanAccessPeer is 0"))
        << cannot;
  }
  EXPECT_EQ(SetAccessCalls(*a0), calls);  // nothing was granted
  int can = -1;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 1, 0), cudaSuccess);
  EXPECT_EQ(can, 1);
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 0, 0), cudaSuccess);
  EXPECT_EQ(can, 0);
  a0->free(p);
  a0->empty_cache();
}

}  // namespace
}  // namespace devmem
