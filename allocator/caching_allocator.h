// allocator/caching_allocator.h: the caching allocator of one device.
//
// Example:
//   auto backend = MakeBackend(config, /*index=*/0);   // allocator/backend_factory.h
//   CachingAllocator alloc(std::move(*backend), config);
//   void* p = alloc.allocate(1 << 20, stream, InternSite(loc, SiteKind::kAlloc));
//   alloc.record_stream(p, other_stream);   // p is also used by work on other_stream
//   alloc.free(p);                          // reused on `other_stream` only after it
//                                           // reaches the point of the free
//
// Policy (docs/architecture.md has the reasoning and the figures):
//   * sizes round up to 512 B; requests up to 1 MiB come from the small pool (2 MiB
//     segments), larger ones from the large pool (20 MiB segments for requests below
//     10 MiB, else the request rounded up to 2 MiB);
//   * best fit over the free blocks of the same pool and stream, ordered by
//     (stream, size, address); a block is split when the rest is worth keeping
//     (small pool: >= 512 B; large pool: > 1 MiB); a freed block coalesces with free
//     neighbours of its segment;
//   * segments made for requests of max_split_size or more are oversize: their blocks
//     are never split, and only serve requests of max_split_size or more that waste
//     less than 20 MiB (a standard 20 MiB segment is never oversize);
//   * a block is reused only on the stream it was allocated on. record_stream(p, s)
//     makes the free of p record an event on s; the block stays pending until every
//     such event completes;
//   * when a new segment cannot be had: (1) release unused cached segments, largest
//     first, until as many bytes as the new segment are released, retry;
//     (2) synchronize every pending event, release every unused segment, retry;
//     (3) large pool only: try a segment of just the request rounded to 2 MiB;
//     (4) throw OutOfMemoryError with an OomReport;
//   * with expandable_segments (auto: where mappings can be shared,
//     segment_kind_policy.h) each (stream, pool) has one address reservation: a miss
//     maps the fewest granules that can hold the request (next to free blocks, in a
//     gap or at the end); whole free
//     granules are unmapped under memory pressure, on trim/empty_cache, and when
//     fragmentation would take a stream's mapped bytes past (1 +
//     expandable_recycle_threshold) x the high-water mark of the stream's bytes in
//     use, without waiting for the stream on the
//     allocating thread (expandable_segments.h);
//   * memory goes back to the device only after its stream has passed it
//     (synchronized, or an event recorded after the free completed: work queued
//     before a free may still use the block);
//   * with garbage_collection_threshold, cached segments unused for longest are
//     released before a new segment is taken, while reserved exceeds the threshold;
//   * per_process_memory_fraction caps reserved bytes at that share of the device.
//
// Thread caches (thread_cache key, on by default; docs/architecture.md, "Thread
// caches"): requests up to thread_cache_max_size are served from a per-(thread,
// device) cache of free blocks without the device lock; frees go to the freeing
// thread's cache when it caches that stream. Blocks with record_stream uses bypass
// them. Caches are bounded (thread_cache_max_bytes, _max_blocks) and drained at thread
// exit, by empty_cache(), trim() and snapshot(), and first when memory runs out.
// Statistics count the blocks they hold as thread_cached (not allocated, not active).
//
// Thread-safety: every public method may be called concurrently from any thread. One
// mutex (the device lock) guards all state except the thread caches (their owner
// thread's, quiesced by the lock holder when it needs them). Lock order: device lock, then the
// backend's internal locks, then the observer's, then the site registry's (a leaf,
// taken only to read site kinds for OOM reports). Public methods never call other
// public methods. The exception to "any thread": a stream callback (a launch_host_fn
// function) must not call any method but device(), backend() and config(); the others
// throw InvalidArgumentError there (allocator/backend.h says why: a deadlock).
//
// Driver errors (allocator/errors.h): a driver failure other than out-of-memory in a
// call that must not fail (an event query or wait, a stream synchronize, a free or
// unmap) is thrown as DriverError naming this call, the driver call and its error,
// and poisons the allocator (poisoned() below); nothing ends the process.
//
// Sizes of 0: allocate(0) returns nullptr without allocating (and counts nothing);
// free(nullptr) does nothing.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "allocator/arena.h"
#include "allocator/backend.h"
#include "allocator/config.h"
#include "allocator/errors.h"
#include "allocator/observer.h"
#include "allocator/oom_report.h"
#include "allocator/pool_id.h"
#include "allocator/site.h"
#include "allocator/snapshot.h"
#include "allocator/stats.h"

namespace devmem {

namespace internal {
class DevicePool;  // the state behind the device lock (allocator/device_pool.h)
class Arenas;      // the state behind ArenaScope (allocator/arena_internal.h)
}

class CachingAllocator {
 public:
  // Takes ownership of the backend. Reads the policy keys of `config`
  // (max_split_size, garbage_collection_threshold, expandable_segments,
  // per_process_memory_fraction).
  CachingAllocator(std::unique_ptr<Backend> backend, const Config& config);
  // Waits for pending events and returns every segment to the backend. Blocks still
  // allocated at this point are reported on stderr (a leak in the program) and their
  // segments are freed anyway.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Returns a block of at least `bytes` bytes, 512-byte aligned, usable at once by work
  // on `stream`. Throws OutOfMemoryError when the device is exhausted after the staged
  // retry, InvalidArgumentError when `bytes` cannot be rounded (overflow). bytes == 0
  // returns nullptr.
  void* allocate(size_t bytes, Stream stream = {}, SiteId site = kUnknownSite);

  // Frees a pointer returned by allocate(). Throws InvalidArgumentError, naming the
  // pointer, when it is not the start of an allocated block (unknown, interior, or
  // already freed); nothing changes then. free(nullptr) is a no-op.
  void free(void* ptr);
  // The same, with the size the caller asked allocate() for (as PyTorch's pluggable
  // free passes it): frees of blocks too large for the thread caches skip their lookup.
  // A wrong size is harmless (it is only a hint); the pointer is checked as by free().
  void free(void* ptr, size_t size);

  // Declares that work on `stream` uses the allocated block at `ptr` (which must be
  // the pointer allocate() returned). The block's free will wait for that work.
  // Throws InvalidArgumentError for a pointer that is not allocated.
  void record_stream(void* ptr, Stream stream);

  // Retires `stream` before the program destroys it (cudaStreamDestroy): a driver gives
  // a destroyed stream's handle to the next stream created, while the kernels queued
  // on the old one still run, and the cache is keyed by the handle. Records one event
  // on `stream`; its cached blocks (free sets, thread caches) and pending ones wait for
  // it, and so do blocks of the stream still allocated when they are freed, and blocks
  // with a record_stream use on it, instead of any event or synchronize on the
  // destroyed stream (nothing synchronizes it afterwards). Until the event completes,
  // allocate and record_stream on the handle throw InvalidArgumentError naming it;
  // then the handle serves a new stream. Every retained arena chunk goes back to the
  // pool first (as empty_cache gives them). Call it after the last work on `stream`
  // is queued and before destroying it. Throws InvalidArgumentError, changing nothing,
  // for the default stream, a stream released already whose work has not completed,
  // or while a graph capture is under way.
  void release_stream(Stream stream);

  // Gives back every thread cache's blocks, waits for every pending cross-stream free,
  // then returns every unused cached segment to the backend.
  void empty_cache();
  // Returns unused cached segments, largest first, until at most `keep_bytes` of
  // cached (reserved but unallocated) memory remains.
  void trim(size_t keep_bytes);

  // Caps reserved memory at `fraction` (0, 1] of the device total.
  absl::Status set_memory_fraction(double fraction);

  // Polls every pending event, moving completed blocks back to the cache. allocate() polls
  // a few (allocator/event_queues.h); the runtime's poller thread calls this for the rest.
  // Does nothing while an allocation to a private pool is under way (a capture).
  // Returns at once, without the device lock, when nothing is queued (no cross-stream
  // free pending, no stream retiring, nothing deferred by a capture or by recycling;
  // allocator/poll_work.h): an idle allocator costs its poller one atomic load (and
// the increment of its call count, poll_stats).
  void process_events();
  // process_events() calls so far and how many took the device lock. Lock-free.
  PollStats poll_stats() const;
  // For a poller of many allocators (the runtime's): while attached, *counter counts
  // this allocator as 1 whenever it has work for process_events() and 0 otherwise,
  // so that the poller can skip every lock while it reads 0. nullptr detaches; a new
  // counter replaces the old. `counter` must outlive the attachment (or the allocator).
  // Takes the device lock; callable from any thread but a stream callback's.
  void set_poll_counter(std::atomic<int64_t>* counter);

  // Graph capture's private pools (allocator/pool_id.h; PyTorch's beginAllocateToPool,
  // endAllocateToPool, releasePool). From begin_allocate_to_pool(pool, filter) to the
  // matching end_allocate_to_pool(pool), allocations on streams for which filter(stream)
  // is true use only the pool's memory (made for it, with cudaMalloc in relaxed capture
  // mode on CUDA), and their blocks return to it when freed: no other allocation is ever
  // handed them. A begin on a live pool shares it (its use count goes up).
  // release_pool(pool) drops the use count; at zero the pool's memory goes back to the
  // device as its blocks are freed. While any allocation to a pool is under way nothing
  // queries events, synchronizes or gives memory back (process_events, empty_cache and
  // trim skip those steps; thread caches and arenas step aside), so a capture is never
  // broken. Misuse (the default pool id {0, 0}, an empty filter, ending a pool not
  // being allocated to, releasing a pool still being allocated to, unknown or already
  // released) throws InvalidArgumentError naming the pool, changing nothing.
  void begin_allocate_to_pool(PoolId pool, StreamFilter filter);
  void end_allocate_to_pool(PoolId pool);
  void release_pool(PoolId pool);

  DeviceStats stats() const;
  void reset_peak_stats();
  void reset_accumulated_stats();
  // Per-site counters, indexed by SiteId (entries beyond the vector are all zero).
  std::vector<SiteStats> site_stats() const;
  // Live bytes and counts of the largest holders, largest first.
  std::vector<SiteUsage> top_sites(size_t k) const;
  // A consistent copy of every segment and block.
  AllocatorSnapshot snapshot() const;
  // How long snapshot() (and validate()'s copy) held the device lock: the count, the
  // latest and the longest hold. Lock-free; safe anywhere.
  SnapshotLockStats snapshot_lock_stats() const;
  // The allocated block starting at `ptr`, if any (for the tensor layer and tools).
  std::optional<BlockInfo> find_allocation(const void* ptr) const;

  // Recounts everything and checks the invariants of docs/architecture.md (and the
  // arenas': their chunks are exactly the pool's arena-site blocks, and each chunk's
  // live count matches its side table; exact only while no arena buffer is being
  // allocated or freed): the
  // blocks of each segment tile it; no allocated blocks overlap; no two adjacent free
  // blocks of a segment are uncoalesced; free lists hold exactly the free blocks and
  // thread caches exactly the thread-cached ones; every statistic equals its recount;
  // reserved == allocated + pending + cached (free sets and thread caches).
  // Returns an InternalError describing the first violation.
  absl::Status validate() const;

  // What the scoped arenas of this allocator hold (allocator/arena.h), and every
  // live arena buffer (snapshot() has them too).
  ArenaReport arena_report() const;
  std::vector<ArenaBufferInfo> arena_buffers() const;

  // Observer for every event (allocator/observer.h). Set at most once, before or
  // after use; nullptr removes it. The observer must outlive the allocator or be
  // removed first.
  void set_observer(AllocatorObserver* observer);

  // Lets device `peer` (another device of this backend's kind, by index) read and
  // write every block of this allocator, those allocated now and later: peer kernels,
  // peer copies and NCCL buffers then work on expandable segments too (Backend::
  // enable_peer_access: one access call per mapped range now, and every later map
  // grants the peer). Idempotent. Errors name this device and the peer:
  // InvalidArgument (the device itself, no such device), FailedPrecondition (the
  // hardware has no peer path), Unimplemented (backends without peers: sim, cpu), or
  // the driver's error; nothing changes then. Throws DriverError as allocate does on
  // a poisoned allocator or a sticky driver error. Takes no device lock.
  absl::Status enable_peer_access(int peer);

  // True once a driver error poisoned this allocator (allocator/errors.h): allocate,
  // free, record_stream, release_stream, release_pool, empty_cache, trim,
  // process_events and enable_peer_access then throw DriverError naming the call and
  // the first driver error, and change nothing; stats(), snapshot(), validate() and
  // the other readers still answer. end_allocate_to_pool is not refused (a capture's
  // bookkeeping must end) but makes no driver call. Never cleared: the device's
  // context is broken (a sticky error) and the process must start again.
  bool poisoned() const;

  DeviceId device() const;
  Backend& backend() const;
  const Config& config() const;

 private:
  friend class ArenaScope;
  std::unique_ptr<internal::DevicePool> pool_;
  // Declared after pool_: destroyed first, giving its retained chunks back.
  std::unique_ptr<internal::Arenas> arenas_;
};

}  // namespace devmem
