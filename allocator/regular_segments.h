// allocator/regular_segments.h: regular segments, one Backend::allocate_segment each
// (internal).
//
// Owns: the Segment objects of regular segments (their first Block comes from
// FreeIndex) and the intents of segment allocations in flight. grow() honours the
// memory limit before asking the backend; release() waits for the segment's stream,
// then frees it (cudaFree would wait by itself; the sim does not).
//
// No driver call under the device lock on the allocation path (driver_in_flight.h):
// grow() registers the intent (its bytes count against the memory limit, so two
// threads cannot both overshoot it), releases req.lock around allocate_segment, takes it
// back and links the result; a failed call un-registers. release() (segment_source.h)
// takes the segments out of the table first and frees them with the lock released.
// Meanwhile the pool is consistent (the new segment is nowhere yet, a released one
// nowhere any more): other threads allocate from the cache, free, trim and validate.
// The caller must expect anything to have changed across grow() and release().
//
// Invariants (validate): those of every segment (SegmentTable::validate); the intents'
// bytes are DriverInFlight's to check.
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include "allocator/backend.h"
#include "allocator/driver_in_flight.h"
#include "allocator/mutex.h"
#include "allocator/free_index.h"
#include "allocator/pool_accounting.h"
#include "allocator/segment_source.h"
#include "allocator/segment_table.h"

namespace devmem::internal {

class RegularSegments final : public SegmentSource {
 public:
  RegularSegments(Backend& backend, size_t max_split_size, SegmentTable& table,
                  FreeIndex& free, PoolAccounting& acct, DriverInFlight& in_flight)
      : SegmentSource(backend, table, free, acct, in_flight), max_split_size_(max_split_size) {}

  // A segment of req.segment_size; nullptr when it would cross req.limit or the
  // backend is out of memory. Another backend failure is a std::runtime_error naming
  // it, with nothing changed.
  Grown grow(const GrowRequest& req) override;
  size_t recycle(size_t, Mutex*) override { return 0; }  // a segment goes back whole
  void release_address_space(Mutex*) override {}
  size_t complete_deferred(bool, Mutex*) override { return 0; }  // gives back at once
  absl::Status validate() const override { return absl::OkStatus(); }

 private:
  void give_back_call(uintptr_t addr, size_t size) override;
  // A private pool's segment (Segment::private_pool) leaves the pool's list when it is
  // detached for release and goes back into it when it is restored after a failed
  // release, so that a DriverError leaves the pool's list as it was (validate: every
  // private segment of the table is in its pool's list and the reverse). The restore
  // never allocates: the list only shrank since the segment left it (no allocation is
  // routed to a released pool, so nothing was added), and erasing keeps the capacity.
  void detached(Segment* s) override;
  void restored(Segment* s) override;

  const size_t max_split_size_;
};

}  // namespace devmem::internal
