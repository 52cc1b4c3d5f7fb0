// tensor/stream.cc: the per-thread current streams (see stream.h).
#include "tensor/stream.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "tensor/device_registry.h"

namespace devmem {
namespace {

struct Entry {
  DeviceId device;
  Stream stream;
};

// The devices this thread set a non-default stream for; a thread touches few devices,
// so a linear search of an inline vector beats a hash map. Entries whose stream is
// the default are removed, so an empty table is the common (and fastest) case.
thread_local absl::InlinedVector<Entry, 4> t_current;

}  // namespace

Stream CurrentStream(DeviceId device) {
  for (const Entry& e : t_current) {
    if (e.device == device) return e.stream;
  }
  return Stream{};
}

void SetCurrentStream(DeviceId device, Stream stream) {
  auto it = std::find_if(t_current.begin(), t_current.end(),
                         [&](const Entry& e) { return e.device == device; });
  if (stream == Stream{}) {
    if (it != t_current.end()) t_current.erase(it);
  } else if (it != t_current.end()) {
    it->stream = stream;
  } else {
    t_current.push_back(Entry{device, stream});
  }
}

void SynchronizeStream(DeviceId device, Stream stream) {
  AllocatorFor(device)->backend().synchronize_stream(stream);
}

void DestroyStream(DeviceId device, Stream stream) {
  const std::shared_ptr<CachingAllocator> allocator = AllocatorFor(device);
  allocator->release_stream(stream);  // throws for the default stream: nothing destroyed
  allocator->backend().destroy_stream(stream);
  if (CurrentStream(device) == stream) SetCurrentStream(device, Stream{});
}

StreamGuard::StreamGuard(DeviceId device, Stream stream)
    : device_(device), stream_(stream), previous_(CurrentStream(device)) {
  SetCurrentStream(device, stream);
}

StreamGuard::~StreamGuard() { SetCurrentStream(device_, previous_); }

}  // namespace devmem
