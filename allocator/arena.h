// allocator/arena.h: scoped step arenas, bump allocation for temporaries that all die
// before the next step.
//
// Example:
//   for (int step = 0; step < steps; ++step) {
//     devmem::ArenaScope arena(*allocator, "step");  // this thread, this allocator
//     Tensor loss = model.forward(x);                 // temporaries: bump allocations
//     best = loss.clone();                            // escapes the scope: stays valid
//   }                                                 // empty chunks are kept for the
//                                                     // next step's scope
//
// What an open scope serves: every allocate() of the thread that opened it, on its
// allocator and on the scope's stream (ArenaOptions::stream, the default stream unless
// set), of at most chunk_size / 4 bytes (rounded to 512 B, the pool's alignment). The
// innermost open scope of that allocator on this thread wins. Everything else takes
// the normal path: other threads, other allocators, other streams, larger requests.
// A scope takes chunks from the pool, as ordinary allocations whose site is the
// arena's (kind `arena`, tag = the arena's name), so the pool's stats, retry,
// snapshots and OOM reports see them; inside a chunk it bumps a pointer.
//
// Chunk size: a scope's first chunk is 64 KiB (kMinArenaChunkSize), each further one
// twice the last, up to chunk_size, and at least four times the request that needs
// it. Space in a chunk is reused only as a whole, so a scope's chunks exceed what it
// has live by at most about what it bumped so far (the growth) or one chunk_size
// (the last chunk, barely begun), plus each full chunk's tail that a request did not
// fit (under chunk_size / 4). So keep chunk_size small next to the step: temporaries
// larger than chunk_size / 4 take the pool's path, whose best fit hands each step the
// blocks the previous one freed, at no cost in footprint. A chunk_size chosen to hold
// the step's largest temporaries defeats this: the demo's step (four 32 MiB
// activations and a few KiB of small ones) in 128 MiB chunks overflowed into a second
// chunk and reserved twice the pool's peak (258 MiB against 130 MiB); with the default
// it reserves the same 130 MiB.
//
// Waste: a buffer's space is reused only when its whole chunk empties, so long-lived
// buffers interleaved with short ones pin chunks full of dead space. When a request
// does not fit the current chunk and no chunk of the scope is empty, the scope checks
// the waste of every arena of its allocator (bytes in held chunks, less live bytes,
// less the current chunk's unbumped tail; retained chunks do not count; from running
// figures, O(1) however many chunks: other threads' open scopes count as of their last
// chunk change): above
// max(chunk_size, max_waste_fraction x the arenas' live bytes) the request takes the
// pool's normal path (a "spill", counted in ArenaStats::spills) instead of a new
// chunk, whose best fit reuses freed space piecemeal. The bump fast path never checks.
// With the default 0.1 every shipped trace replays within the plain fragmentation
// targets (docs/architecture.md, "Replay with arenas"); without the bound ResNet-18's
// peak reserved/requested went 1.081 -> 1.386.
//
// Free is O(1) from any thread: allocator.free(p) finds p's chunk (the thread's own
// scopes' newest chunks first, else a read-locked table of chunks by address; never
// the device lock), clears p's slot in the chunk's side table (which is how a double
// or interior free is caught: InvalidArgumentError naming the pointer and the arena)
// and decrements the chunk's live count. A free by the scope's own thread of a buffer
// in a chunk its scope holds does so with plain loads and stores (arena_internal.h):
// a double free racing on two threads is not caught there, as in any allocator. Space
// inside a chunk is not reused piecemeal: a chunk is reused as a whole once every
// buffer in it has died (a scope reuses the largest of its own such chunks first).
//
// Scope exit (close() or the destructor) has mimalloc's mi_heap_delete semantics, not
// mi_heap_destroy's: nothing live is invalidated. Each chunk of the scope is retired;
// a chunk with no live buffer is kept by the allocator ("retained": it serves the
// next scope without a pool call); a chunk with live buffers ("escaped": a buffer
// outlived its scope) stays until its last buffer dies, from any thread, and is then
// retained. The escaped bytes and the sites that escaped are counted per arena name
// (arena_stats()): an escape is often a bug, a tensor kept for logging that pins a
// whole chunk. Retained chunks go back to the pool on empty_cache() and trim(), and
// the pool's staged retry takes them back before it releases cached segments.
//
// record_stream(p, s) on an arena buffer declares s on its chunk (the pool block):
// the chunk is then never reused by an arena; when its last buffer dies it goes back
// to the pool, whose free waits for s as for any block used on another stream.
//
// Misuse is an error, not corruption: close() from a thread other than the one that
// opened the scope, or while a scope opened after it on the same thread is still open
// (non-nested), throws InvalidArgumentError naming both scopes and changes nothing.
// The destructor cannot throw (that would terminate far from the cause, as in
// tensor/storage.cc): on the same misuse it says so on stderr and abandons the scope,
// which then serves no more allocations and is closed by its own thread when the
// scopes opened inside it close (or when that thread exits).
//
// Lifetime: the allocator must outlive its scopes and every arena buffer, as for any
// block. Thread-safety: an ArenaScope belongs to the thread that opened it; the
// allocator's arena queries (arena_stats, validate, snapshot) may run on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "allocator/site.h"
#include "allocator/types.h"

namespace devmem {

class CachingAllocator;
namespace internal {
struct ArenaFrame;
}

// The default (largest) chunk: 4 MiB, so that the largest request an arena serves
// (chunk_size / 4 = 1 MiB) is exactly the small pool's bound: every request the small
// pool would have served is a bump. docs/architecture.md ("Scoped step arenas") has
// the sweep over chunk sizes this default was checked against.
inline constexpr size_t kDefaultArenaChunkSize = 4 * kMiB;
inline constexpr size_t kMinArenaChunkSize = 64 * kKiB;
inline constexpr size_t kMaxArenaChunkSize = 1 * kGiB;
// Distinct arena names one allocator tracks; further names are counted as "other".
inline constexpr size_t kMaxArenaNames = 32;
inline constexpr size_t kMaxArenaNameBytes = 64;

struct ArenaOptions {
  // Bytes of the largest chunk (chunks grow from 64 KiB up to it; see "Chunk size"
  // above): a multiple of 512 in [64 KiB, 1 GiB]. Requests of at most chunk_size / 4
  // are served by the arena.
  size_t chunk_size = kDefaultArenaChunkSize;
  // Only allocations on this stream come from the arena.
  Stream stream;
  // The waste bound (see "Waste" above): a finite number >= 0; 0 turns it off. Unset:
  // the allocator's arena_max_waste (Config, default 0.1).
  std::optional<double> max_waste_fraction;
};

// One site that had buffers alive when a scope closed.
struct ArenaEscapeSite {
  SiteId site = kUnknownSite;
  int64_t buffers = 0;  // escapes, summed over scope exits
  int64_t bytes = 0;
};

// Per arena name, on one allocator. "now" figures are read at the time of the call;
// totals are counted when each scope closes.
struct ArenaStats {
  std::string name;
  int64_t live_bytes = 0;       // now: bytes of live buffers in this arena's chunks
  int64_t live_buffers = 0;
  int64_t chunks_held = 0;      // now: chunks held by open scopes or pinned by escapes
  int64_t chunk_bytes = 0;      // now: their bytes
  int64_t escaped_bytes = 0;    // now: live bytes in chunks of closed scopes
  int64_t escaped_buffers = 0;
  int64_t open_scopes = 0;      // now
  int64_t scopes_closed = 0;    // total
  int64_t allocations = 0;      // total bumps served (of closed scopes)
  int64_t bytes_allocated = 0;  // total bytes bumped (of closed scopes)
  int64_t chunk_reuses = 0;     // total chunks reused without a pool call
  int64_t pool_chunk_allocs = 0;  // total chunks taken from the pool
  int64_t escapes = 0;          // total buffers alive at their scope's exit
  std::vector<ArenaEscapeSite> escape_sites;  // largest bytes first
  int64_t spills = 0;           // total requests the waste bound sent to the pool (of closed scopes)
  int64_t spill_bytes = 0;      // total bytes of those requests (rounded to 512 B)
};

// Everything the arenas of one allocator hold.
struct ArenaReport {
  int64_t live_bytes = 0;       // live buffers, all arenas
  int64_t escaped_bytes = 0;    // of which in chunks of closed scopes
  int64_t retained_bytes = 0;   // empty chunks kept for the next scope
  int64_t retained_chunks = 0;
  int64_t chunk_bytes = 0;      // every chunk the arenas hold (held + retained)
  int64_t chunks = 0;
  int64_t chunks_returned = 0;  // total chunks given back to the pool
  // Total frees, record_streams and finds that searched the chunk table under its
  // lock. A pointer in no chunk (an ordinary block) is told apart without it, so this
  // counts only calls on arena buffers of other threads' or closed scopes.
  int64_t table_lookups = 0;
  std::vector<ArenaStats> arenas;  // by name, in order of first use
};

// One live arena buffer (snapshots, `memtrace buffers`).
struct ArenaBufferInfo {
  uintptr_t addr = 0;
  size_t size = 0;       // rounded to 512 B
  SiteId site = kUnknownSite;
  std::string arena;     // the arena's name
  uintptr_t chunk = 0;   // the chunk (pool block) it sits in
  bool escaped = false;  // its scope has closed
};

// Routes this thread's allocations on `allocator` into an arena until closed.
// Not copyable or movable: it belongs to the thread and the C++ scope that opened it.
class ArenaScope {
 public:
  // Throws InvalidArgumentError naming the option for an empty name or a bad
  // chunk_size. Names are cut to kMaxArenaNameBytes and made valid UTF-8.
  ArenaScope(CachingAllocator& allocator, std::string_view name, ArenaOptions options = {});
  ~ArenaScope();
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

  // Closes the scope (see the file comment). Throws InvalidArgumentError on misuse
  // (another thread; not the innermost scope of this thread); nothing changes then.
  // Closing twice is a no-op.
  void close();
  bool is_open() const { return frame_ != nullptr; }
  const std::string& name() const { return name_; }

  // What this scope did so far (or until it closed).
  struct Summary {
    int64_t allocations = 0;      // bumps served
    int64_t bytes = 0;            // bytes bumped
    int64_t chunks = 0;           // chunks it used
    int64_t pool_chunk_allocs = 0;  // of which taken from the pool (not reused)
    int64_t escaped_bytes = 0;    // live at close (0 while open)
    int64_t escaped_buffers = 0;
    int64_t spills = 0;           // requests the waste bound sent to the pool
    int64_t spill_bytes = 0;
  };
  Summary summary() const;

 private:
  std::string name_;
  internal::ArenaFrame* frame_ = nullptr;  // owned until close (or abandonment)
  Summary closed_summary_;
};

}  // namespace devmem
