// allocator/errors.h: typed errors for bad input.
//
// Out-of-memory is OutOfMemoryError (allocator/oom_report.h), derived from
// std::bad_alloc and thrown only when memory is really exhausted. Everything the caller
// got wrong (an unknown, interior or already freed pointer; a size that overflows) is an
// InvalidArgumentError whose message names the pointer or size and the device. State
// is unchanged when one is thrown.
#pragma once

#include <stdexcept>
#include <string>

namespace devmem {

class InvalidArgumentError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace devmem
