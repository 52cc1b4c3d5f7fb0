// runtime/device_observer.h: the one AllocatorObserver the runtime installs on each
// allocator, composing the trace with the OOM handling.
//
// A CachingAllocator has a single observer slot (allocator/observer.h), while the
// runtime wants every event in its TraceRing and in the allocation-size histogram of
// /metrics (runtime/size_histogram.h), and every OOM in a dump file and in the
// program's callbacks. A DeviceObserver forwards on_event to the ring and the
// histogram (each if given) and on_oom to the dumper, then to the callbacks (each if
// given).
//
//   DeviceObserver observer(&allocator, &ring, &dumper, &callbacks, &sizes);
//   allocator.set_observer(&observer);   // the observer must outlive the allocator
//
// Ownership: borrows everything; the ring, dumper and callbacks must outlive every
// allocator this observer is set on. The runtime keeps its observers for the life of
// the process for that reason (allocators may outlive Shutdown in tensors).
//
// Cost: one virtual call per event (the allocator's single observer slot), then the
// histogram's per-thread count (inline; no lock, no read-modify-write on a cache line
// other threads write) and, when tracing is on (trace_entries > 0, the default), the
// trace's record (inline, into the calling thread's own chunk: no call, no lock, no
// shared write; a chunk claim per 512 events at the default size, runtime/trace.h).
//
// Thread-safety: on_event runs under the allocator's device lock (or, for thread-cache
// hits, on the allocating thread without it) and only writes the calling thread's lane
// of the trace and its histogram shard; on_oom runs after the lock
// is released (allocator/observer.h).
#pragma once

#include "allocator/caching_allocator.h"
#include "allocator/observer.h"
#include "runtime/flight_recorder.h"
#include "runtime/oom.h"
#include "runtime/size_histogram.h"
#include "runtime/trace.h"

namespace devmem {

class DeviceObserver final : public AllocatorObserver {
 public:
  // `allocator` is the allocator this observer is set on (for the dump's snapshot);
  // any of `ring`, `dumper`, `callbacks`, `sizes` may be null.
  DeviceObserver(const CachingAllocator* allocator, TraceRing* ring, OomDumper* dumper,
                 OomCallbackList* callbacks, SizeHistogram* sizes = nullptr,
                 FlightDevice* flight = nullptr)
      : allocator_(allocator),
        ring_(ring),
        dumper_(dumper),
        callbacks_(callbacks),
        sizes_(sizes),
        flight_(flight) {}

  void on_event(const AllocEvent& event) override {
    if (ring_ != nullptr) ring_->Record(event);
    if (sizes_ != nullptr) sizes_->SizeHistogram::on_event(event);  // no virtual call
    if (flight_ != nullptr) flight_->Record(event);  // the flight record (flight_recorder.h)
  }
  void on_oom(const OomReport& report) override;

 private:
  const CachingAllocator* const allocator_;
  TraceRing* const ring_;
  OomDumper* const dumper_;
  OomCallbackList* const callbacks_;
  SizeHistogram* const sizes_;
  FlightDevice* const flight_;
};

}  // namespace devmem
