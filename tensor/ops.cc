// tensor/ops.cc: argument checks, output allocation and kernel dispatch for the ops of
// ops.h and Tensor's in-place methods. No element is touched here: that is the
// kernels' job (kernels.h), so a device gains every op by registering kernels.
//
// Example: see ops.h.
//
// Order inside every op: check everything (throws before any allocation), look up the
// kernels (throws for a device without any), allocate the output (owned by a Tensor
// from that moment, so a throwing kernel leaks nothing), run one kernel.
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>

#include "allocator/site.h"
#include "tensor/factories.h"
#include "tensor/kernels.h"
#include "tensor/op_util.h"

namespace devmem {
namespace {

SiteId AllocSite(const std::source_location& loc) {
  return InternSite(loc, SiteKind::kAlloc);
}

Tensor BinaryTensor(BinaryOp op, const Tensor& a, const Tensor& b,
                    const std::source_location& loc) {
  const std::string_view name = BinaryOpName(op);
  CheckDefined(a, name);
  CheckDefined(b, name);
  CheckSameDevice(a, b, name);
  CheckSameDType(a, b, name);
  CheckArithmetic(a, name);
  const DimVector shape = BroadcastShapes(a.shape(), b.shape(), name);
  Kernels& k = KernelsFor(a.device(), name);
  const Tensor ab = a.broadcast_to(shape);
  const Tensor bb = b.broadcast_to(shape);
  Tensor out = EmptyAt(shape, a.dtype(), a.device(), AllocSite(loc));
  k.binary(ContextFor(a.device()), op, ArgOf(out), ArgOf(ab), ArgOf(bb));
  return out;
}

Tensor BinaryScalar(BinaryOp op, const Tensor& a, double b,
                    const std::source_location& loc) {
  const std::string_view name = BinaryOpName(op);
  CheckDefined(a, name);
  CheckArithmetic(a, name);
  CheckScalar(a.dtype(), b, name);
  Kernels& k = KernelsFor(a.device(), name);
  Tensor out = EmptyAt(a.shape(), a.dtype(), a.device(), AllocSite(loc));
  k.binary_scalar(ContextFor(a.device()), op, ArgOf(out), ArgOf(a), b);
  return out;
}

Tensor Unary(UnaryOp op, const Tensor& x, const std::source_location& loc) {
  const std::string_view name = UnaryOpName(op);
  CheckDefined(x, name);
  CheckArithmetic(x, name);
  if (op == UnaryOp::kSigmoid) CheckFloating(x, name);
  Kernels& k = KernelsFor(x.device(), name);
  Tensor out = EmptyAt(x.shape(), x.dtype(), x.device(), AllocSite(loc));
  k.unary(ContextFor(x.device()), op, ArgOf(out), ArgOf(x));
  return out;
}

Tensor Reduce(ReduceOp op, const Tensor& x, std::optional<int64_t> dim, bool keepdim,
              const std::source_location& loc) {
  const std::string_view name = ReduceOpName(op);
  CheckDefined(x, name);
  CheckArithmetic(x, name);
  if (op == ReduceOp::kMean) CheckFloating(x, name);
  const int64_t d = dim ? WrapDim(*dim, x.shape(), name) : -1;
  DimVector shape;
  if (d >= 0) {
    shape.assign(x.shape().begin(), x.shape().end());
    shape.erase(shape.begin() + d);
  }
  const DType out_dtype = IsFloatingPoint(x.dtype()) ? x.dtype() : DType::kInt64;
  Kernels& k = KernelsFor(x.device(), name);
  Tensor out = EmptyAt(shape, out_dtype, x.device(), AllocSite(loc));
  k.reduce(ContextFor(x.device()), op, ArgOf(out), ArgOf(x), d);
  return keepdim && d >= 0 ? out.unsqueeze(d) : out;
}

// Checks for `self op= other` and returns other broadcast to self's shape.
Tensor InPlaceOperand(const Tensor& self, const Tensor& other, std::string_view op) {
  CheckDefined(self, op);
  CheckDefined(other, op);
  CheckSameDevice(self, other, op);
  CheckSameDType(self, other, op);
  CheckWritable(self, op);
  if (!BroadcastsTo(other.shape(), self.shape())) {
    ThrowInvalidArgument(Cat(op, ": shape ", ShapeString(other.shape()),
                             " cannot be broadcast to the shape ",
                             ShapeString(self.shape()), " of the tensor written"));
  }
  CheckNoPartialOverlap(self, other, op);
  return other.broadcast_to(self.shape());
}

}  // namespace

// ---- elementwise ----------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b, std::source_location loc) {
  return BinaryTensor(BinaryOp::kAdd, a, b, loc);
}
Tensor sub(const Tensor& a, const Tensor& b, std::source_location loc) {
  return BinaryTensor(BinaryOp::kSub, a, b, loc);
}
Tensor mul(const Tensor& a, const Tensor& b, std::source_location loc) {
  return BinaryTensor(BinaryOp::kMul, a, b, loc);
}
Tensor div(const Tensor& a, const Tensor& b, std::source_location loc) {
  return BinaryTensor(BinaryOp::kDiv, a, b, loc);
}
Tensor add(const Tensor& a, double b, std::source_location loc) {
  return BinaryScalar(BinaryOp::kAdd, a, b, loc);
}
Tensor sub(const Tensor& a, double b, std::source_location loc) {
  return BinaryScalar(BinaryOp::kSub, a, b, loc);
}
Tensor mul(const Tensor& a, double b, std::source_location loc) {
  return BinaryScalar(BinaryOp::kMul, a, b, loc);
}
Tensor div(const Tensor& a, double b, std::source_location loc) {
  return BinaryScalar(BinaryOp::kDiv, a, b, loc);
}

Tensor neg(const Tensor& x, std::source_location loc) {
  return Unary(UnaryOp::kNeg, x, loc);
}
Tensor relu(const Tensor& x, std::source_location loc) {
  return Unary(UnaryOp::kRelu, x, loc);
}
Tensor sigmoid(const Tensor& x, std::source_location loc) {
  return Unary(UnaryOp::kSigmoid, x, loc);
}

Tensor relu_backward(const Tensor& grad, const Tensor& input, std::source_location loc) {
  constexpr std::string_view kOp = "relu_backward";
  CheckDefined(grad, kOp);
  CheckDefined(input, kOp);
  CheckSameDevice(grad, input, kOp);
  CheckSameDType(grad, input, kOp);
  CheckArithmetic(grad, kOp);
  CheckSameShape(grad, input, kOp);
  Kernels& k = KernelsFor(grad.device(), kOp);
  Tensor out = EmptyAt(grad.shape(), grad.dtype(), grad.device(), AllocSite(loc));
  k.relu_backward(ContextFor(grad.device()), ArgOf(out), ArgOf(grad), ArgOf(input));
  return out;
}

// ---- linear algebra -------------------------------------------------------------------

Tensor matmul(const Tensor& a, const Tensor& b, std::source_location loc) {
  constexpr std::string_view kOp = "matmul";
  CheckDefined(a, kOp);
  CheckDefined(b, kOp);
  CheckSameDevice(a, b, kOp);
  CheckSameDType(a, b, kOp);
  CheckArithmetic(a, kOp);
  if (a.dim() != 2 || b.dim() != 2) {
    ThrowInvalidArgument(Cat("matmul: expected 2-D tensors, got shapes ",
                             ShapeString(a.shape()), " and ", ShapeString(b.shape())));
  }
  if (a.shape()[1] != b.shape()[0]) {
    ThrowInvalidArgument(Cat("matmul: shapes ", ShapeString(a.shape()), " and ",
                             ShapeString(b.shape()), " cannot be multiplied (",
                             a.shape()[1], " != ", b.shape()[0], ")"));
  }
  Kernels& k = KernelsFor(a.device(), kOp);
  Tensor out =
      EmptyAt({a.shape()[0], b.shape()[1]}, a.dtype(), a.device(), AllocSite(loc));
  if (out.numel() > 0) k.matmul(ContextFor(a.device()), ArgOf(out), ArgOf(a), ArgOf(b));
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias,
              std::source_location loc) {
  CheckDefined(x, "linear");
  CheckDefined(weight, "linear");
  if (weight.dim() != 2) {
    ThrowInvalidArgument(Cat("linear: expected a 2-D weight [out, in], got shape ",
                             ShapeString(weight.shape())));
  }
  if (bias.defined() && x.dim() == 2) {
    // Checked up front so that a bad bias throws before the product is allocated.
    CheckSameDevice(x, bias, "linear");
    CheckSameDType(x, bias, "linear");
    const DimVector out_shape = {x.shape()[0], weight.shape()[0]};
    if (!BroadcastsTo(bias.shape(), out_shape)) {
      ThrowInvalidArgument(Cat("linear: bias shape ", ShapeString(bias.shape()),
                               " does not broadcast to the output shape ",
                               ShapeString(out_shape)));
    }
  }
  Tensor out = matmul(x, weight.t(), loc);
  if (bias.defined()) out.add_(bias);
  return out;
}

// ---- reductions -----------------------------------------------------------------------

Tensor sum(const Tensor& x, std::source_location loc) {
  return Reduce(ReduceOp::kSum, x, std::nullopt, false, loc);
}
Tensor mean(const Tensor& x, std::source_location loc) {
  return Reduce(ReduceOp::kMean, x, std::nullopt, false, loc);
}
Tensor sum(const Tensor& x, int64_t dim, bool keepdim, std::source_location loc) {
  return Reduce(ReduceOp::kSum, x, dim, keepdim, loc);
}
Tensor mean(const Tensor& x, int64_t dim, bool keepdim, std::source_location loc) {
  return Reduce(ReduceOp::kMean, x, dim, keepdim, loc);
}

// ---- loss -----------------------------------------------------------------------------

namespace {
void CheckLossArgs(const Tensor& logits, const Tensor& target, std::string_view op) {
  CheckDefined(logits, op);
  CheckDefined(target, op);
  CheckSameDevice(logits, target, op);
  CheckSameDType(logits, target, op);
  CheckFloating(logits, op);
  if (logits.shape() != target.shape()) {
    ThrowInvalidArgument(Cat(op, ": logits shape ", ShapeString(logits.shape()),
                             " and target shape ", ShapeString(target.shape()),
                             " differ"));
  }
}
}  // namespace

Tensor sigmoid_cross_entropy(const Tensor& logits, const Tensor& target,
                             std::source_location loc) {
  CheckLossArgs(logits, target, "sigmoid_cross_entropy");
  Kernels& k = KernelsFor(logits.device(), "sigmoid_cross_entropy");
  Tensor out = EmptyAt({}, logits.dtype(), logits.device(), AllocSite(loc));
  k.sigmoid_cross_entropy(ContextFor(logits.device()), ArgOf(out), ArgOf(logits),
                          ArgOf(target));
  return out;
}

Tensor sigmoid_cross_entropy_grad(const Tensor& logits, const Tensor& target,
                                  std::source_location loc) {
  CheckLossArgs(logits, target, "sigmoid_cross_entropy_grad");
  Kernels& k = KernelsFor(logits.device(), "sigmoid_cross_entropy_grad");
  Tensor out = EmptyAt(logits.shape(), logits.dtype(), logits.device(), AllocSite(loc));
  const double scale = 1.0 / static_cast<double>(std::max<int64_t>(logits.numel(), 1));
  k.sigmoid_cross_entropy_grad(ContextFor(logits.device()), ArgOf(out), ArgOf(logits),
                               ArgOf(target), scale);
  return out;
}

// ---- Tensor's in-place methods --------------------------------------------------------

Tensor& Tensor::fill_(double value) {
  CheckDefined(*this, "fill_");
  CheckWritable(*this, "fill_");
  if (dtype_ != DType::kBFloat16) CheckScalar(dtype_, value, "fill_");
  KernelsFor(device(), "fill_").fill(ContextFor(device()), ArgOf(*this), value);
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  const Tensor from = InPlaceOperand(*this, src, "copy_");
  if (numel() > 0) {
    KernelsFor(device(), "copy_").copy(ContextFor(device()), ArgOf(*this), ArgOf(from));
  }
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  CheckArithmetic(*this, "add_");
  CheckScalar(dtype_, alpha, "add_");
  const Tensor b = InPlaceOperand(*this, other, "add_");
  Kernels& k = KernelsFor(device(), "add_");
  if (alpha == 1.0) {
    k.binary(ContextFor(device()), BinaryOp::kAdd, ArgOf(*this), ArgOf(*this), ArgOf(b));
  } else {
    k.add_scaled(ContextFor(device()), ArgOf(*this), ArgOf(*this), ArgOf(b), alpha);
  }
  return *this;
}

Tensor& Tensor::sub_(const Tensor& other, double alpha) {
  CheckArithmetic(*this, "sub_");
  CheckScalar(dtype_, alpha, "sub_");
  const Tensor b = InPlaceOperand(*this, other, "sub_");
  Kernels& k = KernelsFor(device(), "sub_");
  if (alpha == 1.0) {
    k.binary(ContextFor(device()), BinaryOp::kSub, ArgOf(*this), ArgOf(*this), ArgOf(b));
  } else {
    k.add_scaled(ContextFor(device()), ArgOf(*this), ArgOf(*this), ArgOf(b), -alpha);
  }
  return *this;
}

Tensor& Tensor::mul_(const Tensor& other) {
  CheckArithmetic(*this, "mul_");
  const Tensor b = InPlaceOperand(*this, other, "mul_");
  KernelsFor(device(), "mul_")
      .binary(ContextFor(device()), BinaryOp::kMul, ArgOf(*this), ArgOf(*this), ArgOf(b));
  return *this;
}

namespace {
Tensor& InPlaceScalar(Tensor& self, BinaryOp op, double value, std::string_view name) {
  CheckDefined(self, name);
  CheckArithmetic(self, name);
  CheckWritable(self, name);
  CheckScalar(self.dtype(), value, name);
  KernelsFor(self.device(), name)
      .binary_scalar(ContextFor(self.device()), op, ArgOf(self), ArgOf(self), value);
  return self;
}
}  // namespace

Tensor& Tensor::add_(double value) {
  return InPlaceScalar(*this, BinaryOp::kAdd, value, "add_");
}
Tensor& Tensor::sub_(double value) {
  return InPlaceScalar(*this, BinaryOp::kSub, value, "sub_");
}
Tensor& Tensor::mul_(double value) {
  return InPlaceScalar(*this, BinaryOp::kMul, value, "mul_");
}

}  // namespace devmem
