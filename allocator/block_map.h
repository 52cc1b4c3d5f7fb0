// allocator/block_map.h: a lock-free map from a block's start address to its Block,
// for the blocks the thread caches own (internal; allocator/thread_cache.h).
//
// Why: a cache-hit free must find its Block without the device lock and without the
// pool's hash table (which the lock guards). This is tcmalloc's pagemap shape: a radix
// tree over the address, three levels of 2^13 entries under a 512-byte granule (the
// allocator's alignment), covering 48-bit addresses. Interior levels and leaves are
// allocated on first use and never freed before the map is (so a reader never follows
// a pointer into freed memory); a leaf is 64 KiB and covers 4 MiB of device addresses.
// Only blocks owned by the thread caches (small requests, small pool) have entries, so
// the host memory it takes is bounded by the small pool's footprint: at most 64 KiB
// per 4 MiB of small-pool address range touched.
//
// Thread-safety: set/clear are called with the device lock held (one writer at a
// time); find may be called from any thread without a lock and reads with acquire
// loads. A find racing with the set or clear of the same address sees either value
// (the caller validates what it finds, see DevicePool::free_front).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace devmem::internal {

struct Block;

class BlockMap {
 public:
  static constexpr int kGranuleBits = 9;  // 512 B: kMinBlockSize
  static constexpr int kLevelBits = 13;
  static constexpr int kAddressBits = kGranuleBits + 3 * kLevelBits;  // 48
  static constexpr size_t kFanout = size_t{1} << kLevelBits;

  BlockMap();
  ~BlockMap();
  BlockMap(const BlockMap&) = delete;
  BlockMap& operator=(const BlockMap&) = delete;

  // Whether `addr` can have an entry (below 2^48 and 512-byte aligned).
  static bool Mappable(uintptr_t addr) {
    return (addr >> kAddressBits) == 0 && (addr & ((uintptr_t{1} << kGranuleBits) - 1)) == 0;
  }

  // The Block starting at `addr`, or nullptr. Lock-free; any thread.
  Block* find(uintptr_t addr) const {
    if (!Mappable(addr)) return nullptr;
    const Mid* mid = root_[Index(addr, 2)].load(std::memory_order_acquire);
    if (mid == nullptr) return nullptr;
    const Leaf* leaf = mid->leaves[Index(addr, 1)].load(std::memory_order_acquire);
    if (leaf == nullptr) return nullptr;
    return leaf->blocks[Index(addr, 0)].load(std::memory_order_acquire);
  }

  // Enters `b` at `addr` (Mappable). Returns false, changing nothing, when memory for a
  // level cannot be had (never throws). Device lock held.
  bool set(uintptr_t addr, Block* b);
  // Removes the entry at `addr` (no-op without one). Device lock held.
  void clear(uintptr_t addr);
  // Entries present (device lock held): validate() compares it with a recount.
  size_t size() const { return size_; }

 private:
  struct Leaf {
    std::atomic<Block*> blocks[kFanout] = {};
  };
  struct Mid {
    std::atomic<Leaf*> leaves[kFanout] = {};
  };
  static size_t Index(uintptr_t addr, int level) {
    return (addr >> (kGranuleBits + level * kLevelBits)) & (kFanout - 1);
  }

  std::unique_ptr<std::atomic<Mid*>[]> root_;  // read by every find
  // Written by set/clear (under the device lock): on a line of its own, away from root_.
  alignas(64) size_t size_ = 0;
};

}  // namespace devmem::internal
