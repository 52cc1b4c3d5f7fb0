// tests/tensor_scalar_cast_test.cc: FromDouble (tensor/scalar_cast.h), the scalar
// conversion the host and CUDA kernels share: floats cast, bfloat16 rounded through
// float, integers saturated at their limits and NaN to 0 (never the undefined cast).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "tensor/dtype.h"
#include "tensor/scalar_cast.h"

namespace devmem {
namespace {

TEST(ScalarCastTest, FloatsAreCast) {
  EXPECT_EQ(FromDouble<double>(0.1), 0.1);
  EXPECT_EQ(FromDouble<float>(0.1), 0.1f);
  EXPECT_TRUE(std::isnan(FromDouble<float>(std::nan(""))));
  EXPECT_EQ(static_cast<float>(FromDouble<BFloat16>(1.5)), 1.5f);
  // 1 + 2^-8 is halfway between two bfloat16 values: ties go to the even one (1.0).
  EXPECT_EQ(static_cast<float>(FromDouble<BFloat16>(1.0 + 1.0 / 256)), 1.0f);
}

TEST(ScalarCastTest, IntegersSaturateAndNanIsZero) {
  EXPECT_EQ(FromDouble<int32_t>(-7.9), -7);
  EXPECT_EQ(FromDouble<int32_t>(1e20), std::numeric_limits<int32_t>::max());
  EXPECT_EQ(FromDouble<int32_t>(-1e20), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(FromDouble<int64_t>(1e300), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(FromDouble<uint8_t>(-1.0), 0);
  EXPECT_EQ(FromDouble<uint8_t>(300.0), 255);
  EXPECT_EQ(FromDouble<int64_t>(std::nan("")), 0);
  EXPECT_EQ(FromDouble<uint8_t>(std::numeric_limits<double>::infinity()), 255);
}

}  // namespace
}  // namespace devmem
