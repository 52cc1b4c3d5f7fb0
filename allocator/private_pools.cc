// allocator/private_pools.cc: see private_pools.h.
#include "allocator/private_pools.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"

namespace devmem::internal {

PrivatePool* PrivatePools::route(Stream stream) const {
  for (const Underway& u : underway_) {
    if (u.filter(stream)) return u.pool;
  }
  return nullptr;
}

absl::Status PrivatePools::begin(PoolId id, StreamFilter filter, const std::string& device) {
  if (id.is_default()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "devmem: begin_allocate_to_pool(%s) on %s: %s is the default pool's id, not a "
        "private pool's",
        id.ToString(), device, id.ToString()));
  }
  if (!filter) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "devmem: begin_allocate_to_pool(%s) on %s: no stream filter", id.ToString(),
        device));
  }
  auto it = pools_.find(id);
  if (it != pools_.end() && it->second->released) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "devmem: begin_allocate_to_pool(%s) on %s: the pool was released (release_pool) "
        "and still gives its memory back; use a new pool id",
        id.ToString(), device));
  }
  // What may throw first, so that a std::bad_alloc changes nothing.
  underway_.reserve(underway_.size() + 1);
  std::unique_ptr<PrivatePool> made;
  if (it == pools_.end()) made = std::make_unique<PrivatePool>(id);
  PrivatePool* p = made != nullptr ? made.get() : it->second.get();
  if (made != nullptr) pools_.emplace(id, std::move(made));
  ++p->use_count;
  underway_.push_back(Underway{id, std::move(filter), p});
  return absl::OkStatus();
}

absl::Status PrivatePools::end(PoolId id, const std::string& device) {
  // The latest begin of this pool (a pool shared by nested captures ends inside out).
  for (auto it = underway_.rbegin(); it != underway_.rend(); ++it) {
    if (it->id == id) {
      underway_.erase(std::next(it).base());
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "devmem: end_allocate_to_pool(%s) on %s: no allocation to pool %s is under way "
      "(begin_allocate_to_pool was not called for it, or it was ended already)",
      id.ToString(), device, id.ToString()));
}

absl::Status PrivatePools::release(PoolId id, const std::string& device, PrivatePool** pool) {
  auto it = pools_.find(id);
  if (it == pools_.end() || it->second->released) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "devmem: release_pool(%s) on %s: %s", id.ToString(), device,
        it == pools_.end() ? "no such private pool (begin_allocate_to_pool made none)"
                           : "the pool was released already"));
  }
  for (const Underway& u : underway_) {
    if (u.id == id) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "devmem: release_pool(%s) on %s: the pool is in use: allocations are still "
          "routed to it (call end_allocate_to_pool(%s) first)",
          id.ToString(), device, id.ToString()));
    }
  }
  PrivatePool* p = it->second.get();
  if (--p->use_count == 0) p->released = true;
  *pool = p;
  return absl::OkStatus();
}

void PrivatePools::remove_segment(PrivatePool* p, const Segment* s) {
  auto it = std::find(p->segments.begin(), p->segments.end(), s);
  if (it != p->segments.end()) p->segments.erase(it);
}

void PrivatePools::forget_if_empty(PrivatePool* p) {
  if (p->released && p->segments.empty() && p->releasing == 0 && p->growing == 0) {
    pools_.erase(p->id);
  }
}

absl::Status PrivatePools::validate(size_t private_segments) const {
  size_t listed = 0;
  for (const auto& [id, p] : pools_) {
    if (p->growing < 0) {
      return absl::InternalError(absl::StrFormat(
          "devmem validate(): private pool %s has %d grows under way", id.ToString(),
          p->growing));
    }
    if (p->releasing < 0 || (p->releasing > 0 && !p->released)) {
      return absl::InternalError(absl::StrFormat(
          "devmem validate(): private pool %s has %d releases under way but is %s",
          id.ToString(), p->releasing, p->released ? "released" : "live"));
    }
    if (p->released != (p->use_count == 0) || p->use_count < 0) {
      return absl::InternalError(absl::StrFormat(
          "devmem validate(): private pool %s has use count %d but is %s", id.ToString(),
          p->use_count, p->released ? "released" : "live"));
    }
    for (const Segment* s : p->segments) {
      if (s->private_pool != p.get()) {
        return absl::InternalError(absl::StrFormat(
            "devmem validate(): segment %#x is listed in private pool %s but belongs to "
            "%s",
            s->addr, id.ToString(),
            s->private_pool == nullptr ? "the shared pool" : s->private_pool->id.ToString()));
      }
    }
    listed += p->segments.size();
  }
  if (listed != private_segments) {
    return absl::InternalError(absl::StrFormat(
        "devmem validate(): private pools list %u segments, the segment table holds %u "
        "private ones",
        listed, private_segments));
  }
  for (const Underway& u : underway_) {
    auto it = pools_.find(u.id);
    if (it == pools_.end() || it->second.get() != u.pool || u.pool->released) {
      return absl::InternalError(absl::StrFormat(
          "devmem validate(): an allocation under way names private pool %s, which is "
          "not live",
          u.id.ToString()));
    }
  }
  return absl::OkStatus();
}

}  // namespace devmem::internal
