// tensor/dtype.h: the element types a Tensor can hold.
//
// Example:
//   DType t = DTypeOf<float>();          // DType::kFloat32
//   size_t n = ItemSize(t);              // 4
//   std::string_view s = DTypeName(t);   // "float32"
//
// float32, float64, int32, int64 and uint8 support every op. bfloat16 is storage
// only: it can be created, filled, viewed, copied (clone, contiguous, to) and read
// back, but arithmetic on it throws (convert on the host if you need it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace devmem {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kUInt8 = 4,
  kBFloat16 = 5,
};
inline constexpr int kNumDTypes = 6;

// "float32", "float64", "int32", "int64", "uint8", "bfloat16".
std::string_view DTypeName(DType dtype);

constexpr size_t ItemSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kUInt8:
      return 1;
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}

constexpr bool IsFloatingPoint(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 ||
         dtype == DType::kBFloat16;
}

// bfloat16: the upper 16 bits of an IEEE float32. Conversion from float rounds to
// nearest, ties to even; NaN stays NaN.
struct BFloat16 {
  uint16_t bits = 0;

  BFloat16() = default;
  explicit BFloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet and a NaN
      bits = static_cast<uint16_t>((u >> 16) | 0x0040u);
      return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    bits = static_cast<uint16_t>(u >> 16);
  }
  explicit operator float() const {
    uint32_t u = uint32_t{bits} << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
  friend bool operator==(BFloat16 a, BFloat16 b) { return a.bits == b.bits; }
};

template <typename T>
struct DTypeTraits;  // undefined for types a Tensor cannot hold
template <>
struct DTypeTraits<float> {
  static constexpr DType kDType = DType::kFloat32;
};
template <>
struct DTypeTraits<double> {
  static constexpr DType kDType = DType::kFloat64;
};
template <>
struct DTypeTraits<int32_t> {
  static constexpr DType kDType = DType::kInt32;
};
template <>
struct DTypeTraits<int64_t> {
  static constexpr DType kDType = DType::kInt64;
};
template <>
struct DTypeTraits<uint8_t> {
  static constexpr DType kDType = DType::kUInt8;
};
template <>
struct DTypeTraits<BFloat16> {
  static constexpr DType kDType = DType::kBFloat16;
};

template <typename T>
constexpr DType DTypeOf() {
  return DTypeTraits<T>::kDType;
}

// Calls fn.template operator()<T>() with the C++ type of `dtype`, for every dtype
// (bfloat16 included). Returns what fn returns.
template <typename Fn>
decltype(auto) VisitDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn.template operator()<float>();
    case DType::kFloat64:
      return fn.template operator()<double>();
    case DType::kInt32:
      return fn.template operator()<int32_t>();
    case DType::kInt64:
      return fn.template operator()<int64_t>();
    case DType::kUInt8:
      return fn.template operator()<uint8_t>();
    case DType::kBFloat16:
      return fn.template operator()<BFloat16>();
  }
  return fn.template operator()<float>();  // unreachable for valid enums
}

}  // namespace devmem
