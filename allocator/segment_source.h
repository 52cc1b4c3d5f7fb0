// allocator/segment_source.h: where a DevicePool's segments come from and go back to
// (internal).
//
// Two implementations: RegularSegments (regular_segments.h: one backend allocation per
// segment) and ExpandableSegments (expandable_segments.h: granules mapped into reserved
// address ranges). A source creates and deletes its own Segment objects, keeps the
// SegmentTable in step, and reports every segment state change to PoolAccounting
// through the method named for it. It uses FreeIndex for the free blocks at its
// segments' edges and never calls DevicePool; the reclaimer (reclaimer.h) drives its
// release and recycle.
//
// Thread-safety: none; every method requires the owning DevicePool's mutex.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "allocator/backend.h"
#include "allocator/block.h"
#include "allocator/free_index.h"
#include "allocator/mutex.h"
#include "allocator/pool_accounting.h"
#include "allocator/segment_table.h"
#include "allocator/stream_retire.h"
#include "allocator/types.h"

namespace devmem::internal {

// One request for more memory.
struct GrowRequest {
  size_t size = 0;          // the rounded request
  size_t segment_size = 0;  // regular segments: the segment to allocate
  bool small = false;       // small pool
  Stream stream;
  size_t limit = SIZE_MAX;  // the memory limit (per_process_memory_fraction)
  uint64_t now = 0;         // the pool's use clock, for Segment::last_used
  uint64_t free_seq = 0;    // the pool's free sequence (BlockStates::free_seq)
  // Bytes of other segment allocations in flight, counted against `limit`.
  size_t reserved_in_flight = 0;
  // The device lock, held by the caller; a source may release it around a driver call
  // (and takes it back before returning). nullptr: it must not.
  Mutex* lock = nullptr;
  // A graph capture may be under way (private_pools.h): the segment is allocated with
  // Backend::allocate_segment_during_capture. Only RegularSegments takes such requests.
  bool during_capture = false;
  // The private pool the segment is for (RegularSegments only), or nullptr.
  PrivatePool* private_pool = nullptr;
};

// What grow() got: a free block of at least the request's size, out of any free set,
// in a segment that is in the table; or nullptr. `no_room`: this source cannot hold
// the request at all (no address range, or none of its gaps is large enough), so
// another source may; otherwise nullptr means out of memory.
struct Grown {
  Block* block = nullptr;
  bool no_room = false;
};

class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  SegmentSource(const SegmentSource&) = delete;
  SegmentSource& operator=(const SegmentSource&) = delete;

  virtual Grown grow(const GrowRequest& req) = 0;
  // release_segment: gives one unused segment of this source (one free block) back to
  // the backend, after waiting for its stream; `s` is deleted.
  void release(Segment* s);
  // recycle: gives back up to `bytes` without releasing whole segments (unmaps whole
  // free granules); returns the bytes given back. Waits for each affected stream.
  virtual size_t recycle(size_t bytes) = 0;
  // empty_cache's last step: gives back what the source holds besides segments.
  virtual void release_address_space() = 0;
  // Every reclaim's last step: gives back physical memory the backend kept for reuse
  // after an unmap (the handle reserve, allocator/driver_calls.h); returns its bytes.
  virtual size_t release_handle_reserve() { return 0; }
  // Finishes what the source decided to give back once its streams pass an event
  // (ExpandableSegments' deferred recycling) for the events that completed; with
  // `wait`, waits for all of them (memory pressure). Returns the bytes given back.
  virtual size_t complete_deferred(bool wait) = 0;
  // Pool destruction: gives `s` back to the backend whatever its blocks' states and
  // deletes it and its blocks, with no statistics or trace. The caller has waited for
  // the segment's stream. Without `give_back_memory` (a poisoned pool: the driver
  // fails every call) only the host-side records go.
  void destroy(Segment* s, bool give_back_memory = true);
  // This part's share of validate(): the source's own records against its segments.
  virtual absl::Status validate() const = 0;
  // The pool's retired streams (allocator/stream_retire.h): memory of a retired stream
  // waits for the retirement's event, never for the (destroyed) stream. Set once by
  // the pool before use; nullptr: none (every stream live).
  void set_retirements(StreamRetirements* r) { retirements_ = r; }

 protected:
  SegmentSource(Backend& backend, SegmentTable& table, FreeIndex& free, PoolAccounting& acct)
      : backend_(backend), table_(table), free_(free), acct_(acct) {}
  // The backend call that gives all of `s`'s memory back (free_segment, unmap) and the
  // source's own records of it. The segment is still in the table.
  virtual void give_back(Segment* s) = 0;

  // Waits until no work queued on `s` can still use its freed memory (the stream, or
  // its retirement's event).
  void synchronize_for_release(Stream s) {
    if (retirements_ != nullptr) {
      retirements_->synchronize_for_release(s);
    } else {
      backend_.synchronize_stream(s);
    }
  }
  Backend& backend_;
  SegmentTable& table_;
  FreeIndex& free_;
  PoolAccounting& acct_;
  StreamRetirements* retirements_ = nullptr;
};

}  // namespace devmem::internal
