// allocator/site.cc: the global site table and the per-thread cache in front of it.
//
// Structure:
//   * SiteTable (one per process, never destroyed so that threads still running at
//     exit can intern): a deque of SiteInfo indexed by id, and a hash map from the
//     site's identity (file, line, column, function, kind, tag) to its id. Index 0 is
//     the "<unknown>" site. A deque never moves its elements, so the map's keys are
//     string_views into the SiteInfo they name, and the per-thread cache may keep a
//     view of an interned tag without copying it.
//   * A per-thread direct-mapped cache of 64 entries keyed by the identity of the
//     source_location's strings (file and function pointers; they are static), line,
//     column, kind and tag text. A hit takes no lock and allocates nothing.
//
// Identity: the table compares strings by content, so the same place reached through
// two copies of a string literal (an inline function in two translation units) is one
// site; the cache compares file and function by pointer, which at worst costs a miss.
// Two source_locations on one line with different columns are different sites (their
// SiteInfo reads the same, since it has no column). Tags are compared by text: two
// tags with equal text are one site.
//
// Thread-safety: the table is guarded by one SharedMutex (allocator/mutex.h), a leaf
// lock (nothing else is acquired while it is held). Lookups take it shared; inserts take it exclusively.
// GetSite copies the SiteInfo under the shared lock: it returns by value, and indexing
// the deque while another thread appends would race. The cache and the current tag are
// thread_local and touched only by their thread.
#include "allocator/site.h"

#include <array>
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
  absl::StrAppend(&out, file);
  if (line != 0) absl::StrAppend(&out, ":", line);
  absl::StrAppend(&out, " (", std::string(SiteKindName(kind)), ")");
  return out;
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

  friend bool operator==(const SiteKey&, const SiteKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const SiteKey& k) {
    return H::combine(std::move(h), k.file, k.function, k.tag, k.line, k.column,
                      k.kind);
  }
};

SiteInfo UnknownSiteInfo() { return SiteInfo{"<unknown>", 0, "", "", SiteKind::kAlloc}; }

class SiteTable {
 public:
  SiteTable() { sites_.push_back(UnknownSiteInfo()); }

  // Returns the id of `key`, adding it if new. `*stable_tag` is set to a view of the
  // tag text that lives as long as the process.
  SiteId Intern(const SiteKey& key, std::string_view* stable_tag)
      ABSL_LOCKS_EXCLUDED(mu_) {
    {
      ReaderLock lock(&mu_);
      if (auto it = ids_.find(key); it != ids_.end()) {
        *stable_tag = it->first.tag;
        return it->second;
      }
    }
    WriterLock lock(&mu_);
    if (auto it = ids_.find(key); it != ids_.end()) {  // another thread won the race
      *stable_tag = it->first.tag;
      return it->second;
    }
    const SiteId id = static_cast<SiteId>(sites_.size());
    const SiteInfo& info = sites_.emplace_back(SiteInfo{std::string(key.file), key.line,
                                                        std::string(key.function),
                                                        std::string(key.tag), key.kind});
    SiteKey stable{info.file, info.function, info.tag, key.line, key.column, key.kind};
    ids_.emplace(stable, id);
    *stable_tag = info.tag;
    return id;
  }

  SiteInfo Get(SiteId id) const ABSL_LOCKS_EXCLUDED(mu_) {
    ReaderLock lock(&mu_);
    if (id >= sites_.size()) return sites_[kUnknownSite];
    return sites_[id];
  }

  size_t Count() const ABSL_LOCKS_EXCLUDED(mu_) {
    ReaderLock lock(&mu_);
    return sites_.size();
  }

 private:
  mutable SharedMutex mu_;
  std::deque<SiteInfo> sites_ ABSL_GUARDED_BY(mu_);  // index == id; never shrinks
  absl::flat_hash_map<SiteKey, SiteId> ids_ ABSL_GUARDED_BY(mu_);
};

SiteTable& Table() {
  static SiteTable* table = new SiteTable();  // never destroyed (see the top)
  return *table;
}

// One entry of the per-thread cache. Trivially destructible and constant-initialized,
// so the thread_local array needs neither a guard nor an exit-time destructor.
struct CacheEntry {
  const char* file = nullptr;
  const char* function = nullptr;
  std::string_view tag;  // a view into the table: stable for the process's life
  uint32_t line = 0;
  uint32_t column = 0;
  SiteKind kind = SiteKind::kAlloc;
  SiteId id = kUnknownSite;  // kUnknownSite marks an empty entry
};
constexpr size_t kCacheEntries = 64;  // a power of two
thread_local std::array<CacheEntry, kCacheEntries> tls_cache;

// The current thread's tag (ScopedSiteTag).
thread_local std::string tls_tag;

size_t CacheSlot(const std::source_location& loc, SiteKind kind, std::string_view tag) {
  uint64_t h = reinterpret_cast<uintptr_t>(loc.file_name());
  h ^= (uint64_t{loc.line()} << 32) ^ (uint64_t{loc.column()} << 8) ^
       static_cast<uint64_t>(kind);
  if (!tag.empty()) h ^= std::hash<std::string_view>{}(tag);
  // A 64-bit finalizer (from MurmurHash3) so that nearby lines spread over the slots.
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return static_cast<size_t>(h & (kCacheEntries - 1));
}

}  // namespace

SiteId InternSite(const std::source_location& loc, SiteKind kind, std::string_view tag) {
  if (tag.empty()) tag = tls_tag;
  CacheEntry& entry = tls_cache[CacheSlot(loc, kind, tag)];
  if (entry.id != kUnknownSite && entry.file == loc.file_name() &&
      entry.line == loc.line() && entry.column == loc.column() &&
      entry.function == loc.function_name() && entry.kind == kind && entry.tag == tag) {
    return entry.id;
  }
  std::string_view stable_tag;
  SiteId id = Table().Intern(SiteKey{loc.file_name(), loc.function_name(), tag,
                                     loc.line(), loc.column(), kind},
                             &stable_tag);
  entry = CacheEntry{loc.file_name(), loc.function_name(), stable_tag,
                     loc.line(),      loc.column(),        kind,
                     id};
  return id;
}

// Takes `tag` literally (an empty tag is no tag, not the thread's current tag): a
// site read back from a trace file must not pick up the reader's tag.
SiteId InternNamedSite(std::string_view file, uint32_t line, std::string_view function,
                       SiteKind kind, std::string_view tag) {
  std::string_view stable_tag;
  return Table().Intern(SiteKey{file, function, tag, line, /*column=*/0, kind},
                        &stable_tag);
}

SiteInfo GetSite(SiteId id) { return Table().Get(id); }

size_t SiteCount() { return Table().Count(); }

std::string_view CurrentSiteTag() { return tls_tag; }

ScopedSiteTag::ScopedSiteTag(std::string_view tag) {
  // Copy first: `tag` may be a view of the current tag (CurrentSiteTag()).
  std::string next(tag);
  previous_ = std::move(tls_tag);
  tls_tag = std::move(next);
}

ScopedSiteTag::~ScopedSiteTag() { tls_tag = std::move(previous_); }

}  // namespace devmem
