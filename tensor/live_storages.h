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
// Structure: 16 shards, each a mutex and an intrusive doubly-linked list threaded
// through the storages themselves (Storage::live_prev_/live_next_). A thread lists its
// storages in its own shard (assigned round-robin on its first listing), so threads
// that create tensors at once rarely share a lock, and the storage remembers the shard,
// so whichever thread drops the last reference unlinks it there.
//
// Cost: per storage allocation and free, one uncontended lock of the thread's shard and
// a constant-time link or unlink; no hashing, no allocation. Nothing per view or per
// handle copy. A snapshot pays instead: annotate() walks every listed storage once per
// device (the lists are not indexed by address), which is linear in the live tensors.
//
// Thread-safety: every method may be called from any thread. Each shard's mutex is a
// leaf lock; annotate() reads a storage only under its shard's lock, and ~Storage
// unlists under that lock before anything is freed, so the storage is alive while read.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/mutex.h"
#include "allocator/types.h"
#include "runtime/buffer_annotator.h"

namespace devmem {

class Storage;

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

 private:
  LiveStorages() = default;
  struct Shard {
    mutable Mutex mu;
    Storage* head ABSL_GUARDED_BY(mu) = nullptr;  // linked through Storage::live_*_
    size_t count ABSL_GUARDED_BY(mu) = 0;
  };
  static constexpr size_t kShards = 16;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace devmem
