// allocator/observer.cc: names of allocator actions, as they appear in traces,
// snapshots and metrics labels. Thread-safe.
#include "allocator/observer.h"

namespace devmem {

std::string_view AllocActionName(AllocAction action) {
  switch (action) {
    case AllocAction::kAlloc: return "alloc";
    case AllocAction::kFree: return "free";
    case AllocAction::kFreeCompleted: return "free_completed";
    case AllocAction::kSegmentAlloc: return "segment_alloc";
    case AllocAction::kSegmentFree: return "segment_free";
    case AllocAction::kSegmentMap: return "segment_map";
    case AllocAction::kSegmentUnmap: return "segment_unmap";
    case AllocAction::kOom: return "oom";
    case AllocAction::kArenaOpen: return "arena_open";
    case AllocAction::kArenaClose: return "arena_close";
  }
  return "unknown";
}

}  // namespace devmem
