// tests/tensor_ops_test.cc: every op against a float64 reference computed here with
// plain loops (long double where the op itself runs in double), with the error bound
// each comparison allows stated next to it. u = 2^-24 is float32's unit roundoff
// (half an ulp of 1); 2^-53 is float64's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor_test_util.h"

namespace devmem {
namespace {

using tensor_test::kSimDevice;
using tensor_test::SimDeviceTest;

constexpr double kU32 = 0x1p-24;  // float32 unit roundoff
constexpr double kU64 = 0x1p-53;  // float64 unit roundoff

std::vector<double> Values(const Tensor& t) {
  if (t.dtype() == DType::kFloat64) return t.to_vector<double>();
  const std::vector<float> f = t.to_vector<float>();
  return std::vector<double>(f.begin(), f.end());
}

// The same values as a float64 tensor on the same device.
Tensor AsFloat64(const Tensor& t) {
  return from_vector(Values(t), t.shape(), t.device());
}

// The flat index into `in` (broadcast to `out`) of flat output index `flat`.
int64_t BroadcastIndex(IntList in, IntList out, int64_t flat) {
  int64_t index = 0, in_stride = 1;
  for (int64_t d = static_cast<int64_t>(out.size()) - 1; d >= 0; --d) {
    const int64_t coord = flat % out[d];
    flat /= out[d];
    const int64_t id = d - static_cast<int64_t>(out.size() - in.size());
    if (id >= 0) {
      if (in[id] != 1) index += coord * in_stride;
      in_stride *= in[id];
    }
  }
  return index;
}

class TensorOpsTest : public SimDeviceTest {
 protected:
  Generator gen_{2024};
};

TEST_F(TensorOpsTest, ElementwiseWithBroadcastingAgainstFloat64) {
  const Tensor a32 = randn({4, 1, 3}, gen_, On());
  const Tensor b32 = randn({5, 1}, gen_, On());
  const Tensor a64 = AsFloat64(a32), b64 = AsFloat64(b32);
  const std::vector<double> a = Values(a32), b = Values(b32);
  const DimVector out_shape = {4, 5, 3};

  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&, std::source_location);
    double (*ref)(double, double);
  };
  const Case cases[] = {
      {"add", add, [](double x, double y) { return x + y; }},
      {"sub", sub, [](double x, double y) { return x - y; }},
      {"mul", mul, [](double x, double y) { return x * y; }},
      {"div", div, [](double x, double y) { return x / y; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor r32 = c.op(a32, b32, std::source_location::current());
    const Tensor r64 = c.op(a64, b64, std::source_location::current());
    ASSERT_EQ(r32.shape(), IntList(out_shape));
    ASSERT_EQ(r64.shape(), IntList(out_shape));
    const std::vector<double> got32 = Values(r32), got64 = Values(r64);
    for (int64_t i = 0; i < Numel(out_shape); ++i) {
      const double ref = c.ref(a[BroadcastIndex({4, 1, 3}, out_shape, i)],
                               b[BroadcastIndex({5, 1}, out_shape, i)]);
      // float32: one correctly rounded op, so |r - ref| <= u * |ref| (plus the
      // reference's own 2^-53 rounding).
      EXPECT_LE(std::abs(got32[i] - ref), (kU32 + 2 * kU64) * std::abs(ref)) << i;
      // float64: the same double operation as the reference: bit for bit.
      EXPECT_EQ(got64[i], ref) << i;
    }
  }
}

TEST_F(TensorOpsTest, ScalarOpsAndInPlaceUpdates) {
  const Tensor a32 = randn({6, 7}, gen_, On());
  const Tensor b32 = randn({7}, gen_, On());
  const std::vector<double> a = Values(a32), b = Values(b32);

  const std::vector<double> r = Values(mul(a32, 2.5));
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(std::abs(r[i] - a[i] * 2.5), kU32 * std::abs(a[i] * 2.5)) << i;
  }
  // The SGD update w -= alpha * g, in place with broadcasting: alpha rounded to float32,
  // one product and one difference rounded: |r - ref| <= 3u (|w| + |alpha g|).
  Tensor w = a32.clone();
  w.sub_(b32, 0.1);
  const std::vector<double> got = Values(w);
  for (size_t i = 0; i < a.size(); ++i) {
    const double g = b[i % 7];
    const double ref = a[i] - 0.1 * g;
    EXPECT_LE(std::abs(got[i] - ref), 3 * kU32 * (std::abs(a[i]) + std::abs(0.1 * g)))
        << i;
  }
  Tensor v = a32.clone();
  v.add_(1.0).mul_(2.0).sub_(2.0);  // exact in float32 for |a| < 2^22: 2a
  const std::vector<double> twice = Values(v);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(std::abs(twice[i] - 2 * a[i]), 4 * kU32 * (2 * std::abs(a[i]) + 2)) << i;
  }
}

TEST_F(TensorOpsTest, UnaryAgainstFloat64) {
  Tensor x32 = mul(randn({200}, gen_, On()), 8.0);  // spans sigmoid's flat tails
  x32.select(0, 0).fill_(-80);  // exp(80) is near float32's limit; results stay normal
  x32.select(0, 1).fill_(100);  // exp(100) overflows float32: the stable form avoids it
  const std::vector<double> x = Values(x32);
  const std::vector<double> relu32 = Values(relu(x32));
  const std::vector<double> neg32 = Values(neg(x32));
  const std::vector<double> sig32 = Values(sigmoid(x32));
  const std::vector<double> sig64 = Values(sigmoid(AsFloat64(x32)));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(relu32[i], x[i] > 0 ? x[i] : 0.0) << i;  // exact
    EXPECT_EQ(neg32[i], -x[i]) << i;                   // exact
    const long double ref = 1.0L / (1.0L + std::exp(-static_cast<long double>(x[i])));
    // float32: exp (< 1 ulp) plus an add and a divide: 4 ulps = 8u relative.
    EXPECT_LE(std::abs(sig32[i] - static_cast<double>(ref)),
              8 * kU32 * static_cast<double>(ref))
        << x[i];
    // float64: the same formula in double: 8 ulps of float64 relative.
    EXPECT_LE(std::abs(sig64[i] - static_cast<double>(ref)),
              16 * kU64 * static_cast<double>(ref))
        << x[i];
  }
}

TEST_F(TensorOpsTest, MatmulAgainstFloat64WithStridedOperands) {
  const Tensor a32 = randn({7, 5}, gen_, On());
  const Tensor bt32 = randn({3, 5}, gen_, On());
  const Tensor b32 = bt32.t();  // a transposed view: strides [1, 5], not copied
  const std::vector<double> a = Values(a32), bt = Values(bt32);
  const Tensor r32 = matmul(a32, b32);
  const Tensor r64 = matmul(AsFloat64(a32), AsFloat64(bt32).t());
  ASSERT_EQ(r32.shape(), IntList({7, 3}));
  const std::vector<double> got32 = Values(r32), got64 = Values(r64);
  for (int i = 0; i < 7; ++i) {
    for (int j = 0; j < 3; ++j) {
      long double ref = 0, mag = 0;
      for (int k = 0; k < 5; ++k) {
        ref += static_cast<long double>(a[i * 5 + k]) * bt[j * 5 + k];
        mag += std::abs(static_cast<long double>(a[i * 5 + k]) * bt[j * 5 + k]);
      }
      // Accumulated in double (error <= K * 2^-53 * sum|a b|), rounded once to float32
      // (<= u * |ref|).
      const double acc_bound = 5 * 2 * kU64 * static_cast<double>(mag);
      EXPECT_LE(std::abs(got32[i * 3 + j] - static_cast<double>(ref)),
                kU32 * std::abs(static_cast<double>(ref)) + acc_bound);
      EXPECT_LE(std::abs(got64[i * 3 + j] - static_cast<double>(ref)), acc_bound);
    }
  }
}

TEST_F(TensorOpsTest, ReductionsAgainstFloat64) {
  const Tensor x32 = randn({4, 5, 6}, gen_, On());
  const std::vector<double> x = Values(x32);
  auto at = [&](int i, int j, int k) { return x[(i * 5 + j) * 6 + k]; };

  const Tensor s1 = sum(x32, 1);
  const Tensor s1k = sum(x32, 1, /*keepdim=*/true);
  const Tensor m2 = mean(x32, -1);
  ASSERT_EQ(s1.shape(), IntList({4, 6}));
  ASSERT_EQ(s1k.shape(), IntList({4, 1, 6}));
  ASSERT_EQ(m2.shape(), IntList({4, 5}));
  EXPECT_EQ(Values(s1), Values(s1k));
  const std::vector<double> got_s1 = Values(s1), got_m2 = Values(m2);
  for (int i = 0; i < 4; ++i) {
    for (int k = 0; k < 6; ++k) {
      long double ref = 0, mag = 0;
      for (int j = 0; j < 5; ++j) ref += at(i, j, k), mag += std::abs(at(i, j, k));
      // double accumulation, one float32 rounding: u |ref| + K 2^-52 sum|x|.
      EXPECT_LE(std::abs(got_s1[i * 6 + k] - static_cast<double>(ref)),
                kU32 * std::abs(static_cast<double>(ref)) +
                    5 * 2 * kU64 * static_cast<double>(mag));
    }
    for (int j = 0; j < 5; ++j) {
      long double ref = 0, mag = 0;
      for (int k = 0; k < 6; ++k) ref += at(i, j, k), mag += std::abs(at(i, j, k));
      ref /= 6, mag /= 6;
      EXPECT_LE(std::abs(got_m2[i * 5 + j] - static_cast<double>(ref)),
                kU32 * std::abs(static_cast<double>(ref)) +
                    7 * 2 * kU64 * static_cast<double>(mag));
    }
  }
  const Tensor all = sum(x32);
  const Tensor avg = mean(AsFloat64(x32));
  EXPECT_EQ(all.dim(), 0);
  long double ref = 0, mag = 0;
  for (double v : x) ref += v, mag += std::abs(v);
  EXPECT_LE(std::abs(all.item<float>() - static_cast<double>(ref)),
            kU32 * std::abs(static_cast<double>(ref)) +
                120 * 2 * kU64 * static_cast<double>(mag));
  EXPECT_LE(std::abs(avg.item<double>() - static_cast<double>(ref / 120)),
            (121 * 2 * kU64) * static_cast<double>(mag / 120));
}

TEST_F(TensorOpsTest, SigmoidCrossEntropyAndGradientAgainstFloat64) {
  Tensor logits = mul(randn({32, 1}, gen_, On()), 5.0);
  logits.select(0, 0).fill_(80);  // exp(80) overflows float32: the stable form must not
  logits.select(0, 1).fill_(-80);
  std::vector<float> t(32);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(i % 3 == 0);
  const Tensor target = from_vector(t, {32, 1}, kSimDevice);
  const std::vector<double> x = Values(logits);

  long double ref = 0;
  std::vector<long double> grad_ref(32);
  for (int i = 0; i < 32; ++i) {
    const long double xi = x[i], ti = t[i];
    ref += std::max(xi, 0.0L) - xi * ti + std::log1p(std::exp(-std::abs(xi)));
    grad_ref[i] = (1.0L / (1.0L + std::exp(-xi)) - ti) / 32;
  }
  ref /= 32;
  const Tensor loss32 = sigmoid_cross_entropy(logits, target);
  const Tensor loss64 = sigmoid_cross_entropy(AsFloat64(logits), AsFloat64(target));
  EXPECT_EQ(loss32.dim(), 0);
  // Every term is >= 0 (no cancellation); double accumulation, then one rounding:
  // float32 within u (+1e-12) relative, float64 within 1e-14 relative.
  EXPECT_LE(std::abs(loss32.item<float>() - static_cast<double>(ref)),
            (kU32 + 1e-12) * static_cast<double>(ref));
  EXPECT_LE(std::abs(loss64.item<double>() - static_cast<double>(ref)),
            1e-14 * static_cast<double>(ref));

  const std::vector<double> g32 = Values(sigmoid_cross_entropy_grad(logits, target));
  const std::vector<double> g64 =
      Values(sigmoid_cross_entropy_grad(AsFloat64(logits), AsFloat64(target)));
  for (int i = 0; i < 32; ++i) {
    const double r = static_cast<double>(grad_ref[i]);
    // sigmoid(x) - t may cancel: the double computation is good to a few 2^-53
    // absolute (times 1/N); float32 adds one rounding, u |ref|.
    const double abs_bound = 8 * kU64 / 32;
    EXPECT_LE(std::abs(g32[i] - r), kU32 * std::abs(r) + abs_bound) << i;
    EXPECT_LE(std::abs(g64[i] - r), kU64 * std::abs(r) + abs_bound) << i;
  }
}

TEST_F(TensorOpsTest, ReluBackwardAndLinear) {
  const Tensor x = randn({8, 3}, gen_, On());
  const Tensor w = randn({4, 3}, gen_, On());
  const Tensor b = randn({4}, gen_, On());
  const Tensor y = linear(x, w, b);
  ASSERT_EQ(y.shape(), IntList({8, 4}));
  const std::vector<double> xv = Values(x), wv = Values(w), bv = Values(b),
                            yv = Values(y);
  for (int i = 0; i < 8; ++i) {
    for (int o = 0; o < 4; ++o) {
      long double ref = bv[o], mag = std::abs(bv[o]);
      for (int k = 0; k < 3; ++k) {
        ref += static_cast<long double>(xv[i * 3 + k]) * wv[o * 3 + k];
        mag += std::abs(static_cast<long double>(xv[i * 3 + k]) * wv[o * 3 + k]);
      }
      // The product rounded to float32, then the bias added in float32: 2u sum|.|.
      EXPECT_LE(std::abs(yv[i * 4 + o] - static_cast<double>(ref)),
                2 * kU32 * static_cast<double>(mag));
    }
  }
  const Tensor g = ones({8, 4}, On());
  const std::vector<double> rb = Values(relu_backward(g, y));
  for (size_t i = 0; i < rb.size(); ++i) EXPECT_EQ(rb[i], yv[i] > 0 ? 1.0 : 0.0);
}

TEST_F(TensorOpsTest, IntegerOpsWrapTruncateAndWidenSums) {
  const Tensor a =
      from_vector<int32_t>({std::numeric_limits<int32_t>::max(), -7, 9}, {3}, kSimDevice);
  const Tensor b = from_vector<int32_t>({1, 2, -4}, {3}, kSimDevice);
  EXPECT_EQ(add(a, b).to_vector<int32_t>(),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), -5, 5}));
  EXPECT_EQ(div(a, b).to_vector<int32_t>()[1], -3);  // truncates toward zero
  EXPECT_EQ(div(a, b).to_vector<int32_t>()[2], -2);
  const Tensor s = sum(a);
  EXPECT_EQ(s.dtype(), DType::kInt64);
  EXPECT_EQ(s.item<int64_t>(), int64_t{std::numeric_limits<int32_t>::max()} + 2);
  const Tensor zero = zeros({3}, On(DType::kInt32));
  tensor_test::ExpectInvalid(*this, {"division by zero"}, [&] { div(a, zero); });
  tensor_test::ExpectInvalid(*this, {"mul", "0.5", "int32"}, [&] { mul(a, 0.5); });
  tensor_test::ExpectInvalid(*this, {"mean", "int32"}, [&] { mean(a); });
  const Tensor u = from_vector<uint8_t>({250, 3}, {2}, kSimDevice);
  EXPECT_EQ(add(u, 10.0).to_vector<uint8_t>(), (std::vector<uint8_t>{4, 13}));
}

TEST_F(TensorOpsTest, RandnIsSeededAndStandardNormal) {
  Generator g1(99), g2(99);
  const Tensor a = randn({10000}, g1, On());
  const Tensor b = randn({10000}, g2, On());
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());  // same seed, same numbers
  const Tensor c = randn({10000}, g1, On());              // the generator moved on
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  EXPECT_EQ(g1.offset(), 20000u);
  const double m = mean(AsFloat64(a)).item<double>();
  const Tensor centered = sub(AsFloat64(a), m);
  const double var = mean(mul(centered, centered)).item<double>();
  // 10^4 draws: the standard error of the mean is 0.01 and of the variance ~0.014.
  EXPECT_LT(std::abs(m), 0.05);
  EXPECT_LT(std::abs(var - 1.0), 0.07);
}

}  // namespace
}  // namespace devmem
