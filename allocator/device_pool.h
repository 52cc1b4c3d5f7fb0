// allocator/device_pool.h: the state and policy behind CachingAllocator's device lock
// (an internal header: only caching_allocator.cc, device_pool*.cc include it).
//
// DevicePool owns the segments of one device and the blocks tiling them, holds the
// device lock and orchestrates the parts that own the rest (docs/architecture.md,
// "DevicePool's parts"): pool_policy.h (the pure decisions), PoolAccounting (stats,
// site counters, trace: every state change reports there), FreeIndex (free sets, best
// fit, split, coalesce) and EventQueues (events of cross-stream frees). Segment
// provisioning (regular and expandable) and the ways memory goes back are still here.
// The driver is reached only through Backend.
//
// Ways memory goes back, told apart by name: release_segment (one unused segment),
// release_unused (unused segments largest first, then recycle: the staged retry),
// recycle (unmap idle granules of expandable runs), garbage_collect (oldest unused
// first, to the GC threshold), trim (down to a cached-bytes target), empty_cache
// (everything unused, and empty reservations).
//
// Locking: one Mutex (allocator/mutex.h), `mu_`, guards everything. Public methods take it; methods
// named *_locked require it. Lock order: mu_ -> backend's internal locks -> observer's
// lock -> site registry lock (GetSite, a leaf). Backend calls (segment alloc/free,
// event record/query/sync) happen under mu_: that serializes cudaMalloc/cudaFree as
// PyTorch does, and keeps the segment table consistent with the driver.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "allocator/mutex.h"
#include "allocator/backend.h"
#include "allocator/block.h"
#include "allocator/config.h"
#include "allocator/event_queues.h"
#include "allocator/free_index.h"
#include "allocator/observer.h"
#include "allocator/oom_report.h"
#include "allocator/pool_accounting.h"
#include "allocator/snapshot.h"
#include "allocator/stats.h"

namespace devmem::internal {

class ArenaPoolHook;  // allocator/arena_internal.h

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
  // The arenas of this allocator (allocator/arena_internal.h): the staged retry takes
  // their retained chunks back, and OOM reports say what they hold. nullptr: none.
  void set_arena_hook(ArenaPoolHook* hook);  // device_pool_arena.cc

  DeviceId device() const { return device_; }
  Backend& backend() const { return *backend_; }
  const Config& config() const { return config_; }

 private:
  // tests/device_pool_invariants_test.cc corrupts a pool on purpose to show that
  // validate() notices.
  friend class DevicePoolTestPeer;

  // --- allocation path -----------------------------------------------------------
  // Gets a new segment for a request of `size` (the staged retry). On success the
  // segment's single block is returned, out of any free set. On failure returns
  // nullptr with *report filled.
  Block* new_segment_with_retry(size_t requested, size_t size, Stream stream,
                                SiteId site, OomReport* report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One attempt at more memory for a request of `size`: grows the (stream, pool)'s
  // expandable reservation when those are on, else allocates a regular segment of
  // `segment_size`. Returns a free block of at least `size` bytes out of any free set,
  // or nullptr when the device (or the memory fraction) says no.
  Block* try_grow(size_t size, size_t segment_size, bool small, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One attempt at a regular segment of `segment_size` for a request of `size`
  // (honours the memory fraction).
  Block* try_new_segment(size_t size, size_t segment_size, bool small, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- expandable segments (device_pool_expandable.cc) -----------------------------
  // Where mapping for a request goes: map [at, at + bytes), which joins the free
  // blocks `left` (ending at `at`) and/or `right` (starting at at + bytes) when set.
  struct Placement {
    uintptr_t at = 0;
    size_t bytes = 0;  // 0: nothing fits in the reservation's unmapped gaps
    Block* left = nullptr;
    Block* right = nullptr;
  };
  // The reservation of (stream, pool), reserving its address range on first use;
  // nullptr when no address range can be reserved. A refused reservation is not asked
  // for again until empty_cache() (which gives address space back): every miss would
  // otherwise repeat a driver call that fails.
  Reservation* reservation(Stream stream, bool small) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The placement in `r` that maps the fewest bytes for a block of `size` (ties: the
  // lowest address), using free blocks at the edges of its runs.
  Placement place(const Reservation* r, size_t size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Maps memory in `r` for a request of `size`, first recycling idle granules when the
  // footprint would grow past expandable_recycle_threshold or the memory limit, or
  // when the device is out of memory. Returns a free block >= `size` out of any free
  // set, or nullptr when out of memory, with *va_full set when no unmapped gap of the
  // reservation can hold it.
  Block* try_expand(Reservation* r, size_t size, bool* va_full)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records that [at, at + bytes) of `r` was just mapped: extends, creates or merges
  // runs and returns the free block holding the range (coalesced with free
  // neighbours), out of any free set.
  Block* link_mapped(Reservation* r, uintptr_t at, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps [c0, c1) (granule-aligned) of the free block `b` of an expandable run,
  // splitting the run around the hole. The caller has synchronized the run's stream.
  // Returns the bytes unmapped.
  size_t unmap_range(Block* b, uintptr_t c0, uintptr_t c1) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmaps whole free granules of expandable runs, from the blocks with the most whole
  // granules first (only as many of a block's granules as are still wanted, from its
  // top), until `bytes` are unmapped or none are left; never touches `keep_a` or
  // `keep_b`, and with `only` takes from that reservation alone. Synchronizes each
  // run's stream before unmapping its memory. Returns the bytes unmapped.
  size_t recycle(size_t bytes, const Block* keep_a = nullptr, const Block* keep_b = nullptr,
                 const Reservation* only = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves `s` to a new base address in segments_ (its start changed).
  void rekey_segment(Segment* s, uintptr_t addr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the address ranges of reservations that map nothing.
  void release_empty_reservations() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t round_to_granule(size_t bytes) const {
    return RoundToGranule(bytes, granularity_);
  }

  // --- free path -----------------------------------------------------------------
  // Marks a block (allocated or pending, out of any set) free, coalesces it with free
  // neighbours and inserts the result into its free set.
  void release_block(Block* block) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves blocks whose events completed to the cache. With `wait`, synchronizes every
  // pending event first (so nothing stays pending).
  void process_events_locked(bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- releasing segments ----------------------------------------------------------
  bool segment_unused(const Segment* s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return s->busy_blocks == 0;
  }
  void release_segment(Segment* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unused segments (regular, and expandable runs that are one free block), largest
  // first.
  std::vector<Segment*> unused_segments_largest_first() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases unused segments, largest first, until `bytes` have been released; then
  // recycles idle granules of expandable runs for the rest.
  size_t release_unused(size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // garbage_collection_threshold: releases the longest-unused segments until
  // reserved + incoming fits under the threshold.
  void garbage_collect(size_t incoming) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Frees the arenas' retained chunks (allocated blocks to the pool) so that the
  // staged retry can release their segments. Returns how many (device_pool_arena.cc).
  size_t take_back_arena_chunks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- bookkeeping ---------------------------------------------------------------
  size_t memory_limit() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void fill_oom_report(size_t requested, size_t size, size_t segment_size,
                       Stream stream, SiteId site, OomReport* report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finds the block containing `addr` (any state), or nullptr.
  Block* block_containing(uintptr_t addr) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds the message for a bad pointer passed to `op` ("free", "record_stream").
  std::string describe_bad_pointer(const char* op, const void* ptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);


  const std::unique_ptr<Backend> backend_;
  const DeviceId device_;
  const Config config_;
  const size_t device_total_;
  // expandable_segments is on (or auto) and the backend has virtual memory.
  const bool use_expandable_;
  // expandable_recycle_threshold (+inf: recycle only under memory pressure).
  const double recycle_threshold_;
  const size_t granularity_;  // of the backend's virtual memory (0 without)

  mutable Mutex mu_;
  double memory_fraction_ ABSL_GUARDED_BY(mu_);
  // Allocated blocks by address (what free() looks up).
  absl::flat_hash_map<uintptr_t, Block*> allocated_ ABSL_GUARDED_BY(mu_);
  // Expandable reservations by (stream, small pool); their runs are in segments_.
  absl::flat_hash_map<std::pair<uintptr_t, bool>, Reservation*> expandable_
      ABSL_GUARDED_BY(mu_);
  // (stream, small pool) pairs whose reserve_address failed, until empty_cache().
  absl::flat_hash_set<std::pair<uintptr_t, bool>> reservation_failed_ ABSL_GUARDED_BY(mu_);
  // Every segment by base address (for interior-pointer lookups and snapshots).
  absl::btree_map<uintptr_t, Segment*> segments_ ABSL_GUARDED_BY(mu_);
  // Events that pending blocks wait for.
  EventQueues events_ ABSL_GUARDED_BY(mu_);
  // Statistics, site counters and the observer: every state change reports to it.
  PoolAccounting acct_ ABSL_GUARDED_BY(mu_);
  // The free sets and spare Block objects (reports to acct_, so declared after it).
  FreeIndex free_ ABSL_GUARDED_BY(mu_);
  uint64_t use_clock_ ABSL_GUARDED_BY(mu_) = 0;  // ticks once per allocation
  ArenaPoolHook* arena_hook_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace devmem::internal
