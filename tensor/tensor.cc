// tensor/tensor.cc: Tensor's constructor, accessors, host reads and the three copies
// (clone, contiguous, to). Views are in views.cc, in-place ops in ops.cc.
#include "tensor/tensor.h"

#include "allocator/site.h"
#include "tensor/factories.h"
#include "tensor/kernels.h"
#include "tensor/op_util.h"

namespace devmem {

Tensor::Tensor(StoragePtr storage, DType dtype, IntList shape, IntList strides,
               int64_t offset)
    : storage_(std::move(storage)),
      shape_(shape.begin(), shape.end()),
      strides_(strides.begin(), strides.end()),
      offset_(offset),
      dtype_(dtype) {
  if (!storage_) ThrowInvalidArgument("Tensor: the storage is null");
  if (shape.size() != strides.size()) {
    ThrowInvalidArgument(Cat("Tensor: shape ", ShapeString(shape), " and strides ",
                             ShapeString(strides), " have different ranks"));
  }
  if (offset < 0) ThrowInvalidArgument(Cat("Tensor: negative offset ", offset));
  for (int64_t stride : strides) {
    if (stride < 0) {
      ThrowInvalidArgument(Cat("Tensor: negative stride in ", ShapeString(strides)));
    }
  }
  const int64_t numel = CheckedNumel(shape, ItemSize(dtype), "Tensor");
  const auto capacity = static_cast<int64_t>(storage_->bytes() / ItemSize(dtype));
  auto outside = [&](std::string_view what) {
    ThrowInvalidArgument(Cat("Tensor: shape ", ShapeString(shape), " with strides ",
                             ShapeString(strides), " and offset ", offset, " ", what,
                             ", outside the storage of ", capacity, " ",
                             DTypeName(dtype), " elements"));
  };
  // An empty view may sit at the very end (offset == capacity), never past it.
  if (offset > capacity) outside("starts past the end");
  if (numel == 0) return;
  // The last element's index, in checked arithmetic: strides are the caller's, so
  // (size - 1) * stride may overflow int64 (shape {3}, stride {2^62}).
  int64_t last = offset;
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t reach = 0;
    if (__builtin_mul_overflow(shape[d] - 1, strides[d], &reach) ||
        __builtin_add_overflow(last, reach, &last)) {
      outside("reaches beyond any addressable element");
    }
  }
  if (last >= capacity) outside(Cat("reaches element ", last));
}

int64_t Tensor::size(int64_t dim) const { return shape_[WrapDim(dim, shape_, "size")]; }

int64_t Tensor::stride(int64_t dim) const {
  return strides_[WrapDim(dim, shape_, "stride")];
}

void* Tensor::data_ptr() const {
  if (!storage_ || storage_->data() == nullptr) return nullptr;
  return static_cast<char*>(storage_->data()) +
         offset_ * static_cast<int64_t>(ItemSize(dtype_));
}

std::string Tensor::ToString() const {
  if (!defined()) return "Tensor(undefined)";
  return Cat("Tensor(", DTypeName(dtype_), ", ", ShapeString(shape_), ", strides ",
             ShapeString(strides_), ", offset ", offset_, ", ", device().ToString(), ")");
}

void Tensor::CheckDType(DType expected, const char* op) const {
  CheckDefined(*this, op);
  if (dtype_ != expected) {
    ThrowInvalidArgument(
        Cat(op, ": the tensor is ", Describe(*this), ", not ", DTypeName(expected)));
  }
}

void Tensor::CopyToHost(void* dst) const {
  KernelsFor(device(), "copy to host")
      .copy_to_host(ContextFor(device()), dst, ArgOf(*this));
}

void Tensor::record_stream(Stream stream) const {
  CheckDefined(*this, "record_stream");
  storage_->record_stream(stream);
}

Tensor Tensor::clone(std::source_location loc) const {
  CheckDefined(*this, "clone");
  Kernels& k = KernelsFor(device(), "clone");
  Tensor out = EmptyAt(shape_, dtype_, device(), InternSite(loc, SiteKind::kClone));
  if (numel() > 0) k.copy(ContextFor(device()), ArgOf(out), ArgOf(*this));
  return out;
}

Tensor Tensor::contiguous(std::source_location loc) const {
  CheckDefined(*this, "contiguous");
  if (is_contiguous()) return *this;
  Kernels& k = KernelsFor(device(), "contiguous");
  Tensor out = EmptyAt(shape_, dtype_, device(), InternSite(loc, SiteKind::kContiguous));
  k.copy(ContextFor(device()), ArgOf(out), ArgOf(*this));
  return out;
}

Tensor Tensor::to(DeviceId target, std::source_location loc) const {
  CheckDefined(*this, "to");
  const DeviceId source = device();
  if (target == source) return *this;
  // The copy runs on the current stream of the device that is not cpu: the kernels of
  // the device that is not host accessible do it (the target's when neither is); between
  // two host-accessible devices, the host kernels, in the stream order of the sim one
  // (the target's when both are sim).
  DeviceId runs_on = target;
  if (IsHostDevice(source) && IsHostDevice(target)) {
    if (target.type != DeviceType::kSim) runs_on = source;
  } else if (IsHostDevice(target)) {
    runs_on = source;
  }
  Kernels& k =
      KernelsFor(runs_on, Cat("to(", target.ToString(), ") from ", source.ToString()));
  Tensor out = EmptyAt(shape_, dtype_, target, InternSite(loc, SiteKind::kToDevice));
  if (numel() > 0) k.copy(ContextFor(runs_on), ArgOf(out), ArgOf(*this));
  return out;
}

}  // namespace devmem
