// tensor/factories.cc: creating tensors (see factories.h).
#include "tensor/factories.h"

#include "tensor/device_registry.h"
#include "tensor/kernels.h"
#include "tensor/op_util.h"

namespace devmem {
namespace {

DeviceId DeviceOf(const TensorOptions& options) {
  return options.device ? *options.device : DefaultDevice();
}

Tensor FilledAt(IntList shape, double value, const TensorOptions& options,
                const std::source_location& loc, std::string_view op) {
  const DeviceId device = DeviceOf(options);
  if (options.dtype != DType::kBFloat16) CheckScalar(options.dtype, value, op);
  Kernels& k = KernelsFor(device, op);
  Tensor out = EmptyAt(shape, options.dtype, device, InternSite(loc, SiteKind::kAlloc));
  k.fill(ContextFor(device), ArgOf(out), value);
  return out;
}

}  // namespace

Tensor EmptyAt(IntList shape, DType dtype, DeviceId device, SiteId site) {
  const int64_t numel = CheckedNumel(shape, ItemSize(dtype), "empty");
  Storage::Contents contents{DTypeName(dtype), {}};
  contents.shape.assign(shape.begin(), shape.end());
  StoragePtr storage =
      Storage::Allocate(AllocatorFor(device), static_cast<size_t>(numel) * ItemSize(dtype),
                        CurrentStream(device), site, std::move(contents));
  return Tensor(std::move(storage), dtype, shape, ContiguousStrides(shape), 0);
}

Tensor empty(IntList shape, TensorOptions options, std::source_location loc) {
  return EmptyAt(shape, options.dtype, DeviceOf(options),
                 InternSite(loc, SiteKind::kAlloc));
}

Tensor zeros(IntList shape, TensorOptions options, std::source_location loc) {
  return FilledAt(shape, 0.0, options, loc, "zeros");
}

Tensor ones(IntList shape, TensorOptions options, std::source_location loc) {
  return FilledAt(shape, 1.0, options, loc, "ones");
}

Tensor full(IntList shape, double value, TensorOptions options,
            std::source_location loc) {
  return FilledAt(shape, value, options, loc, "full");
}

Tensor randn(IntList shape, Generator& gen, TensorOptions options,
             std::source_location loc) {
  if (options.dtype != DType::kFloat32 && options.dtype != DType::kFloat64) {
    ThrowInvalidArgument(
        Cat("randn: expected dtype float32 or float64, got ", DTypeName(options.dtype)));
  }
  const DeviceId device = DeviceOf(options);
  Kernels& k = KernelsFor(device, "randn");
  Tensor out = EmptyAt(shape, options.dtype, device, InternSite(loc, SiteKind::kAlloc));
  // Advance only once the tensor exists, so a failed call consumes no draws.
  const uint64_t counter = gen.Advance(static_cast<uint64_t>(out.numel()));
  k.randn(ContextFor(device), ArgOf(out), gen.seed(), counter);
  return out;
}

Tensor from_host(const void* data, IntList shape, TensorOptions options,
                 std::source_location loc) {
  const DeviceId device = DeviceOf(options);
  Kernels& k = KernelsFor(device, "from_host");
  Tensor out = EmptyAt(shape, options.dtype, device, InternSite(loc, SiteKind::kAlloc));
  if (out.numel() > 0) k.copy_from_host(ContextFor(device), ArgOf(out), data);
  return out;
}

Tensor from_blob(void* data, IntList shape, DType dtype, DeviceId device,
                 Storage::Deleter deleter) {
  const int64_t numel = CheckedNumel(shape, ItemSize(dtype), "from_blob");
  StoragePtr storage = Storage::WrapForeign(
      data, static_cast<size_t>(numel) * ItemSize(dtype), device, std::move(deleter));
  return Tensor(std::move(storage), dtype, shape, ContiguousStrides(shape), 0);
}

}  // namespace devmem
