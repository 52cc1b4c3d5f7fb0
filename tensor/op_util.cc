// tensor/op_util.cc: shared argument checks (see op_util.h).
#include "tensor/op_util.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/container/inlined_vector.h"

namespace devmem {

std::string Describe(const Tensor& t) {
  return Cat(DTypeName(t.dtype()), " ", ShapeString(t.shape()), " on ",
             t.device().ToString());
}

void CheckDefined(const Tensor& t, std::string_view op) {
  if (!t.defined()) ThrowInvalidArgument(Cat(op, ": the tensor is undefined"));
}

void CheckSameDevice(const Tensor& a, const Tensor& b, std::string_view op) {
  if (a.device() != b.device()) {
    ThrowInvalidArgument(
        Cat(op, ": tensors are on different devices: ", a.device().ToString(), " (",
            ShapeString(a.shape()), ") and ", b.device().ToString(), " (",
            ShapeString(b.shape()), "); move one with to(device)"));
  }
}

void CheckSameDType(const Tensor& a, const Tensor& b, std::string_view op) {
  if (a.dtype() != b.dtype()) {
    ThrowInvalidArgument(Cat(op, ": dtypes differ: ", Describe(a), " and ", Describe(b),
                             " (no implicit conversion)"));
  }
}

void CheckSameShape(const Tensor& a, const Tensor& b, std::string_view op) {
  if (a.shape() != b.shape()) {
    ThrowInvalidArgument(Cat(op, ": shapes differ: ", ShapeString(a.shape()), " and ",
                             ShapeString(b.shape())));
  }
}

void CheckArithmetic(const Tensor& t, std::string_view op) {
  if (t.dtype() == DType::kBFloat16) {
    ThrowInvalidArgument(
        Cat(op, ": bfloat16 is storage-only (", Describe(t), "): no arithmetic on it"));
  }
}

void CheckFloating(const Tensor& t, std::string_view op) {
  if (t.dtype() != DType::kFloat32 && t.dtype() != DType::kFloat64) {
    ThrowInvalidArgument(
        Cat(op, ": expected a float32 or float64 tensor, got ", Describe(t)));
  }
}

void CheckWritable(const Tensor& t, std::string_view op) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.strides()[d] == 0 && t.shape()[d] > 1) {
      ThrowInvalidArgument(
          Cat(op, ": cannot write in place to a broadcast view (shape ",
              ShapeString(t.shape()), ", strides ", ShapeString(t.strides()),
              "): several indices share one element; write to a clone() instead"));
    }
  }
  // Any other self-overlap (shape {2, 2}, strides {1, 1}, made through the Tensor
  // constructor): with the dims of size > 1 sorted by stride, each stride must step
  // past everything the smaller-strided dims reach. That proves no two indices share
  // an element, and holds for every view that slicing, transposing or reshaping a
  // non-overlapping tensor makes; views it cannot prove distinct are refused.
  absl::InlinedVector<std::pair<int64_t, int64_t>, 6> dims;  // (stride, size)
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.shape()[d] > 1) dims.emplace_back(t.strides()[d], t.shape()[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // the largest index offset the dims before this one reach
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) {
      ThrowInvalidArgument(
          Cat(op, ": cannot write in place to a view whose elements overlap (shape ",
              ShapeString(t.shape()), ", strides ", ShapeString(t.strides()),
              "): several indices share one element; write to a clone() instead"));
    }
    reach += (size - 1) * stride;  // cannot overflow: the constructor bounded it
  }
}

namespace {
// [first, last] byte addresses touched by a non-empty view.
std::pair<uintptr_t, uintptr_t> ByteRange(const Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.shape()[d] - 1) * t.strides()[d];
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const auto item = ItemSize(t.dtype());
  return {begin, begin + static_cast<uintptr_t>(last) * item + item - 1};
}
}  // namespace

void CheckNoPartialOverlap(const Tensor& dst, const Tensor& src, std::string_view op) {
  if (!dst.shares_storage_with(src) || dst.numel() == 0 || src.numel() == 0) return;
  if (dst.offset() == src.offset() && dst.shape() == src.shape() &&
      dst.strides() == src.strides()) {
    return;  // the same view: elementwise in place is well defined
  }
  const auto [d0, d1] = ByteRange(dst);
  const auto [s0, s1] = ByteRange(src);
  if (d0 <= s1 && s0 <= d1) {
    ThrowInvalidArgument(Cat(op, ": the source (", ShapeString(src.shape()), ", offset ",
                             src.offset(), ") overlaps the destination (",
                             ShapeString(dst.shape()), ", offset ", dst.offset(),
                             ") in the same storage; clone() the source first"));
  }
}

void CheckScalar(DType dtype, double value, std::string_view op) {
  auto check = [&](double lo, double hi) {
    if (!(value >= lo && value <= hi) || std::trunc(value) != value) {
      ThrowInvalidArgument(
          Cat(op, ": scalar ", value, " is not representable in ", DTypeName(dtype)));
    }
  };
  switch (dtype) {
    case DType::kInt32:
      check(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
      break;
    case DType::kInt64:
      // 2^63 itself is out of range; doubles just below it are fine.
      check(-0x1p63, 0x1.fffffffffffffp62);
      break;
    case DType::kUInt8:
      check(0, 255);
      break;
    default:
      break;  // floats take any double (rounded)
  }
}

}  // namespace devmem
