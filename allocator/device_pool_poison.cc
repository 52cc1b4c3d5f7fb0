// allocator/device_pool_poison.cc: the poisoned state of a DevicePool (device_pool.h,
// "poisoning"; the policy is in allocator/errors.h and caching_allocator.h).
//
// Why poison instead of carrying on: a driver error that is not out-of-memory comes
// from a broken CUDA context (a device-side assert, an illegal address: sticky errors
// that every later call returns). An event query that fails cannot say whether the
// block behind it is still in use, a failed free cannot say whether the memory went
// back. So the pool stops at the first one, keeps its books as they were (every
// driver step of a state change comes before the change, segment_source.cc), and
// answers every later call that would reach the driver with the first error.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/device_pool.h"
#include "allocator/errors.h"

namespace devmem::internal {

std::string DevicePool::poison(const char* op, const char* what) {
  std::call_once(poison_once_, [&] {
    poison_message_ = what;
    poisoned_.store(true, std::memory_order_release);
    std::fprintf(stderr,
                 "devmem: %s: %s failed with a driver error: %s; the allocator of %s "
                 "refuses every later call that reaches the device (stats and "
                 "snapshots stay readable)\n",
                 device_.ToString().c_str(), op, what, device_.ToString().c_str());
  });
  return absl::StrCat("devmem: ", op, " on ", device_.ToString(), ": ", what,
                      " (the allocator of ", device_.ToString(),
                      " is poisoned: later calls fail with this error)");
}

void DevicePool::throw_poisoned(const char* op) const {
  throw DriverError(absl::StrCat("devmem: ", op, " on ", device_.ToString(),
                                 " refused: the allocator is poisoned by an earlier "
                                 "driver error: ",
                                 poison_message_));
}

}  // namespace devmem::internal
