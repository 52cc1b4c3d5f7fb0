// runtime/device_observer.cc: OOM routing of the runtime's observer (see
// device_observer.h).
#include "runtime/device_observer.h"

namespace devmem {

void DeviceObserver::on_oom(const OomReport& report) {
  // The allocator is alive: on_oom is called from inside its allocate().
  if (dumper_ != nullptr) dumper_->MaybeDump(report, *allocator_, ring_);
  if (callbacks_ != nullptr) callbacks_->run(report);
}

}  // namespace devmem
