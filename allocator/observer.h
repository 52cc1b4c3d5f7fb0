// allocator/observer.h: how upper layers watch an allocator without it knowing them.
//
// The runtime layer's event trace, metrics and OOM dumps hang off this interface;
// allocator/ never includes runtime/.
//
// Thread-safety and cost: callbacks run on the allocating thread, WHILE THE
// ALLOCATOR'S DEVICE LOCK IS HELD (so events are seen in the order they happened),
// except kAlloc and kFree of thread-cache hits (allocator/thread_cache.h), which run
// without it, concurrently from several threads: on_event must be thread-safe. They
// must be short and non-blocking, must not throw, and must never call back into any
// allocator. on_oom is the exception: it runs after the lock is released, just
// before OutOfMemoryError is thrown, and may take its time (write a dump file).
#pragma once

#include <cstddef>
#include <cstdint>

#include "allocator/site.h"
#include "allocator/types.h"

namespace devmem {

struct OomReport;

enum class AllocAction : uint8_t {
  kAlloc = 0,           // a block handed to the user
  kFree = 1,            // the user freed a block (it may still be pending)
  kFreeCompleted = 2,   // a pending block's events completed; it is cached now
  kSegmentAlloc = 3,    // a segment came from the driver
  kSegmentFree = 4,     // a segment went back to the driver
  kSegmentMap = 5,      // expandable segment grew
  kSegmentUnmap = 6,    // expandable segment shrank
  kOom = 7,             // an allocation failed for good
  kArenaOpen = 8,
  kArenaClose = 9,
};
inline constexpr int kNumAllocActions = 10;
std::string_view AllocActionName(AllocAction action);

struct AllocEvent {
  AllocAction action = AllocAction::kAlloc;
  DeviceId device;
  Stream stream;
  uintptr_t addr = 0;
  size_t size = 0;       // block or segment bytes
  size_t requested = 0;  // what the user asked for (alloc, free, oom)
  SiteId site = kUnknownSite;
  // Causal-order words for an observer that stamps events (the runtime's trace,
  // runtime/trace.h); the allocator only keeps them and never reads their meaning.
  // block_order: the block's (Block::trace_order) for alloc, free and free_completed,
  // so that a block's events read in order whichever threads made them; pool_order:
  // the device pool's, for every event emitted under the device lock (null for
  // thread-cache hits without it), so that what the pool does to an address reads in
  // the order the lock gave it. Null: none. The observer may read and write *block_order
  // and *pool_order during on_event (the block's owner, or the lock holder, is the
  // caller).
  uint64_t* block_order = nullptr;
  uint64_t* pool_order = nullptr;
};

class AllocatorObserver {
 public:
  virtual ~AllocatorObserver() = default;
  virtual void on_event(const AllocEvent& event) = 0;
  virtual void on_oom(const OomReport& /*report*/) {}
};

}  // namespace devmem
