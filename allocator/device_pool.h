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
//   PrivatePools         graph capture's private pools (device_pool_private.cc)
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
// observer's lock -> site registry lock (GetSite, a leaf). The segment sources' driver
// calls run with mu_ released (driver_in_flight.h): a regular segment's
// allocate_segment, an expandable map, every free and unmap of the reclaimer and of
// recycling (proactive or not), the handle reserve's release and the address ranges'
// release. The intent is registered first
// (its bytes count against the memory limit, DriverInFlight; what the call works on is
// out of everyone's reach), the pool is consistent at the release, and the caller
// re-checks what it prepared once it is back: try_grow, new_segment_with_retry,
// Reclaimer::reclaim, poll_locked, wait_for_events_locked and
// release_private_pools_locked may release mu_. The
// stream waits before frees and unmaps, and the waits for cross-stream frees, wait
// with mu_ released for events recorded under it (release_fence.h: a stream is named
// to the driver only while release_stream is kept out). Still under mu_: event record
// / query / release (non-blocking; the allocation path's queries bounded) and pool
// destruction (docs/architecture.md, "Thread safety and lock order", says why).
#pragma once

#include <cstddef>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "allocator/backend.h"
#include "allocator/block.h"
#include "allocator/block_map.h"
#include "allocator/block_states.h"
#include "allocator/config.h"
#include "allocator/driver_in_flight.h"
#include "allocator/event_queues.h"
#include "allocator/expandable_segments.h"
#include "allocator/free_index.h"
#include "allocator/mutex.h"
#include "allocator/observer.h"
#include "allocator/oom_report.h"
#include "allocator/poll_work.h"
#include "allocator/pool_accounting.h"
#include "allocator/private_pools.h"
#include "allocator/reclaimer.h"
#include "allocator/regular_segments.h"
#include "allocator/segment_table.h"
#include "allocator/snapshot.h"
#include "allocator/snapshot_walk.h"
#include "allocator/stats.h"
#include "allocator/thread_cache.h"

namespace devmem::internal {

class ArenaPoolHook;  // allocator/arena_internal.h

class DevicePool {
 public:
  DevicePool(std::unique_ptr<Backend> backend, const Config& config);
  ~DevicePool();

  void* allocate(size_t bytes, Stream stream, SiteId site);
  void free(void* ptr);
  void record_stream(void* ptr, Stream stream);
  // CachingAllocator::release_stream (device_pool_retire.cc, stream_retire.h).
  void release_stream(Stream stream);
  void empty_cache();
  void trim(size_t keep_bytes);
  absl::Status set_memory_fraction(double fraction);
  // Returns at once, without the device lock, when nothing is queued for a poll
  // (poll_work_, allocator/poll_work.h); else polls every queued event.
  void process_events();
  // Lock-free: work is queued for process_events() (a hint, exact while no other
  // thread holds the lock). CachingAllocator::poll_stats / set_poll_counter.
  bool has_poll_work() const { return poll_work_.any(); }
  PollStats poll_stats() const {
    return {poll_calls_.load(std::memory_order_relaxed),
            poll_locked_.load(std::memory_order_relaxed)};
  }
  void set_poll_counter(std::atomic<int64_t>* counter);

  // --- graph capture's private pools (device_pool_private.cc, private_pools.h) --------
  // CachingAllocator's begin_allocate_to_pool / end_allocate_to_pool / release_pool:
  // InvalidArgumentError naming the pool for misuse, changing nothing.
  void begin_allocate_to_pool(PoolId pool, StreamFilter filter);
  void end_allocate_to_pool(PoolId pool);
  void release_pool(PoolId pool);
  // True while an allocation to a private pool is under way (read without the lock by
  // the front end: thread caches and arenas step aside then).
  bool allocating_to_pools() const { return pools_underway_.load(std::memory_order_acquire); }

  DeviceStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  std::vector<SiteStats> site_stats() const;
  std::vector<SiteUsage> top_sites(size_t k) const;
  AllocatorSnapshot snapshot() const;
  // The same without draining the thread caches (their blocks appear as
  // kThreadCached): for validate(), which must change nothing.
  AllocatorSnapshot segments_for_validation() const;
  // How long snapshots held the device lock (snapshot.h). No lock.
  SnapshotLockStats snapshot_lock_stats() const;
  std::optional<BlockInfo> find_allocation(const void* ptr) const;
  absl::Status validate() const;  // defined in device_pool_validate.cc
  void set_observer(AllocatorObserver* observer);
  // The arenas of this allocator (allocator/arena_internal.h): the staged retry takes
  // their retained chunks back, and OOM reports say what they hold. nullptr: none.
  void set_arena_hook(ArenaPoolHook* hook);  // device_pool_arena.cc
  // The key of this pool's samples in the stack sampler (its CachingAllocator), so that
  // an OOM report names the sampled stacks holding the most. Set once, before any
  // allocation; nullptr: none.
  void set_sample_owner(const void* owner) { sample_owner_ = owner; }

  // --- poisoning (allocator/errors.h; device_pool_poison.cc) -------------------------
  // A DriverError poisons the pool for good: the device's context is broken, so no
  // later call may reach the driver or change the pool. Set once, by the first error
  // (from any thread); readable without the device lock.
  bool poisoned() const { return poisoned_.load(std::memory_order_acquire); }
  // Records the first driver error: `op` is the public call that met it. Returns the
  // message CachingAllocator throws for it (naming the device, op, call and error).
  std::string poison(const char* op, const char* what);
  // Refuses `op` on a poisoned pool: throws DriverError naming `op` and the first error.
  [[noreturn]] void throw_poisoned(const char* op) const;

  DeviceId device() const { return device_; }
  Backend& backend() const { return *backend_; }
  const Config& config() const { return config_; }

  // --- thread caches: the front end (device_pool_tcache.cc, thread_cache.h) -------------
  // allocate() and free() behind this thread's cache: a hit takes no lock.
  // `size_hint` is what the caller asked allocate() for (0: unknown); it lets frees of
  // large blocks skip the cache lookup. Inline, in allocator/device_pool_front.h (the
  // hit runs in the caller's frame); include it to call them.
  inline void* allocate_front(size_t bytes, Stream stream, SiteId site);
  inline void free_front(void* ptr, size_t size_hint);
  // Folds every cache's counted hits into the statistics (stats exact when quiescent).
  void sync_thread_caches();
  // Gives every block in every thread cache back to the pool.
  void drain_thread_caches();
  // The observer the front end reports cache hits to (the same as set_observer's).
  void set_front_observer(AllocatorObserver* observer) {
    front_observer_.store(observer, std::memory_order_release);
  }
  // Thread exit (thread_cache.cc, registry mutex held): drains `cache` and unlists it.
  void release_thread_cache(ThreadCache* cache);

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
  // The staged retry, right before a grow that could fail on the memory limit: waits
  // (mu_ released) until every give-back begun before it has ended (later ones may
  // still be in flight: DriverInFlight::wait_for_give_backs); then a cached block that
  // fits, if another thread freed one meanwhile, else nullptr (grow next).
  Block* wait_for_give_backs_locked(size_t size, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves blocks whose events completed to the cache, polling at most `budget` events
  // (EventQueues::poll). With `wait` (and no budget), synchronizes every pending event
  // first (so nothing stays pending).
  void process_events_locked(bool wait, size_t budget = kPollAllEvents)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    blocks_.complete_events(wait, budget);
  }
  // Waits for every cross-stream free queued now (stage 2 of the staged retry,
  // empty_cache) with mu_ released, then moves the blocks whose events completed to
  // the cache (device_pool.cc says why this is safe). The caller holds an Operation.
  // Frees queued by other threads meanwhile stay pending if not yet complete.
  void wait_for_events_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The allocation path's bounded poll: cross-stream frees whose events completed, and
  // deferred recycles whose events completed (one query per stream queue and per
  // reservation at most; nothing waits), querying at most `budget` cross-stream
  // events (kAllocationEventPollBudget on the allocation path, kPollAllEvents for
  // process_events()). What is not done yet waits for a later call. The unmaps of
  // completed recycles run with mu_ released.
  void poll_locked(size_t budget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // No event is queried while a capture may be under way (device_pool_private.cc).
    if (privates_.any_underway()) return;
    if (blocks_.has_deferred()) record_deferred_events_locked();
    if (!events_.empty()) process_events_locked(/*wait=*/false, budget);
    if (expandable_ != nullptr && expandable_->has_deferred()) {
      const DriverInFlight::Operation op(in_flight_);
      expandable_->complete_deferred(/*wait=*/false, &mu_);
    }
  }

  // --- stream retirement (device_pool_retire.cc) --------------------------------------
  // Before `op` ("allocate", "record_stream") uses `stream`: throws InvalidArgumentError
  // naming it while it is being retired; a retired handle becomes live (a new stream).
  void claim_stream_locked(Stream stream, const char* op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- graph capture (device_pool_private.cc) -----------------------------------------
  // True when a capture may be under way for an allocation on `stream`: a private pool
  // is being allocated to, or the backend says `stream` captures. Then nothing may
  // synchronize, query events or give memory back, and segments come from
  // Backend::allocate_segment_during_capture.
  bool capturing_locked(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A miss while capturing: a regular segment (no expandable map, which the driver
  // refuses during a capture), for `pool` when not nullptr; the thread caches are the
  // only memory taken back (no driver call); nullptr when the device has no room.
  Block* grow_during_capture_locked(size_t size, Stream stream, PrivatePool* pool)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free of `b` (record_stream uses) must not record its events now: a capture is
  // under way, or one of its streams captures.
  bool defer_events_locked(const Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the events of blocks freed during a capture, once their streams capture no
  // more.
  void record_deferred_events_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives the unused segments of released private pools (of `only`, when not nullptr)
  // back to the device (no capture under way), with mu_ released around the stream
  // waits and the frees, and forgets the pools left empty. The caller holds an
  // Operation (driver_in_flight.h). A DriverError puts what was not given back into
  // its pool again and propagates.
  void release_private_pools_locked(PrivatePool* only = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // stats() and snapshots: the private pools' share.
  void private_stats_locked(DeviceStats* stats) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // validate()'s share: the pools' records against the segment table.
  absl::Status validate_private_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // validate()'s share: each poll-work bit set exactly when its source has work
  // (device_pool_validate.cc).
  absl::Status validate_poll_work_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // --- thread caches (device_pool_tcache.cc) ------------------------------------------
  // The device lock held by the caller, the rest of free(): `ptr` as free() takes it.
  void free_locked(void* ptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The allocated block at `addr`, pool-owned (the allocated table) or cache-owned, or
  // nullptr.
  Block* find_allocated_locked(uintptr_t addr) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ThreadCache* create_thread_cache();
  // allocate_front's miss on a thread without a cache: makes one (unless the thread is
  // exiting), then allocate().
  void* allocate_without_cache(size_t requested, Stream stream, SiteId site);
  // Slow paths of the front end.
  void* cache_allocate_slow(ThreadCache* tc, size_t requested, Stream stream, SiteId site);
  void cache_free_slow(ThreadCache* tc, void* ptr);
  // The owner, device lock held: its cache is usable again and its window folded.
  void resume_cache_locked(ThreadCache* tc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A bin of `tc` that may take `b` (claiming a stream slot, making room), or nullptr.
  ThreadCache::Bin* bin_for_free_locked(ThreadCache* tc, const Block* b)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Quiesces every cache (thread_cache.h): afterwards their owners stay out until they
  // take the device lock.
  void quiesce_caches_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void fold_cache_locked(ThreadCache* tc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Folds the calling thread's own cache (its owner may, without quiescing it), so
  // that the pool's statistics change after its hits: peaks exact for one thread.
  void fold_own_cache_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ThreadCache* tc = tcache::Find(pool_id_)) fold_cache_locked(tc);
  }
  // Returns blocks from `tc`'s bins (all slots, or slot `only`) to the free sets until
  // it holds at most `keep_bytes` and `keep_blocks`.
  void flush_cache_locked(ThreadCache* tc, size_t keep_bytes, size_t keep_blocks,
                          int only = -1) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Quiesces, folds and empties every cache; returns the bytes given back.
  size_t drain_thread_caches_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For the const readers (snapshot, validate): the caches' state is not part of the
  // pool's logical value, so draining or quiescing them is allowed there.
  size_t drain_for_read_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return const_cast<DevicePool*>(this)->drain_thread_caches_locked();
  }
  void quiesce_for_read_locked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A block of a bin goes back to the free sets (coalescing).
  void release_cached_block(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ~DevicePool: detaches every cache (their threads delete them) and counts the
  // cache-owned blocks still allocated.
  void detach_thread_caches();
  // validate()'s share for the caches (device lock held, caches quiesced).
  absl::Status validate_caches_locked(size_t thread_cached_blocks,
                                      size_t cache_owned_allocated) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Frees the arenas' retained chunks (allocated blocks to the pool) so that the
  // staged retry can release their segments. Returns how many (device_pool_arena.cc).
  size_t take_back_arena_chunks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  AllocatorSnapshot snapshot_impl(bool drain) const;
  // Records one snapshot's device-lock hold (SnapshotLockStats): wall and CPU time,
  // and the page faults taken in it; called under the lock.
  void note_snapshot_lock_hold(int64_t ns, int64_t cpu_ns, int64_t faults) const;

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
  // Whether the parts below hold work for poll_locked: written by them under mu_, read
  // by process_events() without it (allocator/poll_work.h has the invariant and the
  // memory ordering). Declared before the parts, which publish into it, and destroyed
  // after them. process_events()' counts (PollStats), relaxed: figures only.
  PollWork poll_work_;
  std::atomic<uint64_t> poll_calls_{0};
  std::atomic<uint64_t> poll_locked_{0};
  // The parts, in dependency order (each uses only those declared before it).
  SegmentTable segments_ ABSL_GUARDED_BY(mu_);
  DriverInFlight in_flight_ ABSL_GUARDED_BY(mu_);
  EventQueues events_ ABSL_GUARDED_BY(mu_);
  PoolAccounting acct_ ABSL_GUARDED_BY(mu_);
  FreeIndex free_ ABSL_GUARDED_BY(mu_);
  BlockStates blocks_ ABSL_GUARDED_BY(mu_);
  RegularSegments regular_ ABSL_GUARDED_BY(mu_);
  // nullptr unless expandable_segments is on (or auto) and the backend has virtual
  // memory.
  const std::unique_ptr<ExpandableSegments> expandable_ ABSL_PT_GUARDED_BY(mu_);
  Reclaimer reclaimer_ ABSL_GUARDED_BY(mu_);
  PrivatePools privates_ ABSL_GUARDED_BY(mu_);
  // privates_.any_underway(), written under mu_, for allocating_to_pools().
  // From here on the fields every thread-cache hit reads (pools_underway_, the cache
  // limits and id, the block map's root, front_observer_, poisoned_): on lines of their
  // own, away from what the lock holder writes (the parts above, the block map's count),
  // so that one thread's locked work does not take them from another thread's cache.
  alignas(64) std::atomic<bool> pools_underway_{false};

  // --- thread caches -----------------------------------------------------------------
  const ThreadCacheLimits cache_limits_ = ThreadCacheLimitsFor(config_);
  const uint64_t pool_id_ = tcache::NewPoolId();
  // Cache-owned blocks by address: written under mu_, read by any thread.
  BlockMap block_map_;
  // Every live thread cache of this pool.
  std::vector<ThreadCache*> caches_ ABSL_GUARDED_BY(mu_);
  std::atomic<AllocatorObserver*> front_observer_{nullptr};
  ArenaPoolHook* arena_hook_ ABSL_GUARDED_BY(mu_) = nullptr;
  const void* sample_owner_ = nullptr;  // written before any allocation, then read only

  // snapshot_impl's lock holds (SnapshotLockStats), written after each snapshot's copy.
  // Relaxed: figures for reports, ordered with nothing else.
  mutable std::atomic<uint64_t> snapshot_count_{0};
  mutable std::atomic<int64_t> snapshot_lock_last_ns_{0};
  mutable std::atomic<int64_t> snapshot_lock_max_ns_{0};
  mutable std::atomic<int64_t> snapshot_lock_last_cpu_ns_{0};
  mutable std::atomic<int64_t> snapshot_lock_max_cpu_ns_{0};
  mutable std::atomic<int64_t> snapshot_lock_last_faults_{0};
  mutable std::atomic<int64_t> snapshot_lock_max_faults_{0};
  // The snapshots' copy arrays, kept between snapshots so that their pages are not
  // faulted in again each time (allocator/snapshot_walk.h): one snapshot takes the
  // object, gives it back when done; a concurrent one makes its own. A leaf lock, never
  // held with mu_.
  mutable Mutex kept_walk_mu_;
  mutable std::unique_ptr<SnapshotWalk> kept_walk_ ABSL_GUARDED_BY(kept_walk_mu_);

  // Poisoning: the first driver error's message, written once (poison_once_) before
  // poisoned_ is set, read only after it is.
  std::once_flag poison_once_;
  std::string poison_message_;
  std::atomic<bool> poisoned_{false};
};

}  // namespace devmem::internal
