// allocator/block.h: the allocator's internal data structures (not a public header).
//
//   Segment  one backend allocation [addr, addr + size), owned by one (stream, pool).
//   Block    a contiguous piece of a segment; the blocks of a segment form a doubly
//            linked list in address order that tiles the segment exactly.
//
// Block states and where a block lives:
//   kAllocated  in DevicePool::allocated_ (keyed by address), held by the user;
//   kFree       in exactly one free set (small or large pool, FreeIndex), ordered by
//               (stream, size, address), ready for reuse on its stream;
//   kPending    in no set: freed by the user, waiting for `pending_events` events
//               recorded on other streams (queued in EventQueues);
//   kThreadCached  in one thread cache's bin (allocator/thread_cache.h). Blocks the
//               thread caches own have an entry in DevicePool's BlockMap, in a bin
//               (kThreadCached) and after a cache hit handed them out (kAllocated, and
//               then not in DevicePool::allocated_).
// Invariants (DevicePool::validate checks them):
//   - prev/next link the blocks of one segment in address order, with no gaps;
//   - two adjacent blocks are never both kFree (they are coalesced at once);
//   - a segment with no allocated or pending block is one single free block.
//
// Thread-safety: every field is guarded by the owning DevicePool's mutex, except for
// blocks the thread caches own: their owner thread changes `state` (kThreadCached <->
// kAllocated), `requested`, `site`, `alloc_time_ns` and `tc_next` without the lock.
// `state` is therefore a relaxed atomic (the pool reads neighbours' states while
// coalescing); the other fields are read under the lock only with the caches
// quiesced (allocator/thread_cache.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "allocator/pool_policy.h"
#include "allocator/site.h"
#include "allocator/snapshot.h"
#include "allocator/types.h"

namespace devmem::internal {

struct Segment;
struct PrivatePool;  // allocator/private_pools.h

// A BlockState that may be read and written concurrently: relaxed atomic loads and
// stores, which compile to plain moves; it reads and assigns like a BlockState.
class AtomicBlockState {
 public:
  AtomicBlockState(BlockState s = BlockState::kFree) : s_(s) {}  // NOLINT: implicit
  AtomicBlockState(const AtomicBlockState& o) : s_(o.load()) {}
  AtomicBlockState& operator=(const AtomicBlockState& o) {
    store(o.load());
    return *this;
  }
  AtomicBlockState& operator=(BlockState s) {
    store(s);
    return *this;
  }
  operator BlockState() const { return load(); }  // NOLINT: implicit
  BlockState load() const { return s_.load(std::memory_order_relaxed); }
  void store(BlockState s) { s_.store(s, std::memory_order_relaxed); }

 private:
  std::atomic<BlockState> s_;
};

// Cache-line aligned (64 B; 128 B in all, two lines): the fields a thread-cache hit
// writes (`state`, `requested`, `site`, `alloc_time_ns`, `tc_next`) must not share a
// line with another Block, which another thread's cache may own and write at the same
// time. From plain `new` Blocks lie 144 B apart on 16-byte boundaries, so every Block's
// first and last line was also a neighbour's (false sharing on every hit of two
// threads whose blocks were made next to each other, which blocks that circulate
// through the pool are: see docs/architecture.md, "Thread caches").
//
// The first line holds every field a snapshot copies, with `next` (the walk under the
// device lock reads one line per block: allocator/snapshot_walk.h).
struct alignas(64) Block {
  uintptr_t addr = 0;
  size_t size = 0;
  size_t requested = 0;       // bytes the user asked for; 0 unless allocated
  Block* prev = nullptr;      // the block just below in the same segment
  Block* next = nullptr;      // the block just above in the same segment
  Stream stream;              // the stream it was allocated on (== segment->stream)
  AtomicBlockState state = BlockState::kFree;
  SiteId site = kUnknownSite;
  int64_t alloc_time_ns = 0;
  // The second line (a thread-cache hit writes it too: tc_next, trace_order).
  Segment* segment = nullptr;
  // Free blocks: the pool's free sequence number (BlockStates) when this memory last
  // entered the free sets (a thread-cached block: when its cache gave it back, not
  // when it last left them); no device work queued after that uses it. 0: never used since it was
  // mapped or allocated. Set wherever a free block is made (BlockStates, the segment
  // sources); deferred recycling unmaps only blocks free since before its event.
  uint64_t free_seq = 0;
  // Streams other than `stream` that use the block (record_stream). Almost always
  // empty or one entry, so inline.
  absl::InlinedVector<Stream, 1> stream_uses;
  // The next block of the same thread-cache bin (kThreadCached only).
  Block* tc_next = nullptr;
  int pending_events = 0;     // events still to complete before it is free
  // kPending only: freed while a graph capture was under way, its record_stream events
  // not recorded yet (an event recorded in a capture cannot be queried); they are
  // recorded once no capture is under way (DevicePool, device_pool_private.cc).
  bool events_deferred = false;
  // kPending only: a free (cached) block of a stream being retired (release_stream,
  // allocator/stream_retire.h), waiting for the retirement's event; the user did not
  // free it, so its completion is not traced as a free.
  bool retired_cache = false;
  // The trace's causal stamp of this block's last event (AllocEvent::block_order):
  // written by the observer during the event, so a free on another thread reads after
  // the alloc (runtime/trace.h). Opaque here; under the same rules as `requested`.
  // mutable: the events are emitted through const Block*.
  mutable uint64_t trace_order = 0;

  bool is_split() const { return prev != nullptr || next != nullptr; }
};

// Two lines, no more: the slabs (FreeIndex) put Blocks sizeof(Block) apart on 128-B
// boundaries, so a 128-B Block is alone in its 128-B pair of lines, which the
// adjacent-line prefetcher fetches together. A third line (trace_order at offset 128,
// as it once was) shared a pair with the next Block's first line: two threads' hits on
// neighbouring Blocks then took that line from each other's cores (threads2_speedup's
// slow mode, docs/architecture.md "Thread caches").
static_assert(sizeof(Block) == 128, "Block must stay two cache lines (see above)");

// The bytes of one stream's blocks in expandable reservations that are out of the free
// sets (allocated, pending, or owned by a thread cache) and their high-water mark: the
// recycle trigger's reference (pool_policy.h, StreamFootprint). Shared by the stream's
// two reservations (Reservation::use) and owned by ExpandableSegments, which keeps it
// for the pool's life, so the mark outlives a reservation that empty_cache releases.
// BlockStates changes `in_use` where a block leaves or enters a free set; validate()
// recounts it.
struct StreamUse {
  int64_t in_use = 0;
  int64_t in_use_peak = 0;  // never lowered (reset_peak_stats() does not touch it)
  void add(int64_t bytes) {
    in_use += bytes;
    if (in_use > in_use_peak) in_use_peak = in_use;
  }
};

// An expandable reservation: one virtual address range per (stream, pool), from
// Backend::reserve_address, of which any granule-aligned parts may be mapped. Each
// maximal mapped run is one Segment (Segment::reservation points here) whose blocks
// tile it, so everything that walks segments sees mapped memory only.
// Invariants (validate checks them): runs lie inside [addr, addr + va_size), start and
// end on granule boundaries, and are never adjacent (mapping next to a run extends
// it; mapping between two runs merges them); `mapped` is the sum of their sizes. A
// reservation with no runs maps nothing; it stays in the table until empty_cache.
struct Reservation {
  uintptr_t addr = 0;
  size_t va_size = 0;
  Stream stream;
  bool small_pool = false;
  size_t mapped = 0;  // bytes mapped: the sum of its runs' sizes
  int runs = 0;       // segments (mapped runs) in it
  StreamUse* use = nullptr;  // its stream's bytes in use (never nullptr once created)
};

// A regular segment is one backend allocation of `size` bytes. An expandable segment
// is one mapped run [addr, addr + size) of a Reservation: it grows when granules next
// to it are mapped, splits in two when granules inside a free block are unmapped, and
// merges with the next run when the gap between them is mapped.
struct Segment {
  uintptr_t addr = 0;
  size_t size = 0;           // bytes backed by memory (the blocks tile exactly these)
  Stream stream;
  bool small_pool = false;
  // Made for a request of max_split_size or more. Only such segments' blocks are
  // "oversize": a standard 20 MiB segment that coalesces back to 20 MiB must stay
  // usable for small requests even when max_split_size is 20 MiB.
  bool oversize = false;
  Reservation* reservation = nullptr;  // expandable only: the range this run is in
  bool expandable() const { return reservation != nullptr; }
  Block* head = nullptr;     // the lowest block (never nullptr)
  Block* tail = nullptr;     // the highest block
  int busy_blocks = 0;       // allocated + pending blocks in this segment
  // The private pool (graph capture) this segment belongs to, or nullptr for the shared
  // pool. Its free blocks are in that pool's free sets (FreeIndex routes by this).
  PrivatePool* private_pool = nullptr;
  uint64_t last_used = 0;    // DevicePool::use_clock_ when it last became unused
};

// Key for lookups in the free sets: best fit is the first block >= (stream, size, 0).
struct BlockKey {
  Stream stream;
  size_t size;
  uintptr_t addr;
};

// Orders free blocks by (stream, size, address). Transparent so a BlockKey can look up.
struct BlockLess {
  using is_transparent = void;
  static BlockKey key(const Block* b) { return {b->stream, b->size, b->addr}; }
  static const BlockKey& key(const BlockKey& k) { return k; }
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    const BlockKey& ka = key(a);
    const BlockKey& kb = key(b);
    if (ka.stream.handle != kb.stream.handle) return ka.stream.handle < kb.stream.handle;
    if (ka.size != kb.size) return ka.size < kb.size;
    return ka.addr < kb.addr;
  }
};

// The size policy (kMinBlockSize, RoundSize, SegmentSizeFor, ...) is in
// allocator/pool_policy.h.

}  // namespace devmem::internal
