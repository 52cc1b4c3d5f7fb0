// tensor/tensor.h: a strided view of a Storage, with reference semantics.
//
// Example (the seed's training step, by hand):
//   Generator gen(42);
//   Tensor w = randn({3, 2}, gen);                  // a new buffer, site kind alloc
//   Tensor x = x_train.slice(0, offset, offset + 32);  // a view: no allocation
//   Tensor h = relu(matmul(x, w.t()));              // op outputs: new buffers
//   Tensor best = w.clone();                        // the only way to copy: the
//                                                   // allocator records this line
//   w.sub_(grad, /*alpha=*/lr);                     // in place, through every view of w
//
// Reference semantics (the choice of NumPy, PyTorch, Julia and Arraymancer; README.md
// has the reasoning):
//   * A Tensor is a handle: a pointer to its Storage plus shape, strides and offset.
//     Copying or assigning a Tensor shares the storage; it never copies elements.
//   * Views (slice, select, narrow, transpose, t, permute, view/reshape, broadcast_to,
//     squeeze, unsqueeze, flatten) share the storage and never allocate, not even
//     metadata (shape and strides are inline for up to 6 dims). A write through any view
//     is seen through every other.
//   * Elements are copied only by clone(), contiguous() (when not already contiguous)
//     and to(device). Each records its caller's file and line, with its kind, on the
//     new block, so "which line of my code created these bytes by copying" has an
//     answer (CachingAllocator::site_stats, top_sites, OOM reports). Plain creation
//     (empty, zeros, randn, op outputs; tensor/factories.h, tensor/ops.h) records its
//     caller's line with kind alloc.
//   * The storage is freed the moment the last Tensor viewing it dies.
//
// Errors: bad input throws InvalidArgumentError naming the shapes, dims, dtypes or
// devices (tensor/errors.h); nothing is allocated or leaked then.
//
// Thread-safety: like any value type. Distinct Tensor objects may be used from
// different threads even when they share storage (the refcount is atomic); the
// elements are not synchronized: concurrent writes to the same elements, or a write
// concurrent with a read, are data races as with any memory.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "allocator/types.h"
#include "tensor/dtype.h"
#include "tensor/errors.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace devmem {

// What to create: dtype and device (DefaultDevice() when unset).
//   zeros({2, 3}, {.dtype = DType::kFloat64, .device = DeviceId{DeviceType::kCpu, 0}})
struct TensorOptions {
  DType dtype = DType::kFloat32;
  std::optional<DeviceId> device;
};

// `stop` of slice() meaning "through the end" (Python's x[start:]).
inline constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();

class Tensor {
 public:
  // An undefined tensor: no storage, shape []. defined() is false; ops throw on it.
  Tensor() = default;

  // A view of `storage` (which it shares). Throws InvalidArgumentError when a stride is
  // negative, the ranks differ, the offset is past the end, or some element would lie
  // outside the storage (computed in checked arithmetic: no stride wraps around).
  Tensor(StoragePtr storage, DType dtype, IntList shape, IntList strides,
         int64_t offset = 0);

  // Copying shares the storage (one relaxed atomic increment); moving is free.
  Tensor(const Tensor&) = default;
  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(const Tensor&) = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  ~Tensor() = default;

  // Drops this handle's reference (freeing the storage if it was the last) and makes
  // the tensor undefined. Prefer it to `t = Tensor()`, which is equivalent but makes
  // GCC 12 warn (-Wmaybe-uninitialized, a false positive in abseil's InlinedVector move).
  void reset() {
    storage_.reset();
    shape_.clear();
    strides_.clear();
    offset_ = 0;
    dtype_ = DType::kFloat32;
  }

  // ---- what it is ------------------------------------------------------------------
  bool defined() const { return static_cast<bool>(storage_); }
  DType dtype() const { return dtype_; }
  // cpu for an undefined tensor.
  DeviceId device() const { return storage_ ? storage_->device() : DeviceId{}; }
  IntList shape() const { return shape_; }
  IntList strides() const { return strides_; }
  // In elements, from the start of the storage.
  int64_t offset() const { return offset_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  // Python-style dims (-1 is the last); throws when out of range.
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t numel() const { return Numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * ItemSize(dtype_); }
  // Row-major with no gaps (dims of size 1 may have any stride).
  bool is_contiguous() const { return IsContiguous(shape_, strides_); }

  const StoragePtr& storage() const { return storage_; }
  // Number of handles (Tensors and StoragePtrs) sharing the storage; 0 if undefined.
  uint64_t use_count() const { return storage_.use_count(); }
  bool shares_storage_with(const Tensor& other) const {
    return storage_ && storage_ == other.storage_;
  }

  // Address of element (0, ..., 0): a device address for device memory.
  void* data_ptr() const;
  // The same, typed; throws when T is not the dtype.
  template <typename T>
  T* data() const {
    CheckDType(DTypeOf<T>(), "data");
    return static_cast<T*>(data_ptr());
  }

  // "Tensor(float32, [2, 3], strides [3, 1], offset 0, sim:0)".
  std::string ToString() const;

  // ---- reading elements on the host (synchronous) -------------------------------------
  // The value of a one-element tensor. Throws unless numel() == 1 and T is the dtype.
  template <typename T>
  T item() const {
    CheckDType(DTypeOf<T>(), "item");
    if (numel() != 1) {
      ThrowInvalidArgument("item: expected a tensor with 1 element, got shape " +
                           ShapeString(shape_));
    }
    T value;
    CopyToHost(&value);
    return value;
  }
  // Every element in row-major order. Throws unless T is the dtype.
  template <typename T>
  std::vector<T> to_vector() const {
    CheckDType(DTypeOf<T>(), "to_vector");
    std::vector<T> out(static_cast<size_t>(numel()));
    if (!out.empty()) CopyToHost(out.data());
    return out;
  }

  // ---- views: share the storage, never allocate -------------------------------------
  // Elements start, start+step, ... < stop along `dim`. start and stop are Python-style:
  // negative values count from the end; kEnd means the size. Unlike Python, values
  // outside [-size, size] throw instead of clamping (a clamped batch offset hides
  // bugs); stop <= start gives an empty view. step must be >= 1.
  Tensor slice(int64_t dim, int64_t start, int64_t stop = kEnd, int64_t step = 1) const;
  // Index `index` (Python-style) of `dim`; the dim disappears.
  Tensor select(int64_t dim, int64_t index) const;
  // slice(dim, start, start + length); length >= 0 and the range must fit.
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  // transpose(0, 1) of a 2-D tensor.
  Tensor t() const;
  // dims must be a permutation of 0..dim()-1 (Python-style values allowed).
  Tensor permute(IntList dims) const;
  // The same elements in row-major order with `shape` (one dim may be -1). A view
  // whenever the strides allow it (always for contiguous tensors); otherwise throws,
  // telling the caller to call contiguous() or clone() first: the copy stays explicit.
  Tensor view(IntList shape) const;
  // The same as view() (this library never copies implicitly).
  Tensor reshape(IntList shape) const { return view(shape); }
  // NumPy broadcasting to `shape`: stretched dims get stride 0.
  Tensor broadcast_to(IntList shape) const;
  // Drops every dim of size 1.
  Tensor squeeze() const;
  // Drops `dim`, which must have size 1.
  Tensor squeeze(int64_t dim) const;
  // Inserts a dim of size 1 before `dim` (-1 appends).
  Tensor unsqueeze(int64_t dim) const;
  // Merges dims start_dim..end_dim into one: a view when the strides allow.
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;

  // ---- copies: the only ones, each recorded at the caller's line ----------------------
  // A new contiguous buffer with the same elements (kind clone).
  Tensor clone(std::source_location loc = std::source_location::current()) const;
  // *this when already contiguous (no copy); else a contiguous copy (kind contiguous).
  Tensor contiguous(std::source_location loc = std::source_location::current()) const;
  // *this when already on `device`; else a contiguous copy there (kind to_device).
  Tensor to(DeviceId device,
            std::source_location loc = std::source_location::current()) const;

  // ---- streams (tensor/stream.h) ---------------------------------------------------
  // Announces that work queued on `stream` (of this tensor's device) uses the storage,
  // so that its free waits for that work (CachingAllocator::record_stream): call it
  // whenever the tensor is used on a stream other than the one it was allocated on
  // (storage()->stream()). Without it, dropping the tensor lets the allocating stream
  // reuse the memory while `stream` may still be using it (stream.h, "the user
  // error"). A no-op for foreign storages and empty ones; throws on an undefined
  // tensor.
  void record_stream(Stream stream) const;

  // ---- in place: write through this view (and so through every view of its storage) ---
  // Scalars are converted to the dtype; for integer dtypes they must be integral and
  // in range. `other` must broadcast to this shape and have the same dtype and device.
  // No two indices of this tensor may share an element: a broadcast view (stride 0) or
  // constructor strides that overlap are refused (op_util.h CheckWritable).
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);
  Tensor& add_(const Tensor& other, double alpha = 1.0);  // this += alpha * other
  Tensor& add_(double value);
  Tensor& sub_(const Tensor& other, double alpha = 1.0);  // this -= alpha * other
  Tensor& sub_(double value);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);

 private:
  void CheckDType(DType expected, const char* op) const;
  void CopyToHost(void* dst) const;
  // view() with `op` named in its errors (flatten is a view too).
  Tensor ViewAs(IntList shape, std::string_view op) const;

  // Invariants: shape_.size() == strides_.size(); strides >= 0; for a defined tensor
  // with numel() > 0, every element lies inside the storage; offset_ >= 0.
  StoragePtr storage_;
  DimVector shape_;
  DimVector strides_;
  int64_t offset_ = 0;
  DType dtype_ = DType::kFloat32;
};

}  // namespace devmem
