// allocator/device_pool_arena.cc: the pool's side of the arena hook (device_pool.h,
// allocator/arena_internal.h): the staged retry frees the arenas' retained chunks.
#include "allocator/arena_internal.h"
#include "allocator/device_pool.h"

namespace devmem::internal {

void DevicePool::set_arena_hook(ArenaPoolHook* hook) {
  MutexLock lock(&mu_);
  arena_hook_ = hook;
}

size_t DevicePool::take_back_arena_chunks() {
  if (arena_hook_ == nullptr) return 0;
  std::vector<uintptr_t> chunks;
  arena_hook_->take_back_retained(&chunks);
  for (const uintptr_t addr : chunks) {
    // Every chunk is an allocated block of the pool's table (Arenas::validate checks
    // it; chunks are larger than any thread cache takes); a retained one never has
    // other streams recorded (record_stream'd chunks are not retained), so it is free
    // at once.
    blocks_.free(addr);
  }
  return chunks.size();
}

}  // namespace devmem::internal
