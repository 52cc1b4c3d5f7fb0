// allocator/site.cc: the global site table and the lock-free pointer index in front of it.
//
// Structure:
//   * SiteTable (one per process, never destroyed so that threads still running at
//     exit can intern): a deque of SiteInfo indexed by id, and a hash map from the
//     site's identity (file, line, column, function, kind, tag) to its id. Index 0 is
//     the "<unknown>" site. A deque never moves its elements, so the map's keys are
//     string_views into the SiteInfo they name, and the pointer index may keep a
//     view of an interned tag without copying it.
//   * The pointer index (one per process, beside the table): a fixed open-addressing
//     array of kIndexSlots atomic pointers to immutable IndexEntry records, keyed by
//     the identity of the source_location's strings (file and function pointers; they
//     are static), line, column, kind and tag text. A known site is found there with
//     acquire loads only: no lock, no read-modify-write, no allocation, so threads
//     interning hundreds of hot sites share its cache lines read-only (a per-thread
//     direct-mapped cache of 64 entries thrashed with 256 sites in rotation and fell
//     back to the table's lock on nearly every call). Entries are added under the
//     table's exclusive lock the first time a site is interned through that pointer
//     identity, and never removed; the index is filled to at most half its slots, so a
//     probe always reaches an empty slot, and past that new identities are looked up
//     in the table (correct, only slower). The identity includes the outer ScopedSite
//     frame's (pointers, line, column), so a known chain is found the same way.
//   * The per-thread front (InternSite's fast path): a direct-mapped array of
//     kFrontSlots (source_location identity + kind) -> id, one per thread, made on the
//     thread's first plain intern and freed at its exit. "Plain": no tag (neither the
//     argument nor the thread's ScopedSiteTag) and no ScopedSite frame, which is what
//     nearly every allocation is; the identity is the address of the static record a
//     std::source_location points at (libstdc++ and libc++ keep one pointer), so a hit
//     is one thread_local load, one compare and one load: no hashing of strings, no
//     shared cache line at all. Records of one translation unit lie side by side, so
//     the index (the address / 8) puts up to kFrontSlots neighbouring sites in distinct
//     slots; a slot that two live sites share makes them miss in turn, each miss being
//     the pointer index's read-only lookup (then the slot is overwritten). Where
//     std::source_location is not one pointer, the front is compiled out.
//   * The ScopedSite stack: a thread-local bounded array of source_locations and a
//     depth. Only frame 0 (the outermost) enters a site's identity.
// Identity: the table compares strings by content, so the same place reached through
// two copies of a string literal (an inline function in two translation units) is one
// site; the pointer index compares file and function by pointer, so such a site has
// one index entry per copy (all naming the same id).
// Two source_locations on one line with different columns are different sites (their
// SiteInfo reads the same, since it has no column). Tags are compared by text: two
// tags with equal text are one site.
//
// Hostile strings: every string is cut to a bound (kMaxSiteTagBytes for tags,
// kMaxSiteNameBytes for file and function) and made valid UTF-8 (each byte that does
// not start or continue a valid sequence becomes U+FFFD) once, when the site is
// interned, so every JSON view, metric label and message built from a SiteInfo can
// use it as it is. The map keys on the caller's text (after the cut), so a site
// interned again with the same bytes is found without re-validating.
//
// Bound: the table holds at most kMaxSites ids. When it is full, every new identity
// gets the one kOtherSiteFile site (tag "other"), which is not indexed nor added to the
// map, and the process is told once on stderr: 200,000 distinct tags must not make a
// 43 MB stats JSON.
//
// Thread-safety: the table is guarded by one SharedMutex (allocator/mutex.h), a leaf
// lock (nothing else is acquired while it is held). Table lookups take it shared;
// inserts, into the table or the pointer index, take it exclusively.
// GetSite copies the SiteInfo under the shared lock: it returns by value, and indexing
// the deque while another thread appends would race. The pointer index is read without
// the lock: a slot is written once (release, under the exclusive lock) from null to an
// entry that never changes afterwards, and read with acquire. The current tag is
// thread_local and touched only by its thread.
#include "allocator/site.h"

#include <array>
#include <atomic>
#include <algorithm>
#include <memory>
#include <new>
#include <type_traits>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "allocator/mutex.h"

namespace devmem {

std::string_view SiteKindName(SiteKind kind) {
  switch (kind) {
    case SiteKind::kAlloc: return "alloc";
    case SiteKind::kClone: return "clone";
    case SiteKind::kContiguous: return "contiguous";
    case SiteKind::kToDevice: return "to_device";
    case SiteKind::kArena: return "arena";
  }
  return "unknown";
}

std::string SiteInfo::ToString() const {
  std::string out;
  if (!tag.empty()) absl::StrAppend(&out, tag, " @ ");
  if (has_outer()) {
    absl::StrAppend(&out, outer_file);
    if (outer_line != 0) absl::StrAppend(&out, ":", outer_line);
    absl::StrAppend(&out, " > ");
  }
  absl::StrAppend(&out, file);
  if (line != 0) absl::StrAppend(&out, ":", line);
  absl::StrAppend(&out, " (", std::string(SiteKindName(kind)), ")");
  return out;
}

bool SiteTextMatches(std::string_view where, std::string_view file, uint32_t line,
                     std::string_view function, std::string_view needle) {
  if (needle.empty()) return true;
  return where.find(needle) != std::string_view::npos ||
         (std::string(file) + ":" + std::to_string(line)).find(needle) != std::string::npos ||
         function.find(needle) != std::string_view::npos;
}

namespace {

// A site's identity. In the map the views point into the SiteInfo the key names; for
// a lookup they point at the caller's strings.
struct SiteKey {
  std::string_view file;
  std::string_view function;
  std::string_view tag;
  uint32_t line = 0;
  uint32_t column = 0;
  SiteKind kind = SiteKind::kAlloc;
  // The outer frame ("" / 0 when none).
  std::string_view outer_file = {};
  std::string_view outer_function = {};
  uint32_t outer_line = 0;
  uint32_t outer_column = 0;

  friend bool operator==(const SiteKey&, const SiteKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const SiteKey& k) {
    return H::combine(std::move(h), k.file, k.function, k.tag, k.line, k.column,
                      k.kind, k.outer_file, k.outer_function, k.outer_line,
                      k.outer_column);
  }
};

SiteInfo UnknownSiteInfo() { return SiteInfo{"<unknown>", 0, "", "", SiteKind::kAlloc}; }

// The length of the valid UTF-8 sequence at the start of `s` (1..4), or 0 when the
// first byte does not start one (RFC 3629: no overlongs, no surrogates, <= U+10FFFF).
size_t Utf8SequenceLength(std::string_view s) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // U+D800..U+DFFF are surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < (i == 1 ? lo : 0x80) || b > (i == 1 ? hi : 0xBF)) return 0;
  }
  return n;
}

// `s` with every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD.
std::string ToValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  while (!s.empty()) {
    const size_t n = Utf8SequenceLength(s);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      s.remove_prefix(1);
    } else {
      out.append(s.substr(0, n));
      s.remove_prefix(n);
    }
  }
  return out;
}

// The key of a site: the caller's text cut to the bounds (the cut may split a UTF-8
// sequence; ToValidUtf8 then replaces the partial one).
SiteKey BoundedKey(SiteKey key) {
  key.file = key.file.substr(0, kMaxSiteNameBytes);
  key.function = key.function.substr(0, kMaxSiteNameBytes);
  key.tag = key.tag.substr(0, kMaxSiteTagBytes);
  key.outer_file = key.outer_file.substr(0, kMaxSiteNameBytes);
  key.outer_function = key.outer_function.substr(0, kMaxSiteNameBytes);
  return key;
}

// The pointer identity of an InternSite call: what the index is keyed by. `tag` is the
// caller's view for a lookup, and a view into the table (stable for the process's
// life) once stored in an IndexEntry.
struct PointerKey {
  const char* file = nullptr;
  const char* function = nullptr;
  std::string_view tag;
  uint32_t line = 0;
  uint32_t column = 0;
  SiteKind kind = SiteKind::kAlloc;
  // The outer ScopedSite frame's identity (nullptr / 0 when none).
  const char* outer_file = nullptr;
  const char* outer_function = nullptr;
  uint32_t outer_line = 0;
  uint32_t outer_column = 0;

  bool operator==(const PointerKey& o) const {
    return file == o.file && function == o.function && line == o.line &&
           column == o.column && kind == o.kind && tag == o.tag &&
           outer_file == o.outer_file && outer_function == o.outer_function &&
           outer_line == o.outer_line && outer_column == o.outer_column;
  }
};

size_t PointerHash(const PointerKey& k) {
  uint64_t h = reinterpret_cast<uintptr_t>(k.file) ^
               (reinterpret_cast<uintptr_t>(k.function) * 0x9E3779B97F4A7C15ULL);
  h ^= (uint64_t{k.line} << 32) ^ (uint64_t{k.column} << 8) ^ static_cast<uint64_t>(k.kind);
  if (!k.tag.empty()) h ^= std::hash<std::string_view>{}(k.tag);
  if (k.outer_file != nullptr) {
    h ^= (reinterpret_cast<uintptr_t>(k.outer_file) * 31) ^
         (reinterpret_cast<uintptr_t>(k.outer_function) << 7) ^
         (uint64_t{k.outer_line} << 20) ^ k.outer_column;
  }
  // A 64-bit finalizer (from MurmurHash3) so that nearby lines spread over the slots.
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return static_cast<size_t>(h);
}

// An index record: written once before it is published, never changed or freed.
struct IndexEntry {
  PointerKey key;
  SiteId id = kUnknownSite;
};
constexpr size_t kIndexSlots = 16384;              // a power of two
constexpr size_t kMaxIndexEntries = kIndexSlots / 2;  // so every probe ends at a null

// Slow-path lookups (calls that reached the table); see SiteTableLookups().
std::atomic<uint64_t> g_table_lookups{0};

class SiteTable {
 public:
  SiteTable() : index_(new std::atomic<const IndexEntry*>[kIndexSlots]()) {
    entries_.push_back(Entry{UnknownSiteInfo(), {}, {}, {}, {}, {}});
  }

  // The id indexed for `key`, or kUnknownSite when it is not indexed. Lock-free and
  // read-only: acquire loads of the slots probed.
  SiteId Find(const PointerKey& key, size_t hash) const {
    for (size_t i = hash;; ++i) {
      const IndexEntry* e = index_[i & (kIndexSlots - 1)].load(std::memory_order_acquire);
      if (e == nullptr) return kUnknownSite;
      if (e->key == key) return e->id;
    }
  }

  // Returns the id of `key` (already cut by BoundedKey), adding it if new. When the id
  // may be cached, `*stable_tag` is set to a view of the key's tag text that lives as
  // long as the process and true is returned; false for the `other` site.
  bool Intern(const SiteKey& key, SiteId* id, std::string_view* stable_tag)
      ABSL_LOCKS_EXCLUDED(mu_) {
    g_table_lookups.fetch_add(1, std::memory_order_relaxed);
    {
      ReaderLock lock(&mu_);
      if (auto it = ids_.find(key); it != ids_.end()) {
        *stable_tag = it->first.tag;
        *id = it->second;
        return true;
      }
      if (other_ != kUnknownSite) {
        *id = other_;
        return false;
      }
    }
    WriterLock lock(&mu_);
    return InternLocked(key, id, stable_tag);
  }

  // Intern, then indexes `pointers` (whose tag is replaced by the stable one) under the
  // id found, unless it is the `other` site or the index is at its bound.
  SiteId InternAndIndex(const SiteKey& key, PointerKey pointers, size_t hash)
      ABSL_LOCKS_EXCLUDED(mu_) {
    std::string_view stable_tag;
    SiteId id = kUnknownSite;
    if (!Intern(key, &id, &stable_tag)) return id;
    pointers.tag = stable_tag;
    WriterLock lock(&mu_);
    if (index_count_ >= kMaxIndexEntries) return id;
    for (size_t i = hash;; ++i) {
      std::atomic<const IndexEntry*>& slot = index_[i & (kIndexSlots - 1)];
      const IndexEntry* e = slot.load(std::memory_order_relaxed);  // writers hold mu_
      if (e != nullptr) {
        if (e->key == pointers) return id;  // another thread indexed it first
        continue;
      }
      const IndexEntry& added = index_entries_.emplace_back(IndexEntry{pointers, id});
      ++index_count_;
      slot.store(&added, std::memory_order_release);  // publishes `added`
      return id;
    }
  }

  SiteInfo Get(SiteId id) const ABSL_LOCKS_EXCLUDED(mu_) {
    ReaderLock lock(&mu_);
    if (id >= entries_.size()) return entries_[kUnknownSite].info;
    return entries_[id].info;
  }

  size_t Count() const ABSL_LOCKS_EXCLUDED(mu_) {
    ReaderLock lock(&mu_);
    return entries_.size();
  }

 private:
  bool InternLocked(const SiteKey& key, SiteId* id, std::string_view* stable_tag)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (auto it = ids_.find(key); it != ids_.end()) {  // another thread won the race
      *stable_tag = it->first.tag;
      *id = it->second;
      return true;
    }
    if (other_ == kUnknownSite && entries_.size() == kMaxSites - 1) {
      // The last id: the `other` site, for this key and every new one after it.
      other_ = static_cast<SiteId>(entries_.size());
      entries_.push_back(
          Entry{SiteInfo{std::string(kOtherSiteFile), 0, "", "other", SiteKind::kAlloc},
                {}, {}, {}, {}, {}});
      std::fprintf(stderr,
                   "devmem: error: the site table is full (%zu sites, one per distinct "
                   "call site and tag); allocations from new sites are counted under the "
                   "site \"%s\" from now on: use fewer distinct tags (a tag with a "
                   "counter or an id in it?)\n",
                   kMaxSites, std::string(kOtherSiteFile).c_str());
    }
    if (other_ != kUnknownSite) {
      *id = other_;
      return false;
    }
    const SiteId new_id = static_cast<SiteId>(entries_.size());
    Entry& e = entries_.emplace_back();
    e.info = SiteInfo{ToValidUtf8(key.file),      key.line,
                      ToValidUtf8(key.function),  ToValidUtf8(key.tag),
                      key.kind,                   ToValidUtf8(key.outer_file),
                      key.outer_line,             ToValidUtf8(key.outer_function)};
    // The key keeps the caller's bytes; only where they differ from the SiteInfo's (they
    // were not valid UTF-8) are they stored a second time.
    auto stable = [](std::string_view raw, const std::string& clean, std::string* copy) {
      if (raw == clean) return std::string_view(clean);
      *copy = std::string(raw);
      return std::string_view(*copy);
    };
    SiteKey stable_key{stable(key.file, e.info.file, &e.raw_file),
                       stable(key.function, e.info.function, &e.raw_function),
                       stable(key.tag, e.info.tag, &e.raw_tag),
                       key.line,
                       key.column,
                       key.kind,
                       stable(key.outer_file, e.info.outer_file, &e.raw_outer_file),
                       stable(key.outer_function, e.info.outer_function,
                              &e.raw_outer_function),
                       key.outer_line,
                       key.outer_column};
    ids_.emplace(stable_key, new_id);
    *stable_tag = stable_key.tag;
    *id = new_id;
    return true;
  }

  struct Entry {
    SiteInfo info;  // valid UTF-8, what GetSite returns
    // The caller's bytes where they differ from info's (else empty): the map's keys
    // point at them.
    std::string raw_file;
    std::string raw_function;
    std::string raw_tag;
    std::string raw_outer_file;
    std::string raw_outer_function;
  };
  mutable SharedMutex mu_;
  std::deque<Entry> entries_ ABSL_GUARDED_BY(mu_);  // index == id; never shrinks
  absl::flat_hash_map<SiteKey, SiteId> ids_ ABSL_GUARDED_BY(mu_);
  SiteId other_ ABSL_GUARDED_BY(mu_) = kUnknownSite;  // set once the table is full
  // The pointer index: slots are read without mu_ (Find) and written under it.
  const std::unique_ptr<std::atomic<const IndexEntry*>[]> index_;
  std::deque<IndexEntry> index_entries_ ABSL_GUARDED_BY(mu_);  // never moves an element
  size_t index_count_ ABSL_GUARDED_BY(mu_) = 0;
};

SiteTable& Table() {
  static SiteTable* table = new SiteTable();  // never destroyed (see the top)
  return *table;
}

// The current thread's tag (ScopedSiteTag). Whether it is non-empty is also kept in
// tls_sites.has_tag (below), which the fast path reads instead: a string thread_local's
// wrapper checks its initialization on every access.
thread_local std::string tls_tag;

// The current thread's ScopedSite stack: frames [0, min(tls_sites.depth, kMax)) are
// recorded.
// Constant-initialized and trivially destructible, so no guard and no exit-time work.
thread_local std::array<std::source_location, kMaxScopedSiteDepth> tls_frames;

// The per-thread front (see the top; its types and InternSite's hit are in site.h).
using site_internal::FrontIndex;
using site_internal::FrontKey;
using site_internal::FrontSlot;
using site_internal::kFrontSlots;
using site_internal::kHasFront;
using site_internal::tls_sites;
// Frees the front at thread exit (touched only when the front is made, so a thread
// that never interns registers nothing).
struct FrontOwner {
  bool armed = false;
  ~FrontOwner() {
    delete[] tls_sites.front;
    tls_sites.front = nullptr;
    tls_sites.front_gone = true;
  }
};
thread_local FrontOwner tls_front_owner;

}  // namespace

namespace internal {
uint64_t SiteTableLookups() { return g_table_lookups.load(std::memory_order_relaxed); }
}  // namespace internal

namespace {

// The first interning of `pointers` (or one past the index's bound): out of line, so
// that the lookup above stays small (fewer registers to save on every call).
[[gnu::noinline]] SiteId InternNotIndexed(const PointerKey& pointers, size_t hash) {
  SiteKey key{pointers.file, pointers.function, pointers.tag,
              pointers.line, pointers.column,   pointers.kind};
  if (pointers.outer_file != nullptr) {
    key.outer_file = pointers.outer_file;
    key.outer_function = pointers.outer_function;
    key.outer_line = pointers.outer_line;
    key.outer_column = pointers.outer_column;
  }
  return Table().InternAndIndex(BoundedKey(key), pointers, hash);
}

}  // namespace

namespace {

// InternSite through the pointer index (every case the front does not answer).
SiteId InternIndexed(const std::source_location& loc, SiteKind kind, std::string_view tag) {
  if (tag.empty()) tag = tls_tag;
  tag = tag.substr(0, kMaxSiteTagBytes);  // as BoundedKey cuts it, so the index hits
  PointerKey pointers{loc.file_name(), loc.function_name(), tag,
                      loc.line(),      loc.column(),        kind};
  // The outermost ScopedSite, unless it is `loc` itself (a public op that pushed its
  // caller's location and allocates at it): then the site is no chain.
  if (tls_sites.depth != 0) [[unlikely]] {
    const std::source_location& outer = tls_frames[0];
    if (outer.file_name() != loc.file_name() || outer.line() != loc.line() ||
        outer.column() != loc.column()) {
      pointers.outer_file = outer.file_name();
      pointers.outer_function = outer.function_name();
      pointers.outer_line = outer.line();
      pointers.outer_column = outer.column();
    }
  }
  const size_t hash = PointerHash(pointers);
  if (const SiteId id = Table().Find(pointers, hash); id != kUnknownSite) [[likely]] {
    return id;
  }
  return InternNotIndexed(pointers, hash);
}

// A plain intern that missed the front: the index, then the slot (making the front on
// the thread's first plain intern). Out of line, so that the hit stays a leaf.
[[gnu::noinline]] SiteId InternPlainMiss(const std::source_location& loc, SiteKind kind,
                                         uintptr_t key) {
  const SiteId id = InternIndexed(loc, kind, {});
  if (tls_sites.front == nullptr) {
    if (tls_sites.front_gone) return id;
    tls_sites.front = new (std::nothrow) FrontSlot[kFrontSlots]();
    if (tls_sites.front == nullptr) return id;  // no memory: the index serves this thread
    tls_front_owner.armed = true;         // registers its destructor (thread exit)
  }
  tls_sites.front[FrontIndex(key)] = FrontSlot{key, id};
  return id;
}

// Whether InternSite(loc, kind, tag) may be answered by the front.
bool IsPlain(std::string_view tag) {
  return kHasFront && tag.empty() && !tls_sites.has_tag && tls_sites.depth == 0;
}

}  // namespace

namespace site_internal {
// Everything but a front hit (InternSite is inline in site.h).
constinit thread_local ThreadSites tls_sites;

[[gnu::noinline]] SiteId InternSiteMiss(const std::source_location& loc, SiteKind kind,
                                        std::string_view tag) {
  if (IsPlain(tag)) return InternPlainMiss(loc, kind, FrontKey(loc, kind));
  return InternIndexed(loc, kind, tag);
}
}  // namespace site_internal

// Takes `tag` literally (an empty tag is no tag, not the thread's current tag): a
// site read back from a trace file must not pick up the reader's tag.
SiteId InternNamedSite(std::string_view file, uint32_t line, std::string_view function,
                       SiteKind kind, std::string_view tag) {
  std::string_view stable_tag;
  SiteId id = kUnknownSite;
  Table().Intern(BoundedKey(SiteKey{file, function, tag, line, /*column=*/0, kind}), &id,
                 &stable_tag);
  return id;
}

SiteId InternNamedSiteChain(std::string_view file, uint32_t line,
                            std::string_view function, SiteKind kind,
                            std::string_view tag, std::string_view outer_file,
                            uint32_t outer_line, std::string_view outer_function) {
  std::string_view stable_tag;
  SiteId id = kUnknownSite;
  SiteKey key{file, function, tag, line, /*column=*/0, kind};
  key.outer_file = outer_file;
  key.outer_function = outer_function;
  key.outer_line = outer_line;
  Table().Intern(BoundedKey(key), &id, &stable_tag);
  return id;
}

SiteInfo GetSite(SiteId id) { return Table().Get(id); }

size_t SiteCount() { return Table().Count(); }

std::string_view CurrentSiteTag() { return tls_tag; }

ScopedSiteTag::ScopedSiteTag(std::string_view tag) {
  // Copy first: `tag` may be a view of the current tag (CurrentSiteTag()).
  std::string next(tag.substr(0, kMaxSiteTagBytes));  // as interning cuts it
  previous_ = std::move(tls_tag);
  tls_tag = std::move(next);
  tls_sites.has_tag = !tls_tag.empty();
}

ScopedSiteTag::~ScopedSiteTag() {
  tls_tag = std::move(previous_);
  tls_sites.has_tag = !tls_tag.empty();
}

ScopedSite::ScopedSite(std::source_location loc) {
  if (tls_sites.depth < kMaxScopedSiteDepth) tls_frames[tls_sites.depth] = loc;
  ++tls_sites.depth;
}

ScopedSite::~ScopedSite() { --tls_sites.depth; }

size_t ScopedSiteDepth() { return tls_sites.depth; }

const std::source_location* OutermostScopedSite() {
  return tls_sites.depth == 0 ? nullptr : &tls_frames[0];
}

}  // namespace devmem
