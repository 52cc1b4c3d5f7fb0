// allocator/reclaimer.h: the one place that decides which cached memory goes back to
// the device when the pool asks for bytes (internal).
//
// DevicePool calls reclaim(bytes, urgency) for garbage collection, trim, the staged
// retry's release stages and empty_cache; the urgency says which segments go first and
// what else may be given back. It releases unused segments through the segment source
// that owns each (SegmentSource::release: release_segment), then asks the sources to
// recycle (unmap idle granules of expandable runs) for what is still wanted.
// Waiting for pending events is the caller's step (it decides what a free completes
// into); the reclaimer only gives memory back.
//
// The driver calls (frees, unmaps, the handle reserve's release) run
// with the device lock released (segment_source.h): the segments chosen leave the
// table before the lock is, so reclaim() sees each chosen segment once, and another
// thread reclaiming meanwhile chooses among the others. The caller must expect
// anything to have changed across reclaim().
//
// Owns nothing; uses the SegmentTable (to find unused segments) and the sources.
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include <cstddef>

#include "allocator/segment_source.h"
#include "allocator/segment_table.h"

namespace devmem::internal {

// Why memory is being given back, from least to most pressing.
enum class Urgency {
  kGarbageCollect,  // garbage_collection_threshold crossed: unused segments oldest first
  kTrim,            // trim(keep): largest first, down to a cached-bytes target
  kRetryRelease,    // staged retry, stage 1: worth one new segment, largest first
  kRetryWaitAll,    // staged retry, stage 2 (events waited for): everything unused
  kEmptyCache,      // empty_cache: everything unused, then empty address ranges
};

class Reclaimer {
 public:
  // `expandable` may be nullptr (expandable segments are off). `lock`: the device lock,
  // held by every caller of reclaim() and released around its driver calls.
  Reclaimer(const SegmentTable& table, SegmentSource& regular, SegmentSource* expandable,
            Mutex* lock)
      : table_(table), regular_(regular), expandable_(expandable), lock_(lock) {}
  Reclaimer(const Reclaimer&) = delete;
  Reclaimer& operator=(const Reclaimer&) = delete;

  // Gives back at least `bytes` (SIZE_MAX: all it can), in whole unused segments first
  // and then recycled granules; fewer when no more is unused. Returns the bytes given
  // back (it may exceed `bytes` by up to one segment).
  size_t reclaim(size_t bytes, Urgency urgency);

 private:
  const SegmentTable& table_;
  SegmentSource& regular_;
  SegmentSource* const expandable_;
  Mutex* const lock_;
};

}  // namespace devmem::internal
