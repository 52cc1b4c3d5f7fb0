// allocator/snapshot_walk.cc: see snapshot_walk.h.
#include "allocator/snapshot_walk.h"

#include <algorithm>
#include <cstring>

#include "allocator/block.h"
#include "allocator/free_index.h"

namespace devmem::internal {
namespace {

// A Block's first line: it holds every field copied, and `next` (block.h).
inline void PrefetchBlock(const Block* b) { __builtin_prefetch(b); }

}  // namespace

// Entries may be spare Blocks, which an AddressSanitizer build poisons (FreeIndex): the
// one function that reads them (plan_chains, under the lock, where a spare's addr 0
// rules it out) is left uninstrumented.
#if defined(__SANITIZE_ADDRESS__)
#define DEVMEM_READS_SPARE_BLOCKS __attribute__((no_sanitize("address")))
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DEVMEM_READS_SPARE_BLOCKS __attribute__((no_sanitize("address")))
#endif
#endif
#ifndef DEVMEM_READS_SPARE_BLOCKS
#define DEVMEM_READS_SPARE_BLOCKS
#endif

namespace {
// Makes room for `n` elements in `v` (empty) and touches its pages now: resized, then
// emptied (the capacity, and the pages written, stay).
template <typename T>
void ReserveTouched(std::vector<T>& v, size_t n) {
  // Every element of the capacity is written, not only up to n: a kept vector that
  // grew under the lock (push_back past the room asked for) has a capacity tail that
  // nothing wrote, which the next snapshot would fault in under the lock. These
  // arrays are small (segments, chains), so writing them whole costs little, and it
  // leaves their lines in the caches for the walk.
  v.resize(std::max(n, v.capacity()));
  v.clear();
}
}  // namespace

SnapshotWalk::SnapshotWalk() {
  // Written under the lock (pick_entries): touched now.
  ReserveTouched(entries_, kMaxEntries);
  ReserveTouched(slabs_, 128);  // a pool of 10^6 Blocks has ~70 slabs (more: it grows)
}

void SnapshotWalk::reserve(size_t blocks, size_t segments) {
  // A kept copy array over 4x the room asked for is given back (the pool shrank).
  if (out_.size() > 4 * blocks) std::vector<Copied>().swap(out_);
  if (out_.size() < blocks) out_.resize(blocks);  // value-initialized: its pages touched now
  // Written again now, kept or not: the walk's stores then find these lines in the
  // caches instead of reading each from memory first under the lock.
  // (blocks == 0 after the shrink leaves data() null, which memset may not take.)
  if (blocks != 0) std::memset(static_cast<void*>(out_.data()), 0, blocks * sizeof(Copied));
  ReserveTouched(segments_, segments);
  ReserveTouched(chains_, segments + kMaxEntries);
  ReserveTouched(chain_blocks_, segments + kMaxEntries);
}

void SnapshotWalk::add_segment(const Segment* s) {
  if (s->head != nullptr) PrefetchBlock(s->head);
  segments_.push_back(s);
}

void SnapshotWalk::pick_entries(const FreeIndex& free) {
  slabs_.clear();
  const size_t made = free.blocks_made();
  if (made == 0) return;
  // Every step-th Block over the slabs in order, starting half a step in (rounded up:
  // at most kMaxEntries, and no longer gap at the end).
  const size_t step = (made + kMaxEntries - 1) / kMaxEntries;
  size_t at = step / 2;  // in the current slab
  for (size_t i = 0; i < free.slab_count(); ++i) {
    const Block* blocks = free.slab_blocks(i);
    const size_t n = free.slab_made(i);
    slabs_.push_back({blocks, n});
    for (; at < n && entries_.size() < kMaxEntries; at += step) add_entry(blocks + at);
    at -= std::min(at, n);  // carried into the next slab
  }
}

void SnapshotWalk::add_entry(const Block* b) {
  if (entries_.size() == kMaxEntries) return;
  entries_.push_back({0, b});
}

void SnapshotWalk::prefetch() const {
  // The Blocks' first lines (every field walk() copies, and `next`), one prefetch each:
  // those made since the first look are read from memory as before.
  for (const auto& [blocks, n] : slabs_) {
    for (size_t i = 0; i < n; ++i) PrefetchBlock(blocks + i);
  }
  for (const Entry& e : entries_) __builtin_prefetch(&e.block->segment);  // plan_chains
}

// Chains in segment order, each segment's by address: its head, then its entry points
// above the head (repeats dropped), each stopping where the next one starts.
DEVMEM_READS_SPARE_BLOCKS void SnapshotWalk::plan_chains() {
  for (Entry& e : entries_) e.addr = e.block->addr;
  std::sort(entries_.begin(), entries_.end(),
            [](const Entry& a, const Entry& b) { return a.addr < b.addr; });
  size_t e = 0;
  for (uint32_t i = 0; i < segments_.size(); ++i) {
    const Segment* s = segments_[i];
    if (s->head == nullptr) continue;  // no blocks (never so in a valid pool)
    // Below the segment, or its head (a spare's addr 0 is below every segment).
    while (e < entries_.size() && entries_[e].addr <= s->addr) ++e;
    chains_.push_back({s->head, nullptr, i});
    for (; e < entries_.size() && entries_[e].addr < s->addr + s->size; ++e) {
      const Entry& entry = entries_[e];
      if (entry.block->segment != s) continue;  // not one of its blocks
      if (e > 0 && entries_[e - 1].addr == entry.addr) continue;  // a repeat
      chains_.back().stop = entry.block;
      chains_.push_back({entry.block, nullptr, i});
    }
  }
  chain_blocks_.assign(chains_.size(), 0);
}

void SnapshotWalk::walk() {
  plan_chains();
  struct Cursor {
    const Block* b;
    const Block* stop;
    uint32_t chain;
    uint32_t blocks;  // copied so far
  };
  Cursor window[kWindow];
  size_t active = 0;
  size_t next = 0;  // the next chain to start
  const Chain* chains = chains_.data();
  const size_t nchains = chains_.size();
  uint32_t* chain_blocks = chain_blocks_.data();
  for (; active < kWindow && next < nchains; ++next) {
    window[active++] = {chains[next].start, chains[next].stop, static_cast<uint32_t>(next), 0};
  }
  // Locals, not members: the stores below must not make the compiler reload them.
  Copied* out = out_.data();
  size_t room = out_.size();
  size_t n = copied_;
  while (active > 0) {
    // One round: a block of each chain in the window, whose line was prefetched a
    // round ago; each loads its successor's address and prefetches it.
    for (size_t j = 0; j < active;) {
      Cursor& c = window[j];
      const Block* b = c.b;
      if (n == room) [[unlikely]] {  // more blocks than sized for: grow (correct, slower)
        out_.resize(room * 2 + 1024);
        out = out_.data();
        room = out_.size();
      }
      // Field by field into place (a record built aside and copied in is read back
      // across its own stores: a store-forwarding stall per block).
      Copied& o = out[n++];
      o.addr = b->addr;
      o.size = b->size;
      o.requested = b->requested;
      o.stream = b->stream.handle;
      o.alloc_time_ns = b->alloc_time_ns;
      o.site = b->site;
      o.chain = c.chain;
      o.state = static_cast<uint8_t>(b->state.load());
      ++c.blocks;
      const Block* nb = b->next;
      if (nb != nullptr && nb != c.stop) {
        PrefetchBlock(nb);
        c.b = nb;
        ++j;
        continue;
      }
      chain_blocks[c.chain] = c.blocks;  // this chain is done
      if (next < nchains) {  // the next one takes its place
        c = {chains[next].start, chains[next].stop, static_cast<uint32_t>(next), 0};
        PrefetchBlock(c.b);
        ++next;
        ++j;
      } else {  // none left to start: the last cursor moves here
        c = window[--active];
      }
    }
  }
  copied_ = n;
}

size_t SnapshotWalk::longest_chain() const {
  return chain_blocks_.empty() ? 0 : *std::max_element(chain_blocks_.begin(), chain_blocks_.end());
}

std::vector<std::vector<BlockInfo>> SnapshotWalk::take() {
  std::vector<std::vector<BlockInfo>> result(segments_.size());
  // Where each chain's blocks go in its segment's vector: after its segment's earlier
  // chains (chains are numbered in segment order, then address order).
  std::vector<size_t> at(chains_.size());
  std::vector<size_t> sizes(segments_.size(), 0);
  for (size_t c = 0; c < chains_.size(); ++c) {
    at[c] = sizes[chains_[c].segment];
    sizes[chains_[c].segment] += chain_blocks_[c];
  }
  for (size_t i = 0; i < result.size(); ++i) result[i].resize(sizes[i]);
  for (size_t i = 0; i < copied_; ++i) {
    const Copied& o = out_[i];
    BlockInfo& b = result[chains_[o.chain].segment][at[o.chain]++];
    b.addr = o.addr;
    b.size = o.size;
    b.requested = o.requested;
    b.state = static_cast<BlockState>(o.state);
    b.stream = Stream{o.stream};
    b.site = o.site;
    b.alloc_time_ns = o.alloc_time_ns;
  }
  // slabs_ grows by push_back under the lock (pick_entries) and no reserve() writes
  // it: written whole now, so a tail it grew has no unwritten pages for the next lock.
  ReserveTouched(slabs_, slabs_.capacity());
  segments_.clear();
  entries_.clear();
  chains_.clear();
  chain_blocks_.clear();
  copied_ = 0;  // out_ keeps its size: the next walk writes over it
  return result;
}

}  // namespace devmem::internal
