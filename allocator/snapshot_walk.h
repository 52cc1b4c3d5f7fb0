// allocator/snapshot_walk.h: the copy of every segment's block list that a snapshot
// makes under the device lock (internal; DevicePool::snapshot_impl).
//
// Why a class of its own: that copy is what the lock is held for, and walking a linked
// list costs one dependent load per block. With the Blocks out of cache (10^5 live
// buffers: 13 MB of Blocks) each load is a miss, ~30-60 ns, so a plain walk of 10^5
// blocks held the lock ~3 ms (target <= 1 ms, scripts/bench_snapshot.sh). The lists
// are therefore cut into many chains, walked round-robin with the next block of each
// prefetched, so that up to kWindow misses are in flight instead of one:
//
//   - each segment's head starts a chain, and so does each entry point: a Block taken
//     from the pool's slabs (FreeIndex, allocator/free_index.h) at evenly spaced places,
//     chosen by pointer arithmetic without reading a Block, so at random places in the
//     lists, or evenly spaced along them where the Blocks were made in address order
//     (as a filling pool splits);
//   - a chain runs along `next` until the segment ends or it reaches the start of the
//     next chain of its segment (compared by pointer: no extra load);
//   - each copied block is tagged with its chain; after the lock is released, take()
//     concatenates each segment's chains in address order.
// Why evenly spaced: the window stays full only while chains remain to start; the last
// ones run with fewer misses in flight, each round a full memory latency, so the
// longest chains left at the end set the tail. Entries from the allocated table (a
// hash table's first slots: blocks at random list positions, gaps exponentially
// distributed) left chains of up to ~6x the mean, and the last ~14% of 10^5 blocks took
// ~20-30% of the walk; slab-spaced entries cut that tail to ~6% of the blocks and ~30
// us, and need no walk over the table's slots (~20 us for 512, under the lock).
// Entry points only speed the walk up: whichever Blocks they are (none, the head
// itself, neighbours, repeats, spares), every block of every segment is copied exactly
// once and in address order, as long as the lists are well formed (validate()'s
// invariants). An entry that is not a block of a segment added (a spare: addr 0, or its
// addr outside every segment, or its `segment` another) is ignored.
//
// Before the lock, every Block's first line is prefetched (prefetch()): the slabs are
// known from the first look, and a prefetch is a hint that reads nothing, so it needs
// no lock and cannot race. The walk then finds the lines in the caches (10^5 Blocks'
// first lines are 6.4 MB: the L3, mostly) instead of memory: the hold fell by ~10%
// (a walk whose lines are all cached, run twice in one hold, takes ~80% of a cold one:
// the rest is the walk's own instructions, ~4 ns per block). What changes between the
// prefetch and the hold is read again from memory, correct either way.
//
// Usage: under the device lock (a first brief look) pick_entries(); without it,
// reserve() (allocates and touches the arrays) and prefetch(); under the device
// lock add_segment() for each segment in address order, walk(); release the lock, then
// take(). Not thread-safe: one snapshot's object at a time.
//
// Reusable: take() leaves the object empty but keeps its arrays, their pages touched,
// and the pool keeps the object between snapshots (DevicePool::snapshot_impl), so a
// snapshot does not fault them in again. Why: at 10^5 blocks the copy's array is 5.6
// MB, and faulting it in (~1,460 pages) was most of ~2.3 ms of Runtime::snapshot's
// ~6.5 (no lock held, but the caller waits); reserve() still writes it (~0.3 ms) so the
// walk finds its lines in cache; the chains' arrays, reserved but first written under
// the lock, faulted ~6 pages there. reserve() shrinks a kept array over 4x the room asked
// for (a pool that held many more blocks once does not keep their copy's memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/snapshot.h"

namespace devmem::internal {

struct Block;
struct Segment;
class FreeIndex;

class SnapshotWalk {
 public:
  // Chains walked at once (misses kept in flight): enough to cover a memory latency
  // with the copying of the others. Measured (devmem-bench-snapshot, 10^5 blocks, the
  // lines prefetched): 32 held the lock ~0.60 ms (median), 64 ~0.44, 128 ~0.33-0.37,
  // 256 no less than 128.
  static constexpr size_t kWindow = 128;
  // Entry points worth taking (beyond it, chains are short enough that the window,
  // not their number, bounds the walk).
  static constexpr size_t kMaxEntries = 512;

  SnapshotWalk();
  // Room for `blocks` blocks and `segments` segments (growing under the lock past
  // them: correct, slower). Allocates and touches it now, before the lock (allocates
  // nothing if the arrays kept from an earlier snapshot are big enough and not over 4x
  // as big, but still writes them, so that the walk finds their lines in the caches).
  void reserve(size_t blocks, size_t segments);
  // The room reserve() left for blocks (the copy's array: kept by take()).
  size_t block_room() const { return out_.size(); }

  // Lock held. Segments in address order.
  void add_segment(const Segment* s);
  // Lock held: notes `free`'s slabs and takes up to kMaxEntries entry points, Blocks
  // evenly spaced over them (pointers only: nothing is read from a Block). A Block stays
  // in its slab until the pool is destroyed, so they may be used under a later hold of
  // the same lock (by then spares, or blocks of other segments: walk() checks).
  void pick_entries(const FreeIndex& free);
  // Entry `b`, a Block of the pool's slabs (any; walk() reads it under the lock).
  void add_entry(const Block* b);
  // No lock needed: asks for the lines walk() will read, every Block's first line of
  // the slabs noted and the entries' (a prefetch reads nothing: no data race, no fault),
  // so that the walk under the lock finds them in the caches, not in memory.
  void prefetch() const;
  // Lock held: copies every added segment's blocks.
  void walk();

  // After the lock: the blocks of each segment added, in that order, each in address
  // order. Leaves this object empty, its arrays kept for the next snapshot.
  std::vector<std::vector<BlockInfo>> take();

  size_t blocks() const { return copied_; }
  size_t chains() const { return chains_.size(); }
  // After walk(), before take(): the most blocks one chain copied.
  size_t longest_chain() const;

 private:
  struct Entry {
    uintptr_t addr;  // read under the lock by plan_chains()
    const Block* block;
  };
  struct Chain {
    const Block* start;
    const Block* stop;  // the next chain's start in the same segment, or nullptr
    uint32_t segment;
  };
  void plan_chains();

  // The slabs at the first look (their Blocks and how many were made), for prefetch().
  std::vector<std::pair<const Block*, size_t>> slabs_;
  std::vector<const Segment*> segments_;
  std::vector<Entry> entries_;
  std::vector<Chain> chains_;
  std::vector<uint32_t> chain_blocks_;  // blocks copied per chain
  // One block as copied under the lock: BlockInfo's fields and the block's chain, in
  // 56 bytes (a BlockInfo is 64): the walk is bound by memory traffic.
  struct Copied {
    uintptr_t addr;
    size_t size;
    size_t requested;
    uintptr_t stream;
    int64_t alloc_time_ns;
    SiteId site;
    // < 2^32: chains are segments + kMaxEntries at most, and 2^32 segments would take
    // hundreds of GB of host memory.
    uint32_t chain;
    uint8_t state;
  };
  // The copy, in walk order: out_[0, copied_). Its size is the room reserved (every
  // element written once, when it was made): the walk writes over it.
  std::vector<Copied> out_;
  size_t copied_ = 0;
};

}  // namespace devmem::internal
