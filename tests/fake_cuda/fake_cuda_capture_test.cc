// tests/fake_cuda/fake_cuda_capture_test.cc: CUDA graph capture on the fake runtime
// (tests/fake_cuda/fake_cuda_graphs.cc) and the caching allocator's private pools
// (allocator/pool_id.h, allocator/device_pool_private.cc).
//
//   FakeCudaCaptureModelTest  the fake models capture as <cuda_runtime_api.h> says:
//                             prohibited calls fail and invalidate the capture, the
//                             interaction modes, captured work and events.
//   FakeCudaGraphPoolTest     CachingAllocator with backend:cuda during a global-mode
//                             capture, regular and expandable segments: a miss keeps the
//                             capture, the poller and empty_cache neither query nor
//                             synchronize, memory freed in the captured region stays in
//                             the private pool, release_pool gives it back, stats and
//                             snapshots break it out, misuse is a clear error.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "allocator/backend.h"
#include "allocator/caching_allocator.h"
#include "allocator/errors.h"
#include "allocator/pool_id.h"
#include "gtest/gtest.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/fake_cuda/fake_cuda_test_util.h"

namespace devmem {
namespace {

using fake_cuda_test::Live;

cudaStream_t ToCuda(Stream s) { return reinterpret_cast<cudaStream_t>(s.handle); }

cudaStreamCaptureStatus CaptureStatus(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  return status;
}

// Ends the capture on `s` and destroys the graph; the status EndCapture returned.
cudaError_t EndCapture(cudaStream_t s) {
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(s, &graph);
  if (graph != nullptr) {
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  }
  cudaGetLastError();
  return err;
}

// ---------------------------------------------------------------------------------
// FakeCudaCaptureModelTest

class FakeCudaCaptureModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    EXPECT_EQ(cudaStreamDestroy(s_), cudaSuccess);
    EXPECT_EQ(Live("captures"), 0u);
    EXPECT_EQ(Live("graphs"), 0u);
  }
  cudaStream_t s_ = nullptr;
};

TEST_F(FakeCudaCaptureModelTest, CudaMallocDuringGlobalCaptureFailsAndInvalidatesIt) {
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(CaptureStatus(s_), cudaStreamCaptureStatusActive);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 1 << 20), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(CaptureStatus(s_), cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(EndCapture(s_), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(CaptureStatus(s_), cudaStreamCaptureStatusNone);
}

TEST_F(FakeCudaCaptureModelTest, RelaxedThreadModeMayAllocateDuringCapture) {
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);  // the default, given back
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 1 << 20), cudaSuccess);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(CaptureStatus(s_), cudaStreamCaptureStatusActive);
  EXPECT_EQ(EndCapture(s_), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaSuccess);  // after the capture: allowed again
}

TEST_F(FakeCudaCaptureModelTest, OtherThreadsAreBoundByGlobalCapturesOnly) {
  void* p = nullptr;
  auto malloc_elsewhere = [&p] {
    cudaError_t err = cudaSuccess;
    std::thread([&] { err = cudaMalloc(&p, 4096); }).join();
    return err;
  };
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(malloc_elsewhere(), cudaSuccess);  // a thread-local capture ignores others
  EXPECT_EQ(cudaFree(p), cudaErrorStreamCaptureUnsupported);  // but binds its own thread
  EXPECT_EQ(EndCapture(s_), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaFree(p), cudaSuccess);

  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(malloc_elsewhere(), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(EndCapture(s_), cudaErrorStreamCaptureInvalidated);
}

TEST_F(FakeCudaCaptureModelTest, CapturedWorkRunsOnReplayAndCapturedEventsCannotBeQueried) {
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), cudaSuccess);
  int runs = 0;
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(
                s_, [](void* n) { ++*static_cast<int*>(n); }, &runs),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event, s_), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(event), cudaErrorCapturedEvent);
  EXPECT_EQ(cudaEventSynchronize(event), cudaErrorCapturedEvent);
  cudaGetLastError();
  EXPECT_EQ(CaptureStatus(s_), cudaStreamCaptureStatusActive);  // the query broke nothing
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s_, &graph), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  EXPECT_EQ(runs, 0);  // captured, not run
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s_), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s_), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
  EXPECT_EQ(runs, 2);  // one per replay
  EXPECT_EQ(cudaEventQuery(event), cudaErrorCapturedEvent);  // until recorded again
  ASSERT_EQ(cudaEventRecord(event, s_), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(event), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(event), cudaSuccess);
  cudaGetLastError();
}

TEST_F(FakeCudaCaptureModelTest, SynchronizingACapturingStreamInvalidatesTheCapture) {
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s_), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(CaptureStatus(s_), cudaStreamCaptureStatusInvalidated);
  unsigned long long id = 0;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaStreamGetCaptureInfo(s_, &status, &id), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(EndCapture(s_), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(EndCapture(s_), cudaErrorStreamCaptureUnmatched);  // nothing to end
}

// ---------------------------------------------------------------------------------
// FakeCudaGraphPoolTest

constexpr PoolId kPool{1, 0};

class FakeCudaGraphPoolTest : public fake_cuda_test::CudaAllocatorTest {
 protected:
  void SetUp() override {
    CudaAllocatorTest::SetUp();
    if (HasFatalFailure()) return;
    s_ = NewStream();
    eager_ = NewStream();
    ASSERT_FALSE(HasFailure());
    baseline_ = Live("used_bytes");
  }
  void TearDown() override {
    if (!alloc_) return;
    ExpectValidAndEmptied();
    alloc_->backend().destroy_stream(s_);
    alloc_->backend().destroy_stream(eager_);
    alloc_.reset();
    EXPECT_EQ(Live("captures"), 0u);
    EXPECT_EQ(Live("allocations") + Live("handles"), 0u);
  }
  // PyTorch's capture_begin: the pool first, then the capture (global mode, its default).
  void BeginCapture() {
    const Stream s = s_;
    alloc_->begin_allocate_to_pool(kPool, [s](Stream x) { return x == s; });
    ASSERT_EQ(cudaStreamBeginCapture(ToCuda(s_), cudaStreamCaptureModeGlobal), cudaSuccess);
  }
  // ... and capture_end: the capture, then the pool.
  void EndCaptureAndPool() {
    EXPECT_EQ(EndCapture(ToCuda(s_)), cudaSuccess) << "the capture was broken";
    alloc_->end_allocate_to_pool(kPool);
  }
  Stream s_;
  Stream eager_;
  size_t baseline_ = 0;
};

TEST_P(FakeCudaGraphPoolTest, CacheMissDuringGlobalCaptureKeepsTheCapture) {
  BeginCapture();
  void* small = alloc_->allocate(64 * kKiB, s_);   // misses: new memory
  void* large = alloc_->allocate(8 * kMiB, s_);
  EXPECT_EQ(CaptureStatus(ToCuda(s_)), cudaStreamCaptureStatusActive);
  EXPECT_TRUE(alloc_->validate().ok()) << alloc_->validate();
  alloc_->free(small);
  alloc_->free(large);
  EndCaptureAndPool();
  alloc_->release_pool(kPool);
}

TEST_P(FakeCudaGraphPoolTest, MissOnACapturingStreamWithoutAPoolKeepsTheCapture) {
  // A capture devmem was not told of (no private pool): the backend's capture query
  // still keeps the miss from breaking it.
  ASSERT_EQ(cudaStreamBeginCapture(ToCuda(s_), cudaStreamCaptureModeGlobal), cudaSuccess);
  void* p = alloc_->allocate(8 * kMiB, s_);
  EXPECT_EQ(CaptureStatus(ToCuda(s_)), cudaStreamCaptureStatusActive);
  EXPECT_EQ(EndCapture(ToCuda(s_)), cudaSuccess);
  alloc_->free(p);
}

TEST_P(FakeCudaGraphPoolTest, PollerAndEmptyCacheDuringCaptureNeitherQueryNorSync) {
  // Before the capture: a cached segment (empty_cache would free it) and a block the
  // captured work will use on s (record_stream): its free inside the capture would
  // record an event there, a captured event, which may never be queried.
  alloc_->free(alloc_->allocate(8 * kMiB, eager_));
  void* used = alloc_->allocate(2 * kMiB, eager_);
  alloc_->record_stream(used, s_);
  BeginCapture();
  alloc_->free(used);
  alloc_->process_events();  // the runtime's poller
  alloc_->empty_cache();
  alloc_->trim(0);
  EXPECT_EQ(CaptureStatus(ToCuda(s_)), cudaStreamCaptureStatusActive);
  EXPECT_TRUE(alloc_->validate().ok()) << alloc_->validate();
  EXPECT_GT(alloc_->stats().pending_bytes[kAggregatePool].current, 0);
  EndCaptureAndPool();
  // Now its event is recorded (outside the capture) and completes.
  alloc_->backend().synchronize_stream(s_);
  alloc_->process_events();
  alloc_->process_events();
  EXPECT_EQ(alloc_->stats().pending_bytes[kAggregatePool].current, 0);
  alloc_->release_pool(kPool);
}

TEST_P(FakeCudaGraphPoolTest, BlockFreedInTheCapturedRegionIsNeverHandedToEagerWork) {
  // A shared block cached on s before the capture is not used by the capture either.
  // The same for a small block, which a thread cache keeps.
  void* before = alloc_->allocate(4 * kMiB, s_);
  void* small_before = alloc_->allocate(64 * kKiB, s_);
  alloc_->free(before);
  alloc_->free(small_before);
  BeginCapture();
  void* p = alloc_->allocate(4 * kMiB, s_);
  EXPECT_NE(p, before);
  void* small = alloc_->allocate(64 * kKiB, s_);
  EXPECT_NE(small, small_before);
  alloc_->free(small);
  alloc_->free(p);  // the graph's replays write p: it stays the pool's
  void* again = alloc_->allocate(4 * kMiB, s_);
  EXPECT_EQ(again, p);  // reused inside the capture, in capture order (as PyTorch)
  alloc_->free(again);
  EndCaptureAndPool();
  for (const Stream s : {s_, eager_}) {
    void* q = alloc_->allocate(4 * kMiB, s);
    const auto qa = reinterpret_cast<uintptr_t>(q);
    const auto pa = reinterpret_cast<uintptr_t>(p);
    EXPECT_TRUE(qa + 4 * kMiB <= pa || pa + 4 * kMiB <= qa)
        << "eager allocation on stream " << s.handle << " got the graph's memory";
    alloc_->free(q);
  }
  EXPECT_TRUE(alloc_->validate().ok()) << alloc_->validate();
  alloc_->release_pool(kPool);
}

TEST_P(FakeCudaGraphPoolTest, ReleasePoolReturnsItsMemory) {
  BeginCapture();
  void* kept = alloc_->allocate(4 * kMiB, s_);  // outlives the pool's release
  alloc_->free(alloc_->allocate(64 * kKiB, s_));
  EndCaptureAndPool();
  const int64_t reserved = alloc_->stats().reserved_bytes[kAggregatePool].current;
  alloc_->release_pool(kPool);
  // The unused small segment went back at once; the large one waits for `kept`.
  EXPECT_EQ(alloc_->stats().reserved_bytes[kAggregatePool].current, reserved - 2 * kMiB);
  EXPECT_EQ(alloc_->stats().private_pools, 1);
  alloc_->free(kept);
  alloc_->empty_cache();
  EXPECT_EQ(alloc_->stats().private_pools, 0);
  EXPECT_EQ(alloc_->stats().private_reserved_bytes, 0);
  EXPECT_EQ(alloc_->stats().reserved_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(Live("used_bytes"), baseline_);
}

TEST_P(FakeCudaGraphPoolTest, PrivatePoolBytesAreBrokenOut) {
  void* eager = alloc_->allocate(4 * kMiB, eager_);
  BeginCapture();
  void* p = alloc_->allocate(4 * kMiB, s_);
  DeviceStats st = alloc_->stats();
  EXPECT_EQ(st.private_pools, 1);
  EXPECT_EQ(st.private_reserved_bytes, 20 * static_cast<int64_t>(kMiB));  // one segment
  EXPECT_EQ(st.private_allocated_bytes, 4 * static_cast<int64_t>(kMiB));
  EXPECT_EQ(st.allocated_bytes[kAggregatePool].current, 8 * static_cast<int64_t>(kMiB));
  EndCaptureAndPool();
  const AllocatorSnapshot snap = alloc_->snapshot();
  int private_segments = 0;
  for (const SegmentInfo& s : snap.segments) {
    if (s.private_pool == kPool) ++private_segments;
  }
  EXPECT_EQ(private_segments, 1);
  EXPECT_EQ(snap.stats.private_reserved_bytes, 20 * static_cast<int64_t>(kMiB));
  alloc_->free(p);
  EXPECT_EQ(alloc_->stats().private_allocated_bytes, 0);
  alloc_->free(eager);
  alloc_->release_pool(kPool);
  EXPECT_EQ(alloc_->stats().private_pools, 0);
}

TEST_P(FakeCudaGraphPoolTest, MisuseIsAnErrorNamingThePool) {
  auto message_of = [](auto&& call) {
    try {
      call();
    } catch (const InvalidArgumentError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const PoolId other{7, 3};
  EXPECT_TRUE(absl::StrContains(message_of([&] { alloc_->end_allocate_to_pool(other); }),
                                "end_allocate_to_pool((7, 3))"));
  EXPECT_TRUE(absl::StrContains(message_of([&] { alloc_->release_pool(other); }),
                                "no such private pool"));
  EXPECT_TRUE(absl::StrContains(
      message_of([&] { alloc_->begin_allocate_to_pool(PoolId{}, [](Stream) { return true; }); }),
      "default pool"));
  alloc_->begin_allocate_to_pool(other, [](Stream) { return false; });
  const std::string in_use = message_of([&] { alloc_->release_pool(other); });
  EXPECT_TRUE(absl::StrContains(in_use, "release_pool((7, 3))")) << in_use;
  EXPECT_TRUE(absl::StrContains(in_use, "end_allocate_to_pool((7, 3)) first")) << in_use;
  alloc_->end_allocate_to_pool(other);
  EXPECT_TRUE(absl::StrContains(message_of([&] { alloc_->end_allocate_to_pool(other); }),
                                "no allocation to pool (7, 3) is under way"));
  alloc_->release_pool(other);
  EXPECT_TRUE(absl::StrContains(message_of([&] { alloc_->release_pool(other); }),
                                "no such private pool"));  // empty: forgotten at once
  EXPECT_TRUE(alloc_->validate().ok()) << alloc_->validate();
}

INSTANTIATE_TEST_SUITE_P(Segments, FakeCudaGraphPoolTest, fake_cuda_test::SegmentKinds(),
                         fake_cuda_test::SegmentKindName);

}  // namespace
}  // namespace devmem
