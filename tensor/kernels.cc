// tensor/kernels.cc: the kernel table per device type (see kernels.h).
#include "tensor/kernels.h"

#include <array>
#include <atomic>

#include "tensor/errors.h"

namespace devmem {
namespace {

// Indexed by DeviceType. Atomic pointers: lookups are lock-free and may race with a
// registration (they see the old or the new table, both valid forever).
std::array<std::atomic<Kernels*>, 4>& Table() {
  static std::array<std::atomic<Kernels*>, 4> table{};
  return table;
}

}  // namespace

std::string_view BinaryOpName(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "add";
    case BinaryOp::kSub:
      return "sub";
    case BinaryOp::kMul:
      return "mul";
    case BinaryOp::kDiv:
      return "div";
  }
  return "binary";
}

std::string_view UnaryOpName(UnaryOp op) {
  switch (op) {
    case UnaryOp::kNeg:
      return "neg";
    case UnaryOp::kRelu:
      return "relu";
    case UnaryOp::kSigmoid:
      return "sigmoid";
  }
  return "unary";
}

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
  }
  return "reduce";
}

void RegisterKernels(DeviceType type, Kernels* kernels) {
  Table()[static_cast<size_t>(type)].store(kernels, std::memory_order_release);
}

Kernels& KernelsFor(DeviceId device, std::string_view op) {
  const auto index = static_cast<size_t>(device.type);
  if (index < Table().size()) {
    if (Kernels* k = Table()[index].load(std::memory_order_acquire)) return *k;
  }
  if (device.type == DeviceType::kCpu || device.type == DeviceType::kCpuPinned) {
    return HostKernels();
  }
  if (device.type == DeviceType::kSim) return SimStreamKernels();
  throw UnsupportedDeviceError(
      Cat(op, ": no kernels for device ", device.ToString(),
          " (this build has none registered for ", DeviceTypeName(device.type),
          "; move the tensor to cpu or sim with to(), or build with the CUDA kernels)"));
}

}  // namespace devmem
