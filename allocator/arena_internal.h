// allocator/arena_internal.h: the state behind ArenaScope (an internal header: only
// allocator/*.cc include it). allocator/arena.h describes the behaviour.
//
// Pieces:
//   ArenaChunk  one pool block used for bumps. A side table holds one 64-bit slot per
//               512 B: (units << 32 | site) at the offset of each live buffer, 0
//               elsewhere. The live figure packs (count << 40 | units): count is the
//               live buffers plus one while an open scope holds the chunk. It is the
//               sum, modulo 2^64, of two words (mimalloc's local and thread frees):
//               `owner_live`, which only the thread whose scope holds the chunk
//               changes (bumps and its own frees of buffers in the chunk: plain loads
//               and stores, no read-modify-write), and `live`, which every other free
//               decrements atomically. Scope exit folds owner_live into live; from then
//               on live alone is the figure, and whoever brings it to 0 (the last free,
//               or the close) disposes of the chunk. While held, live alone never
//               reaches 0: it starts at one count and no set of frees sums to exactly
//               one count with zero units.
//   ArenaFrame  one open scope, linked into its thread's stack (t_arena_top).
//   Arenas      per allocator: the chunk table (by address, behind a reader-writer
//               lock that frees on other threads read), the retained empty chunks,
//               the names and their counters.
//
// Chunk states: kHeld (an open scope bumps in it), kRetired (its scope closed, buffers
// live: escaped), kRetained (empty, kept for reuse). Transitions happen under
// Arenas::mu_; `used` and the frame's fields are touched only by the owning thread.
//
// Lock order: the device lock (DevicePool::mu_) -> Arenas::mu_ -> Arenas::table_mu_.
// Arenas never calls the pool while holding either of its locks; the pool calls
// ArenaPoolHook methods with its lock held.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "allocator/arena.h"
#include "allocator/mutex.h"
#include "allocator/observer.h"
#include "allocator/oom_report.h"
#include "allocator/snapshot.h"

namespace devmem::internal {

class DevicePool;

// What the pool asks of the arenas, with the device lock held (the one hook into the
// pool: DevicePool::set_arena_hook).
class ArenaPoolHook {
 public:
  virtual ~ArenaPoolHook() = default;
  // Removes every retained (empty) chunk from the arenas' books and appends its
  // address: the caller frees those blocks itself (staged retry).
  virtual void take_back_retained(std::vector<uintptr_t>* chunks) = 0;
  // Fills the arena_* fields of an OOM report.
  virtual void describe(OomReport* report) const = 0;
};

enum class ChunkState : uint8_t { kHeld, kRetired, kRetained };

inline constexpr int kLiveCountShift = 40;
inline constexpr uint64_t kLiveUnitsMask = (uint64_t{1} << kLiveCountShift) - 1;
inline constexpr uint64_t LivePack(uint64_t count, uint64_t units) {
  return (count << kLiveCountShift) | units;
}

struct ArenaChunk {
  uintptr_t begin = 0;
  size_t size = 0;
  Stream stream;
  std::atomic<int> name{0};              // index into Arenas::names_ (last user)
  std::atomic<ChunkState> state{ChunkState::kHeld};
  std::atomic<size_t> used{0};           // bump offset (written by the owning thread)
  std::atomic<uint64_t> live{0};         // LivePack(count, units), less owner_live
  std::atomic<uint64_t> owner_live{0};   // written by the holding thread only (relaxed)
  std::atomic<bool> stream_used{false};  // record_stream was called on a buffer
  std::unique_ptr<std::atomic<uint64_t>[]> slots;  // size / 512 entries

  bool contains(uintptr_t a) const { return a - begin < size; }
  // The live figure (exact on the holding thread, or once the chunk is retired).
  uint64_t live_total() const {
    return live.load(std::memory_order_acquire) + owner_live.load(std::memory_order_relaxed);
  }
  size_t slot_count() const { return size / kSlotBytes; }
  static constexpr size_t kSlotBytes = 512;
};

struct ArenaFrame {
  class Arenas* arenas = nullptr;
  std::thread::id owner;
  int name = 0;                // index into Arenas' names
  std::string name_text;       // the name as reports spell it
  SiteId site = kUnknownSite;  // the chunks' pool site (kind arena, tag = name)
  Stream stream;
  size_t chunk_size = 0;   // the largest chunk it takes (ArenaOptions::chunk_size)
  size_t max_request = 0;
  size_t next_chunk = 0;   // the least size of its next chunk: doubles up to chunk_size
  // The waste bound (arena.h, "Waste"; 0 = off): ArenaOptions::max_waste_fraction or
  // the allocator's arena_max_waste.
  double waste_fraction = 0;
  ArenaFrame* below = nullptr;        // the next outer scope of this thread
  std::atomic<bool> abandoned{false};  // its ArenaScope died without closing it
  ArenaChunk* current = nullptr;
  std::vector<ArenaChunk*> chunks;    // every chunk it holds, `current` last
  ArenaScope::Summary summary;
  // The arenas' live bytes (Arenas::live_bytes_, for the waste bound) are summary.bytes
  // (bumped) less local_freed (freed by this thread in chunks the scope holds: local
  // frees) less what other frees subtracted there themselves; `folded` of this scope's
  // own share is already in Arenas::live_bytes_. Owner thread only.
  int64_t local_freed = 0;
  int64_t folded = 0;
  std::string label;                  // "arena 'step' on sim:0" for messages
};

// The innermost open scope of this thread (any allocator), or nullptr.
extern constinit thread_local ArenaFrame* t_arena_top;

class Arenas final : public ArenaPoolHook {
 public:
  Arenas(DevicePool* pool, DeviceId device);
  ~Arenas() override;

  // --- scopes (the owning thread) -------------------------------------------------
  ArenaFrame* open(std::string_view name, const ArenaOptions& options);
  // Closes and deletes `frame`, returning what it did. Throws InvalidArgumentError on
  // misuse; nothing changes then.
  ArenaScope::Summary close(ArenaFrame* frame);
  // The destructor's path: closes when it may, else abandons (stderr says why).
  void close_or_abandon(ArenaFrame* frame) noexcept;

  // --- the allocator's hooks -----------------------------------------------------
  // A bump from this thread's innermost scope of this allocator, or nullptr when the
  // request takes the normal path. Inline: the common case is no open scope at all,
  // the next one a bump in the innermost scope's current chunk (no read-modify-write,
  // no lock, no call).
  void* allocate(size_t bytes, Stream stream, SiteId site) {
    ArenaFrame* f = t_arena_top;
    if (f == nullptr) [[likely]] return nullptr;
    ArenaChunk* c = f->current;
    if (f->arenas == this && c != nullptr && bytes - 1 < f->max_request &&
        stream == f->stream && !f->abandoned.load(std::memory_order_relaxed)) {
      const size_t size = (bytes + ArenaChunk::kSlotBytes - 1) & ~(ArenaChunk::kSlotBytes - 1);
      const size_t at = c->used.load(std::memory_order_relaxed);
      if (size <= c->size - at) [[likely]] return bump(f, c, at, size, site);
    }
    return allocate_slow(bytes, stream, site);
  }
  // True when `ptr` is an arena buffer (then it was freed); false: not ours. Inline:
  // a free of the innermost scope's current chunk by its own thread touches only that
  // thread's words (owner_live and the slot).
  bool free(void* ptr) {
    if (chunk_count_.load(std::memory_order_acquire) == 0) [[likely]] return false;
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    ArenaFrame* f = t_arena_top;
    if (f != nullptr && f->arenas == this && f->current != nullptr &&
        f->current->contains(addr)) {
      if (owner_release(f, f->current, addr)) [[likely]] return true;
      return free_slow(ptr);  // throws, naming the pointer
    }
    return free_slow(ptr);
  }
  bool record_stream(void* ptr, Stream stream);
  std::optional<BlockInfo> find(const void* ptr) const;
  // Gives retained chunks back to the pool (empty_cache, trim). Takes no pool lock
  // while holding its own.
  void release_retained();

  ArenaReport report() const;
  std::vector<ArenaBufferInfo> buffers() const;
  // Chunks tile what the pool handed out; live counts and bytes match the side
  // tables. Exact only while no arena allocation or free runs concurrently.
  absl::Status validate(const AllocatorSnapshot& pool_view) const;
  void set_observer(AllocatorObserver* observer);

  // ArenaPoolHook (device lock held).
  void take_back_retained(std::vector<uintptr_t>* chunks) override;
  void describe(OomReport* report) const override;

 private:
  // Names never move (a fixed array, the last entry "other"), and `name` and `site`
  // never change once set, so an error message may read them holding no lock.
  struct Name {
    std::string name;
    SiteId site = kUnknownSite;
    ArenaStats totals;  // the total fields and open_scopes; "now" fields are recounted
    absl::flat_hash_map<SiteId, ArenaEscapeSite> escapes;
  };

  void* allocate_slow(size_t bytes, Stream stream, SiteId site);
  // Bumps `size` bytes at offset `at` of `c`, held by `f` on this thread.
  static void* bump(ArenaFrame* f, ArenaChunk* c, size_t at, size_t size, SiteId site) {
    const uint64_t units = size / ArenaChunk::kSlotBytes;
    c->used.store(at + size, std::memory_order_relaxed);
    c->owner_live.store(c->owner_live.load(std::memory_order_relaxed) + LivePack(1, units),
                        std::memory_order_relaxed);
    c->slots[at / ArenaChunk::kSlotBytes].store((units << 32) | site,
                                                std::memory_order_relaxed);
    ++f->summary.allocations;
    f->summary.bytes += static_cast<int64_t>(size);
    return reinterpret_cast<void*>(c->begin + at);
  }
  bool free_slow(void* ptr);
  // The local free (mimalloc's): a free by the thread whose open scope holds `c`, of
  // a buffer in `c`. Clears the slot and lowers owner_live, which only that thread
  // writes, with plain loads and stores: no read-modify-write, no lock. A racing
  // double free of one buffer from two threads is not caught here (as in any
  // allocator, it is a data race in the program); a second free is. False, changing
  // nothing, when no live buffer starts at `addr` (the caller throws).
  static bool owner_release(ArenaFrame* f, ArenaChunk* c, uintptr_t addr) {
    const uintptr_t off = addr - c->begin;
    if (off % ArenaChunk::kSlotBytes != 0) [[unlikely]] return false;
    std::atomic<uint64_t>& s = c->slots[off / ArenaChunk::kSlotBytes];
    const uint64_t slot = s.load(std::memory_order_relaxed);
    if (slot == 0) [[unlikely]] return false;
    s.store(0, std::memory_order_relaxed);
    c->owner_live.store(
        c->owner_live.load(std::memory_order_relaxed) - LivePack(1, slot >> 32),
        std::memory_order_relaxed);
    f->local_freed += static_cast<int64_t>((slot >> 32) * ArenaChunk::kSlotBytes);
    return true;
  }
  // How many of a scope's most recent chunks free_slow checks for a local free before
  // it looks in the chunk table (a frame may hold hundreds of chunks; the walk also
  // runs for every free of an ordinary block while a scope is open).
  static constexpr size_t kLocalFreeChunks = 4;
  [[noreturn]] void throw_not_a_buffer(const ArenaChunk* c, uintptr_t addr,
                                       const void* ptr) const;
  // Clears the slot of `addr` in `c` and drops its live count; true when the chunk
  // is now empty and retired (the caller disposes of it, holding no table lock).
  bool release_buffer(ArenaChunk* c, uintptr_t addr, const void* ptr);
  // A chunk for `frame` with at least `bytes` free: one of its own that emptied,
  // a retained one, or a new pool block.
  ArenaChunk* next_chunk(ArenaFrame* frame, size_t bytes);
  // True when a request of `size` that does not fit f's current chunk should take the
  // pool's path: no chunk of f is empty and the arenas' waste exceeds f's bound
  // (arena.h, "Waste"). The owning thread, on the slow path only. O(1) in the chunks:
  // the running held_bytes_ and live_bytes_ (plus this thread's scopes' unfolded
  // shares), no lock.
  bool over_waste_bound(const ArenaFrame* f, size_t size) const;
  // Adds f's unfolded share of the live bytes to live_bytes_ (owner thread: at each
  // chunk change and at close), so other threads' waste checks see it.
  void fold_live(ArenaFrame* f);
  static int64_t unfolded_live(const ArenaFrame& f) {
    return f.summary.bytes - f.local_freed - f.folded;
  }
  void dispose(ArenaChunk* c);
  void unregister_locked(ArenaChunk* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ArenaScope::Summary finish_close(ArenaFrame* frame);
  // Closes abandoned scopes at the top of this thread's stack.
  static void pop_abandoned();
  friend struct ArenaThreadExit;
  void emit(AllocAction action, const ArenaFrame& frame, size_t size, size_t requested);
  ArenaChunk* lookup_locked(uintptr_t addr) const ABSL_SHARED_LOCKS_REQUIRED(table_mu_);
  // False when `addr` is certainly in no chunk: most frees and record_streams of
  // ordinary blocks, once any chunk exists, end here without table_mu_ (whose reader
  // side is a read-modify-write on a line every thread's free would share). True
  // means "look it up under the lock". Lock-free and writes nothing.
  bool maybe_in_chunk(uintptr_t addr) const;
  // Copies the table's ranges into the filter (table_mu_ held exclusively: one writer).
  void publish_filter_locked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(table_mu_);
  int intern_name_locked(std::string_view name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  DevicePool* const pool_;
  const DeviceId device_;

  mutable Mutex mu_;
  const std::unique_ptr<Name[]> names_;  // kMaxArenaNames + 1; contents under mu_
  size_t name_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ArenaChunk*> retained_ ABSL_GUARDED_BY(mu_);
  int64_t chunks_returned_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<AllocatorObserver*> observer_{nullptr};

  // Every chunk, sorted by begin. Written under mu_ and table_mu_ (exclusive);
  // free_slow reads it under table_mu_ (shared) only.
  mutable SharedMutex table_mu_;
  std::vector<ArenaChunk*> table_ ABSL_GUARDED_BY(table_mu_);
  std::atomic<size_t> chunk_count_{0};  // table_.size(): lets frees skip the lock

  // The filter behind maybe_in_chunk: the table's [begin, end) ranges, sorted, under a
  // sequence lock (odd filter_seq_: a writer is copying). Exact while the table has at
  // most kFilterCapacity chunks; beyond that filter_size_ is kFilterOverflow and every
  // lookup takes the lock. Readers load atomics only, so a torn read is harmless: the
  // sequence check discards it.
  static constexpr size_t kFilterCapacity = 1024;
  static constexpr size_t kFilterOverflow = SIZE_MAX;
  std::atomic<uint64_t> filter_seq_{0};
  std::atomic<size_t> filter_size_{0};
  const std::unique_ptr<std::atomic<uintptr_t>[]> filter_begin_;
  const std::unique_ptr<std::atomic<uintptr_t>[]> filter_end_;
  // Lookups that took table_mu_ (ArenaReport::table_lookups).
  mutable std::atomic<int64_t> table_lookups_{0};
  // The waste bound's running figures (over_waste_bound), so that its check does not
  // scan the chunk table. held_bytes_: bytes of the chunks not retained (held by a
  // scope or pinned by escapes), changed under mu_ where a chunk changes state.
  // live_bytes_: bytes of live arena buffers, except each open scope's unfolded share
  // (its bumps less its local frees since its last chunk change: ArenaFrame::folded);
  // frees that are not local subtract here themselves, next to their read-modify-write
  // of the chunk's `live` (on the line table_lookups_, which they also write, is on).
  // validate() checks both against the chunks.
  std::atomic<int64_t> live_bytes_{0};
  std::atomic<int64_t> held_bytes_{0};
};

}  // namespace devmem::internal
