// tools/inspect/site_usage.h: who holds the memory in a snapshot: live buffers filtered,
// grouped by (device, site) or listed one by one, and the per-site difference between
// two snapshots. Pure functions of memtrace's Snapshot (tools/snapshot/snapshot_reader.h), so
// the tests drive them without files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/snapshot/snapshot_reader.h"

namespace devmem::memtrace {

struct BufferQuery {
  std::string device;        // "" = every device, else "sim:0"
  std::string site;          // "" = every site, else a substring of the site's text
  uint64_t min_bytes = 0;    // buffers smaller than this are left out
};

// A live buffer: the device it is on and its block.
struct BufferRef {
  const SnapDevice* device;
  const SnapBlock* block;
};

// One row of `buffers` (grouped): a site's live buffers on one device.
struct SiteGroup {
  const SnapDevice* device = nullptr;
  uint32_t site = 0;
  uint64_t count = 0, bytes = 0, requested = 0;
  uint64_t copy_bytes = 0;     // bytes of explicit copies (site kind clone/contiguous/to)
  double device_share = 0;     // bytes / the device's total bytes (0 when unknown)
  int64_t oldest_age_ns = -1;  // -1: no buffer has an age
  int64_t min_refcount = -1, max_refcount = -1;  // -1: no buffer is annotated
  std::string shapes;          // distinct "dtype[shape]" seen, at most 3 then "...";
                               // "" when no buffer is annotated
};

struct BufferTotals {
  uint64_t matched = 0, matched_bytes = 0, copy_bytes = 0;
};

// True when the buffer's site matches `query.site` (substring of "where", of
// "file:line", or of the function name): allocator/site.h's SiteTextMatches, the rule
// of /debug/buffers?site= too.
bool SiteMatches(const SnapSite& site, const std::string& needle);

// Live buffers passing `query`, largest first (ties: device order, then address).
std::vector<BufferRef> ListBuffers(const Snapshot& snap, const BufferQuery& query,
                                   BufferTotals* totals);

// The same, grouped by (device, site), largest bytes first (ties: more buffers, then
// device order, then site id).
std::vector<SiteGroup> GroupBySite(const Snapshot& snap, const BufferQuery& query,
                                   BufferTotals* totals);

// One row of `buffers --stacks`: a sampled stack's live samples on one device, summed
// over the sites they were allocated for ("sampled_stacks" groups by (site, stack)).
struct StackGroup {
  const SnapDevice* device = nullptr;
  uint32_t stack = 0;
  uint64_t samples = 0, sampled_bytes = 0;
  double estimated_bytes = 0;  // the estimate of the live bytes allocated from it
  std::vector<uint32_t> sites;  // the sites of its samples, largest estimate first
  const std::vector<std::string>* frames = nullptr;  // the first group's (one stack)
};

// The sampled stacks of the devices `query` selects, counting only groups whose site
// matches query.site (min_bytes does not apply: a group is an estimate, not a buffer),
// aggregated by (device, stack), largest estimate first (ties: device order, then
// stack id).
std::vector<StackGroup> GroupByStack(const Snapshot& snap, const BufferQuery& query);

// b - a as a signed number, saturated at the int64 range (hostile snapshots can hold
// sums near 2^64, where a plain signed subtraction overflows).
inline int64_t SignedDelta(uint64_t a, uint64_t b) {
  constexpr uint64_t kMax = static_cast<uint64_t>(INT64_MAX);
  if (b >= a) return static_cast<int64_t>(b - a > kMax ? kMax : b - a);
  return a - b > kMax ? INT64_MIN : -static_cast<int64_t>(a - b);
}

// One row of `diff`: a site's live bytes and counts in A and in B. Sites are matched by
// their text ("where") and device, not by id: ids are per process.
struct SiteDelta {
  std::string device, where;
  bool copy = false;
  uint64_t bytes_a = 0, bytes_b = 0, count_a = 0, count_b = 0;
  int64_t delta_bytes() const { return SignedDelta(bytes_a, bytes_b); }
  int64_t delta_count() const { return SignedDelta(count_a, count_b); }
};

struct DiffTotals {
  uint64_t bytes_a = 0, bytes_b = 0;
  uint64_t grew_bytes = 0, shrank_bytes = 0;  // sums of positive / negative deltas
  uint64_t grew_sites = 0, shrank_sites = 0, unchanged_sites = 0;
};

// Per-site changes from `a` to `b`, the largest absolute byte change first (ties:
// growth first, then by where). Sites whose bytes and counts did not change are left
// out (counted in totals->unchanged_sites).
std::vector<SiteDelta> DiffSites(const Snapshot& a, const Snapshot& b, const BufferQuery& query,
                                 DiffTotals* totals);

}  // namespace devmem::memtrace
