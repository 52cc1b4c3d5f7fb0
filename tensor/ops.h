// tensor/ops.h: the arithmetic the seed's training loop needs, with honest numerics.
//
// Example (a two-layer network's forward pass and the loss):
//   Tensor z1 = linear(x, w1, b1);                  // x @ w1^T + b1
//   Tensor n1 = relu(z1);
//   Tensor n2 = linear(n1, w2, b2);
//   Tensor loss = sigmoid_cross_entropy(n2, target);  // 0-dim, the mean
//   float value = loss.item<float>();
//
// Every op returns a new tensor (one new buffer, recorded at the caller's line with
// site kind alloc: every op takes `loc`) and never modifies its inputs; the in-place
// forms are Tensor's methods (fill_, add_, sub_, mul_, copy_).
//
// Rules, checked before anything is allocated (InvalidArgumentError naming the shapes,
// dtypes or devices otherwise):
//   * all tensor arguments on the same device, with the same dtype (no promotion);
//   * elementwise ops broadcast as NumPy does (align on the right; a dim of 1 stretches);
//   * bfloat16 is storage-only: no op accepts it;
//   * sigmoid, mean and the loss need float32 or float64.
// Numerics: elementwise ops compute in the element type (float32 in float32); sums,
// means, matmul and the loss accumulate in double and round once, so their float32
// results are within a few ulps of the exact value on well-conditioned data
// (tensor_ops_test.cc states the bounds it checks). Integer ops wrap on overflow;
// integer division truncates, and division by zero throws.
//
// Execution: ops run synchronously on the calling thread for cpu and sim (host
// kernels); a device with no kernels throws UnsupportedDeviceError naming it.
#pragma once

#include <cstdint>
#include <source_location>

#include "tensor/tensor.h"

namespace devmem {

// ---- elementwise, with broadcasting ---------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b,
           std::source_location loc = std::source_location::current());
Tensor sub(const Tensor& a, const Tensor& b,
           std::source_location loc = std::source_location::current());
Tensor mul(const Tensor& a, const Tensor& b,
           std::source_location loc = std::source_location::current());
Tensor div(const Tensor& a, const Tensor& b,
           std::source_location loc = std::source_location::current());
// With a scalar (converted to a's dtype; integral and in range for integer dtypes).
Tensor add(const Tensor& a, double b,
           std::source_location loc = std::source_location::current());
Tensor sub(const Tensor& a, double b,
           std::source_location loc = std::source_location::current());
Tensor mul(const Tensor& a, double b,
           std::source_location loc = std::source_location::current());
Tensor div(const Tensor& a, double b,
           std::source_location loc = std::source_location::current());

Tensor neg(const Tensor& x, std::source_location loc = std::source_location::current());
// max(x, 0); NaN stays NaN.
Tensor relu(const Tensor& x, std::source_location loc = std::source_location::current());
// 1 / (1 + exp(-x)), computed without overflow for any x.
Tensor sigmoid(const Tensor& x,
               std::source_location loc = std::source_location::current());
// grad where input > 0, else 0 (the backward of relu; same shapes).
Tensor relu_backward(const Tensor& grad, const Tensor& input,
                     std::source_location loc = std::source_location::current());

// ---- linear algebra -------------------------------------------------------------------
// [M, K] @ [K, N] -> [M, N]. Any strides (a transposed view is not copied).
Tensor matmul(const Tensor& a, const Tensor& b,
              std::source_location loc = std::source_location::current());
// x [B, in] @ weight[out, in]^T + bias (bias [out] broadcasts; undefined = none). One
// new buffer: the bias is added in place to the product.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
              std::source_location loc = std::source_location::current());

// ---- reductions -----------------------------------------------------------------------
// Over everything: a 0-dim tensor. Integer sums are int64; mean needs a float dtype.
// The mean of no elements is NaN.
Tensor sum(const Tensor& x, std::source_location loc = std::source_location::current());
Tensor mean(const Tensor& x, std::source_location loc = std::source_location::current());
// Over one dim (Python-style); keepdim leaves it with size 1.
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false,
           std::source_location loc = std::source_location::current());
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false,
            std::source_location loc = std::source_location::current());

// ---- loss -----------------------------------------------------------------------------
// Mean over all elements of the binary cross-entropy of sigmoid(logits) against target,
// in the stable form max(x, 0) - x * t + log1p(exp(-|x|)) (no overflow, no log(0)).
// logits and target have the same shape. Returns a 0-dim tensor.
Tensor sigmoid_cross_entropy(const Tensor& logits, const Tensor& target,
                             std::source_location loc = std::source_location::current());
// Its gradient with respect to logits: (sigmoid(logits) - target) / numel.
Tensor sigmoid_cross_entropy_grad(
    const Tensor& logits, const Tensor& target,
    std::source_location loc = std::source_location::current());

}  // namespace devmem
