// allocator/private_pools.h: a DevicePool's private pools (graph capture) and the
// allocations under way into them (internal).
//
// Owns: one PrivatePool per PoolId (its free sets and the list of its segments; the
// segments themselves are RegularSegments', the blocks FreeIndex's), and the list of
// begin_allocate_to_pool calls not yet ended, in call order (PyTorch's
// captures_underway), each with its stream filter.
//
// Rules (PyTorch's, allocator/pool_id.h):
//   * use_count counts begin_allocate_to_pool calls not yet matched by release_pool; a
//     begin on an existing live pool shares it. When release_pool brings it to zero the
//     pool is released: its unused segments go back to the device (at once, or once no
//     capture is under way), its other segments when their blocks have been freed (on
//     empty_cache and under memory pressure); the pool is forgotten when it holds none
//     and no release of its segments is under way (`releasing`: those run with the
//     device lock released and may put their segments back).
//   * A pool's segments serve only allocations routed to it; their free blocks are in
//     the pool's own free sets (FreeIndex routes by Segment::private_pool), never in the
//     shared ones, never in a thread cache or an arena; the reclaimer never releases
//     them (SegmentTable::unused skips them).
// Invariants (validate): every segment with private_pool == p is in p's list and the
// reverse (one being released with the lock released is in neither); only a released
// pool is pinned; the under-way entries name live (unreleased) pools.
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/status/status.h"
#include "allocator/block.h"
#include "allocator/pool_id.h"

namespace devmem::internal {

struct PrivatePool {
  explicit PrivatePool(PoolId pool_id) : id(pool_id) {}
  const PoolId id;
  int use_count = 0;      // begins not yet released
  bool released = false;  // use_count reached 0: draining back to the device
  // Releases of its segments under way with the device lock released (DevicePool::
  // release_private_pools_locked): while > 0 the pool is pinned (never forgotten), so
  // that a release that fails can put its segments back into this pool.
  int releasing = 0;
  // Grows into it under way with the device lock released (grow_during_capture_locked:
  // an allocation routed to it before its capture ended). While > 0 the pool is never
  // forgotten nor released (its list may still grow), and end_allocate_to_pool waits
  // for them before it returns.
  int growing = 0;
  absl::btree_set<Block*, BlockLess> small_free, large_free;  // its free blocks
  std::vector<Segment*> segments;                              // its segments
  absl::btree_set<Block*, BlockLess>& free_set(bool small) {
    return small ? small_free : large_free;
  }
  const absl::btree_set<Block*, BlockLess>& free_set(bool small) const {
    return small ? small_free : large_free;
  }
};

class PrivatePools {
 public:
  PrivatePools() = default;
  PrivatePools(const PrivatePools&) = delete;
  PrivatePools& operator=(const PrivatePools&) = delete;

  // True while some begin_allocate_to_pool has not been ended: a capture may be under
  // way, so nothing may query events, synchronize, or give memory back to the device.
  bool any_underway() const { return !underway_.empty(); }
  // The pool the allocation on `stream` goes to (the first under-way entry whose
  // filter takes the stream), or nullptr.
  PrivatePool* route(Stream stream) const;

  // The bookkeeping of the three calls; errors name the pool (and `device`) and change
  // nothing. begin may throw std::bad_alloc, changing nothing.
  absl::Status begin(PoolId id, StreamFilter filter, const std::string& device);
  absl::Status end(PoolId id, const std::string& device);
  // On success *pool is the pool and its use count has dropped; released when zero.
  absl::Status release(PoolId id, const std::string& device, PrivatePool** pool);

  void add_segment(PrivatePool* p, Segment* s) { p->segments.push_back(s); }
  void remove_segment(PrivatePool* p, const Segment* s);
  // Forgets a released pool that holds no segment and is not pinned (releasing,
  // growing).
  void forget_if_empty(PrivatePool* p);
  // The known pool `id`, or nullptr.
  PrivatePool* find(PoolId id) const {
    const auto it = pools_.find(id);
    return it == pools_.end() ? nullptr : it->second.get();
  }

  size_t size() const { return pools_.size(); }
  auto begin() const { return pools_.begin(); }
  auto end() const { return pools_.end(); }

  absl::Status validate(size_t private_segments) const;

 private:
  struct Underway {
    PoolId id;
    StreamFilter filter;
    PrivatePool* pool;
  };
  std::map<PoolId, std::unique_ptr<PrivatePool>> pools_;
  std::vector<Underway> underway_;
};

}  // namespace devmem::internal
