// tensor/live_storages.cc: the sharded intrusive lists of live storages (see the header).
#include "tensor/live_storages.h"

#include <atomic>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "runtime/runtime.h"
#include "tensor/storage.h"

namespace devmem {
namespace {

// The calling thread's shard: threads take shards round-robin on first use, so that
// up to kShards threads creating tensors at once each have a lock of their own.
uint32_t ThisThreadsShard(size_t shards) {
  static std::atomic<uint32_t> next{0};
  thread_local const uint32_t shard =
      next.fetch_add(1, std::memory_order_relaxed) % static_cast<uint32_t>(shards);
  return shard;
}

}  // namespace

LiveStorages& LiveStorages::Get() {
  // Never destroyed: storages in static objects may be freed during exit.
  static LiveStorages* const registry = [] {
    auto* r = new LiveStorages;
    Runtime::Get().set_buffer_annotator(r);
    return r;
  }();
  return *registry;
}

void LiveStorages::Add(Storage* s) {
  s->live_shard_ = ThisThreadsShard(kShards);
  Shard& shard = shards_[s->live_shard_];
  ShardLockHolder lock(&shard.mu);
  s->live_prev_ = nullptr;
  s->live_next_ = shard.head;
  if (shard.head != nullptr) shard.head->live_prev_ = s;
  shard.head = s;
  ++shard.count;
}

void LiveStorages::Remove(Storage* s) {
  Shard& shard = shards_[s->live_shard_];
  ShardLockHolder lock(&shard.mu);
  if (s->live_prev_ != nullptr) {
    s->live_prev_->live_next_ = s->live_next_;
  } else {
    shard.head = s->live_next_;
  }
  if (s->live_next_ != nullptr) s->live_next_->live_prev_ = s->live_prev_;
  s->live_prev_ = s->live_next_ = nullptr;
  --shard.count;
}

size_t LiveStorages::size() const {
  size_t n = 0;
  for (const Shard& shard : shards_) {
    ShardLockHolder lock(&shard.mu);
    n += shard.count;
  }
  return n;
}

void LiveStorages::annotate(DeviceId device, const std::vector<uintptr_t>& addrs,
                            BufferAnnotations* out) const {
  const absl::flat_hash_set<uintptr_t> wanted(addrs.begin(), addrs.end());
  for (const Shard& shard : shards_) {
    ShardLockHolder lock(&shard.mu);
    for (const Storage* s = shard.head; s != nullptr; s = s->live_next_) {
      const auto addr = reinterpret_cast<uintptr_t>(s->data());
      if (s->device() != device || !wanted.contains(addr)) continue;
      BufferAnnotation a;
      a.refcount = s->use_count();
      a.dtype = std::string(s->contents().dtype);
      a.shape.assign(s->contents().shape.begin(), s->contents().shape.end());
      (*out)[addr] = std::move(a);
    }
  }
}

}  // namespace devmem
