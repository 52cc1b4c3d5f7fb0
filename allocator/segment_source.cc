// allocator/segment_source.cc: see segment_source.h.
#include "allocator/segment_source.h"

#include <exception>

#include "allocator/release_fence.h"

namespace devmem::internal {

DriverInFlight::Ticket SegmentSource::detach_for_release(const std::vector<Segment*>& segments) {
  // The books first, under the lock: each segment leaves the free sets, the table and
  // the statistics (the trace says it goes), so no one else can find it; its bytes stay
  // counted against the memory limit until the driver has them (DriverInFlight).
  reserve_detached(segments.size());  // may throw: before any change
  DriverInFlight::Ticket ticket = 0;  // the same for every one: the lock is held
  for (Segment* s : segments) {
    acct_.segment_releasing(s);
    free_.erase(s->head);  // the single free block
    acct_.segment_released(s);
    table_.remove(s);
    detached(s);
    ticket = in_flight_.begin_give_back(s->size);
  }
  return ticket;
}

void SegmentSource::give_back_detached(const std::vector<Segment*>& segments,
                                       DriverInFlight::Ticket ticket, Mutex* lock, bool call) {
  if (segments.empty()) return;
  // The block is free in stream order only: work queued on its stream before the free
  // may still use it. cudaFree synchronizes by itself, unmapping does not, and the sim
  // backend does neither; so wait first, as the Backend contract asks. The wait and the
  // driver calls run with the lock released; nothing in there touches the pool.
  //
  // Why this is safe with the lock released (release_fence.h): the segments left every
  // book in detach_for_release, so no other thread can find, allocate, merge or release
  // them meanwhile; their bytes still count against the limit (DriverInFlight). Each
  // stream is named to the driver only here, under the lock (an event of the pool's
  // own is recorded on it), so a release_stream(s) that runs once the lock is free and
  // returns cannot be followed by a call on s: only the event is waited for, and it
  // stays valid after s is destroyed. An allocating thread therefore never waits
  // behind this release's stream wait.
  size_t done = 0;
  std::exception_ptr error;
  ReleaseFence fence(backend_, event_pool_, retirements_);
  try {
    if (call) {
      // Inside the try: a bad_alloc here puts every segment back, as a driver error does.
      std::vector<Stream> streams;
      for (const Segment* s : segments) {
        bool seen = false;
        for (const Stream t : streams) seen = seen || t == s->stream;
        if (!seen) streams.push_back(s->stream);
      }
      fence.record(streams);
      ScopedUnlock unlocked(lock);
      fence.wait();
      for (; done < segments.size(); ++done) {
        give_back_call(segments[done]->addr, segments[done]->size);
      }
    }
  } catch (...) {
    error = std::current_exception();
  }
  fence.finish();
  // The lock is held again. Given back: forgotten. Not given back (a DriverError: the
  // pool is poisoned, but stays readable): cached and counted again, as they were.
  for (size_t i = 0; i < segments.size(); ++i) {
    Segment* s = segments[i];
    in_flight_.end_give_back(s->size, ticket);
    given_back(s, i < done);
    if (i < done) {
      free_.delete_block(s->head);
      delete s;
    } else {
      table_.add(s);
      acct_.segment_release_undone(s);
      free_.insert(s->head);
      restored(s);
    }
  }
  if (error) std::rethrow_exception(error);
}

void SegmentSource::destroy(Segment* s, bool give_back_memory) {
  if (give_back_memory) reserve_detached(1);  // may throw: before any change
  table_.remove(s);
  if (give_back_memory) {
    detached(s);
    try {
      give_back_call(s->addr, s->size);
    } catch (...) {
      given_back(s, false);  // the caller forgets it (destroy(s, false))
      throw;
    }
    given_back(s, true);
  }
  for (Block* b = s->head; b != nullptr;) {
    Block* next = b->next;
    free_.delete_block(b);  // Blocks live in the FreeIndex's slabs: never deleted
    b = next;
  }
  delete s;
}

}  // namespace devmem::internal
