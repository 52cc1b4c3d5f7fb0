// cuda/tensor_kernels.cu: the device code of the tensor layer's CUDA kernels (see
// tensor_kernels.h for the conventions; cuda_kernels.cc is the host side that checks,
// converts and chooses). Elementwise kernels walk a grid-stride loop over the row-major
// index and locate each operand from the shape and its strides, so any strides work
// (stride 0 for broadcast inputs included). The arithmetic mirrors
// tensor/host_kernels.cc operation by operation, so results differ from the host's
// only by the device's math library (expf, log1p) and the order of double sums.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/tensor_kernels.h"

namespace devmem::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kReduceThreads = 1024;

dim3 Blocks(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b > 65535) b = 65535;
  return dim3(static_cast<unsigned>(b < 1 ? 1 : b));
}

// The offsets (in elements) of element `i` (row-major over g's shape) in operands
// 0..N-1.
template <int N>
__device__ inline void Locate(const Geometry& g, int64_t i, int64_t (&off)[N]) {
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = g.ndim - 1; d >= 0; --d) {
    const int64_t s = g.shape[d];
    const int64_t idx = i % s;
    i /= s;
    for (int k = 0; k < N; ++k) off[k] += idx * g.strides[k][d];
  }
}

#define DEVMEM_GRID_LOOP(i, n)                                                  \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// ---- arithmetic, as tensor/host_kernels.cc has it ---------------------------------

template <typename T>
using Unsigned = std::make_unsigned_t<T>;

template <typename T>
__device__ inline T Add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<Unsigned<T>>(a) + static_cast<Unsigned<T>>(b));
  } else {
    return a + b;
  }
}
template <typename T>
__device__ inline T Sub(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<Unsigned<T>>(a) - static_cast<Unsigned<T>>(b));
  } else {
    return a - b;
  }
}
template <typename T>
__device__ inline T Mul(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<Unsigned<T>>(a) * static_cast<Unsigned<T>>(b));
  } else {
    return a * b;
  }
}
template <typename T>
__device__ inline T Div(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    if (b == 0) return T{0};  // the host side refused the call already
    if constexpr (std::is_signed_v<T>) {
      if (b == T{-1}) return static_cast<T>(Unsigned<T>{0} - static_cast<Unsigned<T>>(a));
    }
    return static_cast<T>(a / b);
  } else {
    return a / b;
  }
}
template <typename T>
__device__ inline T Neg(T a) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(Unsigned<T>{0} - static_cast<Unsigned<T>>(a));
  } else {
    return -a;
  }
}
template <typename T>
__device__ inline T Relu(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return (x > T{0} || isnan(x)) ? x : T{0};
  } else {
    return x > T{0} ? x : T{0};
  }
}
template <typename T>
__device__ inline T Exp(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return expf(x);
  } else {
    return exp(x);
  }
}
// The two-branch form never overflows exp.
template <typename T>
__device__ inline T Sigmoid(T x) {
  if (x >= T{0}) return T{1} / (T{1} + Exp(-x));
  const T e = Exp(x);
  return e / (T{1} + e);
}

template <typename T, int Op>
__device__ inline T Apply(T a, T b) {
  if constexpr (Op == kAdd) return Add(a, b);
  if constexpr (Op == kSub) return Sub(a, b);
  if constexpr (Op == kMul) return Mul(a, b);
  if constexpr (Op == kDiv) return Div(a, b);
}

template <typename T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, uint64_t>;
template <typename T>
__device__ inline Acc<T> ToAcc(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<double>(v);
  } else {
    return static_cast<uint64_t>(static_cast<int64_t>(v));
  }
}
template <typename T>
using ReduceOut = std::conditional_t<std::is_floating_point_v<T>, T, int64_t>;
template <typename T>
__device__ inline ReduceOut<T> Finish(Acc<T> acc, int64_t count, bool mean) {
  if constexpr (std::is_floating_point_v<T>) {
    return mean ? static_cast<T>(acc / static_cast<double>(count)) : static_cast<T>(acc);
  } else {
    return static_cast<int64_t>(acc);
  }
}

template <typename T>
T FromScalar(Scalar s) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(s.f);
  } else {
    return static_cast<T>(s.i);
  }
}

// ---- kernels ------------------------------------------------------------------------

template <typename U>
__global__ void FillKernel(U* out, Geometry g, U v) {
  DEVMEM_GRID_LOOP(i, g.numel) {
    int64_t off[1];
    Locate<1>(g, i, off);
    out[off[0]] = v;
  }
}

template <typename U>
__global__ void CopyKernel(U* dst, const U* src, Geometry g) {
  DEVMEM_GRID_LOOP(i, g.numel) {
    int64_t off[2];
    Locate<2>(g, i, off);
    dst[off[0]] = src[off[1]];
  }
}

template <typename T, int Op>
__global__ void BinaryKernel(T* out, const T* a, const T* b, Geometry g) {
  DEVMEM_GRID_LOOP(i, g.numel) {
    int64_t off[3];
    Locate<3>(g, i, off);
    out[off[0]] = Apply<T, Op>(a[off[1]], b[off[2]]);
  }
}

template <typename T, int Op>
__global__ void BinaryScalarKernel(T* out, const T* a, T s, Geometry g) {
  DEVMEM_GRID_LOOP(i, g.numel) {
    int64_t off[2];
    Locate<2>(g, i, off);
    out[off[0]] = Apply<T, Op>(a[off[1]], s);
  }
}

template <typename T>
__global__ void AddScaledKernel(T* out, const T* a, const T* b, T s, Geometry g) {
  DEVMEM_GRID_LOOP(i, g.numel) {
    int64_t off[3];
    Locate<3>(g, i, off);
    out[off[0]] = Add(a[off[1]], Mul(s, b[off[2]]));
  }
}

template <typename T, int Op>
__global__ void UnaryKernel(T* out, const T* a, Geometry g) {
  DEVMEM_GRID_LOOP(i, g.numel) {
    int64_t off[2];
    Locate<2>(g, i, off);
    const T x = a[off[1]];
    if constexpr (Op == kNeg) out[off[0]] = Neg(x);
    if constexpr (Op == kRelu) out[off[0]] = Relu(x);
    if constexpr (Op == kSigmoid) {
      if constexpr (std::is_floating_point_v<T>) out[off[0]] = Sigmoid(x);
    }
  }
}

template <typename T>
__global__ void ReluBackwardKernel(T* out, const T* grad, const T* input, Geometry g) {
  DEVMEM_GRID_LOOP(i, g.numel) {
    int64_t off[3];
    Locate<3>(g, i, off);
    out[off[0]] = input[off[2]] > T{0} ? grad[off[1]] : T{0};
  }
}

template <typename T>
__global__ void AnyZeroKernel(const T* a, Geometry g, int* flag) {
  DEVMEM_GRID_LOOP(i, g.numel) {
    int64_t off[1];
    Locate<1>(g, i, off);
    if (a[off[0]] == T{0}) *flag = 1;  // every writer writes 1: no ordering needed
  }
}

template <typename T>
__global__ void ReduceDimKernel(ReduceOut<T>* out, const T* a, Geometry g, int64_t len,
                                int64_t step, bool mean) {
  DEVMEM_GRID_LOOP(i, g.numel) {
    int64_t off[2];
    Locate<2>(g, i, off);
    Acc<T> acc{0};
    const T* p = a + off[1];
    for (int64_t j = 0; j < len; ++j, p += step) acc += ToAcc(*p);
    out[off[0]] = Finish<T>(acc, len, mean);
  }
}

// Tree reduction of one value per thread of a kReduceThreads block; thread 0 gets it.
template <typename A>
__device__ inline A BlockSum(A v) {
  __shared__ A buf[kReduceThreads];
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int s = kReduceThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    __syncthreads();
  }
  return buf[0];
}

template <typename T>
__global__ void ReduceAllKernel(ReduceOut<T>* out, const T* a, Geometry g, bool mean) {
  Acc<T> acc{0};
  for (int64_t i = threadIdx.x; i < g.numel; i += kReduceThreads) {
    int64_t off[1];
    Locate<1>(g, i, off);
    acc += ToAcc(a[off[0]]);
  }
  const Acc<T> total = BlockSum(acc);
  if (threadIdx.x == 0) *out = Finish<T>(total, g.numel, mean);
}

template <typename T>
__global__ void SigmoidCrossEntropyKernel(T* out, const T* x, const T* t, Geometry g) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < g.numel; i += kReduceThreads) {
    int64_t off[2];
    Locate<2>(g, i, off);
    const double xv = x[off[0]];
    const double tv = t[off[1]];
    acc += fmax(xv, 0.0) - xv * tv + log1p(exp(-fabs(xv)));
  }
  const double total = BlockSum(acc);
  if (threadIdx.x == 0) *out = static_cast<T>(total / static_cast<double>(g.numel));
}

template <typename T>
__global__ void SigmoidCrossEntropyGradKernel(T* out, const T* x, const T* t,
                                              double scale, Geometry g) {
  DEVMEM_GRID_LOOP(i, g.numel) {
    int64_t off[3];
    Locate<3>(g, i, off);
    const double xv = x[off[1]];
    out[off[0]] = static_cast<T>(scale * (Sigmoid(xv) - t[off[2]]));
  }
}

template <typename T>
__global__ void MatmulKernel(T* out, const T* a, const T* b, int64_t m, int64_t k,
                             int64_t n, int64_t os0, int64_t os1, int64_t as0,
                             int64_t as1, int64_t bs0, int64_t bs1) {
  DEVMEM_GRID_LOOP(idx, m * n) {
    const int64_t i = idx / n;
    const int64_t j = idx % n;
    Acc<T> acc{0};
    for (int64_t l = 0; l < k; ++l) acc += ToAcc(a[i * as0 + l * as1]) * ToAcc(b[l * bs0 + j * bs1]);
    out[i * os0 + j * os1] = static_cast<T>(acc);
  }
}

// ---- dispatch -----------------------------------------------------------------------

template <typename F>
cudaError_t VisitArith(int dtype, F&& f) {
  switch (dtype) {
    case kF32:
      return f(float{});
    case kF64:
      return f(double{});
    case kI32:
      return f(int32_t{});
    case kI64:
      return f(int64_t{});
    case kU8:
      return f(uint8_t{});
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename F>
cudaError_t VisitFloat(int dtype, F&& f) {
  switch (dtype) {
    case kF32:
      return f(float{});
    case kF64:
      return f(double{});
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename F>
cudaError_t VisitItem(int item_size, F&& f) {
  switch (item_size) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename F>
cudaError_t VisitBinary(int op, F&& f) {
  switch (op) {
    case kAdd:
      return f(std::integral_constant<int, kAdd>{});
    case kSub:
      return f(std::integral_constant<int, kSub>{});
    case kMul:
      return f(std::integral_constant<int, kMul>{});
    case kDiv:
      return f(std::integral_constant<int, kDiv>{});
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t Launched() { return cudaGetLastError(); }

}  // namespace

cudaError_t LaunchFill(cudaStream_t stream, void* out, const Geometry& g, int item_size,
                       uint64_t bits) {
  if (g.numel == 0) return cudaSuccess;
  return VisitItem(item_size, [&](auto u) {
    using U = decltype(u);
    FillKernel<U><<<Blocks(g.numel), kThreads, 0, stream>>>(static_cast<U*>(out), g,
                                                            static_cast<U>(bits));
    return Launched();
  });
}

cudaError_t LaunchCopy(cudaStream_t stream, void* dst, const void* src, const Geometry& g,
                       int item_size) {
  if (g.numel == 0) return cudaSuccess;
  return VisitItem(item_size, [&](auto u) {
    using U = decltype(u);
    CopyKernel<U><<<Blocks(g.numel), kThreads, 0, stream>>>(
        static_cast<U*>(dst), static_cast<const U*>(src), g);
    return Launched();
  });
}

cudaError_t LaunchBinary(cudaStream_t stream, int dtype, int op, void* out, const void* a,
                         const void* b, const Geometry& g) {
  if (g.numel == 0) return cudaSuccess;
  return VisitArith(dtype, [&](auto t) {
    using T = decltype(t);
    return VisitBinary(op, [&](auto o) {
      BinaryKernel<T, decltype(o)::value><<<Blocks(g.numel), kThreads, 0, stream>>>(
          static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), g);
      return Launched();
    });
  });
}

cudaError_t LaunchBinaryScalar(cudaStream_t stream, int dtype, int op, void* out,
                               const void* a, Scalar s, const Geometry& g) {
  if (g.numel == 0) return cudaSuccess;
  return VisitArith(dtype, [&](auto t) {
    using T = decltype(t);
    return VisitBinary(op, [&](auto o) {
      BinaryScalarKernel<T, decltype(o)::value><<<Blocks(g.numel), kThreads, 0, stream>>>(
          static_cast<T*>(out), static_cast<const T*>(a), FromScalar<T>(s), g);
      return Launched();
    });
  });
}

cudaError_t LaunchAddScaled(cudaStream_t stream, int dtype, void* out, const void* a,
                            const void* b, Scalar alpha, const Geometry& g) {
  if (g.numel == 0) return cudaSuccess;
  return VisitArith(dtype, [&](auto t) {
    using T = decltype(t);
    AddScaledKernel<T><<<Blocks(g.numel), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b),
        FromScalar<T>(alpha), g);
    return Launched();
  });
}

cudaError_t LaunchUnary(cudaStream_t stream, int dtype, int op, void* out, const void* a,
                        const Geometry& g) {
  if (g.numel == 0) return cudaSuccess;
  return VisitArith(dtype, [&](auto t) {
    using T = decltype(t);
    T* o = static_cast<T*>(out);
    const T* x = static_cast<const T*>(a);
    switch (op) {
      case kNeg:
        UnaryKernel<T, kNeg><<<Blocks(g.numel), kThreads, 0, stream>>>(o, x, g);
        break;
      case kRelu:
        UnaryKernel<T, kRelu><<<Blocks(g.numel), kThreads, 0, stream>>>(o, x, g);
        break;
      case kSigmoid:
        if constexpr (!std::is_floating_point_v<T>) return cudaErrorInvalidValue;
        UnaryKernel<T, kSigmoid><<<Blocks(g.numel), kThreads, 0, stream>>>(o, x, g);
        break;
      default:
        return cudaErrorInvalidValue;
    }
    return Launched();
  });
}

cudaError_t LaunchReluBackward(cudaStream_t stream, int dtype, void* out, const void* grad,
                               const void* input, const Geometry& g) {
  if (g.numel == 0) return cudaSuccess;
  return VisitArith(dtype, [&](auto t) {
    using T = decltype(t);
    ReluBackwardKernel<T><<<Blocks(g.numel), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(grad), static_cast<const T*>(input), g);
    return Launched();
  });
}

cudaError_t LaunchAnyZero(cudaStream_t stream, int dtype, const void* a, const Geometry& g,
                          int* flag) {
  if (g.numel == 0) return cudaSuccess;
  return VisitArith(dtype, [&](auto t) {
    using T = decltype(t);
    AnyZeroKernel<T><<<Blocks(g.numel), kThreads, 0, stream>>>(static_cast<const T*>(a), g,
                                                               flag);
    return Launched();
  });
}

cudaError_t LaunchReduceDim(cudaStream_t stream, int dtype, bool mean, void* out,
                            const void* a, const Geometry& g, int64_t len, int64_t step) {
  if (g.numel == 0) return cudaSuccess;
  return VisitArith(dtype, [&](auto t) {
    using T = decltype(t);
    ReduceDimKernel<T><<<Blocks(g.numel), kThreads, 0, stream>>>(
        static_cast<ReduceOut<T>*>(out), static_cast<const T*>(a), g, len, step, mean);
    return Launched();
  });
}

cudaError_t LaunchReduceAll(cudaStream_t stream, int dtype, bool mean, void* out,
                            const void* a, const Geometry& g) {
  return VisitArith(dtype, [&](auto t) {
    using T = decltype(t);
    ReduceAllKernel<T><<<1, kReduceThreads, 0, stream>>>(
        static_cast<ReduceOut<T>*>(out), static_cast<const T*>(a), g, mean);
    return Launched();
  });
}

cudaError_t LaunchSigmoidCrossEntropy(cudaStream_t stream, int dtype, void* out,
                                      const void* x, const void* t, const Geometry& g) {
  return VisitFloat(dtype, [&](auto v) {
    using T = decltype(v);
    SigmoidCrossEntropyKernel<T><<<1, kReduceThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(x), static_cast<const T*>(t), g);
    return Launched();
  });
}

cudaError_t LaunchSigmoidCrossEntropyGrad(cudaStream_t stream, int dtype, void* out,
                                          const void* x, const void* t, double scale,
                                          const Geometry& g) {
  if (g.numel == 0) return cudaSuccess;
  return VisitFloat(dtype, [&](auto v) {
    using T = decltype(v);
    SigmoidCrossEntropyGradKernel<T><<<Blocks(g.numel), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(x), static_cast<const T*>(t), scale, g);
    return Launched();
  });
}

cudaError_t LaunchMatmul(cudaStream_t stream, int dtype, void* out, const void* a,
                         const void* b, int64_t m, int64_t k, int64_t n,
                         const int64_t out_strides[2], const int64_t a_strides[2],
                         const int64_t b_strides[2]) {
  if (m * n == 0) return cudaSuccess;
  return VisitArith(dtype, [&](auto t) {
    using T = decltype(t);
    MatmulKernel<T><<<Blocks(m * n), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), m, k, n,
        out_strides[0], out_strides[1], a_strides[0], a_strides[1], b_strides[0],
        b_strides[1]);
    return Launched();
  });
}

}  // namespace devmem::cuda_kernels
