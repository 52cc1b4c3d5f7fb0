// tensor/factories.h: making new tensors (each one new buffer, recorded at the caller's
// line with site kind alloc), and wrapping memory from elsewhere.
//
// Example:
//   Tensor a = zeros({2, 3});  // float32, default device
//   Tensor b = ones({4}, {.dtype = DType::kInt64, .device = DeviceId{}});  // on cpu
//   Generator gen(7);
//   Tensor w = randn({3, 2}, gen);                        // seeded
//   Tensor x = from_vector<float>({1, 2, 3, 4}, {2, 2});  // host data, uploaded
//   Tensor f = from_blob(ptr, {16}, DType::kFloat32, DeviceId{},
//                        [](void* p) { std::free(p); });  // foreign, owned
//
// Every function takes `std::source_location loc = std::source_location::current()`:
// the allocator records the caller's file and line, not this file's. Shapes with a
// negative dim, or too many elements to address, throw InvalidArgumentError before
// anything is allocated. New tensors are contiguous, with offset 0.
#pragma once

#include <cstdint>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "allocator/site.h"
#include "tensor/random.h"
#include "tensor/storage.h"
#include "tensor/tensor.h"

namespace devmem {

// Uninitialized elements.
Tensor empty(IntList shape, TensorOptions options = {},
             std::source_location loc = std::source_location::current());
Tensor zeros(IntList shape, TensorOptions options = {},
             std::source_location loc = std::source_location::current());
Tensor ones(IntList shape, TensorOptions options = {},
            std::source_location loc = std::source_location::current());
Tensor full(IntList shape, double value, TensorOptions options = {},
            std::source_location loc = std::source_location::current());
// Standard normal draws from `gen` (float32 or float64), in row-major order; advances
// gen by numel draws (tensor/random.h).
Tensor randn(IntList shape, Generator& gen, TensorOptions options = {},
             std::source_location loc = std::source_location::current());

// A new tensor holding the row-major elements at host address `data` (numel elements
// of options.dtype).
Tensor from_host(const void* data, IntList shape, TensorOptions options = {},
                 std::source_location loc = std::source_location::current());
// The same from a vector; the dtype is T's, values.size() must equal the numel.
template <typename T>
Tensor from_vector(const std::vector<T>& values, IntList shape,
                   std::optional<DeviceId> device = std::nullopt,
                   std::source_location loc = std::source_location::current()) {
  if (static_cast<int64_t>(values.size()) !=
      CheckedNumel(shape, sizeof(T), "from_vector")) {
    ThrowInvalidArgument("from_vector: " + std::to_string(values.size()) +
                         " values do not fill shape " + ShapeString(shape));
  }
  return from_host(values.data(), shape, TensorOptions{DTypeOf<T>(), device}, loc);
}

// Views memory devmem did not allocate (no allocation, no copy): `data` holds a
// contiguous row-major tensor of `shape` on `device`. With a deleter the tensor owns
// the memory and calls deleter(data) when the last view dies; without one the caller
// keeps it alive. When this throws (a bad shape), ownership stays with the caller: the
// deleter is not called.
Tensor from_blob(void* data, IntList shape, DType dtype, DeviceId device,
                 Storage::Deleter deleter = nullptr);

// For layers that intern their own sites: a contiguous, uninitialized tensor whose
// block is recorded under `site`.
Tensor EmptyAt(IntList shape, DType dtype, DeviceId device, SiteId site);

}  // namespace devmem
