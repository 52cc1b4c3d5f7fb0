// allocator/free_index.h: the free blocks of one DevicePool: the two free sets, best
// fit, split and coalesce, and the spare Block objects (internal).
//
// Owns: the small and large free sets (btree sets ordered by (stream, size, address),
// so best fit on a stream is one lower_bound) and the recycled Block objects. It does
// not own segments or the blocks in them; it links and unlinks blocks inside a
// segment's list when it splits or coalesces, and reports every entry into and exit
// from a set to PoolAccounting (inactive_split), so the sets and that statistic cannot
// drift apart.
//
// Invariants (validate_free_block, validate_count): the sets hold exactly the free
// blocks of the pool's segments, each in its pool's set; no two adjacent blocks are
// both free (coalesce() merges them as a block becomes free); the per-pool summary
// (free bytes, largest free block) equals a recount over the sets.
//
// The summary is what metrics and OOM reports read instead of walking the blocks: the
// bytes are a sum kept on every insert and erase; the largest size is kept with the
// number of blocks that have it, and when the last of those leaves, it is marked stale
// and recomputed on the next read from each stream's largest block (the sets are
// ordered by stream, then size: O(streams x log n)). So the hot path pays a few
// integer operations, and a read never walks the blocks.
//
// The hot path (best fit, split, insert, erase, coalesce) is defined here so that it
// inlines into DevicePool::allocate and free as it did when it was part of DevicePool.
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/status/status.h"
#include "allocator/asan_poison.h"
#include "allocator/block.h"
#include "allocator/pool_accounting.h"
#include "allocator/pool_policy.h"
#include "allocator/private_pools.h"
#include "allocator/stats.h"

namespace devmem::internal {

class FreeIndex {
 public:
  using FreeSet = absl::btree_set<Block*, BlockLess>;

  explicit FreeIndex(PoolAccounting& acct) : acct_(acct) {}
  ~FreeIndex();
  FreeIndex(const FreeIndex&) = delete;
  FreeIndex& operator=(const FreeIndex&) = delete;

  const FreeSet& set(bool small) const { return small ? small_ : large_; }
  size_t size() const { return small_.size() + large_.size(); }

  // A free block (out of any set) enters / leaves its pool's set: a private pool's
  // (private_pools.h) for the blocks of its segments, which the summary leaves out.
  void insert(Block* b) {
    const bool small = b->segment->small_pool;
    if (PrivatePool* p = b->segment->private_pool) [[unlikely]] {
      p->free_set(small).insert(b);
      acct_.free_block_listed(b);
      return;
    }
    (small ? small_ : large_).insert(b);
    summary_[small].listed(b->size);
    acct_.free_block_listed(b);
  }
  void erase(Block* b) {
    const bool small = b->segment->small_pool;
    if (PrivatePool* p = b->segment->private_pool) [[unlikely]] {
      p->free_set(small).erase(b);
      acct_.free_block_unlisted(b);
      return;
    }
    (small ? small_ : large_).erase(b);
    summary_[small].unlisted(b->size);
    acct_.free_block_unlisted(b);
  }

  // The summary of a pool's free set: its blocks' bytes and the largest one's size
  // (0 when empty). O(1), or O(streams x log n) after the largest block left.
  int64_t free_bytes(bool small) const { return summary_[small].bytes; }
  size_t largest_free(bool small) const;
  // Fills stats->free_bytes, free_blocks and largest_free_block from the summary.
  void summarize(DeviceStats* stats) const;

  // Best fit: the smallest block on `stream` that is >= size and may serve it, taken
  // out of its set; nullptr when none. The oversize rule (OversizeBlockServes): blocks
  // of oversize segments are skipped rather than ending the search, so a larger
  // ordinary block (an expandable run's, say) still serves the request; there are few
  // oversize blocks, so the walk is short. Expandable segments are never oversize:
  // their blocks are split freely (no segment boundaries strand memory), which
  // max_split_size works around.
  Block* take_best_fit(size_t size, Stream stream, size_t max_split_size) {
    return take_best_fit_in(IsSmall(size) ? small_ : large_, size, stream, max_split_size);
  }
  // The same over a private pool's free sets.
  Block* take_best_fit_private(PrivatePool& pool, size_t size, Stream stream,
                               size_t max_split_size) {
    return take_best_fit_in(pool.free_set(IsSmall(size)), size, stream, max_split_size);
  }
  Block* take_best_fit_in(FreeSet& s, size_t size, Stream stream, size_t max_split_size) {
    for (auto it = s.lower_bound(BlockKey{stream, size, 0});
         it != s.end() && (*it)->stream == stream; ++it) {
      Block* b = *it;
      if (b->segment->oversize && !OversizeBlockServes(b->size, size, max_split_size)) {
        continue;
      }
      erase(b);
      return b;
    }
    return nullptr;
  }

  // Splits `b` (out of any set) so that it is exactly `size` when the split rule says
  // the remainder is worth keeping; the remainder goes to its free set.
  void split(Block* b, size_t size, size_t max_split_size) {
    if (!ShouldSplit(b->size, size, b->segment->small_pool, b->segment->expandable(),
                     max_split_size)) {
      return;
    }
    Block* rest = new_block();
    rest->addr = b->addr + size;
    rest->size = b->size - size;
    rest->segment = b->segment;
    rest->stream = b->stream;
    rest->state = BlockState::kFree;
    rest->prev = b;
    rest->next = b->next;
    if (b->next != nullptr) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    if (b->segment->tail == b) b->segment->tail = rest;
    insert(rest);
  }

  // `b` just became free (state kFree, out of any set): merges it with its free
  // neighbours (their Block objects become spares) and inserts the result.
  void coalesce(Block* b) {
    Segment* s = b->segment;
    if (Block* prev = b->prev; prev != nullptr && prev->state == BlockState::kFree) {
      erase(prev);
      b->addr = prev->addr;
      b->size += prev->size;
      b->prev = prev->prev;
      if (b->prev != nullptr) {
        b->prev->next = b;
      } else {
        s->head = b;
      }
      delete_block(prev);
    }
    if (Block* next = b->next; next != nullptr && next->state == BlockState::kFree) {
      erase(next);
      b->size += next->size;
      b->next = next->next;
      if (b->next != nullptr) b->next->prev = b;
      if (s->tail == next) s->tail = b;
      delete_block(next);
    }
    insert(b);
  }

  // Block objects: from the spares when there are any, else the next unused one of the
  // newest slab (a new slab when it is used up: may throw std::bad_alloc, changing
  // nothing). Every Block of a pool lives in its slabs until the pool is destroyed:
  // never `delete` one, give it back with delete_block(). Under ASan, spares and the
  // slabs' unmade room are poisoned (allocator/asan_poison.h): a stale Block* that reads
  // a deleted Block is reported as a use after free of a `new`ed one would be.
  Block* new_block() {
    if (!spares_.empty()) {
      Block* b = spares_.back();
      spares_.pop_back();
      UnpoisonForAsan(b, sizeof(Block));
      return b;
    }
    if (slabs_.empty() || slabs_.back().made == slabs_.back().capacity) add_slab();
    Slab& slab = slabs_.back();
    Block* b = &slab.blocks[slab.made++];
    UnpoisonForAsan(b, sizeof(Block));
    return new (b) Block;
  }
  // Resets `b` and keeps it as a spare. Never throws: callers delete blocks in the
  // middle of relinking; without memory to keep it, the Block stays unused in its slab
  // until the pool is destroyed.
  void delete_block(Block* b);
  // Makes sure one spare exists (may throw std::bad_alloc; changes nothing else), so
  // that a split on the allocation path needs no memory.
  void reserve_spare() {
    if (spares_.empty()) {
      spares_.reserve(spares_.size() + 1);  // may throw: nothing changed yet
      spares_.push_back(new_block());       // cannot throw now (room reserved)
      PoisonForAsan(spares_.back(), sizeof(Block));
    }
  }

  // The slabs, for the snapshot's copy (allocator/snapshot_walk.h): slab i's
  // constructed Blocks are slab_blocks(i)[0, slab_made(i)), spares (reset, in no list)
  // among them; blocks_made() is their sum. Read under the pool's mutex.
  size_t slab_count() const { return slabs_.size(); }
  const Block* slab_blocks(size_t i) const { return slabs_[i].blocks; }
  size_t slab_made(size_t i) const { return slabs_[i].made; }
  size_t blocks_made() const {
    size_t n = 0;
    for (const Slab& s : slabs_) n += s.made;
    return n;
  }

  // This part's share of validate(): `b`, a free block of a segment, is in its set
  // and has no recorded streams.
  absl::Status validate_free_block(const Block* b) const;
  // ... and the sets (with the `private_free` blocks of private pools' sets) hold no
  // more than the `free_blocks` free blocks the segments hold, and each pool's summary
  // equals a recount over its set.
  absl::Status validate_count(size_t free_blocks, size_t private_free = 0) const;

 private:
  friend class DevicePoolTestPeer;  // corrupts the summary to show validate() notices

  // One pool's summary (see the file comment). Mutable state of a const read: the
  // recomputation of a stale largest size, guarded like the rest by the pool's mutex.
  struct Summary {
    int64_t bytes = 0;
    size_t largest = 0;     // meaningful unless stale
    size_t at_largest = 0;  // blocks of that size
    bool stale = false;

    void listed(size_t size) {
      bytes += static_cast<int64_t>(size);
      if (stale) return;
      if (size > largest) {
        largest = size;
        at_largest = 1;
      } else if (size == largest) {
        ++at_largest;
      }
    }
    void unlisted(size_t size) {
      bytes -= static_cast<int64_t>(size);
      if (!stale && size == largest && --at_largest == 0) stale = true;
    }
  };
  // The largest size in `set` and how many blocks have it, from each stream's last block.
  static std::pair<size_t, size_t> LargestOf(const FreeSet& set);

  PoolAccounting& acct_;
  FreeSet small_;
  FreeSet large_;
  mutable std::array<Summary, 2> summary_{};  // [0] large, [1] small (indexed by `small`)
  std::vector<Block*> spares_;
  // Blocks are made in slabs, arrays of raw memory whose first `made` Blocks are
  // constructed, rather than one `new` each: glibc's aligned new put them 192 B apart (a
  // 128 B Block, 64 B aligned) among the heap's other objects, and the snapshot walk,
  // which reads one line of every Block under the device lock (allocator/snapshot_walk.h),
  // is bound by the memory and the pages it touches. The first slab holds
  // kFirstSlabBlocks (64 KiB), each next one twice its predecessor's up to 2 MiB: those
  // are aligned to 2 MiB and asked to be transparent huge pages (madvise, a hint), so a
  // pool of 10^5 Blocks has most of them on a few huge pages (12.8 MB, instead of 19.2
  // MB of 4 KiB pages), and a small pool costs no more than 64 KiB.
  struct Slab {
    Block* blocks = nullptr;  // room for `capacity` Blocks (std::free'd with the index)
    size_t capacity = 0;
    size_t made = 0;          // constructed so far: blocks[0, made)
  };
  static constexpr size_t kFirstSlabBlocks = 512;
  static constexpr size_t kHugeSlabBytes = size_t{2} << 20;
  void add_slab();  // may throw std::bad_alloc; changes nothing then
  std::vector<Slab> slabs_;
};

}  // namespace devmem::internal
