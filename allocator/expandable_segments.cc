// allocator/expandable_segments.cc: see expandable_segments.h.
#include "allocator/expandable_segments.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <string>
#include <stdexcept>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"

namespace devmem::internal {

ExpandableSegments::~ExpandableSegments() {
  for (const Deferred& d : deferred_) backend_.release_event(d.event);
  backend_.release_handle_reserve();  // what destroy() unmapped
  for (auto& [key, r] : reservations_) {
    backend_.release_address(reinterpret_cast<void*>(r->addr), r->va_size);
    delete r;
  }
}

Grown ExpandableSegments::grow(const GrowRequest& req) {
  Reservation* r = reservation(req.stream, req.small, req.limit);
  if (r == nullptr) return Grown{nullptr, true};
  bool va_full = false;
  Block* b = expand(r, req, &va_full);
  return Grown{b, b == nullptr && va_full};
}

Reservation* ExpandableSegments::reservation(Stream stream, bool small, size_t limit) {
  const auto key = std::make_pair(stream.handle, small);
  auto it = reservations_.find(key);
  if (it != reservations_.end()) return it->second;
  if (refused_.contains(key)) return nullptr;
  // Address space is cheap but not free. The large pool's range is twice the device:
  // recycling leaves unmapped gaps between live blocks, and new mappings must find
  // room beside them. The small pool (requests <= 1 MiB) gets a quarter of the device.
  // When a range is used up anyway, requests fall back to regular segments.
  const size_t total = std::min(device_total_, limit);
  const size_t va = ReservationSize(total, granularity_, small);
  absl::StatusOr<void*> p = backend_.reserve_address(va);
  if (!p.ok()) {
    refused_.insert(key);
    return nullptr;
  }
  auto* r = new Reservation;
  r->addr = reinterpret_cast<uintptr_t>(*p);
  r->va_size = va;
  r->stream = stream;
  r->small_pool = small;
  r->use = &streams_[stream.handle];
  reservations_.emplace(key, r);
  return r;
}

ExpandableSegments::Placement ExpandableSegments::place(const Reservation* r, size_t size) const {
  Placement best;
  auto offer = [&](uintptr_t at, size_t bytes, Block* left, Block* right) {
    if (bytes == 0) return;
    if (best.bytes == 0 || bytes < best.bytes || (bytes == best.bytes && at < best.at)) {
      best = Placement{at, bytes, left, right};
    }
  };
  // One unmapped gap [g0, g1) between the run `lo` (ending at g0, or none) and the run
  // `hi` (starting at g1, or none).
  auto consider = [&](uintptr_t g0, uintptr_t g1, const Segment* lo, const Segment* hi) {
    if (g1 <= g0) return;
    const size_t gap = g1 - g0;
    Block* lf = lo != nullptr && lo->tail->state == BlockState::kFree ? lo->tail : nullptr;
    Block* rf = hi != nullptr && hi->head->state == BlockState::kFree ? hi->head : nullptr;
    const size_t lb = lf != nullptr ? lf->size : 0;
    const size_t rb = rf != nullptr ? rf->size : 0;
    // Extend the free block below (or start fresh at the gap's bottom).
    if (lb < size) {
      const size_t need = round_to_granule(size - lb);
      if (need <= gap) offer(g0, need, lf, nullptr);
    }
    // Extend the free block above, mapping the top of the gap.
    if (rf != nullptr && rb < size) {
      const size_t need = round_to_granule(size - rb);
      if (need <= gap) offer(g1 - need, need, nullptr, rf);
    }
    // Fill the whole gap, joining both.
    if (lf != nullptr && rf != nullptr && lb + gap + rb >= size) offer(g0, gap, lf, rf);
  };
  uintptr_t prev_end = r->addr;
  const Segment* prev = nullptr;
  const uintptr_t end = r->addr + r->va_size;
  for (auto it = table_.lower_bound(r->addr); it != table_.end() && it->first < end;
       ++it) {
    const Segment* s = it->second;
    consider(prev_end, s->addr, prev, s);
    prev_end = s->addr + s->size;
    prev = s;
  }
  consider(prev_end, end, prev, nullptr);
  return best;
}

Block* ExpandableSegments::expand(Reservation* r, const GrowRequest& req, bool* va_full) {
  const size_t size = req.size;
  const Placement p = place(r, size);
  if (p.bytes == 0) {
    *va_full = true;
    return nullptr;
  }
  const size_t limit = req.limit;
  if (p.bytes > limit) return nullptr;
  // How much to recycle before mapping: what the memory limit demands, and what keeps
  // the footprint within the threshold (never more than is about to be mapped).
  // The limit may take idle granules from any reservation; the threshold only from
  // this one: another stream's cache is likely to be wanted back by that stream.
  // Regular segment allocations in flight count as reserved, and so does the
  // backend's physical-handle reserve (device memory still held); a map takes its
  // granules from the reserve first, so only the rest (`fresh`) is new memory, and
  // each granule recycled (unmapped into the reserve) is one fewer to create.
  auto held = [&] { return backend_.handle_reserve_bytes(); };
  auto fresh = [&] { return p.bytes > held() ? p.bytes - held() : 0; };
  auto committed_now = [&] { return reserved() + held() + req.reserved_in_flight; };
  if (committed_now() > limit - fresh()) {
    recycle_except(committed_now() + fresh() - limit, Scope{p.left, p.right});
    if (committed_now() > limit - fresh()) return nullptr;
  }
  // The recycle trigger is measured against the stream's high-water mark of bytes in
  // use, not the current value: a program between two peaks will need the memory
  // again, and unmapping it only to map it back is churn. Bytes already decided
  // (deferred) count as given back, so that waiting decisions are not taken twice.
  if (const size_t over = proactive_recycle_bytes(r, size, p.bytes); over > 0) {
    recycle_proactively(r, over, p, req.free_seq);
  }
  void* at = reinterpret_cast<void*>(p.at);
  absl::Status st = backend_.map(at, p.bytes);
  if (absl::IsResourceExhausted(st) && recycle_except(p.bytes, Scope{p.left, p.right}) > 0) {
    // The device itself is full (other processes, or a sim capacity below the
    // fraction): idle granules of ours make room.
    st = backend_.map(at, p.bytes);
  }
  if (!st.ok()) {
    if (absl::IsResourceExhausted(st)) return nullptr;
    throw std::runtime_error(absl::StrFormat("devmem: %s: mapping %u bytes at %p failed: %s",
                                             backend_.device().ToString(), p.bytes, at,
                                             st.ToString()));
  }
  // link_mapped allocates its Block and Segment before it changes anything: if that
  // throws, the mapping is undone and the pool is as it was.
  try {
    return link_mapped(r, p.at, p.bytes, req.now);
  } catch (...) {
    backend_.unmap(at, p.bytes);
    throw;
  }
}

Block* ExpandableSegments::link_mapped(Reservation* r, uintptr_t at, size_t bytes,
                                       uint64_t now) {
  const uintptr_t end = at + bytes;
  // The runs just below and just above the new range, if they touch it.
  Segment* lo = nullptr;
  if (auto it = table_.lower_bound(at); it != table_.begin()) {
    Segment* s = std::prev(it)->second;
    if (s->reservation == r && s->addr + s->size == at) lo = s;
  }
  Segment* hi = nullptr;
  if (auto it = table_.find(end); it != table_.end() && it->second->reservation == r) {
    hi = it->second;
  }
  // Everything that allocates first (see expand()); nothing below throws.
  std::unique_ptr<Segment> fresh =
      lo == nullptr && hi == nullptr ? std::make_unique<Segment>() : nullptr;
  Block* b = free_.new_block();
  r->mapped += bytes;
  acct_.mapped(r, at, bytes);
  // Free neighbours leave their set before any link changes (the set's split
  // statistics depend on the links).
  Block* lf = lo != nullptr && lo->tail->state == BlockState::kFree ? lo->tail : nullptr;
  Block* rf = hi != nullptr && hi->head->state == BlockState::kFree ? hi->head : nullptr;
  if (lf != nullptr) free_.erase(lf);
  if (rf != nullptr) free_.erase(rf);

  b->addr = at;
  b->size = bytes;
  b->stream = r->stream;
  b->state = BlockState::kFree;
  // Fresh memory was never used; joined with free neighbours, it is as recent as the
  // newest of them.
  b->free_seq = std::max(lf != nullptr ? lf->free_seq : 0, rf != nullptr ? rf->free_seq : 0);
  Segment* s;
  if (lo != nullptr) {
    s = lo;
    b->prev = lo->tail;
    lo->tail->next = b;
    s->tail = b;
    s->size += bytes;
    if (hi != nullptr) {  // the gap is filled: hi's blocks join lo
      b->next = hi->head;
      hi->head->prev = b;
      s->tail = hi->tail;
      s->size += hi->size;
      s->busy_blocks += hi->busy_blocks;
      for (Block* x = hi->head; x != nullptr; x = x->next) x->segment = s;
      table_.remove(hi);
      acct_.run_removed(r->small_pool);
      --r->runs;
      delete hi;
    }
  } else if (hi != nullptr) {
    s = hi;
    table_.rekey(s, at);
    s->size += bytes;
    b->next = hi->head;
    hi->head->prev = b;
    s->head = b;
  } else {
    s = fresh.release();
    s->addr = at;
    s->size = bytes;
    s->stream = r->stream;
    s->small_pool = r->small_pool;
    s->reservation = r;
    s->head = s->tail = b;
    s->last_used = now;
    table_.add(s);
    acct_.run_added(r->small_pool);
    ++r->runs;
  }
  b->segment = s;
  // Coalesce with the free neighbours (out of their sets already).
  if (lf != nullptr) {
    b->addr = lf->addr;
    b->size += lf->size;
    b->prev = lf->prev;
    if (b->prev != nullptr) {
      b->prev->next = b;
    } else {
      s->head = b;
    }
    free_.delete_block(lf);
  }
  if (rf != nullptr) {
    b->size += rf->size;
    b->next = rf->next;
    if (b->next != nullptr) b->next->prev = b;
    free_.delete_block(rf);
  }
  if (b->next == nullptr) s->tail = b;
  return b;
}

void ExpandableSegments::give_back(Segment* s) {
  backend_.unmap(reinterpret_cast<void*>(s->addr), s->size);
  s->reservation->mapped -= s->size;
  --s->reservation->runs;
}

void ExpandableSegments::release_address_space() {
  complete_deferred(/*wait=*/true);  // no decision may outlive its reservation
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    Reservation* r = it->second;
    if (r->runs != 0) {
      ++it;
      continue;
    }
    backend_.release_address(reinterpret_cast<void*>(r->addr), r->va_size);
    delete r;
    reservations_.erase(it++);
  }
  refused_.clear();
}

absl::Status ExpandableSegments::validate() const {
  auto violation = [](const std::string& what) {
    return absl::InternalError("devmem validate(): " + what);
  };
  // Per reservation: its runs and the bytes they map, recounted.
  absl::flat_hash_map<const Reservation*, std::pair<int, size_t>> runs;
  for (auto seg = table_.begin(); seg != table_.end(); ++seg) {
    const Segment* s = seg->second;
    if (!s->expandable()) continue;
    const Reservation* r = s->reservation;
    auto it = reservations_.find(std::make_pair(r->stream.handle, r->small_pool));
    if (it == reservations_.end() || it->second != r) {
      return violation(absl::StrFormat(
          "expandable segment %#x belongs to a reservation not in the table", s->addr));
    }
    if (s->stream != r->stream || s->small_pool != r->small_pool) {
      return violation(absl::StrFormat(
          "expandable segment %#x: stream or pool differs from its reservation", s->addr));
    }
    if (s->addr < r->addr || s->size > r->va_size || s->addr - r->addr > r->va_size - s->size) {
      return violation(absl::StrFormat(
          "expandable segment %#x (%u bytes) lies outside its reservation %#x (%u bytes)",
          s->addr, s->size, r->addr, r->va_size));
    }
    if (s->size == 0 || granularity_ == 0 || s->addr % granularity_ != 0 ||
        s->size % granularity_ != 0) {
      return violation(absl::StrFormat(
          "expandable segment %#x maps %u bytes, not whole granules of %u", s->addr,
          s->size, granularity_));
    }
    if (const auto next = std::next(seg); next != table_.end() &&
                                          next->second->reservation == r &&
                                          next->first == s->addr + s->size) {
      return violation(absl::StrFormat(
          "expandable segments %#x and %#x are adjacent but not merged", s->addr,
          next->first));
    }
    runs[r].first += 1;
    runs[r].second += s->size;
  }
  size_t deferred = 0;
  for (size_t i = 0; i < deferred_.size(); ++i) {
    const Deferred& d = deferred_[i];
    auto it = reservations_.find(
        std::make_pair(d.reservation->stream.handle, d.reservation->small_pool));
    if (it == reservations_.end() || it->second != d.reservation || d.bytes == 0) {
      return violation(absl::StrFormat(
          "deferred recycle of %u bytes names reservation %#x, not one in the table",
          d.bytes, d.reservation->addr));
    }
    for (size_t j = 0; j < i; ++j) {
      if (deferred_[j].reservation == d.reservation) {
        return violation(absl::StrFormat(
            "reservation %#x has two deferred recycles", d.reservation->addr));
      }
    }
    deferred += d.bytes;
  }
  if (deferred != deferred_bytes_) {
    return violation(absl::StrFormat("deferred recycles decide %u bytes, recorded %u",
                                     deferred, deferred_bytes_));
  }
  for (const auto& [key, r] : reservations_) {
    const auto [count, mapped] = runs[r];
    if (count != r->runs || mapped != r->mapped) {
      return violation(absl::StrFormat(
          "reservation %#x records %d runs mapping %u bytes; its segments are %d mapping %u",
          r->addr, r->runs, r->mapped, count, mapped));
    }
  }
  return validate_stream_use();
}

}  // namespace devmem::internal
