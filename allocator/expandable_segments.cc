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

namespace {

// How often expand() places a request again when other threads changed the
// reservation while the lock was released, before it gives up (the staged retry then
// goes on with its next stage).
constexpr int kMaxPlacements = 8;

}  // namespace

void ExpandableSegments::forget_driver_state() {
  deferred_.clear();
  deferred_bytes_ = 0;
  publish_deferred();
  for (auto& [key, r] : reservations_) delete r;
  reservations_.clear();
}

Grown ExpandableSegments::grow(const GrowRequest& req) {
  Reservation* r = reservation(req.stream, req.small, req.limit);
  if (r == nullptr) return Grown{nullptr, true};
  const Pin pin(pinned_, r);  // expand() releases the lock around recycles and maps
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
  // Ranges being mapped or unmapped (the lock released) are no gap: they split the gaps
  // they lie in, and no run borders them.
  std::vector<std::pair<uintptr_t, uintptr_t>> busy;
  for (const InFlight& f : in_flight_ranges_) {
    if (f.reservation == r) busy.emplace_back(f.at, f.at + f.bytes);
  }
  std::sort(busy.begin(), busy.end());
  auto consider_around_busy = [&](uintptr_t g0, uintptr_t g1, const Segment* lo,
                                  const Segment* hi) {
    for (const auto& [b0, b1] : busy) {
      if (b1 <= g0 || b0 >= g1) continue;
      consider(g0, b0, lo, nullptr);
      g0 = b1;
      lo = nullptr;
    }
    consider(g0, g1, lo, hi);
  };
  uintptr_t prev_end = r->addr;
  const Segment* prev = nullptr;
  const uintptr_t end = r->addr + r->va_size;
  for (auto it = table_.lower_bound(r->addr); it != table_.end() && it->first < end;
       ++it) {
    const Segment* s = it->second;
    consider_around_busy(prev_end, s->addr, prev, s);
    prev_end = s->addr + s->size;
    prev = s;
  }
  consider_around_busy(prev_end, end, prev, nullptr);
  return best;
}

std::pair<Block*, Block*> ExpandableSegments::free_neighbours(const Reservation* r,
                                                               uintptr_t at,
                                                               uintptr_t end) const {
  Block* lf = nullptr;
  if (auto it = table_.lower_bound(at); it != table_.begin()) {
    const Segment* s = std::prev(it)->second;
    if (s->reservation == r && s->addr + s->size == at &&
        s->tail->state == BlockState::kFree) {
      lf = s->tail;
    }
  }
  Block* rf = nullptr;
  if (auto it = table_.find(end); it != table_.end() && it->second->reservation == r &&
                                  it->second->head->state == BlockState::kFree) {
    rf = it->second->head;
  }
  return {lf, rf};
}

bool ExpandableSegments::overlaps_in_flight(const Reservation* r, uintptr_t at,
                                            size_t bytes) const {
  for (const InFlight& f : in_flight_ranges_) {
    if (f.reservation == r && f.at < at + bytes && at < f.at + f.bytes) return true;
  }
  return false;
}

void ExpandableSegments::end_in_flight(const Reservation* r, uintptr_t at) {
  for (size_t i = 0; i < in_flight_ranges_.size(); ++i) {
    if (in_flight_ranges_[i].reservation == r && in_flight_ranges_[i].at == at) {
      in_flight_ranges_[i] = in_flight_ranges_.back();
      in_flight_ranges_.pop_back();
      return;
    }
  }
}

bool ExpandableSegments::still_fits(const Reservation* r, const Placement& p,
                                    size_t size) const {
  const uintptr_t end = p.at + p.bytes;
  if (overlaps_in_flight(r, p.at, p.bytes)) return false;
  // Unmapped: no run overlaps it (runs of other reservations lie in other ranges).
  auto it = table_.lower_bound(p.at);
  if (it != table_.end() && it->first < end) return false;
  if (it != table_.begin()) {
    const Segment* below = std::prev(it)->second;
    if (below->addr + below->size > p.at) return false;
  }
  const auto [lf, rf] = free_neighbours(r, p.at, end);
  return (lf != nullptr ? lf->size : 0) + p.bytes + (rf != nullptr ? rf->size : 0) >= size;
}

Block* ExpandableSegments::expand(Reservation* r, const GrowRequest& req, bool* va_full) {
  const size_t size = req.size;
  const size_t limit = req.limit;
  Placement p = place(r, size);
  bool proactive_done = false;
  bool remapped = false;
  // Each recycle and each map below releases the lock (req.lock): afterwards the
  // placement is checked again (still_fits) and made again when another thread took
  // what it counted on. Single-threaded, `p` always still fits, so the decisions are
  // those of one pass: recycle for the limit, recycle proactively, map, (out of memory)
  // recycle and map once more.
  for (int placements = 0; placements < kMaxPlacements;) {
    if (p.bytes == 0) {
      *va_full = true;
      return nullptr;
    }
    if (p.bytes > limit) return nullptr;
    // The free blocks the mapping joins now: no recycle may take them.
    const auto [lf, rf] = free_neighbours(r, p.at, p.at + p.bytes);
    auto replace_if_stale = [&] {
      if (still_fits(r, p, size)) return false;
      p = place(r, size);
      ++placements;
      return true;
    };
    // How much to recycle before mapping: what the memory limit demands, and what
    // keeps the footprint within the threshold (never more than is about to be
    // mapped). The limit may take idle granules from any reservation; the threshold
    // only from this one: another stream's cache is likely to be wanted back by that
    // stream. Driver calls in flight (segment allocations, maps, unmaps and frees with
    // the lock released) count as reserved, and so does the backend's physical-handle
    // reserve (device memory still held); a map takes its granules from the reserve
    // first, so only the rest (`fresh`) is new memory, and each granule recycled
    // (unmapped into the reserve) is one fewer to create.
    auto held = [&] { return backend_.handle_reserve_bytes(); };
    auto fresh = [&] { return p.bytes > held() ? p.bytes - held() : 0; };
    auto committed_now = [&] { return reserved() + held() + in_flight_.bytes(); };
    if (committed_now() > limit - fresh()) {
      recycle_except(committed_now() + fresh() - limit, Scope{lf, rf}, req.lock);
      if (replace_if_stale()) continue;
      if (committed_now() > limit - fresh()) return nullptr;
    }
    // The recycle trigger is measured against the stream's high-water mark of bytes in
    // use, not the current value: a program between two peaks will need the memory
    // again, and unmapping it only to map it back is churn. Bytes already decided
    // (deferred) count as given back, so that waiting decisions are not taken twice.
    if (!proactive_done) {
      proactive_done = true;
      if (const size_t over = proactive_recycle_bytes(r, size, p.bytes); over > 0) {
        // The free neighbours again: the limit's recycle above may have released the
        // lock, and another thread may have freed, taken or merged the blocks around
        // the range meanwhile (`p` still fits, but lf/rf are what they were). With the
        // stale ones, the recycle could unmap the block the map now extends, which the
        // next placement would then map again.
        const auto [lf_now, rf_now] = free_neighbours(r, p.at, p.at + p.bytes);
        recycle_proactively(r, over, lf_now, rf_now, req.free_seq, req.lock);
        replace_if_stale();
        continue;  // the limit again: other threads may have grown meanwhile
      }
    }
    // The intent: [p.at, p.at + p.bytes) is being mapped, no other placement takes it,
    // and its bytes count against the limit until it is linked.
    void* at = reinterpret_cast<void*>(p.at);
    in_flight_ranges_.push_back(InFlight{r, p.at, p.bytes, InFlight::kMapping});
    in_flight_.begin_grow(p.bytes);
    absl::Status st;
    try {
      ScopedUnlock unlocked(req.lock);
      st = backend_.map(at, p.bytes);
    } catch (...) {
      end_in_flight(r, p.at);
      in_flight_.end_grow(p.bytes);
      throw;
    }
    end_in_flight(r, p.at);
    in_flight_.end_grow(p.bytes);
    if (absl::IsResourceExhausted(st) && !remapped) {
      // The device itself is full (other processes, or a sim capacity below the
      // fraction): idle granules of ours make room, and the map is tried once more.
      remapped = true;
      const auto [lf2, rf2] = free_neighbours(r, p.at, p.at + p.bytes);
      if (recycle_except(p.bytes, Scope{lf2, rf2}, req.lock) > 0) {
        replace_if_stale();
        continue;
      }
    }
    if (!st.ok()) {
      if (absl::IsResourceExhausted(st)) return nullptr;
      throw std::runtime_error(absl::StrFormat(
          "devmem: %s: mapping %u bytes at %p failed: %s", backend_.device().ToString(),
          p.bytes, at, st.ToString()));
    }
    // link_mapped allocates its Block and Segment before it changes anything: if that
    // throws, the mapping is undone and the pool is as it was.
    Block* b;
    try {
      b = link_mapped(r, p.at, p.bytes, req.now);
    } catch (...) {
      backend_.unmap(at, p.bytes);
      throw;
    }
    if (b->size >= size) return b;
    // A free neighbour the placement counted on was taken while the lock was released:
    // the new memory stays cached (free), and the request is placed again.
    free_.insert(b);
    p = place(r, size);
    ++placements;
  }
  return nullptr;
}

Block* ExpandableSegments::link_mapped(Reservation* r, uintptr_t at, size_t bytes,
                                       uint64_t now, bool undo) {
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
  if (undo) {
    acct_.unmap_undone(r->small_pool, bytes);
  } else {
    acct_.mapped(r, at, bytes);
  }
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

void ExpandableSegments::reserve_detached(size_t n) {
  in_flight_ranges_.reserve(in_flight_ranges_.size() + n);
}

void ExpandableSegments::detached(Segment* s) {
  // No allocation: reserve_detached made room in the same lock hold.
  Reservation* r = s->reservation;
  r->mapped -= s->size;
  --r->runs;
  in_flight_ranges_.push_back(InFlight{r, s->addr, s->size, InFlight::kUnmapping});
}

void ExpandableSegments::give_back_call(uintptr_t addr, size_t size) {
  backend_.unmap(reinterpret_cast<void*>(addr), size);
}

void ExpandableSegments::given_back(Segment* s, bool ok) {
  Reservation* r = s->reservation;
  end_in_flight(r, s->addr);
  if (!ok) {
    r->mapped += s->size;
    ++r->runs;
  }
}

void ExpandableSegments::restored(Segment* s) {
  // While the run was being unmapped (the lock released) another thread may have
  // mapped right next to it: its range was no gap then, so that map linked to nothing
  // on this side. Back in the table, the run joins such neighbours, as a map filling
  // the space between them would have (runs of a reservation are never adjacent).
  Reservation* r = s->reservation;
  if (auto it = table_.find(s->addr + s->size);
      it != table_.end() && it->second->reservation == r) {
    join_runs(s, it->second);
  }
  if (auto it = table_.lower_bound(s->addr); it != table_.begin()) {
    Segment* lo = std::prev(it)->second;
    if (lo->reservation == r && lo->addr + lo->size == s->addr) join_runs(lo, s);
  }
}

void ExpandableSegments::join_runs(Segment* lo, Segment* hi) {
  Reservation* r = lo->reservation;
  Block* a = lo->tail;
  Block* b = hi->head;
  // Free edge blocks leave their sets before any link changes and enter them again
  // after (the sets' split statistics depend on the links, as in link_mapped).
  const bool a_free = a->state == BlockState::kFree;
  const bool b_free = b->state == BlockState::kFree;
  const bool coalesce = a_free && b_free;
  if (a_free) free_.erase(a);
  if (b_free) free_.erase(b);
  a->next = b;
  b->prev = a;
  for (Block* x = b; x != nullptr; x = x->next) x->segment = lo;
  lo->tail = hi->tail;
  lo->size += hi->size;
  lo->busy_blocks += hi->busy_blocks;
  lo->last_used = std::max(lo->last_used, hi->last_used);
  table_.remove(hi);
  acct_.run_removed(r->small_pool);
  --r->runs;
  delete hi;
  if (coalesce) {
    a->size += b->size;
    a->free_seq = std::max(a->free_seq, b->free_seq);
    a->next = b->next;
    if (a->next != nullptr) {
      a->next->prev = a;
    } else {
      lo->tail = a;
    }
    free_.delete_block(b);
    free_.insert(a);
  } else if (a_free) {
    free_.insert(a);
  } else if (b_free) {
    free_.insert(b);
  }
}

bool ExpandableSegments::in_use(const Reservation* r) const {
  if (r->runs != 0) return true;
  for (const InFlight& f : in_flight_ranges_) {
    if (f.reservation == r) return true;
  }
  for (const Deferred& d : deferred_) {
    if (d.reservation == r) return true;
  }
  return std::find(pinned_.begin(), pinned_.end(), r) != pinned_.end();
}

void ExpandableSegments::release_address_space(Mutex* lock) {
  complete_deferred(/*wait=*/true, lock);  // no decision may outlive its reservation
  // Out of the table first, then the driver calls with the lock released: no one can
  // find these reservations any more (a request for the same (stream, pool) reserves a
  // new range).
  std::vector<Reservation*> empty;
  for (auto it = reservations_.begin(); it != reservations_.end();) {
    Reservation* r = it->second;
    if (in_use(r)) {
      ++it;
      continue;
    }
    empty.push_back(r);
    reservations_.erase(it++);
  }
  refused_.clear();
  if (empty.empty()) return;
  {
    ScopedUnlock unlocked(lock);
    // release_address reports failures on stderr and does not throw (backend.h).
    for (const Reservation* r : empty) {
      backend_.release_address(reinterpret_cast<void*>(r->addr), r->va_size);
    }
  }
  for (const Reservation* r : empty) delete r;
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
  // Ranges in flight: in a reservation of the table, on granule boundaries, over no run
  // and no other range in flight.
  for (size_t i = 0; i < in_flight_ranges_.size(); ++i) {
    const InFlight& f = in_flight_ranges_[i];
    const Reservation* r = f.reservation;
    auto it = reservations_.find(std::make_pair(r->stream.handle, r->small_pool));
    if (it == reservations_.end() || it->second != r || f.bytes == 0 ||
        f.at % granularity_ != 0 || f.bytes % granularity_ != 0 || f.at < r->addr ||
        f.bytes > r->va_size || f.at - r->addr > r->va_size - f.bytes) {
      return violation(absl::StrFormat(
          "%s of %u bytes at %#x in flight is not whole granules of a reservation in the "
          "table",
          f.kind == InFlight::kMapping ? "map" : "unmap", f.bytes, f.at));
    }
    for (size_t j = 0; j < i; ++j) {
      const InFlight& g = in_flight_ranges_[j];
      if (g.at < f.at + f.bytes && f.at < g.at + g.bytes) {
        return violation(absl::StrFormat("driver calls in flight at %#x and %#x overlap",
                                         g.at, f.at));
      }
    }
    if (auto seg = table_.lower_bound(f.at);
        (seg != table_.end() && seg->first < f.at + f.bytes) ||
        (seg != table_.begin() &&
         std::prev(seg)->second->addr + std::prev(seg)->second->size > f.at)) {
      return violation(absl::StrFormat(
          "%u bytes at %#x are in flight and mapped in a segment of the table", f.bytes,
          f.at));
    }
  }
  for (const Reservation* r : pinned_) {
    auto it = reservations_.find(std::make_pair(r->stream.handle, r->small_pool));
    if (it == reservations_.end() || it->second != r) {
      return violation(absl::StrFormat(
          "a call works in reservation %#x, which is not in the table", r->addr));
    }
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
