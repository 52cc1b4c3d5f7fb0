// tensor/shape.cc: shape and stride arithmetic (see shape.h).
#include "tensor/shape.h"

#include <limits>

#include "absl/strings/str_join.h"
#include "tensor/errors.h"

namespace devmem {

std::string ShapeString(IntList shape) {
  return Cat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t Numel(IntList shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t CheckedNumel(IntList shape, size_t item_size, std::string_view op) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      ThrowInvalidArgument(
          Cat(op, ": shape ", ShapeString(shape), " has a negative dim"));
    }
  }
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  const int64_t max_elems =
      std::numeric_limits<int64_t>::max() / static_cast<int64_t>(item_size);
  for (int64_t d : shape) {
    if (n > max_elems / d) {
      ThrowInvalidArgument(
          Cat(op, ": shape ", ShapeString(shape), " has too many elements to address"));
    }
    n *= d;
  }
  return n;
}

DimVector ContiguousStrides(IntList shape) {
  DimVector strides(shape.size());
  ContiguousStridesInto(shape, absl::MakeSpan(strides));
  return strides;
}

void ContiguousStridesInto(IntList shape, absl::Span<int64_t> out) {
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    out[i] = s;
    s *= shape[i] > 1 ? shape[i] : 1;
  }
}

bool IsContiguous(IntList shape, IntList strides) {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return true;
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

int64_t WrapDim(int64_t dim, IntList shape, std::string_view op) {
  const int64_t ndim = static_cast<int64_t>(shape.size());
  if (dim < -ndim || dim >= ndim) {
    if (ndim == 0) {
      ThrowInvalidArgument(
          Cat(op, ": dim ", dim, " is out of range for a 0-dim tensor (shape [])"));
    }
    ThrowInvalidArgument(Cat(op, ": dim ", dim, " is out of range for shape ",
                             ShapeString(shape), " (expected a dim in [", -ndim, ", ",
                             ndim - 1, "])"));
  }
  return dim < 0 ? dim + ndim : dim;
}

DimVector BroadcastShapes(IntList a, IntList b, std::string_view op) {
  const size_t n = std::max(a.size(), b.size());
  DimVector out(n);
  for (size_t i = 0; i < n; ++i) {
    // i counts from the right.
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) {
      ThrowInvalidArgument(Cat(op, ": shapes ", ShapeString(a), " and ", ShapeString(b),
                               " cannot be broadcast together (dim ",
                               static_cast<int64_t>(n - 1 - i), " of the result: ", da,
                               " vs ", db, ")"));
    }
    out[n - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

bool BroadcastsTo(IntList from, IntList to) {
  if (from.size() > to.size()) return false;
  const size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i] != 1 && from[i] != to[lead + i]) return false;
  }
  return true;
}

std::optional<DimVector> ViewStrides(IntList shape, IntList strides, IntList new_shape) {
  DimVector new_strides(new_shape.size());
  if (shape.empty()) {  // a scalar: any shape of ones
    for (auto& s : new_strides) s = 1;
    return new_strides;
  }
  const int64_t numel = Numel(shape);
  if (numel == 0) {
    if (std::equal(shape.begin(), shape.end(), new_shape.begin(), new_shape.end())) {
      return DimVector(strides.begin(), strides.end());
    }
    return ContiguousStrides(new_shape);
  }
  // Walk both shapes from the right, one "chunk" of mutually contiguous old dims at a
  // time; the new dims covering a chunk get strides within that chunk.
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(shape.size()) - 1; tensor_d >= 0;
       --tensor_d) {
    tensor_numel *= shape[tensor_d];
    const bool chunk_ends =
        tensor_d == 0 || (shape[tensor_d - 1] != 1 &&
                          strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
      new_strides[view_d] = view_numel * chunk_base_stride;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (tensor_d > 0) {
      chunk_base_stride = strides[tensor_d - 1];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return new_strides;
}

DimVector InferShape(IntList requested, IntList current, std::string_view op) {
  const int64_t numel = Numel(current);
  DimVector out(requested.begin(), requested.end());
  int64_t infer_at = -1;
  int64_t known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      if (infer_at >= 0) {
        ThrowInvalidArgument(
            Cat(op, ": shape ", ShapeString(requested), " has more than one -1"));
      }
      infer_at = static_cast<int64_t>(i);
    } else if (out[i] < 0) {
      ThrowInvalidArgument(
          Cat(op, ": shape ", ShapeString(requested), " has a negative dim"));
    } else {
      known *= out[i];
    }
  }
  if (infer_at >= 0) {
    if (known == 0 || numel % known != 0) {
      ThrowInvalidArgument(Cat(op, ": shape ", ShapeString(requested),
                               " is invalid for a tensor of shape ", ShapeString(current),
                               " (", numel, " elements)"));
    }
    out[infer_at] = numel / known;
    known = numel;
  }
  if (known != numel) {
    ThrowInvalidArgument(Cat(op, ": shape ", ShapeString(requested),
                             " is invalid for a tensor of shape ", ShapeString(current),
                             " (", numel, " elements)"));
  }
  return out;
}

}  // namespace devmem
