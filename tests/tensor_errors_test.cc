// tests/tensor_errors_test.cc: bad input throws an exception whose message names the
// shapes, dims, dtypes or devices involved, and leaks nothing: the device's live block
// count is the same after the throw (ExpectInvalid checks both).
#include <gtest/gtest.h>

#include "tensor/errors.h"
#include "tensor/factories.h"
#include "tensor/kernels.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor_test_util.h"

namespace devmem {
namespace {

using tensor_test::ExpectInvalid;
using tensor_test::kOtherSimDevice;
using tensor_test::kSimDevice;
using tensor_test::SimDeviceTest;

class TensorErrorsTest : public SimDeviceTest {};

TEST_F(TensorErrorsTest, OutOfRangeSlicesAndDims) {
  const Tensor x = zeros({32, 2}, On());
  ExpectInvalid(*this, {"slice", "[0, 40)", "dim 0", "size 32", "[32, 2]"},
                [&] { x.slice(0, 0, 40); });
  ExpectInvalid(*this, {"slice", "[-33, 5)", "dim 0", "[32, 2]"},
                [&] { x.slice(0, -33, 5); });
  ExpectInvalid(*this, {"slice", "step 0", "[32, 2]"}, [&] { x.slice(1, 0, 2, 0); });
  ExpectInvalid(*this, {"slice", "dim 2", "[32, 2]", "[-2, 1]"},
                [&] { x.slice(2, 0, 1); });
  ExpectInvalid(*this, {"select", "index 2", "dim 1", "[32, 2]"},
                [&] { x.select(1, 2); });
  ExpectInvalid(*this, {"narrow", "length 5", "dim 1", "[32, 2]"},
                [&] { x.narrow(1, 0, 5); });
  ExpectInvalid(*this, {"transpose", "dim -3", "[32, 2]"}, [&] { x.transpose(0, -3); });
  ExpectInvalid(*this, {"permute", "repeat dim 0", "[32, 2]"}, [&] {
    x.permute({0, 0});
  });
  ExpectInvalid(*this, {"squeeze", "dim 1", "[32, 2]", "size 2"}, [&] { x.squeeze(1); });
  ExpectInvalid(*this, {"unsqueeze", "dim 4", "[32, 2]"}, [&] { x.unsqueeze(4); });
  ExpectInvalid(*this, {"sum", "dim 5", "[32, 2]"}, [&] { sum(x, 5); });
}

TEST_F(TensorErrorsTest, ShapeMismatches) {
  const Tensor a = zeros({2, 3}, On());
  const Tensor b = zeros({4}, On());
  ExpectInvalid(*this, {"add", "[2, 3]", "[4]", "broadcast"}, [&] { add(a, b); });
  ExpectInvalid(*this, {"mul", "[2, 3]", "[4]"}, [&] { mul(a, b); });
  ExpectInvalid(*this, {"matmul", "[2, 3]", "[4, 5]", "3 != 4"}, [&] {
    matmul(a, zeros({4, 5}, On()));
  });
  ExpectInvalid(*this, {"matmul", "2-D", "[4]"}, [&] { matmul(a, b); });
  ExpectInvalid(*this, {"sub_", "[2, 3]", "[3, 3]"}, [&] {
    Tensor small = zeros({2, 3}, On());
    small.sub_(zeros({3, 3}, On()));  // would have to grow the tensor written
  });
  ExpectInvalid(*this, {"sigmoid_cross_entropy", "[32, 1]", "[32]"}, [&] {
    sigmoid_cross_entropy(zeros({32, 1}, On()), zeros({32}, On()));
  });
  ExpectInvalid(*this, {"broadcast_to", "[2, 3]", "[3, 3]"}, [&] {
    a.broadcast_to({3, 3});
  });
  ExpectInvalid(*this, {"view", "[7]", "[2, 3]"}, [&] { a.view({7}); });
  ExpectInvalid(*this, {"linear", "bias", "[5]", "[2, 4]"}, [&] {
    linear(a, zeros({4, 3}, On()), zeros({5}, On()));
  });
  ExpectInvalid(*this, {"from_vector", "[2, 2]"}, [&] {
    from_vector<float>({1, 2, 3}, {2, 2}, kSimDevice);
  });
}

TEST_F(TensorErrorsTest, DTypeMismatches) {
  const Tensor f = zeros({2, 2}, On(DType::kFloat32));
  const Tensor d = zeros({2, 2}, On(DType::kFloat64));
  ExpectInvalid(*this, {"add", "float32", "float64"}, [&] { add(f, d); });
  ExpectInvalid(*this, {"matmul", "float32", "float64"}, [&] { matmul(f, d); });
  ExpectInvalid(*this, {"copy_", "float32", "float64"}, [&] {
    Tensor g = f;
    g.copy_(d);
  });
  ExpectInvalid(*this, {"item", "float32", "float64"},
                [&] { f.select(0, 0).select(0, 0).item<double>(); });
  ExpectInvalid(*this, {"sigmoid", "int64"},
                [&] { sigmoid(zeros({2}, On(DType::kInt64))); });
  ExpectInvalid(*this, {"randn", "int32"}, [&] {
    Generator gen(1);
    randn({2}, gen, On(DType::kInt32));
  });
}

TEST_F(TensorErrorsTest, NonViewableReshapeSaysToCopyExplicitly) {
  const Tensor x = zeros({2, 3}, On());
  ExpectInvalid(*this,
                {"view", "[6]", "[3, 2]", "strides [1, 3]", "contiguous()", "clone()"},
                [&] { x.t().view({6}); });
  ExpectInvalid(*this, {"view", "contiguous()"}, [&] { x.t().reshape({-1}); });
  ExpectInvalid(*this, {"flatten", "[6]", "contiguous()"}, [&] { x.t().flatten(); });
  // The explicit copy makes it work.
  EXPECT_EQ(x.t().contiguous().view({6}).shape(), IntList({6}));
}

TEST_F(TensorErrorsTest, OpsAcrossDevices) {
  ScopedAllocatorOverride other(tensor_test::MakeSmallSim(kOtherSimDevice.index));
  const Tensor a = zeros({2, 2}, On());
  const Tensor b = zeros({2, 2}, {.device = kOtherSimDevice});
  ExpectInvalid(*this, {"add", "different devices", "sim:11", "sim:12"},
                [&] { add(a, b); });
  ExpectInvalid(*this, {"matmul", "sim:11", "sim:12"}, [&] { matmul(a, b); });
  ExpectInvalid(*this, {"sub_", "sim:11", "sim:12"}, [&] {
    Tensor w = a;
    w.sub_(b, 0.1);
  });
  ExpectInvalid(*this, {"sigmoid_cross_entropy", "sim:11", "sim:12"},
                [&] { sigmoid_cross_entropy(a, b); });
  EXPECT_EQ(other.allocator().stats().allocation[kAggregatePool].current, 1);
}

TEST_F(TensorErrorsTest, InPlaceWritesThatWouldBeAmbiguous) {
  const Tensor row = zeros({1, 4}, On());
  ExpectInvalid(*this, {"add_", "broadcast view", "[3, 4]", "[0, 1]"}, [&] {
    Tensor wide = row.broadcast_to({3, 4});
    wide.add_(1.0);
  });
  const Tensor x = zeros({8}, On());
  ExpectInvalid(*this, {"copy_", "overlaps"}, [&] {
    Tensor dst = x.slice(0, 0, 4);
    dst.copy_(x.slice(0, 2, 6));
  });
  ExpectInvalid(*this, {"fill_", "int32", "1.5"},
                [&] { zeros({2}, On(DType::kInt32)).fill_(1.5); });
  ExpectInvalid(*this, {"undefined"}, [&] { relu(Tensor()); });
}

// The constructor bounds every element with checked arithmetic: strides whose
// (size - 1) * stride overflows int64 are refused, not wrapped into the buffer, and so
// is an offset past the end (an empty view may sit exactly at the end).
TEST_F(TensorErrorsTest, ConstructorRefusesViewsOutsideTheStorage) {
  const Tensor base = zeros({4}, On());  // 16 bytes
  const StoragePtr& s = base.storage();
  constexpr int64_t k2to62 = int64_t{1} << 62;
  ExpectInvalid(*this, {"Tensor", "[3]", "[4611686018427387904]", "outside the storage"},
                [&] { Tensor(s, DType::kFloat32, {3}, {k2to62}); });
  ExpectInvalid(*this, {"Tensor", "outside the storage"}, [&] {
    Tensor(s, DType::kFloat32, {2, 2}, {k2to62, k2to62});  // sum overflows too
  });
  ExpectInvalid(*this, {"Tensor", "[2]", "[1]"},
                [&] { Tensor(s, DType::kFloat32, {2}, {1}, INT64_MAX); });
  ExpectInvalid(*this, {"Tensor", "offset 5", "starts past the end"},
                [&] { Tensor(s, DType::kFloat32, {0}, {1}, 5); });
  ExpectInvalid(*this, {"Tensor", "reaches element 4"},
                [&] { Tensor(s, DType::kFloat32, {2}, {1}, 3); });
  ExpectInvalid(*this, {"Tensor", "negative stride"},
                [&] { Tensor(s, DType::kFloat32, {0, 2}, {1, -1}); });
  // What fits is accepted: the last element, and an empty view at the end.
  EXPECT_EQ(Tensor(s, DType::kFloat32, {2}, {3}).numel(), 2);
  EXPECT_EQ(Tensor(s, DType::kFloat32, {0}, {1}, 4).numel(), 0);
}

// A view whose indices share elements cannot be written in place, whatever made it:
// broadcasting (stride 0) or strides given to the constructor that overlap.
TEST_F(TensorErrorsTest, InPlaceWritesToSelfOverlappingViewsAreRefused) {
  const Tensor base = zeros({8}, On());
  const StoragePtr& s = base.storage();
  for (const auto& [shape, strides] :
       std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{2, 2}, {1, 1}}, {{3, 2}, {1, 2}}, {{2, 4}, {2, 1}}}) {
    Tensor v(s, DType::kFloat32, shape, strides);
    ExpectInvalid(*this, {"fill_", "overlap", ShapeString(strides)}, [&] { v.fill_(1); });
    ExpectInvalid(*this, {"add_", "overlap"}, [&] { v.add_(1.0); });
  }
  // Distinct elements in any stride order are fine, and the write lands.
  Tensor ok(s, DType::kFloat32, {2, 2}, {1, 4});
  ok.fill_(3);
  EXPECT_EQ(base.to_vector<float>(), (std::vector<float>{3, 3, 0, 0, 3, 3, 0, 0}));
}

TEST_F(TensorErrorsTest, DeviceWithoutKernelsIsNamed) {
  // Where cuda/ registered kernels, take them away for this test (and put them back).
  struct Unregistered {
    Kernels* saved = nullptr;
    Unregistered() {
      try {
        saved = &KernelsFor(DeviceId{DeviceType::kCuda, 3}, "probe");
      } catch (const UnsupportedDeviceError&) {
      }
      RegisterKernels(DeviceType::kCuda, nullptr);
    }
    ~Unregistered() { RegisterKernels(DeviceType::kCuda, saved); }
  } unregistered;
  // Foreign memory labelled cuda:3 (never touched: the op must refuse first).
  float host[4] = {};
  const Tensor t = from_blob(host, {4}, DType::kFloat32, DeviceId{DeviceType::kCuda, 3});
  const int64_t live = LiveBlocks();
  try {
    relu(t);
    ADD_FAILURE() << "relu on a device without kernels did not throw";
  } catch (const UnsupportedDeviceError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("relu"), std::string::npos) << message;
    EXPECT_NE(message.find("cuda:3"), std::string::npos) << message;
  }
  EXPECT_EQ(LiveBlocks(), live);
}

}  // namespace
}  // namespace devmem
