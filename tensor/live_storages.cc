// tensor/live_storages.cc: the sharded registry of live storages (see the header).
#include "tensor/live_storages.h"

#include <mutex>
#include <string>

#include "absl/hash/hash.h"
#include "runtime/runtime.h"
#include "tensor/storage.h"

namespace devmem {

LiveStorages& LiveStorages::Get() {
  // Never destroyed: storages in static objects may be freed during exit.
  static LiveStorages* const registry = [] {
    auto* r = new LiveStorages;
    Runtime::Get().set_buffer_annotator(r);
    return r;
  }();
  return *registry;
}

LiveStorages::Shard& LiveStorages::shard_for(const Key& key) const {
  return shards_[absl::HashOf(key) % kShards];
}

void LiveStorages::Add(const Storage* s) {
  const Key key{s->device(), reinterpret_cast<uintptr_t>(s->data())};
  Shard& shard = shard_for(key);
  MutexLock lock(&shard.mu);
  shard.storages[key] = s;
}

void LiveStorages::Remove(const Storage* s) {
  const Key key{s->device(), reinterpret_cast<uintptr_t>(s->data())};
  Shard& shard = shard_for(key);
  MutexLock lock(&shard.mu);
  auto it = shard.storages.find(key);
  // The address may already belong to a newer storage only if this one was freed
  // first, which ~Storage's order rules out; check anyway rather than erase another.
  if (it != shard.storages.end() && it->second == s) shard.storages.erase(it);
}

size_t LiveStorages::size() const {
  size_t n = 0;
  for (const Shard& shard : shards_) {
    MutexLock lock(&shard.mu);
    n += shard.storages.size();
  }
  return n;
}

void LiveStorages::annotate(DeviceId device, const std::vector<uintptr_t>& addrs,
                            BufferAnnotations* out) const {
  for (uintptr_t addr : addrs) {
    const Key key{device, addr};
    const Shard& shard = shard_for(key);
    MutexLock lock(&shard.mu);
    auto it = shard.storages.find(key);
    if (it == shard.storages.end()) continue;
    const Storage* s = it->second;
    BufferAnnotation a;
    a.refcount = s->use_count();
    a.dtype = std::string(s->contents().dtype);
    a.shape.assign(s->contents().shape.begin(), s->contents().shape.end());
    (*out)[addr] = std::move(a);
  }
}

}  // namespace devmem
