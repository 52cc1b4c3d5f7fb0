// tests/tensor_streams_test.cc: the tensor layer's current stream (tensor/stream.h) on
// a sim device, whose streams are real queues: StreamGuard scopes the stream per thread
// and device, outputs are allocated on it, host kernels run in its order, and
// record_stream is what keeps a tensor used on another stream from being reused
// early (the documented user error, shown corrupting data without it).
#include <gtest/gtest.h>

#include <latch>
#include <thread>
#include <vector>

#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"
#include "tests/tensor_test_util.h"

namespace devmem {
namespace {

using tensor_test::kOtherSimDevice;
using tensor_test::kSimDevice;
using tensor_test::SimDeviceTest;

// A sim stream of the fixture's device, blocked until Release(): work queued on it
// after the constructor waits, so a test can look at memory before that work runs.
class BlockedStream {
 public:
  explicit BlockedStream(CachingAllocator& alloc) : alloc_(alloc) {
    stream_ = *alloc_.backend().create_stream();
    const absl::Status s =
        alloc_.backend().launch_host_fn(stream_, [this] { gate_.wait(); });
    EXPECT_TRUE(s.ok()) << s;
  }
  ~BlockedStream() {
    Release();
    alloc_.backend().synchronize_stream(stream_);
    alloc_.empty_cache();  // nothing may stay cached on a stream that is destroyed
    alloc_.backend().destroy_stream(stream_);
  }
  void Release() {
    if (!released_) gate_.count_down();
    released_ = true;
  }
  Stream stream() const { return stream_; }

 private:
  CachingAllocator& alloc_;
  Stream stream_;
  std::latch gate_{1};
  bool released_ = false;
};

class TensorStreamsTest : public SimDeviceTest {};

// DestroyStream retires the stream first: memory cached on it is released later
// without synchronizing the destroyed stream (the sim ends the process on a stream it
// does not know), and the default stream is current again.
TEST_F(TensorStreamsTest, DestroyStreamRetiresTheStreamsMemory) {
  const Stream side = *alloc().backend().create_stream();
  SetCurrentStream(kSimDevice, side);
  { Tensor t = zeros({1024}, On()); }  // freed: cached on `side`
  EXPECT_GT(alloc().stats().reserved_bytes[kAggregatePool].current, 0);
  DestroyStream(kSimDevice, side);
  EXPECT_EQ(CurrentStream(kSimDevice), Stream{});
  alloc().empty_cache();
  EXPECT_EQ(alloc().stats().reserved_bytes[kAggregatePool].current, 0);
  ExpectInvalid(*this, {"release_stream", "default stream"},
                [] { DestroyStream(kSimDevice, Stream{}); });
}

TEST_F(TensorStreamsTest, GuardSetsTheStreamPerDeviceAndThreadAndRestoresIt) {
  EXPECT_EQ(CurrentStream(kSimDevice), Stream{});
  {
    StreamGuard outer(kSimDevice, Stream{7});
    EXPECT_EQ(CurrentStream(kSimDevice), Stream{7});
    EXPECT_EQ(CurrentStream(kOtherSimDevice), Stream{}) << "another device is unaffected";
    {
      StreamGuard inner(kSimDevice, Stream{9});
      EXPECT_EQ(inner.previous(), Stream{7});
      EXPECT_EQ(CurrentStream(kSimDevice), Stream{9});
      Stream seen{1};
      std::thread([&] { seen = CurrentStream(kSimDevice); }).join();
      EXPECT_EQ(seen, Stream{}) << "another thread has its own current stream";
    }
    EXPECT_EQ(CurrentStream(kSimDevice), Stream{7});
  }
  EXPECT_EQ(CurrentStream(kSimDevice), Stream{});
}

TEST_F(TensorStreamsTest, OutputsAreAllocatedOnTheCurrentStream) {
  BlockedStream side(alloc());
  side.Release();
  Tensor a = ones({4, 4}, On());
  EXPECT_EQ(a.storage()->stream(), Stream{});
  StreamGuard guard(kSimDevice, side.stream());
  Tensor b = add(a, a);
  Tensor c = a.clone();
  EXPECT_EQ(b.storage()->stream(), side.stream());
  EXPECT_EQ(c.storage()->stream(), side.stream());
  a.record_stream(side.stream());  // used on `side` by add and clone
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(16, 2.0f));
}

TEST_F(TensorStreamsTest, HostKernelsRunInTheStreamsOrder) {
  BlockedStream side(alloc());
  StreamGuard guard(kSimDevice, side.stream());
  Tensor t = zeros({256}, On());  // queued behind the blocked work: not yet run
  t.fill_(7.0);
  Tensor u = mul(t, 2.0);
  // Nothing ran: the stream is still blocked (sim memory is host memory, so the test
  // may look; the stream's thread touches it only after Release).
  const float* raw = static_cast<const float*>(u.data_ptr());
  EXPECT_EQ(u.storage()->stream(), side.stream());
  side.Release();
  // to_vector waits for the stream (copy_to_host runs in its order too).
  EXPECT_EQ(u.to_vector<float>(), std::vector<float>(256, 14.0f));
  EXPECT_EQ(raw[0], 14.0f);
}

TEST_F(TensorStreamsTest, AQueuedKernelHasNotRunBeforeItsStreamReachesIt) {
  BlockedStream side(alloc());
  Tensor t = zeros({64}, On());  // on the default stream: filled at once
  {
    StreamGuard guard(kSimDevice, side.stream());
    t.fill_(3.0);  // queued on the blocked stream
    t.record_stream(side.stream());
  }
  EXPECT_EQ(static_cast<const float*>(t.data_ptr())[0], 0.0f)
      << "the fill ran before the work queued ahead of it on its stream";
  side.Release();
  SynchronizeStream(kSimDevice, side.stream());
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>(64, 3.0f));
}

// The user error of stream.h: t is used on `side`, then dropped without
// record_stream. The allocator hands its block to the next allocation on the default
// stream at once, and side's pending kernel then overwrites that new tensor.
TEST_F(TensorStreamsTest, WithoutRecordStreamThePendingKernelCorruptsTheNextTensor) {
  BlockedStream side(alloc());
  Tensor t = zeros({1024}, On());
  void* p = t.data_ptr();
  {
    StreamGuard guard(kSimDevice, side.stream());
    t.fill_(1.0);  // pending on `side`
  }
  t.reset();  // no record_stream: the user error
  Tensor u = full({1024}, 5.0, On());
  ASSERT_EQ(u.data_ptr(), p) << "the block was reused at once, while side still uses it";
  side.Release();
  SynchronizeStream(kSimDevice, side.stream());
  EXPECT_EQ(u.to_vector<float>()[0], 1.0f) << "side's fill landed in u";
}

TEST_F(TensorStreamsTest, RecordStreamKeepsTheBlockUntilTheOtherStreamPassedIt) {
  BlockedStream side(alloc());
  Tensor t = zeros({1024}, On());
  void* p = t.data_ptr();
  {
    StreamGuard guard(kSimDevice, side.stream());
    t.fill_(1.0);
  }
  t.record_stream(side.stream());
  t.reset();
  Tensor u = full({1024}, 5.0, On());
  EXPECT_NE(u.data_ptr(), p) << "reused while side's fill was pending";
  side.Release();
  SynchronizeStream(kSimDevice, side.stream());
  EXPECT_EQ(u.to_vector<float>(), std::vector<float>(1024, 5.0f));
  // Once side passed the fill, the block is free again (its event completed).
  Tensor v = empty({1024}, On());
  EXPECT_EQ(v.data_ptr(), p);
}

TEST_F(TensorStreamsTest, IntegerDivisionByZeroOnAStreamThrowsAtTheCall) {
  BlockedStream side(alloc());
  side.Release();
  StreamGuard guard(kSimDevice, side.stream());
  Tensor a = full({4}, 6.0, On(DType::kInt32));
  Tensor z = zeros({4}, On(DType::kInt32));
  EXPECT_THROW(div(a, z), InvalidArgumentError);
  EXPECT_EQ(div(a, 3.0).to_vector<int32_t>(), std::vector<int32_t>(4, 2));
}

TEST_F(TensorStreamsTest, CopiesToAndFromCpuRunOnTheSimStream) {
  BlockedStream side(alloc());
  StreamGuard guard(kSimDevice, side.stream());
  Tensor s = full({8}, 2.5, On());
  Tensor c = s.to(DeviceId{});  // waits for nothing: queued behind the blocked work
  EXPECT_EQ(c.device(), DeviceId{});
  side.Release();
  SynchronizeStream(kSimDevice, side.stream());
  EXPECT_EQ(c.to_vector<float>(), std::vector<float>(8, 2.5f));
  Tensor back = c.to(kSimDevice);
  EXPECT_EQ(back.storage()->stream(), side.stream());
  EXPECT_EQ(back.to_vector<float>(), std::vector<float>(8, 2.5f));
}

TEST_F(TensorStreamsTest, RecordStreamOfAnUndefinedTensorThrows) {
  EXPECT_THROW(Tensor().record_stream(Stream{}), InvalidArgumentError);
}

}  // namespace
}  // namespace devmem
