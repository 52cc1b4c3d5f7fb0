// allocator/free_index.cc: see free_index.h.
#include "allocator/free_index.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <new>
#include <tuple>
#include <utility>

#include "absl/strings/str_format.h"

namespace devmem::internal {

// The slabs free every Block, spare or not (the pool's segments are gone by then).
FreeIndex::~FreeIndex() {
  for (Slab& slab : slabs_) {
    UnpoisonForAsan(slab.blocks, slab.capacity * sizeof(Block));  // spares and unmade room
    for (size_t i = 0; i < slab.made; ++i) slab.blocks[i].~Block();
    std::free(slab.blocks);
  }
}

void FreeIndex::add_slab() {
  static_assert(kHugeSlabBytes / sizeof(Block) >= 2 * kFirstSlabBlocks);
  constexpr size_t kHugeSlabBlocks = kHugeSlabBytes / sizeof(Block);
  const size_t blocks =
      slabs_.empty() ? kFirstSlabBlocks : std::min(2 * slabs_.back().capacity, kHugeSlabBlocks);
  const bool huge = blocks == kHugeSlabBlocks;
  // At least 128 B aligned: with a 128 B Block, no two Blocks share a 128 B pair of
  // lines, which the adjacent-line prefetcher fetches together (another thread's hit
  // writes would otherwise take a neighbour's line away). aligned_alloc wants a size that
  // is a multiple of the alignment: 512 * 2^k Blocks of a multiple of 64 B are.
  constexpr size_t kPair = 128;
  const size_t bytes = huge ? kHugeSlabBytes : blocks * sizeof(Block);
  slabs_.reserve(slabs_.size() + 1);  // may throw: nothing changed yet
  void* p = std::aligned_alloc(huge ? kHugeSlabBytes : std::max(alignof(Block), kPair), bytes);
  if (p == nullptr) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);  // a hint: without huge pages, 4 KiB ones
#endif
  PoisonForAsan(p, bytes);  // unmade room: new_block() unpoisons each Block it makes
  slabs_.push_back({static_cast<Block*>(p), blocks, 0});  // cannot throw (room reserved)
}

void FreeIndex::delete_block(Block* b) {
  // Field by field rather than `*b = Block{}`: GCC 12 warns (falsely) about the
  // moved-from temporary's InlinedVector storage.
  b->addr = 0;
  b->size = 0;
  b->requested = 0;
  b->segment = nullptr;
  b->prev = b->next = nullptr;
  b->stream = Stream{};
  b->state = BlockState::kFree;
  b->site = kUnknownSite;
  b->pending_events = 0;
  b->alloc_time_ns = 0;
  b->stream_uses.clear();
  b->events_deferred = false;
  b->retired_cache = false;
  try {
    spares_.push_back(b);
  } catch (...) {
    // Without room to list it, the Block stays unused in its slab (freed with it).
  }
  PoisonForAsan(b, sizeof(Block));  // until new_block() hands it out again
}

absl::Status FreeIndex::validate_free_block(const Block* b) const {
  const FreeSet& s = b->segment->private_pool != nullptr
                        ? b->segment->private_pool->free_set(b->segment->small_pool)
                        : set(b->segment->small_pool);
  auto it = s.find(b);
  if (it == s.end() || *it != b) {
    return absl::InternalError(absl::StrFormat(
        "devmem validate(): free block %#x is missing from its free set", b->addr));
  }
  if (!b->stream_uses.empty()) {
    return absl::InternalError(absl::StrFormat(
        "devmem validate(): free block %#x has %u recorded streams (they must be cleared "
        "when it is freed)",
        b->addr, b->stream_uses.size()));
  }
  return absl::OkStatus();
}

std::pair<size_t, size_t> FreeIndex::LargestOf(const FreeSet& set) {
  size_t largest = 0;
  size_t count = 0;
  for (auto it = set.begin(); it != set.end();) {
    const Stream stream = (*it)->stream;
    // The first block past this stream; the one before it is the stream's largest.
    const auto end = set.upper_bound(BlockKey{stream, SIZE_MAX, UINTPTR_MAX});
    const size_t size = (*std::prev(end))->size;
    if (size >= largest) {
      // The stream's blocks of that size are its last ones.
      const size_t n =
          static_cast<size_t>(std::distance(set.lower_bound(BlockKey{stream, size, 0}), end));
      count = size > largest ? n : count + n;
      largest = size;
    }
    it = end;
  }
  return {largest, count};
}

size_t FreeIndex::largest_free(bool small) const {
  Summary& s = summary_[small];
  if (s.stale) {
    std::tie(s.largest, s.at_largest) = LargestOf(set(small));
    s.stale = false;
  }
  return s.largest;
}

void FreeIndex::summarize(DeviceStats* stats) const {
  for (const bool small : {true, false}) {
    const int pool = small ? kSmallPool : kLargePool;
    stats->free_bytes[pool] = free_bytes(small);
    stats->free_blocks[pool] = static_cast<int64_t>(set(small).size());
    stats->largest_free_block[pool] = static_cast<int64_t>(largest_free(small));
  }
  stats->free_bytes[kAggregatePool] = stats->free_bytes[kSmallPool] + stats->free_bytes[kLargePool];
  stats->free_blocks[kAggregatePool] =
      stats->free_blocks[kSmallPool] + stats->free_blocks[kLargePool];
  stats->largest_free_block[kAggregatePool] =
      std::max(stats->largest_free_block[kSmallPool], stats->largest_free_block[kLargePool]);
}

absl::Status FreeIndex::validate_count(size_t free_blocks, size_t private_free) const {
  if (free_blocks != size() + private_free) {
    return absl::InternalError(absl::StrFormat(
        "devmem validate(): free sets hold %u blocks but segments hold %u free",
        size() + private_free, free_blocks));
  }
  for (const bool small : {true, false}) {
    const char* pool = small ? "small" : "large";
    int64_t bytes = 0;
    for (const Block* b : set(small)) bytes += static_cast<int64_t>(b->size);
    const Summary& s = summary_[small];
    if (s.bytes != bytes) {
      return absl::InternalError(absl::StrFormat(
          "devmem validate(): the %s free set's bytes counter is %d but its blocks hold %d",
          pool, s.bytes, bytes));
    }
    if (s.stale) continue;  // recomputed on the next read
    const auto [largest, count] = LargestOf(set(small));
    if (s.largest != largest || s.at_largest != count) {
      return absl::InternalError(absl::StrFormat(
          "devmem validate(): the %s free set's largest block is recorded as %u bytes "
          "(%u blocks) but is %u bytes (%u blocks)",
          pool, s.largest, s.at_largest, largest, count));
    }
  }
  return absl::OkStatus();
}

}  // namespace devmem::internal
