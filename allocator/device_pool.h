// allocator/device_pool.h: the state and policy behind CachingAllocator's device lock
// (an internal header: only caching_allocator.cc, device_pool*.cc include it).
//
// DevicePool holds the device lock and orchestrates parts that own their state and
// check their own share of validate() (docs/architecture.md, "DevicePool's parts");
// none of them calls DevicePool:
//   pool_policy.h        the pure decisions (rounding, pool, segment size, split, ...)
//   PoolAccounting       stats, site counters, trace: every state change reports there
//   FreeIndex            free sets, best fit, split, coalesce, spare Blocks
//   EventQueues          events of cross-stream frees
//   BlockStates          allocated / free / pending transitions, the allocated table
//   SegmentTable         every segment by address
//   RegularSegments,     the segment sources (segment_source.h): grow, release,
//   ExpandableSegments   recycle
//   Reclaimer            which cached memory goes back, by urgency
// The driver is reached only through Backend.
//
// The ways memory goes back, told apart by name:
//   release_segment  one unused segment (or whole expandable run) back to the backend
//                    (SegmentSource::release), the unit the others are made of;
//   recycle          unmapping whole free granules inside expandable runs: the
//                    footprint shrinks, segments stay (SegmentSource::recycle);
//   garbage_collect  on the allocation path before growing, while reserved is over
//                    garbage_collection_threshold: unused segments oldest first;
//   trim(keep)       unused segments largest first, then recycling, until at most
//                    `keep` bytes are cached;
//   empty_cache      waits for every event, releases everything unused, then the
//                    address ranges of reservations that map nothing.
// The staged retry's stages release through the same Reclaimer::reclaim (urgencies
// kRetryRelease and kRetryWaitAll).
//
// Locking: one Mutex (allocator/mutex.h), `mu_`, guards everything. Public methods take
// it; methods named *_locked require it. Lock order: mu_ -> backend's internal locks ->
// observer's lock -> site registry lock (GetSite, a leaf). Backend calls (segment
// alloc/free, event record/query/sync) happen under mu_: that serializes
// cudaMalloc/cudaFree as PyTorch does, and keeps the segment table consistent with the
// driver.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "allocator/backend.h"
#include "allocator/block.h"
#include "allocator/block_states.h"
#include "allocator/config.h"
#include "allocator/event_queues.h"
#include "allocator/expandable_segments.h"
#include "allocator/free_index.h"
#include "allocator/mutex.h"
#include "allocator/observer.h"
#include "allocator/oom_report.h"
#include "allocator/pool_accounting.h"
#include "allocator/reclaimer.h"
#include "allocator/regular_segments.h"
#include "allocator/segment_table.h"
#include "allocator/snapshot.h"
#include "allocator/stats.h"

namespace devmem::internal {

class DevicePool {
 public:
  DevicePool(std::unique_ptr<Backend> backend, const Config& config);
  ~DevicePool();

  void* allocate(size_t bytes, Stream stream, SiteId site);
  void free(void* ptr);
  void record_stream(void* ptr, Stream stream);
  void empty_cache();
  void trim(size_t keep_bytes);
  absl::Status set_memory_fraction(double fraction);
  void process_events();

  DeviceStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  std::vector<SiteStats> site_stats() const;
  std::vector<SiteUsage> top_sites(size_t k) const;
  AllocatorSnapshot snapshot() const;
  std::optional<BlockInfo> find_allocation(const void* ptr) const;
  absl::Status validate() const;  // defined in device_pool_validate.cc
  void set_observer(AllocatorObserver* observer);

  DeviceId device() const { return device_; }
  Backend& backend() const { return *backend_; }
  const Config& config() const { return config_; }

 private:
  // tests/device_pool_invariants_test.cc corrupts a pool on purpose to show that
  // validate() notices.
  friend class DevicePoolTestPeer;

  // --- allocation path -----------------------------------------------------------
  // Gets a new segment for a request of `size` (the staged retry). On success the
  // segment's single block is returned, out of any free set; nullptr when out of
  // memory.
  Block* new_segment_with_retry(size_t size, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One attempt at more memory for a request of `size`: grows the (stream, pool)'s
  // expandable reservation when those are on, else (or when it has no room) allocates
  // a regular segment of `segment_size`. Returns a free block of at least `size` bytes
  // out of any free set, or nullptr when the device (or the memory fraction) says no.
  Block* try_grow(size_t size, size_t segment_size, bool small, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  GrowRequest grow_request(size_t size, size_t segment_size, bool small, Stream stream) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves blocks whose events completed to the cache. With `wait`, synchronizes every
  // pending event first (so nothing stays pending).
  void process_events_locked(bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    blocks_.complete_events(wait);
  }

  // --- bookkeeping ---------------------------------------------------------------
  size_t memory_limit() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t reserved_bytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<size_t>(acct_.stats().reserved_bytes[kAggregatePool].current);
  }
  // The OOM report of a failed allocation (built on the failure path only).
  OomReport oom_report(size_t requested, size_t size, Stream stream, SiteId site)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finds the block containing `addr` (any state), or nullptr.
  Block* block_containing(uintptr_t addr) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return segments_.block_containing(addr);
  }
  // Builds the message for a bad pointer passed to `op` ("free", "record_stream").
  std::string describe_bad_pointer(const char* op, const void* ptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<Backend> backend_;
  const DeviceId device_;
  const Config config_;
  const size_t device_total_;

  mutable Mutex mu_;
  double memory_fraction_ ABSL_GUARDED_BY(mu_);
  // The parts, in dependency order (each uses only those declared before it).
  SegmentTable segments_ ABSL_GUARDED_BY(mu_);
  EventQueues events_ ABSL_GUARDED_BY(mu_);
  PoolAccounting acct_ ABSL_GUARDED_BY(mu_);
  FreeIndex free_ ABSL_GUARDED_BY(mu_);
  BlockStates blocks_ ABSL_GUARDED_BY(mu_);
  RegularSegments regular_ ABSL_GUARDED_BY(mu_);
  // nullptr unless expandable_segments is on (or auto) and the backend has virtual
  // memory.
  const std::unique_ptr<ExpandableSegments> expandable_ ABSL_PT_GUARDED_BY(mu_);
  Reclaimer reclaimer_ ABSL_GUARDED_BY(mu_);
};

}  // namespace devmem::internal
