// tensor/scalar_cast.h: a scalar argument of an op (fill's value, add's alpha, mul's
// scalar: always a double in the API) converted to a tensor's element type, the one
// rule every backend's kernels share (tensor/host_kernels.cc, cuda/cuda_kernels.cc), so
// that an op gives the same elements on every device.
//
// Floats: static_cast (bfloat16 through float, rounding to nearest even). Integers:
// saturating, and NaN gives 0; the ops check that integer scalars are in range first,
// so this only keeps the cast defined (a double outside T's range cast to T is
// undefined behaviour).
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "tensor/dtype.h"

namespace devmem {

template <typename T>
T FromDouble(double v) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    return BFloat16(static_cast<float>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v);
  } else {
    if (std::isnan(v)) return T{0};
    if (v <= static_cast<double>(std::numeric_limits<T>::min())) {
      return std::numeric_limits<T>::min();
    }
    if (v >= static_cast<double>(std::numeric_limits<T>::max())) {
      return std::numeric_limits<T>::max();
    }
    return static_cast<T>(v);
  }
}

}  // namespace devmem
