// cuda/tensor_kernels.h: the device code of the tensor layer's CUDA kernels
// (tensor_kernels.cu, compiled by nvcc), as plain launch functions that
// cuda_kernels.cc (compiled by the host compiler) calls.
//
// Why the split: nvcc sees only this header, <cuda_runtime.h> and the .cu file, never
// abseil or the tensor layer's C++20 headers, so the device code builds with any host
// compiler nvcc accepts and its compile time stays small (one file, a few templates).
//
// Conventions: every launch enqueues on `stream` of the current device and returns
// the launch's cudaError_t (cudaGetLastError after the launch: a bad configuration,
// not the kernel's outcome, which surfaces at the next synchronizing call). Operands
// share `geometry`'s shape (at most kMaxDims dims, merged by the caller where strides
// allow); strides are in elements, >= 0. Dtypes are tensor/dtype.h's DType values as
// ints. Integer arithmetic wraps; floats are computed in the element type; sums,
// means and the loss accumulate in double (int64 for integers), as the host kernels do.
//
// Thread-safety: launches are as thread-safe as the CUDA runtime (fully).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace devmem::cuda_kernels {

inline constexpr int kMaxDims = 8;
inline constexpr int kMaxOperands = 3;

// tensor/dtype.h's DType, by value.
enum Dt : int { kF32 = 0, kF64 = 1, kI32 = 2, kI64 = 3, kU8 = 4, kBF16 = 5 };
// tensor/kernels.h's BinaryOp, UnaryOp, ReduceOp, by value.
enum Bin : int { kAdd = 0, kSub = 1, kMul = 2, kDiv = 3 };
enum Un : int { kNeg = 0, kRelu = 1, kSigmoid = 2 };

// The common shape of up to three operands and each one's strides.
struct Geometry {
  int ndim = 0;
  int64_t numel = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxOperands][kMaxDims] = {};
};

// A scalar already converted to the operands' dtype on the host (as the host kernels
// convert it: static_cast for floats, saturating for integers).
struct Scalar {
  double f = 0;   // float dtypes
  int64_t i = 0;  // integer dtypes (the value, in range for the dtype)
};

// out = the element pattern `bits` of `item_size` bytes (1, 2, 4 or 8), everywhere.
cudaError_t LaunchFill(cudaStream_t stream, void* out, const Geometry& g, int item_size,
                       uint64_t bits);
// dst[i] = src[i] (operand 0 dst, 1 src), by item size.
cudaError_t LaunchCopy(cudaStream_t stream, void* dst, const void* src, const Geometry& g,
                       int item_size);
// out = a op b (operands 0 out, 1 a, 2 b). Integer division by zero gives 0 here:
// the caller checks divisors first (LaunchAnyZero).
cudaError_t LaunchBinary(cudaStream_t stream, int dtype, int op, void* out, const void* a,
                         const void* b, const Geometry& g);
cudaError_t LaunchBinaryScalar(cudaStream_t stream, int dtype, int op, void* out,
                               const void* a, Scalar s, const Geometry& g);
// out = a + alpha * b.
cudaError_t LaunchAddScaled(cudaStream_t stream, int dtype, void* out, const void* a,
                            const void* b, Scalar alpha, const Geometry& g);
cudaError_t LaunchUnary(cudaStream_t stream, int dtype, int op, void* out, const void* a,
                        const Geometry& g);
// out = input > 0 ? grad : 0 (operands 0 out, 1 grad, 2 input).
cudaError_t LaunchReluBackward(cudaStream_t stream, int dtype, void* out, const void* grad,
                               const void* input, const Geometry& g);
// Sets *flag (device memory, an int the caller zeroed) to 1 if any element of `a`
// (operand 0) is zero.
cudaError_t LaunchAnyZero(cudaStream_t stream, int dtype, const void* a, const Geometry& g,
                          int* flag);
// Sum or mean of `a` along one dim: `g` is the shape of the output (operand 0 out,
// operand 1 a's strides over the kept dims), `len` and `step` the reduced dim's size
// and a's stride along it. Integer a writes int64 (sum only).
cudaError_t LaunchReduceDim(cudaStream_t stream, int dtype, bool mean, void* out,
                            const void* a, const Geometry& g, int64_t len, int64_t step);
// Sum or mean of every element of `a` (operand 0 of `g`) into the 0-dim *out, in one
// block (deterministic: the same order every run).
cudaError_t LaunchReduceAll(cudaStream_t stream, int dtype, bool mean, void* out,
                            const void* a, const Geometry& g);
// *out (0-dim) = mean of max(x, 0) - x * t + log1p(exp(-|x|)) over `g`'s elements
// (operands 0 x, 1 t), in one block.
cudaError_t LaunchSigmoidCrossEntropy(cudaStream_t stream, int dtype, void* out,
                                      const void* x, const void* t, const Geometry& g);
// out = scale * (sigmoid(x) - t), computed in double (operands 0 out, 1 x, 2 t).
cudaError_t LaunchSigmoidCrossEntropyGrad(cudaStream_t stream, int dtype, void* out,
                                          const void* x, const void* t, double scale,
                                          const Geometry& g);
// out[M, N] = a[M, K] @ b[K, N], any strides (in elements), accumulating in double
// (int64 for integers): the kernel for integers, and for floats where cuBLAS is absent.
cudaError_t LaunchMatmul(cudaStream_t stream, int dtype, void* out, const void* a,
                         const void* b, int64_t m, int64_t k, int64_t n,
                         const int64_t out_strides[2], const int64_t a_strides[2],
                         const int64_t b_strides[2]);

}  // namespace devmem::cuda_kernels
