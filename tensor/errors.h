// tensor/errors.h: what the tensor layer throws.
//
// Example:
//   try {
//     Tensor y = x.view({7});
//   } catch (const InvalidArgumentError& e) {
//     // "view: shape [7] is invalid for a tensor of shape [2, 3] (6 elements)"
//   }
//
// Bad input (out-of-range dims or slices, shape, dtype or device mismatches, a reshape
// that cannot be a view) throws InvalidArgumentError (allocator/errors.h, a
// std::invalid_argument) whose message starts with the operation's name and names the
// shapes, dims, dtypes or devices involved. Checks run before anything is allocated,
// and every allocation is owned by a handle from the moment it exists, so nothing
// leaks when one is thrown.
//
// An op on a device that has no kernels registered (kernels.h) throws
// UnsupportedDeviceError naming the op and the device. Out-of-memory is the
// allocator's OutOfMemoryError (allocator/oom_report.h), passed through unchanged.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "allocator/errors.h"
#include "allocator/string_view_bridge.h"

namespace devmem {

class UnsupportedDeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace tensor_internal {
// Debian's abseil has its own absl::string_view (allocator/string_view_bridge.h);
// Cat() bridges std::string_view arguments.
inline absl::string_view CatArg(std::string_view s) { return Av(s); }
template <typename T>
const T& CatArg(const T& value) {
  return value;
}
}  // namespace tensor_internal

// absl::StrCat that also takes std::string_view: how error messages are built here.
template <typename... Args>
std::string Cat(const Args&... args) {
  return absl::StrCat(tensor_internal::CatArg(args)...);
}

// Out of line in spirit (cold), inline so that headers can use it.
[[noreturn]] inline void ThrowInvalidArgument(std::string message) {
  throw InvalidArgumentError(std::move(message));
}

}  // namespace devmem
