// allocator/errors.h: typed errors for bad input and for a failing driver.
//
// Out-of-memory is OutOfMemoryError (allocator/oom_report.h), derived from
// std::bad_alloc and thrown only when memory is really exhausted. Everything the caller
// got wrong (an unknown, interior or already freed pointer; a size that overflows) is an
// InvalidArgumentError whose message names the pointer or size and the device. State
// is unchanged when one is thrown.
//
// A driver call that fails for any reason but memory (a sticky device error after a
// kernel fault or device-side assert, a lost device) is a DriverError whose message
// names the device, the call and the driver's error ("cuda:0: cudaStreamSynchronize:
// an illegal memory access was encountered (cudaErrorIllegalAddress, error 700)").
// Backends throw it from the methods that return no Status (allocator/backend.h). The
// allocator that sees one is poisoned: that call and every later call that would
// touch the device throws a DriverError carrying the first one's message, while
// stats, snapshots and validate() stay readable (caching_allocator.h).
#pragma once

#include <stdexcept>
#include <string>

namespace devmem {

class InvalidArgumentError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class DriverError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace devmem
