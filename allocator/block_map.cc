// allocator/block_map.cc: see block_map.h.
#include "allocator/block_map.h"

#include <new>

namespace devmem::internal {

BlockMap::BlockMap() : root_(new std::atomic<Mid*>[kFanout]) {
  for (size_t i = 0; i < kFanout; ++i) root_[i].store(nullptr, std::memory_order_relaxed);
}

BlockMap::~BlockMap() {
  for (size_t i = 0; i < kFanout; ++i) {
    Mid* mid = root_[i].load(std::memory_order_relaxed);
    if (mid == nullptr) continue;
    for (auto& leaf : mid->leaves) delete leaf.load(std::memory_order_relaxed);
    delete mid;
  }
}

bool BlockMap::set(uintptr_t addr, Block* b) {
  if (!Mappable(addr)) return false;
  std::atomic<Mid*>& mid_slot = root_[Index(addr, 2)];
  Mid* mid = mid_slot.load(std::memory_order_relaxed);
  if (mid == nullptr) {
    mid = new (std::nothrow) Mid;
    if (mid == nullptr) return false;
    // Release: a reader that sees the pointer sees the zeroed level.
    mid_slot.store(mid, std::memory_order_release);
  }
  std::atomic<Leaf*>& leaf_slot = mid->leaves[Index(addr, 1)];
  Leaf* leaf = leaf_slot.load(std::memory_order_relaxed);
  if (leaf == nullptr) {
    leaf = new (std::nothrow) Leaf;
    if (leaf == nullptr) return false;
    leaf_slot.store(leaf, std::memory_order_release);
  }
  std::atomic<Block*>& entry = leaf->blocks[Index(addr, 0)];
  if (entry.load(std::memory_order_relaxed) == nullptr) ++size_;
  entry.store(b, std::memory_order_release);
  return true;
}

void BlockMap::clear(uintptr_t addr) {
  if (!Mappable(addr)) return;
  Mid* mid = root_[Index(addr, 2)].load(std::memory_order_relaxed);
  if (mid == nullptr) return;
  Leaf* leaf = mid->leaves[Index(addr, 1)].load(std::memory_order_relaxed);
  if (leaf == nullptr) return;
  std::atomic<Block*>& entry = leaf->blocks[Index(addr, 0)];
  if (entry.load(std::memory_order_relaxed) != nullptr) --size_;
  entry.store(nullptr, std::memory_order_release);
}

}  // namespace devmem::internal
