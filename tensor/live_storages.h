// tensor/live_storages.h: the storages the tensor layer holds, so that snapshots can
// say what a live buffer is.
//
// Storage::Allocate lists every storage that owns a block; ~Storage unlists it before
// the block is freed. LiveStorages is the runtime's BufferAnnotator
// (runtime/buffer_annotator.h): for each live buffer of a snapshot it reports the
// storage's reference count (the tensor handles sharing it) and the dtype and shape it
// was created with. Views are not enumerated: listing them would put bookkeeping on the
// view and copy paths, which devmem keeps free of it (slice_ns, tensor_copy_ns).
//
// Structure: 16 shards, each a lock and an intrusive doubly-linked list threaded
// through the storages themselves (Storage::live_prev_/live_next_). A thread lists its
// storages in its own shard (assigned round-robin on its first listing), so threads
// that create tensors at once rarely share a lock, and the storage remembers the shard,
// so whichever thread drops the last reference unlinks it there.
//
// Cost: per storage allocation and free, one uncontended lock of the thread's shard and
// a constant-time link or unlink; no hashing, no allocation. Nothing per view or per
// handle copy. The shard lock is a spin lock (ShardLock): taken uncontended it is one
// atomic exchange and one release store, where a std::mutex costs about 50
// instructions in pthreads per lock and unlock (tensor_create_ns pays two pairs). A snapshot pays instead: annotate() walks every listed storage once per
// device (the lists are not indexed by address), which is linear in the live tensors.
//
// Thread-safety: every method may be called from any thread. Each shard's lock is a
// leaf lock; annotate() reads a storage only under its shard's lock, and ~Storage
// unlists under that lock before anything is freed, so the storage is alive while read.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "allocator/types.h"
#include "runtime/buffer_annotator.h"

namespace devmem {

class Storage;

// A shard's lock. Held for a link or unlink (a few stores) by creating and destroying
// threads, which rarely share a shard, and for a walk of the shard by annotate(), which
// is rare: a waiter yields rather than sleeps, so no futex and no pthread call on the
// uncontended path. Acquire on taking, release on giving back, as a mutex.
class ABSL_LOCKABLE ShardLock {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      while (locked_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() ABSL_UNLOCK_FUNCTION() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

// Holds a ShardLock for its scope.
class ABSL_SCOPED_LOCKABLE ShardLockHolder {
 public:
  explicit ShardLockHolder(ShardLock* lock) ABSL_EXCLUSIVE_LOCK_FUNCTION(lock) : lock_(lock) {
    lock_->lock();
  }
  ~ShardLockHolder() ABSL_UNLOCK_FUNCTION() { lock_->unlock(); }
  ShardLockHolder(const ShardLockHolder&) = delete;
  ShardLockHolder& operator=(const ShardLockHolder&) = delete;

 private:
  ShardLock* const lock_;
};

class LiveStorages : public BufferAnnotator {
 public:
  // The process-wide registry; registers itself with the Runtime on first use.
  static LiveStorages& Get();

  // Lists `storage` (not listed yet) in the calling thread's shard.
  void Add(Storage* storage);
  // Unlists a storage that Add listed, from any thread.
  void Remove(Storage* storage);
  // Number of listed storages (for tests).
  size_t size() const;

  void annotate(DeviceId device, const std::vector<uintptr_t>& addrs,
                BufferAnnotations* out) const override;

  // One shard, on a cache line of its own: a thread writes its shard's lock, head and
  // count on every tensor creation and destruction, and the shards are taken
  // round-robin, so two threads that start together get neighbouring shards; 24 bytes
  // apart they shared a line (creating tensors on two threads at once cost each
  // thread ~25% more). Public for the layout check (tests/hit_path_lines_test.cc).
  struct alignas(64) Shard {
    mutable ShardLock mu;
    Storage* head ABSL_GUARDED_BY(mu) = nullptr;  // linked through Storage::live_*_
    size_t count ABSL_GUARDED_BY(mu) = 0;
  };

 private:
  LiveStorages() = default;
  static constexpr size_t kShards = 16;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace devmem
