// allocator/regular_segments.h: regular segments, one Backend::allocate_segment each
// (internal).
//
// Owns: the Segment objects of regular segments (their first Block comes from
// FreeIndex). grow() honours the memory limit before asking the backend; release()
// waits for the segment's stream, then frees it (cudaFree would wait by itself; the
// sim does not).
//
// Invariants: those of every segment (SegmentTable::validate); it keeps no other
// records.
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include "allocator/backend.h"
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
  absl::Status validate() const override;

 private:
  void give_back(Segment* s) override;

  const size_t max_split_size_;
};

}  // namespace devmem::internal
