// allocator/site.h: call sites, interned to small integers once.
//
// A site says where an allocation was asked for: file, line and function (from
// std::source_location), an optional tag, and a kind (plain alloc, or one of the
// explicit copies: clone, contiguous, to_device; or arena). Public entry points take
// `std::source_location loc = std::source_location::current()` and intern it here, so
// that stats, snapshots, metrics and OOM reports can name the code responsible.
//
// A site may be a short chain: when the allocation is made under a ScopedSite (a
// library function or a layer pushed the frame of the user's call), the site also
// records the OUTERMOST pushed frame (`outer_*`), so a clone inside a library helper
// names both the helper's line and the user's line that led there.
//
// Cost: interning a known site is a read-only lookup. A plain one (no tag, no
// ScopedSite frame: nearly every allocation) is found in a per-thread direct-mapped
// cache keyed by the source_location's identity (one load and one compare, no string
// hashed); the rest, and a plain site the thread's cache does not hold, in a lock-free,
// process-wide index keyed by the identity of the source_location's strings (they are
// static) and of the outer frame's, so hundreds of hot sites cost what one does; the
// global table, under a mutex, is reached only the first time a site is interned
// (site.cc). SiteId 0 is "unknown".
//
// Thread-safety: every function here may be called from any thread at any time. Site
// ids are never reused; SiteInfo for an id never changes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace devmem {

using SiteId = uint32_t;
inline constexpr SiteId kUnknownSite = 0;

// Bounds on what one process's sites may hold. A tag is cut to kMaxSiteTagBytes and a
// file or function name to kMaxSiteNameBytes (tags that agree in their first
// kMaxSiteTagBytes bytes are one site). The table holds at most kMaxSites ids: once it
// is full, every new site is the one site whose file is kOtherSiteFile (tag "other"),
// and stderr says so once.
inline constexpr size_t kMaxSiteTagBytes = 256;
inline constexpr size_t kMaxSiteNameBytes = 4096;
inline constexpr size_t kMaxSites = 16384;
inline constexpr std::string_view kOtherSiteFile = "<other>";

enum class SiteKind : uint8_t {
  kAlloc = 0,       // plain creation (empty, zeros, op outputs, raw allocate)
  kClone = 1,       // Tensor::clone
  kContiguous = 2,  // Tensor::contiguous when it had to copy
  kToDevice = 3,    // Tensor::to(device)
  kArena = 4,       // a chunk taken by an arena
};
inline constexpr int kNumSiteKinds = 5;
std::string_view SiteKindName(SiteKind kind);
// True for the kinds that are explicit copies (clone, contiguous, to_device).
inline bool IsCopyKind(SiteKind kind) {
  return kind == SiteKind::kClone || kind == SiteKind::kContiguous ||
         kind == SiteKind::kToDevice;
}

// Every string of a SiteInfo is valid UTF-8: bytes of the caller's text that were not
// are replaced by U+FFFD when the site is interned.
struct SiteInfo {
  std::string file;      // as the compiler spelled it
  uint32_t line = 0;
  std::string function;  // the compiler's pretty name
  std::string tag;       // "" when none
  SiteKind kind = SiteKind::kAlloc;
  // The outermost ScopedSite frame active when the site was interned, when it differs
  // from (file, line): the user's call that led to this allocation. "" / 0 when none.
  std::string outer_file = {};
  uint32_t outer_line = 0;
  std::string outer_function = {};

  bool has_outer() const { return !outer_file.empty(); }
  // "tensor/tensor.cc:120 (clone)", "optimizer @ train.cc:40 (alloc)", or with an
  // outer frame "train.cc:12 > lib/helpers.cc:30 (clone)" (outermost first).
  std::string ToString() const;
};

// The one rule of a site filter (/debug/buffers?site=, memtrace buffers/diff --site):
// `needle` is a substring of the site's text (`where`: SiteInfo::ToString's
// "tag @ file:line (kind)"), of "file:line", or of the function name. An empty needle
// matches every site. Taking the parts lets the runtime (SiteInfo) and memtrace (a
// site read from a snapshot) share it.
bool SiteTextMatches(std::string_view where, std::string_view file, uint32_t line,
                     std::string_view function, std::string_view needle);

namespace site_internal {
// InternSite's per-thread front (allocator/site.cc has the design): a direct-mapped
// array of kFrontSlots (source_location identity + kind + 1) -> id. The records a
// std::source_location points at are pointer-aligned, so the low three bits are free
// and a used slot's key is never 0, which an empty slot reads. Only its thread reads
// or writes it.
inline constexpr bool kHasFront = sizeof(std::source_location) == sizeof(uintptr_t) &&
                                  std::is_trivially_copyable_v<std::source_location> &&
                                  alignof(void*) >= 8 && kNumSiteKinds < 8;
inline constexpr size_t kFrontSlots = 1024;  // a power of two; 16 KiB per thread
struct FrontSlot {
  uintptr_t key = 0;
  SiteId id = kUnknownSite;
};
// What InternSite's fast path reads, in one thread_local (one TLS address: in a shared
// library each is a __tls_get_addr call). Constant-initialized, trivially destructible.
// Defined in site.cc, which alone writes it (on the thread it belongs to).
struct ThreadSites {
  FrontSlot* front = nullptr;  // null until the thread's first plain intern
  size_t depth = 0;            // ScopedSite frames live (recorded or not)
  bool has_tag = false;        // the thread's ScopedSiteTag is not empty
  // Set at thread exit once the front is freed: later interns (from other thread_local
  // destructors) take the index and make no new front.
  bool front_gone = false;
};
extern constinit thread_local ThreadSites tls_sites;
// (Copied, not bit_cast: well-formed whatever the layout; with kHasFront it is the one
// pointer std::source_location holds.)
inline uintptr_t FrontKey(const std::source_location& loc, SiteKind kind) {
  uintptr_t identity = 0;
  std::memcpy(&identity, &loc, std::min(sizeof(identity), sizeof(loc)));
  return identity + static_cast<uintptr_t>(kind) + 1;
}
inline size_t FrontIndex(uintptr_t key) { return (key >> 3) & (kFrontSlots - 1); }
// Everything but a front hit, with InternSite's own arguments (out of line).
SiteId InternSiteMiss(const std::source_location& loc, SiteKind kind,
                      std::string_view tag);
}  // namespace site_internal

// Interns (loc, kind, tag). The same arguments always give the same id.
//
// Inline: a plain intern of a site this thread's front holds (nearly every call) is
// three thread-local loads, two compares and a load, at the call site, where `loc` is
// a constant; out of line it paid a call and a frame (four registers pushed and
// popped around the TLS read, which is a call in -fPIC code): about 20 of its 34
// instructions. The tag is tested before the thread_local is read, and dropped (an
// empty tag is no tag whatever its pointer).
inline SiteId InternSite(const std::source_location& loc, SiteKind kind,
                         std::string_view tag = {}) {
  if (site_internal::kHasFront && tag.empty()) [[likely]] {
    const site_internal::ThreadSites& t = site_internal::tls_sites;
    if (!t.has_tag && t.depth == 0 && t.front != nullptr) [[likely]] {
      const uintptr_t key = site_internal::FrontKey(loc, kind);
      const site_internal::FrontSlot& slot = t.front[site_internal::FrontIndex(key)];
      if (slot.key == key) [[likely]] return slot.id;
    }
    return site_internal::InternSiteMiss(loc, kind, {});
  }
  return site_internal::InternSiteMiss(loc, kind, tag);
}
// Interns a site that has no source location (for example one read from a trace
// file, or a C caller that passes a name). No ScopedSite frame is added.
SiteId InternNamedSite(std::string_view file, uint32_t line, std::string_view function,
                       SiteKind kind, std::string_view tag = {});
// The same with an outer frame (a site read back from a snapshot that had one).
SiteId InternNamedSiteChain(std::string_view file, uint32_t line,
                            std::string_view function, SiteKind kind,
                            std::string_view tag, std::string_view outer_file,
                            uint32_t outer_line, std::string_view outer_function);

// The site for an id; id 0 and unknown ids give {"<unknown>", 0, "", "", kAlloc}.
SiteInfo GetSite(SiteId id);
// Number of ids handed out so far, plus one for kUnknownSite.
size_t SiteCount();

namespace internal {
// How many InternSite/InternNamedSite calls reached the table (its lock) since the
// process started: for tests that check a known site is a read-only lookup.
uint64_t SiteTableLookups();
}  // namespace internal

// The current thread's tag: InternSite calls with an empty tag use it. Set through
// ScopedSiteTag; "" when none.
std::string_view CurrentSiteTag();

// Names the allocations made on this thread while it lives (nesting restores the outer
// tag on destruction). Not copyable or movable: it restores a thread-local on
// destruction, so it must die on the thread and in the scope that made it.
class ScopedSiteTag {
 public:
  explicit ScopedSiteTag(std::string_view tag);
  ~ScopedSiteTag();
  ScopedSiteTag(const ScopedSiteTag&) = delete;
  ScopedSiteTag& operator=(const ScopedSiteTag&) = delete;

 private:
  std::string previous_;
};

// The name programs use: `ScopedTag tag("optimizer");` names every allocation this
// thread makes until `tag` dies.
using ScopedTag = ScopedSiteTag;

// Most ScopedSite frames one thread records; deeper pushes are counted (so pops match)
// but not recorded. Only the outermost frame enters a site, so the bound costs nothing
// that is reported.
inline constexpr size_t kMaxScopedSiteDepth = 16;

// An attribution frame: while it lives, every site this thread interns through
// InternSite also records the OUTERMOST live ScopedSite's location (SiteInfo::outer_*),
// unless that is the allocation's own location. Libraries push it at their public
// entry points with the caller's location:
//
//   Tensor MyLayer(const Tensor& x,
//                  std::source_location loc = std::source_location::current()) {
//     ScopedSite frame(loc);   // allocations below name the user's line too
//     return relu(matmul(x, w_)).clone();
//   }
//
// and a user may push one around a call into code that does not forward locations.
// Cost: a thread-local store on construction and destruction; none on interning when
// no frame is live. Not copyable or movable: it pops a thread-local stack, so it must
// die on the thread and in the scope that made it (strictly nested, as RAII gives).
class ScopedSite {
 public:
  explicit ScopedSite(std::source_location loc = std::source_location::current());
  ~ScopedSite();
  ScopedSite(const ScopedSite&) = delete;
  ScopedSite& operator=(const ScopedSite&) = delete;
};

// The number of ScopedSite frames live on this thread (including unrecorded ones
// beyond kMaxScopedSiteDepth), and the outermost one (nullptr when none).
size_t ScopedSiteDepth();
const std::source_location* OutermostScopedSite();

}  // namespace devmem
