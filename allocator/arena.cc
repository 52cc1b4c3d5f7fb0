// allocator/arena.cc: scoped step arenas (allocator/arena.h, arena_internal.h).
#include "allocator/arena.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/arena_internal.h"
#include "allocator/caching_allocator.h"
#include "allocator/device_pool.h"
#include "allocator/errors.h"
#include "allocator/pool_policy.h"

namespace devmem {
namespace internal {

constinit thread_local ArenaFrame* t_arena_top = nullptr;

namespace {

constexpr size_t kSlot = ArenaChunk::kSlotBytes;
static_assert(kSlot == kMinBlockSize, "arena buffers keep the pool's alignment");

uint64_t SlotUnits(uint64_t slot) { return slot >> 32; }
SiteId SlotSite(uint64_t slot) { return static_cast<SiteId>(slot & 0xffffffffu); }
uint64_t LiveCount(uint64_t live) { return live >> kLiveCountShift; }
int64_t LiveBytes(uint64_t live) {
  return static_cast<int64_t>((live & kLiveUnitsMask) * kSlot);
}

std::string ThreadName(std::thread::id id) {
  std::ostringstream os;
  os << id;
  return os.str();
}

}  // namespace

// Closes the abandoned scopes a thread leaves behind when it exits (an ArenaScope
// destroyed on another thread, or out of order, whose inner scopes never closed).
struct ArenaThreadExit {
  ~ArenaThreadExit() {
    for (ArenaFrame* f = t_arena_top; f != nullptr; f = t_arena_top) {
      if (!f->abandoned.load(std::memory_order_acquire)) break;
      f->arenas->finish_close(f);
    }
  }
};

Arenas::Arenas(DevicePool* pool, DeviceId device)
    : pool_(pool),
      device_(device),
      names_(new Name[kMaxArenaNames + 1]),
      filter_begin_(new std::atomic<uintptr_t>[kFilterCapacity]),
      filter_end_(new std::atomic<uintptr_t>[kFilterCapacity]) {}

Arenas::~Arenas() {
  // Open scopes must have closed (the allocator outlives its scopes). Retained chunks
  // go back to the pool; chunks pinned by live buffers stay allocated in the pool,
  // which reports them as leaks when it is destroyed.
  release_retained();
  WriterLock lock(&table_mu_);
  for (ArenaChunk* c : table_) delete c;
  table_.clear();
}

int Arenas::intern_name_locked(std::string_view name) {
  for (size_t i = 0; i < name_count_; ++i) {
    if (names_[i].name == name) return static_cast<int>(i);
  }
  size_t i = name_count_;
  if (i == kMaxArenaNames) {
    // Bounded, for metrics labels: further names share "other".
    i = kMaxArenaNames;
    if (names_[i].name.empty()) {
      names_[i].name = "other";
      names_[i].site = InternNamedSite("<arena>", 0, "", SiteKind::kArena, "other");
      names_[i].totals.name = "other";
      std::fprintf(stderr,
                   "devmem: more than %zu arena names on %s: further names are counted "
                   "as \"other\" (first: \"%.*s\")\n",
                   kMaxArenaNames, device_.ToString().c_str(),
                   static_cast<int>(name.size()), name.data());
    }
    return static_cast<int>(i);
  }
  names_[i].name = std::string(name);
  names_[i].site = InternNamedSite("<arena>", 0, "", SiteKind::kArena, name);
  names_[i].totals.name = names_[i].name;
  ++name_count_;
  return static_cast<int>(i);
}

ArenaFrame* Arenas::open(std::string_view name, const ArenaOptions& options) {
  if (name.empty()) {
    throw InvalidArgumentError(
        absl::StrCat("devmem: ArenaScope on ", device_.ToString(), ": the name is empty"));
  }
  if (options.chunk_size % kSlot != 0 || options.chunk_size < kMinArenaChunkSize ||
      options.chunk_size > kMaxArenaChunkSize) {
    throw InvalidArgumentError(absl::StrFormat(
        "devmem: ArenaScope '%s' on %s: chunk_size %u must be a multiple of 512 in "
        "[64 KiB, 1 GiB]",
        name, device_.ToString(), options.chunk_size));
  }
  const double waste_fraction =
      options.max_waste_fraction.value_or(pool_->config().arena_max_waste);
  if (!(waste_fraction >= 0 && waste_fraction <= 1e6)) {  // NaN fails too
    throw InvalidArgumentError(absl::StrFormat(
        "devmem: ArenaScope '%s' on %s: max_waste_fraction %g must be a number in "
        "[0, 1e6] (0 = no waste bound)",
        name, device_.ToString(), waste_fraction));
  }
  static thread_local ArenaThreadExit exit_closer;
  (void)&exit_closer;
  pop_abandoned();
  // The name as every report spells it: cut, then made valid UTF-8 by the site table.
  const SiteId probe = InternNamedSite("<arena>", 0, "", SiteKind::kArena,
                                       name.substr(0, kMaxArenaNameBytes));
  const std::string clean = GetSite(probe).tag;
  auto frame = std::make_unique<ArenaFrame>();
  {
    MutexLock lock(&mu_);
    frame->name = intern_name_locked(clean);
    frame->site = names_[frame->name].site;
    ++names_[frame->name].totals.open_scopes;
  }
  frame->arenas = this;
  frame->owner = std::this_thread::get_id();
  frame->stream = options.stream;
  frame->chunk_size = options.chunk_size;
  frame->max_request = options.chunk_size / 4;
  frame->next_chunk = kMinArenaChunkSize;
  frame->waste_fraction = waste_fraction;
  frame->name_text = clean;
  frame->label = absl::StrCat("arena '", clean, "' on ", device_.ToString());
  frame->below = t_arena_top;
  t_arena_top = frame.get();
  emit(AllocAction::kArenaOpen, *frame, frame->chunk_size, 0);
  return frame.release();
}

void Arenas::pop_abandoned() {
  while (t_arena_top != nullptr && t_arena_top->abandoned.load(std::memory_order_acquire)) {
    ArenaFrame* f = t_arena_top;
    f->arenas->finish_close(f);
  }
}

ArenaScope::Summary Arenas::close(ArenaFrame* frame) {
  if (frame->owner != std::this_thread::get_id()) {
    throw InvalidArgumentError(absl::StrCat(
        "devmem: close of ", frame->label, " on thread ",
        ThreadName(std::this_thread::get_id()), ", but it was opened on thread ",
        ThreadName(frame->owner), ": a scope belongs to the thread that opened it"));
  }
  pop_abandoned();
  if (t_arena_top != frame) {
    throw InvalidArgumentError(absl::StrCat(
        "devmem: close of ", frame->label, " while ", t_arena_top->label,
        ", opened inside it on this thread, is still open: scopes close innermost "
        "first"));
  }
  ArenaScope::Summary s = finish_close(frame);
  pop_abandoned();
  return s;
}

void Arenas::close_or_abandon(ArenaFrame* frame) noexcept {
  const char* why = nullptr;
  if (frame->owner != std::this_thread::get_id()) {
    why = "destroyed on another thread than the one that opened it";
  } else {
    pop_abandoned();
    if (t_arena_top != frame) why = "destroyed while a scope opened inside it is open";
  }
  if (why == nullptr) {
    finish_close(frame);
    pop_abandoned();
    return;
  }
  std::fprintf(stderr,
               "devmem: %s was %s; it serves no more allocations and closes when the "
               "scopes opened inside it close (or its thread exits)\n",
               frame->label.c_str(), why);
  frame->abandoned.store(true, std::memory_order_release);
}

ArenaScope::Summary Arenas::finish_close(ArenaFrame* frame) {
  // Only the owning thread gets here, with `frame` at the top of its stack.
  t_arena_top = frame->below;
  fold_live(frame);  // from here on, frees of its buffers are not local
  std::vector<ArenaChunk*> give_back;
  ArenaScope::Summary& s = frame->summary;
  {
    MutexLock lock(&mu_);
    Name& n = names_[frame->name];
    for (ArenaChunk* c : frame->chunks) {
      c->state.store(ChunkState::kRetired, std::memory_order_relaxed);
      // Escapes are read before the scope's reference is dropped: past that, the last
      // free (on any thread) may dispose of the chunk.
      if (LiveCount(c->live_total()) > 1) {
        const size_t used_slots = c->used.load(std::memory_order_relaxed) / kSlot;
        for (size_t i = 0; i < used_slots; ++i) {
          const uint64_t slot = c->slots[i].load(std::memory_order_relaxed);
          if (slot == 0) continue;
          const int64_t bytes = static_cast<int64_t>(SlotUnits(slot) * kSlot);
          ArenaEscapeSite& e = n.escapes[SlotSite(slot)];
          e.site = SlotSite(slot);
          ++e.buffers;
          e.bytes += bytes;
          ++s.escaped_buffers;
          s.escaped_bytes += bytes;
        }
      }
      // Fold this thread's word into the shared one, dropping the scope's count: from
      // here on `live` alone is the figure, and frees on any thread decrement it.
      const uint64_t delta =
          c->owner_live.load(std::memory_order_relaxed) - LivePack(1, 0);
      c->owner_live.store(0, std::memory_order_relaxed);
      const uint64_t prev = c->live.fetch_add(delta, std::memory_order_acq_rel);
      if (prev + delta != 0) continue;  // escaped: the last free disposes of it
      held_bytes_.fetch_sub(static_cast<int64_t>(c->size), std::memory_order_relaxed);
      if (c->stream_used.load(std::memory_order_relaxed)) {
        unregister_locked(c);
        give_back.push_back(c);
      } else {
        c->state.store(ChunkState::kRetained, std::memory_order_relaxed);
        retained_.push_back(c);
      }
    }
    --n.totals.open_scopes;
    ++n.totals.scopes_closed;
    n.totals.allocations += s.allocations;
    n.totals.bytes_allocated += s.bytes;
    n.totals.escapes += s.escaped_buffers;
    n.totals.pool_chunk_allocs += s.pool_chunk_allocs;
    n.totals.chunk_reuses += s.chunks - s.pool_chunk_allocs;
    n.totals.spills += s.spills;
    n.totals.spill_bytes += s.spill_bytes;
    chunks_returned_ += static_cast<int64_t>(give_back.size());
  }
  emit(AllocAction::kArenaClose, *frame, static_cast<size_t>(s.bytes),
       static_cast<size_t>(s.escaped_bytes));
  for (ArenaChunk* c : give_back) {
    try {
      pool_->free(reinterpret_cast<void*>(c->begin));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "devmem: returning an arena chunk failed: %s\n", e.what());
    }
    delete c;
  }
  const ArenaScope::Summary result = s;
  delete frame;
  return result;
}

void* Arenas::allocate_slow(size_t bytes, Stream stream, SiteId site) {
  ArenaFrame* f = t_arena_top;
  while (f != nullptr &&
         (f->arenas != this || f->abandoned.load(std::memory_order_relaxed))) {
    f = f->below;
  }
  // The normal path: no scope of ours, another stream, nothing, or too large.
  if (f == nullptr || stream != f->stream || bytes == 0 || bytes > f->max_request) {
    return nullptr;
  }
  const size_t size = (bytes + kSlot - 1) & ~(kSlot - 1);
  ArenaChunk* c = f->current;
  size_t at = c != nullptr ? c->used.load(std::memory_order_relaxed) : 0;
  if (c == nullptr || at + size > c->size) {
    fold_live(f);
    if (f->waste_fraction > 0 && over_waste_bound(f, size)) {
      ++f->summary.spills;
      f->summary.spill_bytes += static_cast<int64_t>(size);
      return nullptr;  // the pool's path (arena.h, "Waste")
    }
    c = next_chunk(f, size);
    at = 0;
  }
  return bump(f, c, at, size, site);
}

void Arenas::fold_live(ArenaFrame* f) {
  const int64_t delta = unfolded_live(*f);
  if (delta == 0) return;
  live_bytes_.fetch_add(delta, std::memory_order_relaxed);
  f->folded += delta;
}

bool Arenas::over_waste_bound(const ArenaFrame* f, size_t size) const {
  // An empty chunk of the scope's own is reused by next_chunk at no cost in footprint
  // (the same condition as its step 1).
  for (const ArenaChunk* c : f->chunks) {
    if (c->size >= size && c->live_total() == LivePack(1, 0) &&
        !c->stream_used.load(std::memory_order_relaxed)) {
      return false;
    }
  }
  // Arena-wide: the scopes of one allocator (a step's, an inner layer's) pin chunks
  // in the same pool. Retained chunks are empty and serve the next chunk request, so
  // they are not waste (held_bytes_ leaves them out). The running figures, not a scan
  // of the chunk table: this thread's scopes add their unfolded shares (so a thread
  // alone sees the exact figure), other threads' open scopes count as of their last
  // chunk change, and other threads' frees race with this read; the figure is a
  // heuristic and only decides between two valid paths.
  int64_t held = held_bytes_.load(std::memory_order_relaxed);
  int64_t live = live_bytes_.load(std::memory_order_relaxed);
  for (const ArenaFrame* g = t_arena_top; g != nullptr; g = g->below) {
    if (g->arenas == this) live += unfolded_live(*g);
  }
  if (f->current != nullptr) {  // its unbumped tail is free space, not waste
    held -= static_cast<int64_t>(f->current->size -
                                 f->current->used.load(std::memory_order_relaxed));
  }
  const int64_t waste = held - live;
  const auto limit = std::max(static_cast<int64_t>(f->chunk_size),
                              static_cast<int64_t>(f->waste_fraction * static_cast<double>(live)));
  return waste > limit;
}

ArenaChunk* Arenas::next_chunk(ArenaFrame* f, size_t bytes) {
  // 1. One of the scope's own chunks whose buffers all died: only the scope's
  //    reference is left, so no other thread can touch it but to find its slots empty.
  //    The largest: which one costs nothing in footprint (the scope holds them all),
  //    and a scope whose chunks grew would otherwise go back to its first 64 KiB one
  //    and change chunks every few bumps (each change a slow allocation, and the
  //    frees of the window of buffers still live in the old chunk slow frees).
  size_t best = f->chunks.size();
  for (size_t i = 0; i < f->chunks.size(); ++i) {
    const ArenaChunk* c = f->chunks[i];
    if (c->size >= bytes && c->live_total() == LivePack(1, 0) &&
        !c->stream_used.load(std::memory_order_relaxed) &&
        (best == f->chunks.size() || c->size > f->chunks[best]->size)) {
      best = i;
    }
  }
  if (best != f->chunks.size()) {
    ArenaChunk* c = f->chunks[best];
    c->used.store(0, std::memory_order_relaxed);
    f->chunks.erase(f->chunks.begin() + static_cast<ptrdiff_t>(best));
    f->chunks.push_back(c);
    f->current = c;
    return c;
  }
  f->chunks.reserve(f->chunks.size() + 1);  // nothing below may be undone by a throw
  // The new chunk's size: the scope's chunks grow from 64 KiB, doubling up to
  // chunk_size, and hold at least four requests of this size. A scope's chunks exceed
  // what it bumped by at most about that much again (or 64 KiB), never a whole
  // chunk_size for a step that bumps a few KiB (arena.h, "Chunk size").
  size_t want = f->next_chunk;
  while (want < 4 * bytes && want < f->chunk_size) want *= 2;
  want = std::min(want, f->chunk_size);
  f->next_chunk = std::min(f->chunk_size, 2 * want);
  // 2. A retained chunk (from an earlier scope): the smallest that holds `want`.
  {
    MutexLock lock(&mu_);
    size_t best = retained_.size();
    for (size_t i = 0; i < retained_.size(); ++i) {
      const ArenaChunk* c = retained_[i];
      if (c->size < want || c->stream != f->stream) continue;
      if (best == retained_.size() || c->size < retained_[best]->size) best = i;
    }
    if (best != retained_.size()) {
      ArenaChunk* c = retained_[best];
      retained_.erase(retained_.begin() + static_cast<ptrdiff_t>(best));
      c->name.store(f->name, std::memory_order_relaxed);
      c->used.store(0, std::memory_order_relaxed);
      c->live.store(LivePack(1, 0), std::memory_order_relaxed);
      c->owner_live.store(0, std::memory_order_relaxed);
      c->state.store(ChunkState::kHeld, std::memory_order_relaxed);
      held_bytes_.fetch_add(static_cast<int64_t>(c->size), std::memory_order_relaxed);
      f->chunks.push_back(c);
      f->current = c;
      ++f->summary.chunks;
      return c;
    }
  }
  // 3. A new block from the pool (its OutOfMemoryError propagates: the report names
  //    the arena's site).
  void* p = pool_->allocate(want, f->stream, f->site);
  ArenaChunk* c;
  try {
    auto chunk = std::make_unique<ArenaChunk>();
    chunk->begin = reinterpret_cast<uintptr_t>(p);
    chunk->size = want;
    chunk->stream = f->stream;
    chunk->name.store(f->name, std::memory_order_relaxed);
    chunk->slots = std::make_unique<std::atomic<uint64_t>[]>(want / kSlot);
    chunk->live.store(LivePack(1, 0), std::memory_order_relaxed);
    MutexLock lock(&mu_);
    WriterLock table(&table_mu_);
    auto at = std::upper_bound(
        table_.begin(), table_.end(), chunk->begin,
        [](uintptr_t a, const ArenaChunk* x) { return a < x->begin; });
    table_.insert(at, chunk.get());
    chunk_count_.store(table_.size(), std::memory_order_release);
    publish_filter_locked();
    held_bytes_.fetch_add(static_cast<int64_t>(want), std::memory_order_relaxed);
    c = chunk.release();
  } catch (...) {
    pool_->free(p);
    throw;
  }
  f->chunks.push_back(c);
  f->current = c;
  ++f->summary.chunks;
  ++f->summary.pool_chunk_allocs;
  return c;
}

ArenaChunk* Arenas::lookup_locked(uintptr_t addr) const {
  auto it = std::upper_bound(table_.begin(), table_.end(), addr,
                             [](uintptr_t a, const ArenaChunk* x) { return a < x->begin; });
  if (it == table_.begin()) return nullptr;
  ArenaChunk* c = *(it - 1);
  return c->contains(addr) ? c : nullptr;
}

bool Arenas::release_buffer(ArenaChunk* c, uintptr_t addr, const void* ptr) {
  const uintptr_t off = addr - c->begin;
  const uint64_t slot = off % kSlot == 0
                            ? c->slots[off / kSlot].exchange(0, std::memory_order_acq_rel)
                            : 0;
  if (slot == 0) throw_not_a_buffer(c, addr, ptr);
  live_bytes_.fetch_sub(static_cast<int64_t>(SlotUnits(slot) * kSlot), std::memory_order_relaxed);
  const uint64_t drop = LivePack(1, SlotUnits(slot));
  return c->live.fetch_sub(drop, std::memory_order_acq_rel) == drop;
}

void Arenas::throw_not_a_buffer(const ArenaChunk* c, uintptr_t addr, const void* ptr) const {
  throw InvalidArgumentError(absl::StrFormat(
      "devmem: free(%p) on %s: no live buffer of arena '%s' starts there (it lies %u "
      "bytes into the chunk at 0x%x): freed twice, or an interior pointer",
      ptr, device_.ToString(), names_[c->name.load(std::memory_order_relaxed)].name,
      addr - c->begin, c->begin));
}

bool Arenas::free_slow(void* ptr) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  // The chunks this thread's open scopes hold first, newest first (a buffer is most
  // often freed soon after it was bumped): they cannot go away, no lock is needed to
  // find them, and the free is a local one (owner_release). A buffer of the chunk
  // before the current one (a window of live temporaries across a chunk change) is
  // the common case.
  for (ArenaFrame* f = t_arena_top; f != nullptr; f = f->below) {
    if (f->arenas != this) continue;
    const size_t n = f->chunks.size();
    for (size_t i = n; i > 0 && i + kLocalFreeChunks > n; --i) {
      ArenaChunk* c = f->chunks[i - 1];
      if (!c->contains(addr)) continue;
      if (!owner_release(f, c, addr)) throw_not_a_buffer(c, addr, ptr);
      return true;  // never the last reference: the scope holds the chunk
    }
  }
  if (!maybe_in_chunk(addr)) return false;
  ArenaChunk* c;
  bool empty;
  {
    ReaderLock lock(&table_mu_);
    table_lookups_.fetch_add(1, std::memory_order_relaxed);
    c = lookup_locked(addr);
    if (c == nullptr) return false;
    empty = release_buffer(c, addr, ptr);
  }
  // The last buffer of a retired chunk: this thread alone owns its disposal.
  if (empty) dispose(c);
  return true;
}

void Arenas::dispose(ArenaChunk* c) {
  bool give_back = false;
  {
    MutexLock lock(&mu_);
    held_bytes_.fetch_sub(static_cast<int64_t>(c->size), std::memory_order_relaxed);
    if (c->stream_used.load(std::memory_order_relaxed)) {
      unregister_locked(c);
      ++chunks_returned_;
      give_back = true;
    } else {
      c->state.store(ChunkState::kRetained, std::memory_order_relaxed);
      retained_.push_back(c);
    }
  }
  if (give_back) {
    pool_->free(reinterpret_cast<void*>(c->begin));
    delete c;
  }
}

void Arenas::unregister_locked(ArenaChunk* c) {
  WriterLock table(&table_mu_);
  auto it = std::find(table_.begin(), table_.end(), c);
  if (it != table_.end()) table_.erase(it);
  chunk_count_.store(table_.size(), std::memory_order_release);
  publish_filter_locked();
}

void Arenas::publish_filter_locked() {
  // The seqlock's writer side (one writer: table_mu_ is held exclusively), without
  // fences (ThreadSanitizer does not model atomic_thread_fence): every entry is stored
  // with release, so a reader whose acquire load sees a new entry also sees the odd
  // sequence stored before it, and its recheck fails; the release store of the even
  // sequence orders the entries before it. On x86 a release store is a plain store.
  const uint64_t seq = filter_seq_.load(std::memory_order_relaxed);
  filter_seq_.store(seq + 1, std::memory_order_relaxed);
  if (table_.size() > kFilterCapacity) {
    filter_size_.store(kFilterOverflow, std::memory_order_release);
  } else {
    for (size_t i = 0; i < table_.size(); ++i) {
      filter_begin_[i].store(table_[i]->begin, std::memory_order_release);
      filter_end_[i].store(table_[i]->begin + table_[i]->size, std::memory_order_release);
    }
    filter_size_.store(table_.size(), std::memory_order_release);
  }
  filter_seq_.store(seq + 2, std::memory_order_release);
}

bool Arenas::maybe_in_chunk(uintptr_t addr) const {
  // A chunk a free could target was published before the buffer was handed out (the
  // bump follows the chunk's registration on the owning thread, and the freeing
  // thread got the pointer after that), and is unpublished only once it is empty: a
  // stable read that finds no range is a certain "no".
  // The reader side: the entries are loaded with acquire (plain loads on x86, as the
  // acquire fence this replaces was), which keeps the recheck of the sequence after
  // them and makes it see the writer's odd store if any entry read is a new one.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const uint64_t seq = filter_seq_.load(std::memory_order_acquire);
    if (seq % 2 != 0) continue;
    const size_t n = filter_size_.load(std::memory_order_acquire);
    if (n > kFilterCapacity) return true;
    size_t lo = 0, hi = n;  // the first range that begins after addr
    while (lo < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      if (filter_begin_[mid].load(std::memory_order_acquire) <= addr) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    const bool inside = lo > 0 && addr < filter_end_[lo - 1].load(std::memory_order_acquire);
    if (filter_seq_.load(std::memory_order_relaxed) == seq) return inside;
  }
  return true;  // a writer kept publishing: ask the table
}

bool Arenas::record_stream(void* ptr, Stream stream) {
  if (chunk_count_.load(std::memory_order_acquire) == 0) return false;
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  if (!maybe_in_chunk(addr)) return false;
  uintptr_t chunk_begin;
  Stream chunk_stream;
  {
    ReaderLock lock(&table_mu_);
    table_lookups_.fetch_add(1, std::memory_order_relaxed);
    ArenaChunk* c = lookup_locked(addr);
    if (c == nullptr) return false;
    const uintptr_t off = addr - c->begin;
    if (off % kSlot != 0 || c->slots[off / kSlot].load(std::memory_order_acquire) == 0) {
      throw InvalidArgumentError(absl::StrFormat(
          "devmem: record_stream(%p) on %s: no live buffer of arena '%s' starts there",
          ptr, device_.ToString(), names_[c->name.load(std::memory_order_relaxed)].name));
    }
    chunk_begin = c->begin;
    chunk_stream = c->stream;
    if (stream != chunk_stream) c->stream_used.store(true, std::memory_order_relaxed);
  }
  // The buffer is live (the caller holds it), so its chunk stays allocated here.
  if (stream != chunk_stream) pool_->record_stream(reinterpret_cast<void*>(chunk_begin), stream);
  return true;
}

std::optional<BlockInfo> Arenas::find(const void* ptr) const {
  if (chunk_count_.load(std::memory_order_acquire) == 0) return std::nullopt;
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  if (!maybe_in_chunk(addr)) return std::nullopt;
  ReaderLock lock(&table_mu_);
  table_lookups_.fetch_add(1, std::memory_order_relaxed);
  const ArenaChunk* c = lookup_locked(addr);
  if (c == nullptr) return std::nullopt;
  const uintptr_t off = addr - c->begin;
  const uint64_t slot =
      off % kSlot == 0 ? c->slots[off / kSlot].load(std::memory_order_acquire) : 0;
  if (slot == 0) return std::nullopt;
  BlockInfo b;
  b.addr = addr;
  b.size = SlotUnits(slot) * kSlot;
  b.requested = b.size;
  b.state = BlockState::kAllocated;
  b.stream = c->stream;
  b.site = SlotSite(slot);
  return b;
}

void Arenas::release_retained() {
  std::vector<ArenaChunk*> chunks;
  {
    MutexLock lock(&mu_);
    chunks.swap(retained_);
    for (ArenaChunk* c : chunks) unregister_locked(c);
    chunks_returned_ += static_cast<int64_t>(chunks.size());
  }
  for (ArenaChunk* c : chunks) {
    pool_->free(reinterpret_cast<void*>(c->begin));
    delete c;
  }
}

void Arenas::take_back_retained(std::vector<uintptr_t>* out) {
  MutexLock lock(&mu_);
  for (ArenaChunk* c : retained_) {
    unregister_locked(c);
    out->push_back(c->begin);
    delete c;
  }
  chunks_returned_ += static_cast<int64_t>(retained_.size());
  retained_.clear();
}

ArenaReport Arenas::report() const {
  ArenaReport r;
  MutexLock lock(&mu_);
  const size_t n = name_count_ + (names_[kMaxArenaNames].name.empty() ? 0 : 1);
  std::vector<int> index(kMaxArenaNames + 1, -1);
  for (size_t i = 0; i <= kMaxArenaNames; ++i) {
    if (names_[i].name.empty()) continue;
    index[i] = static_cast<int>(r.arenas.size());
    ArenaStats s = names_[i].totals;
    for (const auto& [site, e] : names_[i].escapes) s.escape_sites.push_back(e);
    std::sort(s.escape_sites.begin(), s.escape_sites.end(),
              [](const ArenaEscapeSite& a, const ArenaEscapeSite& b) {
                return a.bytes != b.bytes ? a.bytes > b.bytes : a.site < b.site;
              });
    r.arenas.push_back(std::move(s));
  }
  (void)n;
  ReaderLock table(&table_mu_);
  for (const ArenaChunk* c : table_) {
    ++r.chunks;
    r.chunk_bytes += static_cast<int64_t>(c->size);
    const ChunkState state = c->state.load(std::memory_order_relaxed);
    if (state == ChunkState::kRetained) {
      ++r.retained_chunks;
      r.retained_bytes += static_cast<int64_t>(c->size);
      continue;
    }
    const uint64_t live = c->live_total();
    const int64_t buffers =
        static_cast<int64_t>(LiveCount(live)) - (state == ChunkState::kHeld ? 1 : 0);
    ArenaStats& s = r.arenas[static_cast<size_t>(index[static_cast<size_t>(
        c->name.load(std::memory_order_relaxed))])];
    s.live_bytes += LiveBytes(live);
    s.live_buffers += buffers;
    ++s.chunks_held;
    s.chunk_bytes += static_cast<int64_t>(c->size);
    r.live_bytes += LiveBytes(live);
    if (state == ChunkState::kRetired) {
      s.escaped_bytes += LiveBytes(live);
      s.escaped_buffers += buffers;
      r.escaped_bytes += LiveBytes(live);
    }
  }
  r.chunks_returned = chunks_returned_;
  r.table_lookups = table_lookups_.load(std::memory_order_relaxed);
  return r;
}

std::vector<ArenaBufferInfo> Arenas::buffers() const {
  std::vector<ArenaBufferInfo> out;
  MutexLock lock(&mu_);
  ReaderLock table(&table_mu_);
  for (const ArenaChunk* c : table_) {
    const ChunkState state = c->state.load(std::memory_order_relaxed);
    if (state == ChunkState::kRetained) continue;
    const std::string& name = names_[c->name.load(std::memory_order_relaxed)].name;
    const size_t used_slots = c->used.load(std::memory_order_relaxed) / kSlot;
    for (size_t i = 0; i < used_slots; ++i) {
      const uint64_t slot = c->slots[i].load(std::memory_order_relaxed);
      if (slot == 0) continue;
      out.push_back({c->begin + i * kSlot, SlotUnits(slot) * kSlot, SlotSite(slot), name,
                     c->begin, state == ChunkState::kRetired});
    }
  }
  return out;
}

absl::Status Arenas::validate(const AllocatorSnapshot& pool_view) const {
  MutexLock lock(&mu_);
  ReaderLock table(&table_mu_);
  auto fail = [&](const ArenaChunk* c, const std::string& what) {
    return absl::InternalError(absl::StrFormat("arena chunk 0x%x (%u bytes) on %s: %s",
                                               c->begin, c->size, device_.ToString(), what));
  };
  // Every allocated pool block of an arena site is a chunk, and the other way round.
  size_t arena_blocks = 0;
  for (const SegmentInfo& seg : pool_view.segments) {
    for (const BlockInfo& b : seg.blocks) {
      // A chunk given back while used on another stream is pending there: no chunk.
      if (b.state != BlockState::kAllocated || GetSite(b.site).kind != SiteKind::kArena) {
        continue;
      }
      ++arena_blocks;
      const ArenaChunk* c = lookup_locked(b.addr);
      if (c == nullptr || c->begin != b.addr) {
        return absl::InternalError(absl::StrFormat(
            "pool block 0x%x (%u bytes) on %s has an arena site but is no arena chunk",
            b.addr, b.size, device_.ToString()));
      }
      if (b.size < c->size) return fail(c, absl::StrCat("its pool block has only ", b.size, " bytes"));
    }
  }
  if (arena_blocks != table_.size()) {
    return absl::InternalError(absl::StrFormat(
        "%u arena chunks on %s but the pool holds %u arena blocks", table_.size(),
        device_.ToString(), arena_blocks));
  }
  size_t retained = 0;
  uintptr_t prev_end = 0;
  for (const ArenaChunk* c : table_) {
    if (c->begin < prev_end) return fail(c, "overlaps the chunk below it");
    prev_end = c->begin + c->size;
    const ChunkState state = c->state.load(std::memory_order_relaxed);
    const uint64_t live = c->live_total();
    const size_t used = c->used.load(std::memory_order_relaxed);
    if (used > c->size) return fail(c, absl::StrCat("bumped ", used, " bytes past its end"));
    uint64_t count = 0, units = 0;
    size_t end = 0;  // where the previous buffer ends
    for (size_t i = 0; i < c->slot_count(); ++i) {
      const uint64_t slot = c->slots[i].load(std::memory_order_relaxed);
      if (slot == 0) continue;
      const size_t at = i * kSlot;
      const size_t bytes = SlotUnits(slot) * kSlot;
      if (at < end) return fail(c, absl::StrCat("buffer at +", at, " overlaps the one below"));
      if (bytes == 0 || at + bytes > used) {
        return fail(c, absl::StrCat("buffer at +", at, " of ", bytes,
                                    " bytes lies past the bump pointer ", used));
      }
      end = at + bytes;
      ++count;
      units += SlotUnits(slot);
    }
    const uint64_t expect_count = count + (state == ChunkState::kHeld ? 1 : 0);
    if (LiveCount(live) != expect_count || (live & kLiveUnitsMask) != units) {
      return fail(c, absl::StrFormat("live count %u / %u units, but its side table holds "
                                     "%u buffers / %u units",
                                     LiveCount(live), live & kLiveUnitsMask, count, units));
    }
    if (state == ChunkState::kRetained) {
      ++retained;
      if (std::find(retained_.begin(), retained_.end(), c) == retained_.end()) {
        return fail(c, "is retained but not on the retained list");
      }
    } else if (state == ChunkState::kRetired && count == 0) {
      return fail(c, "is retired and empty but was not disposed of");
    }
  }
  if (retained != retained_.size()) {
    return absl::InternalError(absl::StrFormat(
        "%u retained arena chunks on %s but %u are on the retained list", retained,
        device_.ToString(), retained_.size()));
  }
  // The waste bound's running figures. The live one leaves out open scopes' unfolded
  // shares, which only their threads may read: checked while no scope is open.
  int64_t held = 0, live = 0, open_scopes = 0;
  for (const ArenaChunk* c : table_) {
    if (c->state.load(std::memory_order_relaxed) == ChunkState::kRetained) continue;
    held += static_cast<int64_t>(c->size);
    live += LiveBytes(c->live_total());
  }
  for (size_t i = 0; i <= kMaxArenaNames; ++i) open_scopes += names_[i].totals.open_scopes;
  if (held != held_bytes_.load(std::memory_order_relaxed)) {
    return absl::InternalError(absl::StrFormat(
        "arena chunks on %s not retained hold %d bytes, but the waste bound counts %d",
        device_.ToString(), held, held_bytes_.load(std::memory_order_relaxed)));
  }
  if (open_scopes == 0 && live != live_bytes_.load(std::memory_order_relaxed)) {
    return absl::InternalError(absl::StrFormat(
        "arena buffers on %s hold %d live bytes, but the waste bound counts %d",
        device_.ToString(), live, live_bytes_.load(std::memory_order_relaxed)));
  }
  return absl::OkStatus();
}

void Arenas::describe(OomReport* report) const {
  // A subset of report(), without building the per-name tables.
  MutexLock lock(&mu_);
  ReaderLock table(&table_mu_);
  for (const ArenaChunk* c : table_) {
    const ChunkState state = c->state.load(std::memory_order_relaxed);
    const int64_t bytes = LiveBytes(c->live_total());
    if (state == ChunkState::kRetained) {
      report->arena_retained_bytes += c->size;
    } else {
      report->arena_live_bytes += static_cast<size_t>(bytes);
      if (state == ChunkState::kRetired) report->arena_escaped_bytes += static_cast<size_t>(bytes);
    }
  }
}

void Arenas::set_observer(AllocatorObserver* observer) {
  observer_.store(observer, std::memory_order_release);
}

void Arenas::emit(AllocAction action, const ArenaFrame& frame, size_t size,
                  size_t requested) {
  AllocatorObserver* o = observer_.load(std::memory_order_acquire);
  if (o == nullptr) return;
  AllocEvent e;
  e.action = action;
  e.device = device_;
  e.stream = frame.stream;
  e.size = size;
  e.requested = requested;
  e.site = frame.site;
  o->on_event(e);
}

}  // namespace internal

ArenaScope::ArenaScope(CachingAllocator& allocator, std::string_view name,
                       ArenaOptions options) {
  frame_ = allocator.arenas_->open(name, options);
  name_ = frame_->name_text;
}

ArenaScope::~ArenaScope() {
  if (frame_ != nullptr) frame_->arenas->close_or_abandon(frame_);
}

void ArenaScope::close() {
  if (frame_ == nullptr) return;
  closed_summary_ = frame_->arenas->close(frame_);
  frame_ = nullptr;
}

ArenaScope::Summary ArenaScope::summary() const {
  return frame_ != nullptr ? frame_->summary : closed_summary_;
}

}  // namespace devmem
