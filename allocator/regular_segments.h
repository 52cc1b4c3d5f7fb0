// allocator/regular_segments.h: regular segments, one Backend::allocate_segment each
// (internal).
//
// Owns: the Segment objects of regular segments (their first Block comes from
// FreeIndex) and the intents of segment allocations in flight. grow() honours the
// memory limit before asking the backend; release() waits for the segment's stream,
// then frees it (cudaFree would wait by itself; the sim does not).
//
// No driver call under the device lock on the allocation path: grow() registers the
// intent (reserved_in_flight: its bytes count against the memory limit, so two threads
// cannot both overshoot it), releases req.lock around allocate_segment, takes it back
// and links the result; a failed call un-registers. Meanwhile the pool is consistent
// (the new segment is nowhere yet): other threads allocate from the cache, free,
// trim and validate. The caller must expect anything to have changed across grow().
//
// Invariants (validate): those of every segment (SegmentTable::validate); intents hold
// bytes exactly while calls are in flight.
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include "allocator/backend.h"
#include "allocator/mutex.h"
#include "allocator/free_index.h"
#include "allocator/pool_accounting.h"
#include "allocator/segment_source.h"
#include "allocator/segment_table.h"

namespace devmem::internal {

class RegularSegments final : public SegmentSource {
 public:
  RegularSegments(Backend& backend, size_t max_split_size, SegmentTable& table,
                  FreeIndex& free, PoolAccounting& acct)
      : SegmentSource(backend, table, free, acct), max_split_size_(max_split_size) {}

  // A segment of req.segment_size; nullptr when it would cross req.limit or the
  // backend is out of memory. Another backend failure is a std::runtime_error naming
  // it, with nothing changed.
  Grown grow(const GrowRequest& req) override;
  size_t recycle(size_t) override { return 0; }  // a segment goes back whole or not
  void release_address_space() override {}
  size_t complete_deferred(bool) override { return 0; }  // gives back at once
  absl::Status validate() const override;

  // Bytes of segment allocations in flight (the lock released around the driver call).
  size_t reserved_in_flight() const { return in_flight_bytes_; }

 private:
  void give_back(Segment* s) override;

  const size_t max_split_size_;
  size_t in_flight_bytes_ = 0;
  int in_flight_calls_ = 0;
};

}  // namespace devmem::internal
