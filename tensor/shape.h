// tensor/shape.h: shapes and strides, and the arithmetic views are made of.
//
// Example:
//   DimVector strides = ContiguousStrides({2, 3, 4});        // [12, 4, 1]
//   DimVector out = BroadcastShapes({3, 1}, {4}, "add");     // [3, 4]
//   std::optional<DimVector> s = ViewStrides({2, 3}, {3, 1}, {6});  // [1]
//   std::string text = ShapeString({2, 3});                  // "[2, 3]"
//
// Conventions: strides and offsets count elements, not bytes. A dim of size 1 may have
// any stride (it is never stepped over); a stride of 0 on a larger dim means broadcast
// (every index reads the same element). Shapes and strides live in DimVector, an
// inline vector of 6: tensors of up to 6 dims never touch the heap for their metadata,
// which is what keeps copying a Tensor handle and making a view cheap.
//
// The functions that can fail throw InvalidArgumentError (tensor/errors.h) with a
// message that starts with `op` and names the shapes and dims involved.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"

namespace devmem {

using DimVector = absl::InlinedVector<int64_t, 6>;
// A read-only list of dims; binds to DimVector, std::vector and {2, 3} literals.
using IntList = absl::Span<const int64_t>;

// "[2, 3]"; "[]" for a 0-dim (scalar) shape.
std::string ShapeString(IntList shape);

// Product of the dims (1 for a 0-dim shape). No checks.
int64_t Numel(IntList shape);
// Product of the dims, after checking that none is negative and that the product and
// its size in bytes (times `item_size`) fit in int64_t.
int64_t CheckedNumel(IntList shape, size_t item_size, std::string_view op);

// Row-major strides for `shape` (the last dim has stride 1).
DimVector ContiguousStrides(IntList shape);
// The same, written into `out` (of shape.size() elements), for a tensor's own strides.
void ContiguousStridesInto(IntList shape, absl::Span<int64_t> out);
// True when `strides` are the row-major strides of `shape`, ignoring dims of size 1
// (their stride never matters) and true for any tensor with no elements.
bool IsContiguous(IntList shape, IntList strides);

// Maps a Python-style dim (-ndim .. ndim-1) to 0 .. ndim-1, or throws naming the dim
// and the shape.
int64_t WrapDim(int64_t dim, IntList shape, std::string_view op);

// The NumPy broadcast of two shapes (align on the right; a dim of 1 stretches), or a
// throw naming both.
DimVector BroadcastShapes(IntList a, IntList b, std::string_view op);

// True when `from` broadcasts to exactly `to` (what broadcast_to accepts).
bool BroadcastsTo(IntList from, IntList to);

// Strides that let a tensor of (shape, strides) be seen as `new_shape` without moving
// data, or nullopt when no such strides exist (then a copy is needed). Numel of both
// shapes must be equal. This is PyTorch's computeStride: each run of dims that are
// contiguous among themselves can be split or merged freely.
std::optional<DimVector> ViewStrides(IntList shape, IntList strides, IntList new_shape);

// Replaces one -1 in `requested` by the size that makes numel match, checks that the
// result has `numel` elements, or throws naming both shapes.
DimVector InferShape(IntList requested, IntList current, std::string_view op);

}  // namespace devmem
