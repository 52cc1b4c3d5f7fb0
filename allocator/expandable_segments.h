// allocator/expandable_segments.h: expandable segments, a DevicePool's use of the
// backend's virtual memory (internal; block.h defines Reservation and its runs).
//
// Each (stream, pool) gets one reserved address range. Memory is mapped into it one
// granule (2 MiB on CUDA) at a time, where a request needs it, and unmapped from
// inside free blocks, so the device footprint follows what is allocated rather than
// where it was allocated: a 32 MiB request that fits in none of the 16 MiB holes
// between live buffers can take the holes' physical memory (unmapped) at a new
// address, instead of new memory next to them.
//
// When granules are unmapped ("recycled"):
//   * under memory pressure: the device or the memory fraction refuses a map, or the
//     reclaimer (staged retry, trim, empty_cache, garbage collection) asks for bytes;
//   * proactively, when a request must map new memory and the bytes its stream maps
//     would then exceed (1 + expandable_recycle_threshold) x the high-water mark of
//     the stream's bytes in use (StreamFootprint, pool_policy.h): that is
//     fragmentation growing the footprint, so the reservation's idle granules are
//     unmapped (at most as many as are being mapped; the footprint never shrinks on
//     the allocation path). Per stream, because a stream's blocks serve only that
//     stream: streams whose peaks do not coincide each keep what their own peak needs.
// Steady workloads whose cached memory stays under the threshold never recycle, so
// they map once and then run from the cache like regular segments.
//
// A free block may still be used by work queued on its stream before the free, and
// unmapping, unlike cudaFree, does not wait for it. Under memory pressure recycling
// synchronizes the stream first. Proactive recycling never does: it records an event
// on the reservation's stream; if the stream is idle (the event is complete at once)
// it unmaps then, before the map; otherwise the decision waits (one per reservation,
// merged) and complete_deferred() unmaps, once the event completes, what is still
// over the cap, taking only blocks that were free when the event was recorded
// (Block::free_seq). Until then the footprint may overshoot the cap by what was
// decided. Unmaps and maps are counted in num_device_free and num_device_alloc.
//
// The handle reserve (allocator/driver_calls.h): an unmap leaves its granules'
// physical memory with the backend, and a map takes it first. The limit check and the
// proactive trigger count those bytes as held (a map adds only what the reserve
// lacks), so a recycle for a map moves handles rather than creating new ones; the
// reclaimer releases the reserve (release_handle_reserve) after every reclaim.
//
// The high-water marks are policy-private (StreamUse, block.h): reset_peak_stats()
// resets allocated_bytes.peak for the user and not them, so resetting peaks each epoch
// does not change how much is recycled.
//
// Owns: the reservations (their address ranges are released by empty_cache when they
// map nothing, and by the destructor), the record of refused reservations, the
// Segment objects of the mapped runs, and each stream's StreamUse (kept for the pool's
// life: a few bytes per stream ever used).
// Invariants (validate): those of Reservation (block.h): runs inside their range, on
// granule boundaries, never adjacent, summing to `mapped`, counted in `runs`; each
// run's reservation is in the table, with the run's stream and pool; each deferred
// decision names a reservation of the table (one at most per reservation), decided
// bytes > 0, summing to deferred_bytes_; each reservation's `use` is its stream's
// StreamUse, whose in_use is the bytes of the stream's blocks out of the free sets
// (at most in_use_peak).
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "allocator/backend.h"
#include "allocator/free_index.h"
#include "allocator/pool_accounting.h"
#include "allocator/pool_policy.h"
#include "allocator/segment_source.h"
#include "allocator/segment_table.h"

namespace devmem::internal {

class ExpandableSegments final : public SegmentSource {
 public:
  // `granularity` > 0: the backend's; `recycle_threshold`: expandable_recycle_threshold
  // (+inf: recycle only under memory pressure).
  ExpandableSegments(Backend& backend, size_t device_total, size_t granularity,
                     double recycle_threshold, SegmentTable& table, FreeIndex& free,
                     PoolAccounting& acct)
      : SegmentSource(backend, table, free, acct),
        device_total_(device_total),
        granularity_(granularity),
        recycle_threshold_(recycle_threshold) {}
  // Releases every reservation's address range (destroy() has unmapped the runs).
  ~ExpandableSegments() override;

  // Maps memory in the (stream, pool)'s reservation for the request, first recycling
  // idle granules when the footprint would grow past expandable_recycle_threshold or
  // the memory limit, or when the device is out of memory. no_room when the
  // reservation cannot be had or none of its unmapped gaps can hold the request.
  Grown grow(const GrowRequest& req) override;
  // Unmaps whole free granules of any reservation, largest blocks first.
  size_t recycle(size_t bytes) override { return recycle_except(bytes, Scope{}); }
  // Gives the backend's physical-handle reserve back to the driver (the reclaimer's
  // last step: memory unmapped for reuse is released when memory is given back).
  size_t release_handle_reserve() override { return backend_.release_handle_reserve(); }
  // Releases the address ranges of reservations that map nothing, and forgets the
  // refusals (address space was given back: worth asking again).
  void release_address_space() override;
  // Deferred proactive recycling: unmaps for each decision whose event completed (with
  // `wait`: after waiting for every event) what is still over the cap.
  size_t complete_deferred(bool wait) override;
  absl::Status validate() const override;

  size_t granularity() const { return granularity_; }
  bool has_deferred() const { return !deferred_.empty(); }

  // A retired stream's handle names a new stream (release_stream, stream_retire.h):
  // its high-water mark starts again from the bytes it still has in use.
  void restart_stream_peak(Stream s) {
    if (auto it = streams_.find(s.handle); it != streams_.end()) {
      it->second.in_use_peak = it->second.in_use;
    }
  }

 private:
  // Where mapping for a request goes: map [at, at + bytes), which joins the free
  // blocks `left` (ending at `at`) and/or `right` (starting at at + bytes) when set.
  struct Placement {
    uintptr_t at = 0;
    size_t bytes = 0;  // 0: nothing fits in the reservation's unmapped gaps
    Block* left = nullptr;
    Block* right = nullptr;
  };
  using Key = std::pair<uintptr_t, bool>;  // (stream handle, small pool)
  // Which free blocks recycle_except may take.
  struct Scope {
    const Block* keep_a = nullptr;  // never these two
    const Block* keep_b = nullptr;
    const Reservation* only = nullptr;  // only this reservation's (nullptr: any)
    uint64_t freed_by = UINT64_MAX;     // only blocks with free_seq <= this
    bool sync = true;  // synchronize each stream first (false: it has passed them)
  };
  // A proactive recycle waiting for its stream to pass `event`.
  struct Deferred {
    Reservation* reservation;
    Event event;
    uint64_t free_seq;  // blocks free since then (free_seq <= this) are safe after it
    size_t bytes;       // what was decided
  };

  // The reservation of (stream, pool), reserving its address range on first use;
  // nullptr when no address range can be reserved. A refused reservation is not asked
  // for again until empty_cache() (which gives address space back): every miss would
  // otherwise repeat a driver call that fails.
  Reservation* reservation(Stream stream, bool small, size_t limit);
  // The placement in `r` that maps the fewest bytes for a block of `size` (ties: the
  // lowest address), using free blocks at the edges of its runs.
  Placement place(const Reservation* r, size_t size) const;
  // Maps memory in `r` for the request (see grow()); *va_full when no unmapped gap can
  // hold it.
  Block* expand(Reservation* r, const GrowRequest& req, bool* va_full);
  // Records that [at, at + bytes) of `r` was just mapped: extends, creates or merges
  // runs and returns the free block holding the range (coalesced with free
  // neighbours), out of any free set.
  Block* link_mapped(Reservation* r, uintptr_t at, size_t bytes, uint64_t now);
  // Unmaps [c0, c1) (granule-aligned) of the free block `b` of a run, splitting the
  // run around the hole. The caller has synchronized the run's stream. Returns the
  // bytes unmapped.
  size_t unmap_range(Block* b, uintptr_t c0, uintptr_t c1);
  // Unmaps whole free granules of runs, from the blocks with the most whole granules
  // first (only as many of a block's granules as are still wanted, from its top),
  // until `bytes` are unmapped or none are left, taking only the blocks `scope`
  // allows. Synchronizes each run's stream before unmapping its memory unless
  // scope.sync is false. Returns the bytes unmapped.
  size_t recycle_except(size_t bytes, const Scope& scope);
  // The proactive recycle of `bytes` from `r` before mapping `p` (see the top of this
  // file): at once when r's stream is idle, else deferred.
  void recycle_proactively(Reservation* r, size_t bytes, const Placement& p,
                           uint64_t free_seq);
  // The recycle trigger's figures for r's stream: its use, what its reservations map
  // and what deferred decisions have set aside of that (expandable_recycle.cc).
  StreamFootprint footprint(const Reservation* r) const;
  // The bytes to recycle proactively from `r` before mapping `mapping` bytes for a
  // request of `size` (ProactiveRecycleBytes of r's stream).
  size_t proactive_recycle_bytes(const Reservation* r, size_t size, size_t mapping) const {
    return ProactiveRecycleBytes(recycle_threshold_, footprint(r), size, mapping);
  }
  // validate()'s recount of each stream's bytes in use (expandable_recycle.cc).
  absl::Status validate_stream_use() const;
  size_t reserved() const {
    return static_cast<size_t>(acct_.stats().reserved_bytes[kAggregatePool].current);
  }
  size_t round_to_granule(size_t bytes) const { return RoundToGranule(bytes, granularity_); }
  // A whole run is unmapped (release, destroy).
  void give_back(Segment* s) override;

  const size_t device_total_;
  const size_t granularity_;
  const double recycle_threshold_;
  absl::flat_hash_map<Key, Reservation*> reservations_;
  absl::flat_hash_set<Key> refused_;  // reserve_address failed, until empty_cache
  std::vector<Deferred> deferred_;    // at most one per reservation
  size_t deferred_bytes_ = 0;         // the sum of their bytes
  // Per stream handle; node-based: reservations point at their stream's entry.
  absl::node_hash_map<uintptr_t, StreamUse> streams_;
};

}  // namespace devmem::internal
