// allocator/segment_source.cc: see segment_source.h.
#include "allocator/segment_source.h"

namespace devmem::internal {

void SegmentSource::release(Segment* s) {
  Block* b = s->head;  // the single free block
  acct_.segment_releasing(s);
  // The block is free in stream order only: work queued on its stream before the free
  // may still use it. cudaFree synchronizes by itself, unmapping does not, and the sim
  // backend does neither; so wait here, as the Backend contract asks (for a retired
  // stream, its retirement's event). Both driver steps come before any change: a
  // DriverError leaves the segment cached and counted, as it was (the allocator is
  // poisoned then, but still readable).
  synchronize_for_release(s->stream);
  give_back(s);
  free_.erase(b);
  acct_.segment_released(s);
  table_.remove(s);
  free_.delete_block(b);
  delete s;
}

void SegmentSource::destroy(Segment* s, bool give_back_memory) {
  if (give_back_memory) give_back(s);
  table_.remove(s);
  for (Block* b = s->head; b != nullptr;) {
    Block* next = b->next;
    delete b;
    b = next;
  }
  delete s;
}

}  // namespace devmem::internal
