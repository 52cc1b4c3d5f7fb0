// allocator/segment_table.h: every segment of one DevicePool by base address
// (internal).
//
// An index, not an owner: the segment sources (regular_segments.h,
// expandable_segments.h) create and delete their Segment objects and add, move and
// remove them here; DevicePool, the reclaimer and the sources look segments up
// (interior pointers, the runs of a reservation in address order, unused segments).
//
// Invariants (validate): each key is its segment's address; segments do not overlap;
// the blocks of each segment tile it exactly (address order, linked both ways, head and
// tail right, 512-byte aligned, on the segment's stream); its busy count is its
// allocated + pending blocks; a segment with none is one single free block.
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "allocator/block.h"

namespace devmem::internal {

class SegmentTable {
 public:
  using Map = absl::btree_map<uintptr_t, Segment*>;

  SegmentTable() = default;
  SegmentTable(const SegmentTable&) = delete;
  SegmentTable& operator=(const SegmentTable&) = delete;

  void add(Segment* s) { segments_.emplace(s->addr, s); }
  void remove(const Segment* s) { segments_.erase(s->addr); }
  // Moves `s` to a new base address (its start changed).
  void rekey(Segment* s, uintptr_t addr) {
    segments_.erase(s->addr);
    s->addr = addr;
    segments_.emplace(addr, s);
  }

  size_t size() const { return segments_.size(); }
  Map::const_iterator begin() const { return segments_.begin(); }
  Map::const_iterator end() const { return segments_.end(); }
  Map::const_iterator lower_bound(uintptr_t addr) const {
    return segments_.lower_bound(addr);
  }
  Map::const_iterator find(uintptr_t addr) const { return segments_.find(addr); }

  // The block containing `addr` (any state), or nullptr.
  Block* block_containing(uintptr_t addr) const;
  // Shared-pool segments with no allocated or pending block, in address order (private
  // pools' segments are not the reclaimer's to release).
  std::vector<Segment*> unused() const;

  // This part's share of validate(). Calls on_segment(s) once per segment (in address
  // order) and on_block(b) once per block of it (b->prev is checked already), and
  // stops at the first error any of them returns.
  absl::Status validate(absl::FunctionRef<absl::Status(const Segment*)> on_segment,
                        absl::FunctionRef<absl::Status(const Block*)> on_block) const;

 private:
  Map segments_;
};

}  // namespace devmem::internal
