// tests/fake_cuda/fake_cuda_capture_test.cc: CUDA graph capture on the fake runtime
// (tests/fake_cuda/fake_cuda_graphs.cc).
//
//   FakeCudaCaptureModelTest  the fake models capture as <cuda_runtime_api.h> says:
//                             prohibited calls fail and invalidate the capture, the
//                             interaction modes, captured work and events.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <thread>

#include "gtest/gtest.h"
#include "tests/fake_cuda/fake_cuda.h"

namespace devmem {
namespace {

size_t Live(const char* what) { return devmem_fake_cuda_live(what); }

cudaStreamCaptureStatus CaptureStatus(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaStreamIsCapturing(s, &status), cudaSuccess);
  return status;
}

// Ends the capture on `s` and destroys the graph; the status EndCapture returned.
cudaError_t EndCapture(cudaStream_t s) {
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(s, &graph);
  if (graph != nullptr) EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
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

}  // namespace
}  // namespace devmem
