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
//   - each segment's head starts a chain, and so does each entry point: an allocated
//     block taken from the allocated table (a hash table, so its first slots are blocks
//     at random places in the lists; no walk is needed to find them);
//   - a chain runs along `next` until the segment ends or it reaches the start of the
//     next chain of its segment (compared by pointer: no extra load);
//   - each copied block is tagged with its chain; after the lock is released, take()
//     concatenates each segment's chains in address order.
// Entry points only speed the walk up: whichever blocks they are (none, the head
// itself, neighbours, repeats), every block of every segment is copied exactly once and
// in address order, as long as the lists are well formed (validate()'s invariants). An
// entry that is not a block of a segment added (its addr outside every segment, or its
// `segment` another) is ignored.
//
// Usage: construct (allocates and touches the arrays; no lock needed), then under the
// device lock add_segment() for each segment in address order, add_entry() for some
// allocated blocks, walk(); release the lock, then take(). Not thread-safe: one
// snapshot's own object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/snapshot.h"

namespace devmem::internal {

struct Block;
struct Segment;

class SnapshotWalk {
 public:
  // Chains walked at once (misses kept in flight): enough to cover a memory latency
  // with the copying of the others.
  static constexpr size_t kWindow = 64;
  // Entry points worth taking (beyond it, chains are short enough that the window,
  // not their number, bounds the walk).
  static constexpr size_t kMaxEntries = 512;

  // Room for `blocks` blocks and `segments` segments (growing under the lock past
  // them: correct, slower). Allocates and touches it now, before the lock.
  SnapshotWalk(size_t blocks, size_t segments);

  // Lock held. Segments in address order.
  void add_segment(const Segment* s);
  // Lock held. `b` starts at `addr` (an allocated block: DevicePool's allocated table).
  void add_entry(uintptr_t addr, const Block* b);
  // Lock held: copies every added segment's blocks.
  void walk();

  // After the lock: the blocks of each segment added, in that order, each in address
  // order. Leaves this object empty.
  std::vector<std::vector<BlockInfo>> take();

  size_t blocks() const { return copied_; }
  size_t chains() const { return chains_.size(); }

 private:
  struct Entry {
    uintptr_t addr;
    const Block* block;
  };
  struct Chain {
    const Block* start;
    const Block* stop;  // the next chain's start in the same segment, or nullptr
    uint32_t segment;
  };
  void plan_chains();

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
  // The copy, in walk order.
  std::vector<Copied> out_;
  size_t copied_ = 0;
};

}  // namespace devmem::internal
