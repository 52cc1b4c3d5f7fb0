// tests/fake_cuda/fake_cuda_streams_test.cc: the fake's streams as a driver has them
// (fake_cuda.cc, "Streams"): a destroyed stream's handle comes back from the next
// cudaStreamCreateWithFlags while the old stream still runs the work queued on it,
// and the new stream does not wait for that work. This is what makes a cache keyed by
// the raw stream value unsafe across stream destruction (the next allocation on the
// new stream may get a block the old stream's kernels still use).
#include <cuda_runtime_api.h>

#include <future>

#include "gtest/gtest.h"
#include "tests/fake_cuda/fake_cuda.h"

namespace {

void CUDART_CB WaitFor(void* arg) { static_cast<std::shared_future<void>*>(arg)->wait(); }

TEST(FakeCudaStreamsTest, ADestroyedStreamsHandleComesBackWhileItStillRuns) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  cudaStream_t old_stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&old_stream, cudaStreamNonBlocking), cudaSuccess);
  // A "kernel" that runs until released.
  ASSERT_EQ(cudaLaunchHostFunc(old_stream, WaitFor, &released), cudaSuccess);
  cudaEvent_t old_work = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&old_work, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(old_work, old_stream), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(old_stream), cudaSuccess);  // returns at once

  cudaStream_t new_stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&new_stream, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(new_stream, old_stream);  // the same handle value, another stream
  EXPECT_EQ(cudaEventQuery(old_work), cudaErrorNotReady);  // the old work still runs
  // The new stream is not behind it: its own work completes while the old one waits.
  EXPECT_EQ(cudaStreamSynchronize(new_stream), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(old_work), cudaErrorNotReady);

  release.set_value();
  EXPECT_EQ(cudaEventSynchronize(old_work), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(old_work), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(new_stream), cudaSuccess);
  EXPECT_EQ(devmem_fake_cuda_live("streams"), 0u);
  EXPECT_EQ(devmem_fake_cuda_live("events"), 0u);
}

}  // namespace
