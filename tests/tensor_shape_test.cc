// tests/tensor_shape_test.cc: CheckedNumel (tensor/shape.h), the check every factory
// and the Tensor constructor run on a shape before anything is allocated: a negative
// dim, or a product of dims whose size in bytes does not fit int64_t, is refused with
// an error naming the op and the shape; everything that fits is its exact product.
#include "tensor/shape.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "allocator/caching_allocator.h"
#include "tensor/device_registry.h"
#include "tensor/factories.h"

namespace devmem {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// The message of what CheckedNumel(shape, item_size, "op") throws ("" if it returns).
std::string Refusal(IntList shape, size_t item_size) {
  try {
    CheckedNumel(shape, item_size, "op");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(TensorShapeTest, TheProductOfWhatFits) {
  EXPECT_EQ(CheckedNumel({}, 4, "op"), 1);
  EXPECT_EQ(CheckedNumel({3, 4}, 4, "op"), 12);
  EXPECT_EQ(CheckedNumel({kMax / 4}, 4, "op"), kMax / 4);  // bytes: just under 2^63
  EXPECT_EQ(CheckedNumel({int64_t{1} << 31, int64_t{1} << 31}, 1, "op"), int64_t{1} << 62);
  EXPECT_EQ(CheckedNumel({3, 3074457345618258602}, 1, "op"), 9223372036854775806);
  EXPECT_EQ(CheckedNumel({kMax}, 1, "op"), kMax);
}

TEST(TensorShapeTest, AZeroDimIsZeroWhateverTheOthers) {
  EXPECT_EQ(CheckedNumel({0, kMax, kMax}, 8, "op"), 0);
  EXPECT_EQ(CheckedNumel({kMax, kMax, 0}, 8, "op"), 0);
}

TEST(TensorShapeTest, ANegativeDimIsRefusedByName) {
  EXPECT_EQ(Refusal({2, -1}, 4), "op: shape [2, -1] has a negative dim");
  EXPECT_EQ(Refusal({0, -3}, 4), "op: shape [0, -3] has a negative dim");  // before the zero
}

TEST(TensorShapeTest, ProductsWhoseBytesDoNotFitAreRefusedByName) {
  // One element more than int64 bytes hold, in every way of getting there.
  EXPECT_EQ(Refusal({kMax / 4 + 1}, 4),
            "op: shape [2305843009213693952] has too many elements to address");
  EXPECT_EQ(Refusal({int64_t{1} << 31, int64_t{1} << 31}, 2),
            "op: shape [2147483648, 2147483648] has too many elements to address");
  // The product itself overflows (2^63), and wraps to a small one (2^64 + 2).
  EXPECT_EQ(Refusal({int64_t{1} << 31, int64_t{1} << 31, 2}, 1),
            "op: shape [2147483648, 2147483648, 2] has too many elements to address");
  EXPECT_EQ(Refusal({kMax, kMax}, 1),
            "op: shape [9223372036854775807, 9223372036854775807] has too many elements "
            "to address");
  EXPECT_EQ(Refusal({3, 3074457345618258603}, 1),
            "op: shape [3, 3074457345618258603] has too many elements to address");
}

TEST(TensorShapeTest, FactoriesRefuseBadShapesBeforeAllocating) {
  const TensorOptions on{DType::kFloat32, DeviceId{DeviceType::kSim, 0}};
  const std::shared_ptr<CachingAllocator> alloc = AllocatorFor(*on.device);
  const int64_t allocations = alloc->stats().allocation[kAggregatePool].allocated;
  try {
    empty({4, -2}, on);
    FAIL() << "empty({4, -2}) returned";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "empty: shape [4, -2] has a negative dim");
  }
  try {
    empty({int64_t{1} << 40, int64_t{1} << 40}, on);
    FAIL() << "empty({2^40, 2^40}) returned";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()),
              "empty: shape [1099511627776, 1099511627776] has too many elements to address");
  }
  EXPECT_EQ(alloc->stats().allocation[kAggregatePool].allocated, allocations)
      << "a refused shape reached the allocator";
}

}  // namespace
}  // namespace devmem
