// tensor/host_kernels.cc: the kernels for devices whose memory the host can touch (cpu
// and sim; see kernels.h for the contract). Plain loops over strided views, running on
// the calling thread: correct for any strides, and fast enough for the demo and tests.
//
// Example (ops call these through KernelsFor; a direct call looks like this):
//   Kernels& k = HostKernels();
//   k.fill(KernelContext{DeviceId{}, Stream{}}, out_arg, 1.0);
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tensor/errors.h"
#include "tensor/kernels.h"
#include "tensor/random.h"
#include "tensor/scalar_cast.h"

namespace devmem {
namespace {

// ---- strided iteration ----------------------------------------------------------

template <size_t N>
using Ptrs = std::array<char*, N>;

DimVector ByteStrides(const TensorArg& t) {
  DimVector s(t.strides.begin(), t.strides.end());
  const auto item = static_cast<int64_t>(ItemSize(t.dtype));
  for (int64_t& x : s) x *= item;
  return s;
}

// Calls f(ptrs) once per element of `shape`, in row-major order, where ptrs[k] is the
// address of that element in operand k (base[k] advanced by strides[k], in bytes).
template <size_t N, typename F>
void ForEach(IntList shape, Ptrs<N> base, const std::array<DimVector, N>& strides,
             F&& f) {
  const auto ndim = static_cast<int64_t>(shape.size());
  for (int64_t d : shape) {
    if (d == 0) return;
  }
  if (ndim == 0) {
    f(base);
    return;
  }
  const int64_t inner = shape[ndim - 1];
  std::array<int64_t, N> inner_stride;
  for (size_t k = 0; k < N; ++k) inner_stride[k] = strides[k][ndim - 1];
  DimVector index(ndim, 0);
  for (;;) {
    Ptrs<N> p = base;
    for (int64_t i = 0; i < inner; ++i) {
      f(p);
      for (size_t k = 0; k < N; ++k) p[k] += inner_stride[k];
    }
    // Advance the outer dims like an odometer.
    int64_t d = ndim - 2;
    for (; d >= 0; --d) {
      ++index[d];
      for (size_t k = 0; k < N; ++k) base[k] += strides[k][d];
      if (index[d] < shape[d]) break;
      for (size_t k = 0; k < N; ++k) base[k] -= strides[k][d] * shape[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

template <typename T>
T& At(char* p) {
  return *reinterpret_cast<T*>(p);
}

char* Bytes(const TensorArg& t) { return static_cast<char*>(t.data); }

// ---- element types and arithmetic --------------------------------------------------

// Dispatches over the dtypes that support arithmetic (not bfloat16, which ops reject
// before calling a kernel).
template <typename Fn>
void VisitArith(DType dtype, Fn&& fn) {
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
      break;
  }
  ThrowInvalidArgument("host kernels: bfloat16 is storage-only (no arithmetic)");
}

template <typename Fn>
void VisitFloat(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn.template operator()<float>();
    case DType::kFloat64:
      return fn.template operator()<double>();
    default:
      break;
  }
  ThrowInvalidArgument(
      Cat("host kernels: expected float32 or float64, got ", DTypeName(dtype)));
}

// Integer arithmetic wraps (through the unsigned type) instead of overflowing.
template <typename T>
using Unsigned = std::make_unsigned_t<T>;

template <typename T>
T Add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<Unsigned<T>>(a) + static_cast<Unsigned<T>>(b));
  } else {
    return a + b;
  }
}
template <typename T>
T Sub(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<Unsigned<T>>(a) - static_cast<Unsigned<T>>(b));
  } else {
    return a - b;
  }
}
template <typename T>
T Mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<Unsigned<T>>(a) * static_cast<Unsigned<T>>(b));
  } else {
    return a * b;
  }
}
template <typename T>
T Div(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) ThrowInvalidArgument("div: integer division by zero");
    if constexpr (std::is_signed_v<T>) {
      if (a == std::numeric_limits<T>::min() && b == -1) return a;  // wraps
    }
    return static_cast<T>(a / b);
  } else {
    return a / b;
  }
}
template <typename T>
T Neg(T a) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(Unsigned<T>{0} - static_cast<Unsigned<T>>(a));
  } else {
    return -a;
  }
}
template <typename T>
T Relu(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return (x > T{0} || std::isnan(x)) ? x : T{0};
  } else {
    return x > T{0} ? x : T{0};
  }
}
// The two-branch form never overflows exp: for x >= 0, exp(-x) <= 1; for x < 0,
// exp(x) < 1.
template <typename T>
T Sigmoid(T x) {
  if (x >= T{0}) return T{1} / (T{1} + std::exp(-x));
  const T e = std::exp(x);
  return e / (T{1} + e);
}

template <typename T, typename F>
void ApplyBinary(BinaryOp op, F&& with_fn) {
  switch (op) {
    case BinaryOp::kAdd:
      return with_fn([](T a, T b) { return Add(a, b); });
    case BinaryOp::kSub:
      return with_fn([](T a, T b) { return Sub(a, b); });
    case BinaryOp::kMul:
      return with_fn([](T a, T b) { return Mul(a, b); });
    case BinaryOp::kDiv:
      return with_fn([](T a, T b) { return Div(a, b); });
  }
}

// The accumulator of sums: double for floats, a wrapping 64-bit integer otherwise.
template <typename T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, uint64_t>;

template <typename T>
Acc<T> ToAcc(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<double>(v);
  } else {
    return static_cast<uint64_t>(static_cast<int64_t>(v));
  }
}

// ---- the kernels ----------------------------------------------------------------------

class HostKernelsImpl final : public Kernels {
 public:
  std::string_view name() const override { return "host"; }

  void fill(const KernelContext&, const TensorArg& out, double value) override {
    VisitDType(out.dtype, [&]<typename T>() {
      const T v = FromDouble<T>(value);
      ForEach<1>(out.shape, {Bytes(out)}, {ByteStrides(out)},
                 [v](const Ptrs<1>& p) { std::memcpy(p[0], &v, sizeof(T)); });
    });
  }

  void copy(const KernelContext&, const TensorArg& dst, const TensorArg& src) override {
    const size_t item = ItemSize(dst.dtype);
    if (IsContiguous(dst.shape, dst.strides) && IsContiguous(src.shape, src.strides)) {
      if (dst.data != src.data) {
        std::memmove(dst.data, src.data, static_cast<size_t>(dst.numel()) * item);
      }
      return;
    }
    const std::array<DimVector, 2> strides = {ByteStrides(dst), ByteStrides(src)};
    const Ptrs<2> base = {Bytes(dst), Bytes(src)};
    auto by_size = [&]<typename U>() {
      ForEach<2>(dst.shape, base, strides,
                 [](const Ptrs<2>& p) { std::memcpy(p[0], p[1], sizeof(U)); });
    };
    switch (item) {
      case 1:
        return by_size.template operator()<uint8_t>();
      case 2:
        return by_size.template operator()<uint16_t>();
      case 4:
        return by_size.template operator()<uint32_t>();
      default:
        return by_size.template operator()<uint64_t>();
    }
  }

  void copy_from_host(const KernelContext& ctx, const TensorArg& dst,
                      const void* src) override {
    const DimVector strides = ContiguousStrides(dst.shape);
    TensorArg from{const_cast<void*>(src), dst.dtype, dst.shape, strides, DeviceId{}};
    copy(ctx, dst, from);
  }

  void copy_to_host(const KernelContext& ctx, void* dst, const TensorArg& src) override {
    const DimVector strides = ContiguousStrides(src.shape);
    TensorArg to{dst, src.dtype, src.shape, strides, DeviceId{}};
    copy(ctx, to, src);
  }

  void randn(const KernelContext&, const TensorArg& out, uint64_t seed,
             uint64_t counter) override {
    VisitFloat(out.dtype, [&]<typename T>() {
      uint64_t i = counter;
      ForEach<1>(out.shape, {Bytes(out)}, {ByteStrides(out)}, [&](const Ptrs<1>& p) {
        At<T>(p[0]) = static_cast<T>(NormalAt(seed, i++));
      });
    });
  }

  void binary(const KernelContext&, BinaryOp op, const TensorArg& out, const TensorArg& a,
              const TensorArg& b) override {
    const std::array<DimVector, 3> strides = {ByteStrides(out), ByteStrides(a),
                                              ByteStrides(b)};
    VisitArith(out.dtype, [&]<typename T>() {
      ApplyBinary<T>(op, [&](auto fn) {
        ForEach<3>(
            out.shape, {Bytes(out), Bytes(a), Bytes(b)}, strides,
            [fn](const Ptrs<3>& p) { At<T>(p[0]) = fn(At<T>(p[1]), At<T>(p[2])); });
      });
    });
  }

  void binary_scalar(const KernelContext&, BinaryOp op, const TensorArg& out,
                     const TensorArg& a, double scalar) override {
    const std::array<DimVector, 2> strides = {ByteStrides(out), ByteStrides(a)};
    VisitArith(out.dtype, [&]<typename T>() {
      const T s = FromDouble<T>(scalar);
      ApplyBinary<T>(op, [&](auto fn) {
        ForEach<2>(out.shape, {Bytes(out), Bytes(a)}, strides,
                   [fn, s](const Ptrs<2>& p) { At<T>(p[0]) = fn(At<T>(p[1]), s); });
      });
    });
  }

  void add_scaled(const KernelContext&, const TensorArg& out, const TensorArg& a,
                  const TensorArg& b, double alpha) override {
    const std::array<DimVector, 3> strides = {ByteStrides(out), ByteStrides(a),
                                              ByteStrides(b)};
    VisitArith(out.dtype, [&]<typename T>() {
      const T s = FromDouble<T>(alpha);
      ForEach<3>(
          out.shape, {Bytes(out), Bytes(a), Bytes(b)}, strides,
          [s](const Ptrs<3>& p) { At<T>(p[0]) = Add(At<T>(p[1]), Mul(s, At<T>(p[2]))); });
    });
  }

  void unary(const KernelContext&, UnaryOp op, const TensorArg& out,
             const TensorArg& a) override {
    const std::array<DimVector, 2> strides = {ByteStrides(out), ByteStrides(a)};
    const Ptrs<2> base = {Bytes(out), Bytes(a)};
    if (op == UnaryOp::kSigmoid) {
      VisitFloat(out.dtype, [&]<typename T>() {
        ForEach<2>(out.shape, base, strides,
                   [](const Ptrs<2>& p) { At<T>(p[0]) = Sigmoid(At<T>(p[1])); });
      });
      return;
    }
    VisitArith(out.dtype, [&]<typename T>() {
      if (op == UnaryOp::kRelu) {
        ForEach<2>(out.shape, base, strides,
                   [](const Ptrs<2>& p) { At<T>(p[0]) = Relu(At<T>(p[1])); });
      } else {
        ForEach<2>(out.shape, base, strides,
                   [](const Ptrs<2>& p) { At<T>(p[0]) = Neg(At<T>(p[1])); });
      }
    });
  }

  void relu_backward(const KernelContext&, const TensorArg& out, const TensorArg& grad,
                     const TensorArg& input) override {
    const std::array<DimVector, 3> strides = {ByteStrides(out), ByteStrides(grad),
                                              ByteStrides(input)};
    VisitArith(out.dtype, [&]<typename T>() {
      ForEach<3>(out.shape, {Bytes(out), Bytes(grad), Bytes(input)}, strides,
                 [](const Ptrs<3>& p) {
                   At<T>(p[0]) = At<T>(p[2]) > T{0} ? At<T>(p[1]) : T{0};
                 });
    });
  }

  void matmul(const KernelContext&, const TensorArg& out, const TensorArg& a,
              const TensorArg& b) override {
    const int64_t m = a.shape[0], k = a.shape[1], n = b.shape[1];
    VisitArith(out.dtype, [&]<typename T>() {
      const T* pa = static_cast<const T*>(a.data);
      const T* pb = static_cast<const T*>(b.data);
      T* po = static_cast<T*>(out.data);
      const int64_t as0 = a.strides[0], as1 = a.strides[1];
      const int64_t bs0 = b.strides[0], bs1 = b.strides[1];
      const int64_t os0 = out.strides[0], os1 = out.strides[1];
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          Acc<T> acc{0};
          for (int64_t l = 0; l < k; ++l) {
            acc += ToAcc(pa[i * as0 + l * as1]) * ToAcc(pb[l * bs0 + j * bs1]);
          }
          po[i * os0 + j * os1] = static_cast<T>(acc);
        }
      }
    });
  }

  void reduce(const KernelContext&, ReduceOp op, const TensorArg& out, const TensorArg& a,
              int64_t dim) override {
    VisitArith(a.dtype, [&]<typename T>() {
      // Integer sums are written as int64 (kernels.h); floats keep their dtype.
      using Out = std::conditional_t<std::is_floating_point_v<T>, T, int64_t>;
      auto finish = [op](Acc<T> acc, int64_t count) -> Out {
        if constexpr (std::is_floating_point_v<T>) {
          if (op == ReduceOp::kMean)
            return static_cast<T>(acc / static_cast<double>(count));
          return static_cast<T>(acc);
        } else {
          return static_cast<int64_t>(acc);  // mean of integers is rejected by ops
        }
      };
      if (dim < 0) {
        Acc<T> acc{0};
        ForEach<1>(a.shape, {Bytes(a)}, {ByteStrides(a)},
                   [&acc](const Ptrs<1>& p) { acc += ToAcc(At<T>(p[0])); });
        *static_cast<Out*>(out.data) = finish(acc, a.numel());
        return;
      }
      // Iterate over out's elements (a's dims without `dim`), then along `dim`.
      DimVector kept_shape, a_kept_strides;
      for (size_t d = 0; d < a.shape.size(); ++d) {
        if (static_cast<int64_t>(d) == dim) continue;
        kept_shape.push_back(a.shape[d]);
        a_kept_strides.push_back(a.strides[d] * static_cast<int64_t>(sizeof(T)));
      }
      DimVector out_strides(out.strides.begin(), out.strides.end());
      for (int64_t& s : out_strides) s *= static_cast<int64_t>(sizeof(Out));
      const int64_t len = a.shape[dim];
      const int64_t step = a.strides[dim] * static_cast<int64_t>(sizeof(T));
      ForEach<2>(kept_shape, {Bytes(out), Bytes(a)}, {out_strides, a_kept_strides},
                 [&](const Ptrs<2>& p) {
                   Acc<T> acc{0};
                   const char* q = p[1];
                   for (int64_t i = 0; i < len; ++i, q += step) {
                     acc += ToAcc(*reinterpret_cast<const T*>(q));
                   }
                   At<Out>(p[0]) = finish(acc, len);
                 });
    });
  }

  void sigmoid_cross_entropy(const KernelContext&, const TensorArg& out,
                             const TensorArg& x, const TensorArg& t) override {
    VisitFloat(x.dtype, [&]<typename T>() {
      double acc = 0;
      ForEach<2>(x.shape, {Bytes(x), Bytes(t)}, {ByteStrides(x), ByteStrides(t)},
                 [&acc](const Ptrs<2>& p) {
                   const double xv = At<T>(p[0]);
                   const double tv = At<T>(p[1]);
                   acc +=
                       std::max(xv, 0.0) - xv * tv + std::log1p(std::exp(-std::abs(xv)));
                 });
      *static_cast<T*>(out.data) = static_cast<T>(acc / static_cast<double>(x.numel()));
    });
  }

  void sigmoid_cross_entropy_grad(const KernelContext&, const TensorArg& out,
                                  const TensorArg& x, const TensorArg& t,
                                  double scale) override {
    VisitFloat(x.dtype, [&]<typename T>() {
      ForEach<3>(out.shape, {Bytes(out), Bytes(x), Bytes(t)},
                 {ByteStrides(out), ByteStrides(x), ByteStrides(t)},
                 [scale](const Ptrs<3>& p) {
                   const double xv = At<T>(p[1]);
                   At<T>(p[0]) = static_cast<T>(scale * (Sigmoid(xv) - At<T>(p[2])));
                 });
    });
  }
};

}  // namespace

Kernels& HostKernels() {
  static HostKernelsImpl* kernels = new HostKernelsImpl;  // stateless; never destroyed
  return *kernels;
}

}  // namespace devmem
