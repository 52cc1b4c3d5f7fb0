// tools/inspect/site_usage.cc: filtering, grouping and diffing of live buffers (see
// tools/inspect/site_usage.h). Site matches are decided once per site id, not per buffer: a
// snapshot has 10^6 buffers but few sites.
#include "tools/inspect/site_usage.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "allocator/site.h"

namespace devmem::memtrace {
namespace {

// Decides, once per site id, whether a buffer of that site passes the site filter.
class SiteFilter {
 public:
  SiteFilter(const Snapshot& snap, const std::string& needle) : snap_(snap), needle_(needle) {}
  bool Pass(uint32_t id) {
    if (needle_.empty()) return true;
    auto it = cache_.find(id);
    if (it == cache_.end()) it = cache_.emplace(id, SiteMatches(snap_.Site(id), needle_)).first;
    return it->second;
  }

 private:
  const Snapshot& snap_;
  const std::string& needle_;
  std::unordered_map<uint32_t, bool> cache_;
};

template <typename Fn>
void ForEachLive(const Snapshot& snap, const BufferQuery& query, Fn fn) {
  SiteFilter filter(snap, query.site);
  for (const SnapDevice& d : snap.devices) {
    if (!query.device.empty() && d.device != query.device) continue;
    for (const SnapBlock& b : d.blocks) {
      if (b.state != BlockKind::kAllocated || b.size < query.min_bytes) continue;
      if (!filter.Pass(b.site)) continue;
      fn(d, b);
    }
  }
}

}  // namespace

std::vector<StackGroup> GroupByStack(const Snapshot& snap, const BufferQuery& query) {
  SiteFilter filter(snap, query.site);
  std::vector<StackGroup> out;
  for (const SnapDevice& d : snap.devices) {
    if (!query.device.empty() && d.device != query.device) continue;
    std::map<uint32_t, size_t> index;  // stack id -> row in `out`
    // "sampled_stacks" is largest estimate first, so each row's sites come in that order.
    for (const SnapStack& g : d.stacks) {
      if (!filter.Pass(g.site)) continue;
      auto [it, inserted] = index.emplace(g.stack, out.size());
      if (inserted) {
        out.push_back(StackGroup{});
        out.back().device = &d;
        out.back().stack = g.stack;
        out.back().frames = &g.frames;
      }
      StackGroup& row = out[it->second];
      row.samples += g.samples;
      row.sampled_bytes += g.sampled_bytes;
      row.estimated_bytes += g.estimated_bytes;
      row.sites.push_back(g.site);
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const StackGroup& x, const StackGroup& y) {
    if (x.estimated_bytes != y.estimated_bytes) return x.estimated_bytes > y.estimated_bytes;
    if (x.device != y.device) return x.device < y.device;
    return x.stack < y.stack;
  });
  return out;
}

bool SiteMatches(const SnapSite& site, const std::string& needle) {
  // The runtime's rule (allocator/site.h), so that --site and /debug/buffers?site= pick
  // the same buffers.
  return SiteTextMatches(site.where, site.file, site.line, site.function, needle);
}

std::vector<BufferRef> ListBuffers(const Snapshot& snap, const BufferQuery& query,
                                   BufferTotals* totals) {
  std::vector<BufferRef> out;
  BufferTotals t;
  ForEachLive(snap, query, [&](const SnapDevice& d, const SnapBlock& b) {
    out.push_back({&d, &b});
    ++t.matched;
    t.matched_bytes += b.size;
    if (snap.Site(b.site).copy) t.copy_bytes += b.size;
  });
  // Devices and blocks are stored in file order, so pointer order is device order,
  // then segment (address) order.
  std::sort(out.begin(), out.end(), [](const BufferRef& x, const BufferRef& y) {
    if (x.block->size != y.block->size) return x.block->size > y.block->size;
    if (x.device != y.device) return x.device < y.device;
    return x.block->addr < y.block->addr;
  });
  if (totals != nullptr) *totals = t;
  return out;
}

std::vector<SiteGroup> GroupBySite(const Snapshot& snap, const BufferQuery& query,
                                   BufferTotals* totals) {
  std::map<std::pair<const SnapDevice*, uint32_t>, SiteGroup> groups;
  std::map<std::pair<const SnapDevice*, uint32_t>, std::set<std::string>> shapes;
  BufferTotals t;
  // The last group touched: buffers of one site often come in runs.
  std::pair<const SnapDevice*, uint32_t> last_key{nullptr, 0};
  SiteGroup* last = nullptr;
  ForEachLive(snap, query, [&](const SnapDevice& d, const SnapBlock& b) {
    const std::pair<const SnapDevice*, uint32_t> key{&d, b.site};
    if (last == nullptr || key != last_key) {
      last = &groups[key];
      last_key = key;
      if (last->device == nullptr) {
        last->device = &d;
        last->site = b.site;
      }
    }
    SiteGroup& g = *last;
    ++g.count;
    g.bytes += b.size;
    g.requested += b.requested;
    if (b.has_age) g.oldest_age_ns = std::max(g.oldest_age_ns, b.age_ns);
    if (b.tensor >= 0) {
      const TensorInfo& ti = d.tensors[static_cast<size_t>(b.tensor)];
      const int64_t rc = static_cast<int64_t>(ti.refcount);
      g.min_refcount = g.min_refcount < 0 ? rc : std::min(g.min_refcount, rc);
      g.max_refcount = std::max(g.max_refcount, rc);
      std::set<std::string>& seen = shapes[key];
      if (seen.size() <= 3) seen.insert(ti.dtype + ti.shape);
    }
    ++t.matched;
    t.matched_bytes += b.size;
  });
  std::vector<SiteGroup> out;
  out.reserve(groups.size());
  for (auto& [key, g] : groups) {
    if (snap.Site(g.site).copy) g.copy_bytes = g.bytes;
    t.copy_bytes += g.copy_bytes;
    if (g.device->total_bytes > 0) {
      g.device_share = static_cast<double>(g.bytes) / static_cast<double>(g.device->total_bytes);
    }
    if (auto it = shapes.find(key); it != shapes.end()) {
      size_t n = 0;
      for (const std::string& s : it->second) {
        if (n++ == 3) {
          g.shapes += " ...";
          break;
        }
        if (!g.shapes.empty()) g.shapes += ' ';
        g.shapes += s;
      }
    }
    out.push_back(std::move(g));
  }
  std::sort(out.begin(), out.end(), [](const SiteGroup& x, const SiteGroup& y) {
    return std::make_tuple(y.bytes, y.count, x.device, x.site) <
           std::make_tuple(x.bytes, x.count, y.device, y.site);
  });
  if (totals != nullptr) *totals = t;
  return out;
}

std::vector<SiteDelta> DiffSites(const Snapshot& a, const Snapshot& b, const BufferQuery& query,
                                 DiffTotals* totals) {
  std::map<std::pair<std::string, std::string>, SiteDelta> rows;
  auto add = [&](const Snapshot& snap, bool is_b) {
    for (const SiteGroup& g : GroupBySite(snap, query, nullptr)) {
      const SnapSite& site = snap.Site(g.site);
      SiteDelta& row = rows[{g.device->device, site.where}];
      row.device = g.device->device;
      row.where = site.where;
      row.copy = site.copy;
      (is_b ? row.bytes_b : row.bytes_a) += g.bytes;
      (is_b ? row.count_b : row.count_a) += g.count;
    }
  };
  add(a, false);
  add(b, true);
  DiffTotals t;
  std::vector<SiteDelta> out;
  for (auto& [key, row] : rows) {
    t.bytes_a += row.bytes_a;
    t.bytes_b += row.bytes_b;
    if (row.bytes_b > row.bytes_a) {
      t.grew_bytes += row.bytes_b - row.bytes_a;
      ++t.grew_sites;
    } else if (row.bytes_b < row.bytes_a) {
      t.shrank_bytes += row.bytes_a - row.bytes_b;
      ++t.shrank_sites;
    } else if (row.count_a == row.count_b) {
      ++t.unchanged_sites;
      continue;
    }
    out.push_back(std::move(row));
  }
  auto magnitude = [](const SiteDelta& d) {
    return d.bytes_b > d.bytes_a ? d.bytes_b - d.bytes_a : d.bytes_a - d.bytes_b;
  };
  std::sort(out.begin(), out.end(), [&](const SiteDelta& x, const SiteDelta& y) {
    if (magnitude(x) != magnitude(y)) return magnitude(x) > magnitude(y);
    const bool xg = x.bytes_b > x.bytes_a, yg = y.bytes_b > y.bytes_a;
    if (xg != yg) return xg;
    return std::tie(x.device, x.where) < std::tie(y.device, y.where);
  });
  if (totals != nullptr) *totals = t;
  return out;
}

}  // namespace devmem::memtrace
