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
// Driver calls and the device lock (driver_in_flight.h): maps, unmaps and the handle
// reserve's release run with the device lock released. A map's range [at, at + bytes)
// is registered "being mapped" (InFlight, kMapping) first, so no other placement takes
// it; once mapped, it is linked with whatever free blocks border it then (a neighbour
// the placement counted on may have been taken meanwhile: expand() then places again).
// An unmap takes its granules out of their block and run first (the books: run split,
// bytes out of reserved_bytes) and registers them "being unmapped" (kUnmapping); after
// the call they are forgotten, or, when it threw (the pool is poisoned), linked back
// as free mapped memory. A reservation with a call in flight, a grow() under way or a
// deferred decision is not released. States of a granule of a reservation: unmapped,
// being mapped, mapped (in a run, inside one of its blocks), being unmapped.
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
// bytes > 0, summing to deferred_bytes_; each range in flight lies in its reservation
// on granule boundaries, overlapping no run and no other range, and their bytes are
// what DriverInFlight holds for them; each reservation's `use` is its stream's
// StreamUse, whose in_use is the bytes of the stream's blocks out of the free sets
// (at most in_use_peak).
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "allocator/backend.h"
#include "allocator/free_index.h"
#include "allocator/poll_work.h"
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
                     PoolAccounting& acct, DriverInFlight& in_flight)
      : SegmentSource(backend, table, free, acct, in_flight),
        device_total_(device_total),
        granularity_(granularity),
        recycle_threshold_(recycle_threshold) {}
  // Releases every reservation's address range (destroy() has unmapped the runs).
  ~ExpandableSegments() override;
  // A poisoned pool's destruction (the driver fails every call): forgets the
  // reservations and deferred decisions without a driver call, so that the destructor
  // makes none.
  void forget_driver_state();

  // Maps memory in the (stream, pool)'s reservation for the request, first recycling
  // idle granules when the footprint would grow past expandable_recycle_threshold or
  // the memory limit, or when the device is out of memory. no_room when the
  // reservation cannot be had or none of its unmapped gaps can hold the request.
  // req.lock is released around every map and unmap.
  Grown grow(const GrowRequest& req) override;
  // Unmaps whole free granules of any reservation, largest blocks first.
  size_t recycle(size_t bytes, Mutex* lock) override {
    return recycle_except(bytes, Scope{}, lock);
  }
  // Gives the backend's physical-handle reserve back to the driver (the reclaimer's
  // last step: memory unmapped for reuse is released when memory is given back), with
  // `lock` released.
  size_t release_handle_reserve(Mutex* lock) override {
    ScopedUnlock unlocked(lock);
    return backend_.release_handle_reserve();
  }
  // Releases the address ranges of reservations that map nothing (and have nothing in
  // flight), and forgets the refusals (address space was given back: worth asking
  // again).
  void release_address_space(Mutex* lock) override;
  // Deferred proactive recycling: unmaps for each decision whose event completed (with
  // `wait`: after waiting for every event) what is still over the cap.
  size_t complete_deferred(bool wait, Mutex* lock) override;
  absl::Status validate() const override;

  size_t granularity() const { return granularity_; }
  bool has_deferred() const { return !deferred_.empty(); }
  // Where has_deferred() is published (PollWork::kDeferredRecycles, allocator/poll_work.h),
  // at each change of the deferred list; null: nowhere. Set once, before use.
  void set_poll_work(PollWork* work) {
    poll_work_ = work;
    publish_deferred();
  }

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
  // A driver call on [at, at + bytes) of `reservation` with the device lock released.
  struct InFlight {
    enum Kind { kMapping, kUnmapping };
    const Reservation* reservation;
    uintptr_t at;
    size_t bytes;
    Kind kind;
  };
  // Granules unmapped from a run's books, waiting for (or past) their unmap call.
  struct Hole {
    Reservation* reservation;
    uintptr_t at;
    size_t bytes;
    Stream stream;
    uint64_t last_used;  // the run's and the block's, for linking the granules back
    uint64_t free_seq;   // on an error
    DriverInFlight::Ticket give_back = 0;  // its unmap's, from begin to end
  };

  // Keeps a reservation in `pinned` for its scope (release_address_space leaves it
  // alone meanwhile). The lock is held at both ends.
  class Pin {
   public:
    Pin(std::vector<const Reservation*>& pinned, const Reservation* r)
        : pinned_(pinned), r_(r) {
      pinned_.push_back(r_);
    }
    ~Pin() { pinned_.erase(std::find(pinned_.begin(), pinned_.end(), r_)); }
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;

   private:
    std::vector<const Reservation*>& pinned_;
    const Reservation* const r_;
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
  // The free blocks that end at `at` and start at `end` in r's runs (nullptr: none).
  std::pair<Block*, Block*> free_neighbours(const Reservation* r, uintptr_t at,
                                            uintptr_t end) const;
  // Whether `p` still maps an unmapped, not in-flight range of `r` that yields a block
  // of at least `size` with the free blocks bordering it now (after the lock was
  // released, another thread may have changed them).
  bool still_fits(const Reservation* r, const Placement& p, size_t size) const;
  // Whether [at, at + bytes) overlaps a range of `r` in flight.
  bool overlaps_in_flight(const Reservation* r, uintptr_t at, size_t bytes) const;
  void end_in_flight(const Reservation* r, uintptr_t at);
  // Records that [at, at + bytes) of `r` was just mapped: extends, creates or merges
  // runs and returns the free block holding the range (coalesced with free
  // neighbours), out of any free set. `undo`: the range is linked back after a failed
  // unmap (its statistics are restored, no map is counted).
  Block* link_mapped(Reservation* r, uintptr_t at, size_t bytes, uint64_t now,
                     bool undo = false);
  // Takes [c0, c1) (granule-aligned) out of the free block `b` of a run, splitting the
  // run around the hole, and registers it as being unmapped: every change but the
  // driver call. Returns the hole.
  Hole detach_range(Block* b, uintptr_t c0, uintptr_t c1);
  // Unmaps `holes` (detached) with `lock` released, after waiting for `streams` (none:
  // the caller knows they passed the blocks); then forgets them, or links back those
  // not unmapped when a call threw, and rethrows. Returns the bytes unmapped.
  size_t unmap_holes(const std::vector<Hole>& holes, const std::vector<Stream>& streams,
                     Mutex* lock);
  // Unmaps whole free granules of runs, from the blocks with the most whole granules
  // first (only as many of a block's granules as are still wanted, from its top),
  // until `bytes` are unmapped or none are left, taking only the blocks `scope`
  // allows. Synchronizes each run's stream before unmapping its memory unless
  // scope.sync is false. The driver calls run with `lock` released. Returns the bytes
  // unmapped.
  size_t recycle_except(size_t bytes, const Scope& scope, Mutex* lock);
  // The proactive recycle of `bytes` from `r` before mapping `p` (see the top of this
  // file): at once when r's stream is idle (no wait), else deferred.
  void recycle_proactively(Reservation* r, size_t bytes, Block* keep_a, Block* keep_b,
                           uint64_t free_seq, Mutex* lock);
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
  // A whole run is unmapped (release, destroy): its reservation's books, the call, and
  // the books restored when the call threw.
  void reserve_detached(size_t n) override;
  void detached(Segment* s) override;
  void give_back_call(uintptr_t addr, size_t size) override;
  void given_back(Segment* s, bool ok) override;
  void restored(Segment* s) override;
  // Joins run `hi` (starting where `lo` ends, same reservation) to `lo`, coalescing
  // the two edge blocks when both are free; `hi` is deleted.
  void join_runs(Segment* lo, Segment* hi);
  // release_address_space may not release `r`: something still refers to it.
  bool in_use(const Reservation* r) const;

  const size_t device_total_;
  const size_t granularity_;
  const double recycle_threshold_;
  absl::flat_hash_map<Key, Reservation*> reservations_;
  absl::flat_hash_set<Key> refused_;  // reserve_address failed, until empty_cache
  std::vector<Deferred> deferred_;    // at most one per reservation
  size_t deferred_bytes_ = 0;         // the sum of their bytes
  // After every change of deferred_, before the lock can be released (complete_deferred
  // releases it right after taking a decision out).
  void publish_deferred() {
    if (poll_work_ != nullptr) {
      poll_work_->set(PollWork::kDeferredRecycles, !deferred_.empty());
    }
  }
  PollWork* poll_work_ = nullptr;
  std::vector<InFlight> in_flight_ranges_;  // maps and unmaps with the lock released
  // Reservations a call is working in while it may release the lock (a grow(), a
  // deferred decision's wait): one entry per such call.
  std::vector<const Reservation*> pinned_;
  // Per stream handle; node-based: reservations point at their stream's entry.
  absl::node_hash_map<uintptr_t, StreamUse> streams_;
};

}  // namespace devmem::internal
