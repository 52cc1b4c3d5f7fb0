// tensor/live_storages.h: the storages the tensor layer holds, by device and address,
// so that snapshots can say what a live buffer is.
//
// Storage::Allocate lists every storage that owns a block; ~Storage unlists it before
// the block is freed. LiveStorages is the runtime's BufferAnnotator
// (runtime/buffer_annotator.h): for each live buffer of a snapshot it reports the
// storage's reference count (the tensor handles sharing it) and the dtype and shape it
// was created with. Views are not enumerated: listing them would put bookkeeping on the
// view and copy paths, which devmem keeps free of it (slice_ns, tensor_copy_ns).
//
// Cost: one lock of one of 16 shards and a hash insert per storage allocation and
// free; nothing per view or per handle copy.
//
// Thread-safety: every method may be called from any thread. Each shard's mutex is a
// leaf lock; annotate() reads a storage only under its shard's lock, and ~Storage
// unlists under that lock before anything is freed, so the storage is alive while read.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "allocator/mutex.h"
#include "allocator/types.h"
#include "runtime/buffer_annotator.h"

namespace devmem {

class Storage;

class LiveStorages : public BufferAnnotator {
 public:
  // The process-wide registry; registers itself with the Runtime on first use.
  static LiveStorages& Get();

  void Add(const Storage* storage);
  void Remove(const Storage* storage);
  // Number of listed storages (for tests).
  size_t size() const;

  void annotate(DeviceId device, const std::vector<uintptr_t>& addrs,
                BufferAnnotations* out) const override;

 private:
  LiveStorages() = default;
  using Key = std::pair<DeviceId, uintptr_t>;
  struct Shard {
    mutable Mutex mu;
    absl::flat_hash_map<Key, const Storage*> storages ABSL_GUARDED_BY(mu);
  };
  static constexpr size_t kShards = 16;
  Shard& shard_for(const Key& key) const;
  mutable std::array<Shard, kShards> shards_;
};

}  // namespace devmem
