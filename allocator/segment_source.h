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
// Driver calls and the device lock (driver_in_flight.h): methods that take a `Mutex*
// lock` (the device lock, held by the caller) release it around their driver calls and
// take it back before returning; nullptr: they keep it. What a call works on is taken
// out of everyone's reach first (a released segment leaves the table and the free
// sets; a granule being mapped or unmapped is no gap and no block), so the pool is
// consistent whenever the lock is free; the caller must expect anything else to have
// changed across such a call.
//
// Thread-safety: none; every method requires the owning DevicePool's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "allocator/backend.h"
#include "allocator/block.h"
#include "allocator/driver_in_flight.h"
#include "allocator/event_pool.h"
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
  // The device lock, held by the caller; a source releases it around its driver calls
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
  // release_segment: gives unused segments of this source (each one free block) back
  // to the backend, after waiting for their streams; they are deleted. All leave the
  // table, the free sets and the statistics first; then an event is recorded on each
  // of their streams (under the lock: release_stream must not return while a stream
  // may still be named to the driver), and the events are waited for and the segments
  // given back with `lock` released (release_fence.h). A DriverError
  // puts the segments not given back where they were (cached and counted) and is
  // rethrown.
  void release(const std::vector<Segment*>& segments, Mutex* lock) {
    give_back_detached(segments, detach_for_release(segments), lock);
  }
  // release()'s two halves, for a caller that releases segments of two sources at once
  // (the reclaimer): every segment of both leaves the books before the lock is first
  // released, so none of them can change meanwhile. Without `call` (the other
  // source's calls failed: the device is broken) nothing reaches the driver, and the
  // segments are put back. detach_for_release returns the give-backs' ticket
  // (DriverInFlight: one for the batch, detached in one lock hold), which
  // give_back_detached ends them with.
  DriverInFlight::Ticket detach_for_release(const std::vector<Segment*>& segments);
  // Makes room, before any change, for what detaching `n` segments records (host
  // memory: a bad_alloc halfway through a detach would leave segments out of every
  // book and their bytes "giving back" forever, which wait_for_give_backs would then
  // wait for). detach_for_release calls it; a caller detaching from two sources in one
  // lock hold (the reclaimer) calls both first.
  virtual void reserve_detached(size_t /*n*/) {}
  void give_back_detached(const std::vector<Segment*>& segments,
                          DriverInFlight::Ticket ticket, Mutex* lock, bool call = true);
  // recycle: gives back up to `bytes` without releasing whole segments (unmaps whole
  // free granules); returns the bytes given back. Waits for each affected stream.
  virtual size_t recycle(size_t bytes, Mutex* lock) = 0;
  // empty_cache's last step: gives back what the source holds besides segments.
  virtual void release_address_space(Mutex* lock) = 0;
  // Every reclaim's last step: gives back physical memory the backend kept for reuse
  // after an unmap (the handle reserve, allocator/driver_calls.h); returns its bytes.
  virtual size_t release_handle_reserve(Mutex* /*lock*/) { return 0; }
  // Finishes what the source decided to give back once its streams pass an event
  // (ExpandableSegments' deferred recycling) for the events that completed; with
  // `wait`, waits for all of them (memory pressure). Returns the bytes given back.
  virtual size_t complete_deferred(bool wait, Mutex* lock) = 0;
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
  // The device's event pool (event_pool.h): the events a release waits for with the
  // lock released (release_fence.h) and proactive recycling's come from it. Set once
  // by the pool before use; nullptr: a new event each time.
  void set_event_pool(EventPool* p) { event_pool_ = p; }

 protected:
  SegmentSource(Backend& backend, SegmentTable& table, FreeIndex& free, PoolAccounting& acct,
                DriverInFlight& in_flight)
      : backend_(backend), table_(table), free_(free), acct_(acct), in_flight_(in_flight) {}
  // Giving all of a segment's memory back, in three steps: detached(s) under the lock
  // (the source's own records; `s` is out of the table already), give_back_call(addr,
  // size) without it (the backend call: free_segment, unmap; it touches nothing of the
  // pool), given_back(s, ok) under the lock again (ok false: the call threw, and the
  // records are restored).
  virtual void detached(Segment* /*s*/) {}
  virtual void give_back_call(uintptr_t addr, size_t size) = 0;
  virtual void given_back(Segment* /*s*/, bool /*ok*/) {}
  // After a segment not given back is in the table and its free set again: the
  // source's own repairs (ExpandableSegments joins runs mapped next to it meanwhile).
  virtual void restored(Segment* /*s*/) {}

  // An event on `stream` from the device's pool (or a new one without a pool); its
  // owner gives it back with event_completed() once it completed, or with
  // Backend::release_event. Under the lock (the pool is guarded by it).
  Event record_pooled_event(Stream stream) {
    return event_pool_ != nullptr ? event_pool_->record(stream) : backend_.record_event(stream);
  }
  void event_completed(Event event) noexcept {
    if (event_pool_ != nullptr) {
      event_pool_->recycle(event);
    } else {
      backend_.release_event(event);
    }
  }

  Backend& backend_;
  SegmentTable& table_;
  FreeIndex& free_;
  PoolAccounting& acct_;
  DriverInFlight& in_flight_;
  StreamRetirements* retirements_ = nullptr;
  EventPool* event_pool_ = nullptr;
};

}  // namespace devmem::internal
