// tensor/op_util.h: checks and glue shared by the files that implement Tensor and the
// ops (tensor.cc, views.cc, ops.cc, factories.cc). Internal to tensor/.
//
// Example:
//   CheckDefined(a, "add");
//   CheckSameDevice(a, b, "add");   // "add: tensors are on different devices: ..."
//   Kernels& k = KernelsFor(a.device(), "add");
//   k.binary(ContextFor(a.device()), BinaryOp::kAdd, ArgOf(out), ArgOf(a), ArgOf(b));
#pragma once

#include <string>
#include <string_view>

#include "allocator/types.h"
#include "tensor/kernels.h"
#include "tensor/stream.h"
#include "tensor/tensor.h"

namespace devmem {

// The kernel's view of `t`. Valid while `t` lives.
inline TensorArg ArgOf(const Tensor& t) {
  return TensorArg{t.data_ptr(), t.dtype(), t.shape(), t.strides(), t.device()};
}

// Ops run on the calling thread's current stream of the device (tensor/stream.h).
inline KernelContext ContextFor(DeviceId device) {
  return KernelContext{device, CurrentStream(device)};
}

// True for the devices the host kernels serve (their memory is host accessible).
inline bool IsHostDevice(DeviceId device) {
  return device.type == DeviceType::kCpu || device.type == DeviceType::kSim ||
         device.type == DeviceType::kCpuPinned;
}

// "float32 [2, 3] on sim:0": how messages name a tensor.
std::string Describe(const Tensor& t);

void CheckDefined(const Tensor& t, std::string_view op);
void CheckSameDevice(const Tensor& a, const Tensor& b, std::string_view op);
void CheckSameDType(const Tensor& a, const Tensor& b, std::string_view op);
void CheckSameShape(const Tensor& a, const Tensor& b, std::string_view op);
// Rejects bfloat16 (storage only).
void CheckArithmetic(const Tensor& t, std::string_view op);
void CheckFloating(const Tensor& t, std::string_view op);
// For in-place ops: no two indices may reach the same element.
void CheckWritable(const Tensor& t, std::string_view op);
// For in-place ops: `src` must be exactly `dst`'s view or not overlap it at all
// (conservatively: their address ranges are disjoint).
void CheckNoPartialOverlap(const Tensor& dst, const Tensor& src, std::string_view op);
// An integer dtype takes only integral scalars in its range.
void CheckScalar(DType dtype, double value, std::string_view op);

}  // namespace devmem
