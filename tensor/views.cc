// tensor/views.cc: the views (see tensor.h). Each copies the handle (one relaxed atomic
// increment, shape and strides copied inline) and edits shape, strides and offset;
// none allocates. The checks that throw build their messages in out-of-line cold
// functions so that the hot paths stay small (slice_ns in the benchmark).
#include <algorithm>

#include "absl/base/attributes.h"
#include "tensor/op_util.h"
#include "tensor/tensor.h"

namespace devmem {
namespace {

[[noreturn]] ABSL_ATTRIBUTE_NOINLINE void ThrowRange(std::string_view op,
                                                     std::string_view what, int64_t value,
                                                     int64_t dim, IntList shape,
                                                     std::string_view expected) {
  ThrowInvalidArgument(Cat(op, ": ", what, " ", value, " is out of range for dim ", dim,
                           " of size ", shape[dim], " (shape ", ShapeString(shape),
                           "; expected ", expected, ")"));
}

[[noreturn]] ABSL_ATTRIBUTE_NOINLINE void ThrowSliceRange(int64_t start, int64_t stop,
                                                          int64_t dim, IntList shape) {
  const int64_t size = shape[dim];
  ThrowInvalidArgument(Cat("slice: [", start, ", ", stop, ") is out of range for dim ",
                           dim, " of size ", size, " (shape ", ShapeString(shape),
                           "; start and stop must be in [", -size, ", ", size, "])"));
}

}  // namespace

Tensor Tensor::slice(int64_t dim, int64_t start, int64_t stop, int64_t step) const {
  const int64_t d = WrapDim(dim, shape_, "slice");
  const int64_t size = shape_[d];
  if (stop == kEnd) stop = size;
  if (start < -size || start > size || stop < -size || stop > size) {
    ThrowSliceRange(start, stop, d, shape_);
  }
  if (step < 1) {
    ThrowInvalidArgument(Cat("slice: step ", step, " must be >= 1 (dim ", d, " of shape ",
                             ShapeString(shape_), ")"));
  }
  if (start < 0) start += size;
  if (stop < 0) stop += size;
  const int64_t length = stop > start ? (stop - start + step - 1) / step : 0;
  Tensor out(*this);
  out.offset_ += start * strides_[d];
  out.shape_[d] = length;
  out.strides_[d] *= step;
  return out;
}

Tensor Tensor::select(int64_t dim, int64_t index) const {
  const int64_t d = WrapDim(dim, shape_, "select");
  const int64_t size = shape_[d];
  if (index < -size || index >= size) {
    ThrowRange("select", "index", index, d, shape_,
               Cat("an index in [", -size, ", ", size - 1, "]"));
  }
  if (index < 0) index += size;
  Tensor out(*this);
  out.offset_ += index * strides_[d];
  out.shape_.erase(out.shape_.begin() + d);
  out.strides_.erase(out.strides_.begin() + d);
  return out;
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  const int64_t d = WrapDim(dim, shape_, "narrow");
  const int64_t size = shape_[d];
  if (start < -size || start > size) {
    ThrowRange("narrow", "start", start, d, shape_,
               Cat("a start in [", -size, ", ", size, "]"));
  }
  if (start < 0) start += size;
  if (length < 0 || start + length > size) {
    ThrowInvalidArgument(Cat("narrow: length ", length, " from start ", start,
                             " does not fit dim ", d, " of size ", size, " (shape ",
                             ShapeString(shape_), ")"));
  }
  return slice(d, start, start + length);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const int64_t a = WrapDim(dim0, shape_, "transpose");
  const int64_t b = WrapDim(dim1, shape_, "transpose");
  Tensor out(*this);
  std::swap(out.shape_[a], out.shape_[b]);
  std::swap(out.strides_[a], out.strides_[b]);
  return out;
}

Tensor Tensor::t() const {
  if (dim() > 2) {
    ThrowInvalidArgument(Cat("t: expected a tensor of at most 2 dims, got shape ",
                             ShapeString(shape_), "; use transpose(dim0, dim1)"));
  }
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(IntList dims) const {
  if (dims.size() != shape_.size()) {
    ThrowInvalidArgument(Cat("permute: dims ", ShapeString(dims), " do not match the ",
                             dim(), " dims of shape ", ShapeString(shape_)));
  }
  Tensor out(*this);
  absl::InlinedVector<bool, 6> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = WrapDim(dims[i], shape_, "permute");
    if (seen[d]) {
      ThrowInvalidArgument(Cat("permute: dims ", ShapeString(dims), " repeat dim ", d,
                               " (shape ", ShapeString(shape_), ")"));
    }
    seen[d] = true;
    out.shape_[i] = shape_[d];
    out.strides_[i] = strides_[d];
  }
  return out;
}

Tensor Tensor::ViewAs(IntList shape, std::string_view op) const {
  DimVector new_shape = InferShape(shape, shape_, op);
  std::optional<DimVector> new_strides = ViewStrides(shape_, strides_, new_shape);
  if (!new_strides) {
    ThrowInvalidArgument(Cat(
        op, ": shape ", ShapeString(new_shape), " cannot be a view of shape ",
        ShapeString(shape_), " with strides ", ShapeString(strides_),
        " (its elements are not evenly spaced in row-major order); call contiguous() or "
        "clone() first to make the copy explicit"));
  }
  Tensor out(*this);
  out.shape_ = std::move(new_shape);
  out.strides_ = *std::move(new_strides);
  return out;
}

Tensor Tensor::view(IntList shape) const { return ViewAs(shape, "view"); }

Tensor Tensor::broadcast_to(IntList shape) const {
  const size_t n = shape.size();
  const size_t m = shape_.size();
  auto fail = [&] {
    ThrowInvalidArgument(Cat("broadcast_to: shape ", ShapeString(shape_),
                             " cannot be broadcast to ", ShapeString(shape)));
  };
  if (m > n) fail();
  Tensor out(*this);
  out.shape_.assign(shape.begin(), shape.end());
  out.strides_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (shape[i] < 0) fail();
    if (i < n - m) continue;  // a new leading dim: stride 0
    const size_t j = i - (n - m);
    if (shape_[j] == shape[i]) {
      out.strides_[i] = strides_[j];
    } else if (shape_[j] != 1) {
      fail();
    }
  }
  return out;
}

Tensor Tensor::squeeze() const {
  Tensor out(*this);
  out.shape_.clear();
  out.strides_.clear();
  for (size_t d = 0; d < shape_.size(); ++d) {
    if (shape_[d] == 1) continue;
    out.shape_.push_back(shape_[d]);
    out.strides_.push_back(strides_[d]);
  }
  return out;
}

Tensor Tensor::squeeze(int64_t dim) const {
  const int64_t d = WrapDim(dim, shape_, "squeeze");
  if (shape_[d] != 1) {
    ThrowInvalidArgument(Cat("squeeze: dim ", d, " of shape ", ShapeString(shape_),
                             " has size ", shape_[d], ", not 1"));
  }
  Tensor out(*this);
  out.shape_.erase(out.shape_.begin() + d);
  out.strides_.erase(out.strides_.begin() + d);
  return out;
}

Tensor Tensor::unsqueeze(int64_t dim) const {
  const int64_t n = this->dim();
  if (dim < -(n + 1) || dim > n) {
    ThrowInvalidArgument(Cat("unsqueeze: dim ", dim, " is out of range for shape ",
                             ShapeString(shape_), " (expected a dim in [", -(n + 1), ", ",
                             n, "])"));
  }
  if (dim < 0) dim += n + 1;
  // Any stride works for a dim of size 1; this one keeps a contiguous tensor's strides
  // the row-major ones.
  const int64_t stride = dim < n ? shape_[dim] * strides_[dim] : 1;
  Tensor out(*this);
  out.shape_.insert(out.shape_.begin() + dim, 1);
  out.strides_.insert(out.strides_.begin() + dim, stride);
  return out;
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return ViewAs({1}, "flatten");
  const int64_t s = WrapDim(start_dim, shape_, "flatten");
  const int64_t e = WrapDim(end_dim, shape_, "flatten");
  if (s > e) {
    ThrowInvalidArgument(Cat("flatten: start dim ", start_dim, " comes after end dim ",
                             end_dim, " (shape ", ShapeString(shape_), ")"));
  }
  DimVector shape(shape_.begin(), shape_.begin() + s);
  shape.push_back(Numel(IntList(shape_).subspan(s, e - s + 1)));
  shape.insert(shape.end(), shape_.begin() + e + 1, shape_.end());
  return ViewAs(shape, "flatten");
}

}  // namespace devmem
