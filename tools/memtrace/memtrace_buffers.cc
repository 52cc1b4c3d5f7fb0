// tools/memtrace/memtrace_buffers.cc: `memtrace buffers SOURCE`: who holds the memory right now.
// SOURCE is a running process (http://HOST:PORT, its /debug/snapshot) or a snapshot
// file. Live buffers grouped by site (default) or one by one (--list), largest first,
// with the share of the device, the bytes made by explicit copies (clone, contiguous,
// to), ages, and tensor refcounts/shapes where the snapshot has them ('-' otherwise).
// --stacks adds the sampled stacks (allocator/stack_sampler.h): each listed buffer's
// stack id where it was sampled, and the stacks by estimated live bytes with frames.
#include <cstdio>
#include <memory>
#include <string>

#include "allocator/config.h"
#include "nlohmann/json.hpp"
#include "tools/inspect/inspect_format.h"
#include "tools/memtrace/memtrace_commands.h"
#include "tools/inspect/site_usage.h"
#include "tools/memtrace/snapshot_source.h"

namespace devmem::memtrace {
namespace {

using ojson = nlohmann::ordered_json;

struct BuffersOptions {
  std::string source, token_file, device, site, min_bytes;
  size_t top = 20;
  bool list = false, json = false, stacks = false;
};

constexpr size_t kStackFramesShown = 16;  // frames printed per stack (JSON has all)

std::string StackText(uint32_t stack) { return stack == 0 ? "-" : std::to_string(stack); }

ojson StacksJson(const Snapshot& snap, const BufferQuery& q, size_t top) {
  ojson rows = ojson::array();
  const std::vector<StackGroup> groups = GroupByStack(snap, q);
  for (size_t i = 0; i < std::min(top, groups.size()); ++i) {
    const StackGroup& g = groups[i];
    ojson sites = ojson::array();
    for (uint32_t site : g.sites) sites.push_back(ojson{{"site", site}, {"where", snap.Site(site).where}});
    rows.push_back(ojson{{"device", g.device->device}, {"stack", g.stack},
                         {"samples", g.samples}, {"sampled_bytes", g.sampled_bytes},
                         {"estimated_bytes", g.estimated_bytes},
                         {"stack_sample_bytes", g.device->stack_sample_bytes},
                         {"sites", std::move(sites)}, {"frames", *g.frames}});
  }
  return rows;
}

// The sampled stacks holding the most estimated live bytes, with their frames.
void PrintStacks(const Snapshot& snap, const BufferQuery& q, size_t top) {
  const std::vector<StackGroup> groups = GroupByStack(snap, q);
  if (groups.empty()) {
    std::printf("\nno sampled stacks (sampling off, nothing live sampled, or a snapshot "
                "older than sampled stacks)\n");
    return;
  }
  const size_t n = std::min(top, groups.size());
  std::printf("\nsampled stacks by estimated live bytes: %zu of %zu\n", n, groups.size());
  for (size_t i = 0; i < n; ++i) {
    const StackGroup& g = groups[i];
    std::string sites;
    for (uint32_t site : g.sites) sites += (sites.empty() ? "" : "; ") + snap.Site(site).where;
    std::printf("%3zu. %s  ~%s estimated (%llu %s of %s; one per %s allocated)  stack %u  %s\n",
                i + 1, g.device->device.c_str(),
                Bytes(static_cast<uint64_t>(g.estimated_bytes)).c_str(),
                static_cast<unsigned long long>(g.samples), g.samples == 1 ? "sample" : "samples",
                Bytes(g.sampled_bytes).c_str(), Bytes(g.device->stack_sample_bytes).c_str(),
                g.stack, sites.c_str());
    const size_t shown = std::min(g.frames->size(), kStackFramesShown);
    for (size_t f = 0; f < shown; ++f) std::printf("       %s\n", (*g.frames)[f].c_str());
    if (shown < g.frames->size()) {
      std::printf("       ... %zu more frames\n", g.frames->size() - shown);
    }
  }
}

// The live buffers of scoped arenas on the selected devices, largest first.
std::vector<std::pair<const SnapDevice*, const SnapArenaBuffer*>> ArenaBuffers(
    const Snapshot& snap, const BufferQuery& q) {
  std::vector<std::pair<const SnapDevice*, const SnapArenaBuffer*>> out;
  for (const SnapDevice& d : snap.devices) {
    if (!q.device.empty() && d.device != q.device) continue;
    for (const SnapArenaBuffer& b : d.arena_buffers) {
      if (b.size < q.min_bytes) continue;
      if (!q.site.empty() && snap.Site(b.site).where.find(q.site) == std::string::npos) continue;
      out.emplace_back(&d, &b);
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& x, const auto& y) {
    return x.second->size > y.second->size;
  });
  return out;
}

ojson ArenaBuffersJson(const Snapshot& snap, const BufferQuery& q, size_t top) {
  ojson rows = ojson::array();
  const auto buffers = ArenaBuffers(snap, q);
  for (size_t i = 0; i < std::min(top, buffers.size()); ++i) {
    const SnapArenaBuffer& b = *buffers[i].second;
    rows.push_back(ojson{{"device", buffers[i].first->device}, {"arena", b.arena},
                         {"addr", b.addr}, {"size", b.size}, {"chunk", b.chunk},
                         {"escaped", b.escaped}, {"site", b.site},
                         {"where", snap.Site(b.site).where}});
  }
  return rows;
}

// Scoped arenas' buffers sit inside chunk blocks (sites of kind arena) of the tables
// above; this one says which arena holds what, and what escaped its scope.
void PrintArenaBuffers(const Snapshot& snap, const BufferQuery& q, size_t top) {
  const auto buffers = ArenaBuffers(snap, q);
  if (buffers.empty()) return;
  uint64_t bytes = 0, escaped = 0;
  for (const auto& [d, b] : buffers) {
    bytes += b->size;
    if (b->escaped) escaped += b->size;
  }
  const size_t n = std::min(top, buffers.size());
  std::printf("\narena buffers (inside the arena chunks above), largest first: %zu of %zu "
              "(%s; %s escaped their scope)\n",
              n, buffers.size(), Bytes(bytes).c_str(), Bytes(escaped).c_str());
  TextTable t({"<DEVICE", "<ARENA", "<ADDRESS", "SIZE", "<ESCAPED", "<SITE"});
  for (size_t i = 0; i < n; ++i) {
    const SnapArenaBuffer& b = *buffers[i].second;
    char addr[24];
    std::snprintf(addr, sizeof(addr), "0x%llx", static_cast<unsigned long long>(b.addr));
    t.Add({buffers[i].first->device, b.arena, addr, Bytes(b.size), b.escaped ? "yes" : "no",
           snap.Site(b.site).where});
  }
  std::printf("%s", t.Render().c_str());
}

ojson DevicesJson(const Snapshot& snap) {
  ojson devices = ojson::array();
  for (const SnapDevice& d : snap.devices) {
    devices.push_back(ojson{{"device", d.device},
                            {"total_bytes", d.total_bytes},
                            {"free_bytes", d.free_bytes},
                            {"allocated_bytes", d.allocated_bytes},
                            {"reserved_bytes", d.reserved_bytes}});
  }
  return devices;
}

std::string RefcountText(int64_t lo, int64_t hi) {
  if (lo < 0) return "-";
  return lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi);
}

void PrintDevices(const Snapshot& snap, const std::string& only) {
  TextTable t({"<DEVICE", "TOTAL", "DRIVER FREE", "ALLOCATED", "RESERVED", "<NAME"});
  for (const SnapDevice& d : snap.devices) {
    if (!only.empty() && d.device != only) continue;
    t.Add({d.device, Bytes(d.total_bytes), Bytes(d.free_bytes),
           Bytes(static_cast<uint64_t>(std::max<int64_t>(0, d.allocated_bytes))),
           Bytes(static_cast<uint64_t>(std::max<int64_t>(0, d.reserved_bytes))), d.name});
  }
  std::printf("%s", t.Render().c_str());
}

int RunBuffers(const BuffersOptions& o) {
  BufferQuery q;
  q.device = o.device;
  q.site = o.site;
  if (!o.min_bytes.empty()) {
    absl::StatusOr<size_t> n = ParseSize(o.min_bytes);
    if (!n.ok()) {
      std::fprintf(stderr, "memtrace buffers: --min-bytes \"%s\": %s\n", o.min_bytes.c_str(),
                   std::string(n.status().message()).c_str());
      return kExitBadInput;
    }
    q.min_bytes = *n;
  }
  LoadedSnapshot loaded;
  if (int rc = LoadSnapshot("buffers", o.source, o.token_file, &loaded); rc != kExitOk) return rc;
  const Snapshot& snap = loaded.snap;
  if (!o.device.empty()) {
    bool found = false;
    for (const SnapDevice& d : snap.devices) found = found || d.device == o.device;
    if (!found) {
      std::string names;
      for (const SnapDevice& d : snap.devices) names += (names.empty() ? "" : ", ") + d.device;
      std::fprintf(stderr, "memtrace buffers: --device %s: not in %s (it has: %s)\n",
                   o.device.c_str(), o.source.c_str(), names.empty() ? "none" : names.c_str());
      return kExitBadInput;
    }
  }
  const size_t top = o.top == 0 ? SIZE_MAX : o.top;
  BufferTotals totals;
  if (o.list) {
    const std::vector<BufferRef> buffers = ListBuffers(snap, q, &totals);
    const size_t n = std::min(top, buffers.size());
    if (o.json) {
      ojson rows = ojson::array();
      for (size_t i = 0; i < n; ++i) {
        const SnapBlock& b = *buffers[i].block;
        const SnapSite& s = snap.Site(b.site);
        ojson r{{"device", buffers[i].device->device}, {"addr", b.addr}, {"size", b.size},
                {"requested", b.requested}, {"stream", b.stream}, {"site", b.site},
                {"where", s.where}, {"kind", s.kind}, {"copy", s.copy}};
        r["age_ns"] = b.has_age ? ojson(b.age_ns) : ojson(nullptr);
        if (o.stacks) r["stack"] = b.stack == 0 ? ojson(nullptr) : ojson(b.stack);
        if (b.tensor >= 0) {
          const TensorInfo& t = buffers[i].device->tensors[static_cast<size_t>(b.tensor)];
          r["refcount"] = t.refcount;
          r["dtype"] = t.dtype;
          r["shape"] = t.shape;
        } else {
          r["refcount"] = nullptr;
          r["dtype"] = nullptr;
          r["shape"] = nullptr;
        }
        rows.push_back(std::move(r));
      }
      ojson out{{"source", o.source}, {"matched", totals.matched},
                {"matched_bytes", totals.matched_bytes}, {"copy_bytes", totals.copy_bytes},
                {"returned", n}, {"devices", DevicesJson(snap)}, {"buffers", std::move(rows)},
                {"arena_buffers", ArenaBuffersJson(snap, q, top)}};
      if (o.stacks) out["stacks"] = StacksJson(snap, q, top);
      std::printf("%s\n", out.dump(1).c_str());
      return kExitOk;
    }
    std::printf("source  %s\n\n", o.source.c_str());
    PrintDevices(snap, o.device);
    std::printf("\nlive buffers, largest first: %zu of %llu (%s; %s made by clone/contiguous/to)\n",
                n, static_cast<unsigned long long>(totals.matched),
                Bytes(totals.matched_bytes).c_str(), Bytes(totals.copy_bytes).c_str());
    std::vector<std::string> columns = {"<DEVICE", "<ADDRESS", "SIZE", "REQUESTED", "SHARE",
                                        "STREAM", "AGE", "REFCOUNT", "<TENSOR", "<SITE"};
    if (o.stacks) columns.insert(columns.end() - 1, "STACK");
    TextTable t(columns);
    for (size_t i = 0; i < n; ++i) {
      const SnapDevice& d = *buffers[i].device;
      const SnapBlock& b = *buffers[i].block;
      char addr[24];
      std::snprintf(addr, sizeof(addr), "0x%llx", static_cast<unsigned long long>(b.addr));
      std::string rc = "-", tensor = "-";
      if (b.tensor >= 0) {
        const TensorInfo& ti = d.tensors[static_cast<size_t>(b.tensor)];
        rc = std::to_string(ti.refcount);
        tensor = ti.dtype + ti.shape;
      }
      std::vector<std::string> row = {
          d.device, addr, Bytes(b.size), Bytes(b.requested), FormatShare(b.size, d.total_bytes),
          std::to_string(b.stream), b.has_age ? FormatAge(b.age_ns) : "-", rc, tensor,
          snap.Site(b.site).where};
      if (o.stacks) row.insert(row.end() - 1, StackText(b.stack));
      t.Add(row);
    }
    std::printf("%s", t.Render().c_str());
    if (n < totals.matched) std::printf("(%llu more; --top 0 lists all)\n",
                                        static_cast<unsigned long long>(totals.matched - n));
    PrintArenaBuffers(snap, q, top);
    if (o.stacks) PrintStacks(snap, q, top);
    return kExitOk;
  }
  const std::vector<SiteGroup> groups = GroupBySite(snap, q, &totals);
  const size_t n = std::min(top, groups.size());
  if (o.json) {
    ojson rows = ojson::array();
    for (size_t i = 0; i < n; ++i) {
      const SiteGroup& g = groups[i];
      const SnapSite& s = snap.Site(g.site);
      ojson r{{"device", g.device->device}, {"site", g.site}, {"where", s.where},
              {"kind", s.kind}, {"copy", s.copy}, {"count", g.count}, {"bytes", g.bytes},
              {"requested_bytes", g.requested}, {"device_share", g.device_share},
              {"copy_bytes", g.copy_bytes}};
      r["oldest_age_ns"] = g.oldest_age_ns >= 0 ? ojson(g.oldest_age_ns) : ojson(nullptr);
      r["refcount_min"] = g.min_refcount >= 0 ? ojson(g.min_refcount) : ojson(nullptr);
      r["refcount_max"] = g.max_refcount >= 0 ? ojson(g.max_refcount) : ojson(nullptr);
      r["tensors"] = g.shapes.empty() ? ojson(nullptr) : ojson(g.shapes);
      rows.push_back(std::move(r));
    }
    ojson out{{"source", o.source}, {"matched", totals.matched},
              {"matched_bytes", totals.matched_bytes}, {"copy_bytes", totals.copy_bytes},
              {"sites_matched", groups.size()}, {"returned", n}, {"devices", DevicesJson(snap)},
              {"sites", std::move(rows)}, {"arena_buffers", ArenaBuffersJson(snap, q, top)}};
    if (o.stacks) out["stacks"] = StacksJson(snap, q, top);
    std::printf("%s\n", out.dump(1).c_str());
    return kExitOk;
  }
  std::printf("source  %s\n\n", o.source.c_str());
  PrintDevices(snap, o.device);
  std::printf("\nlive buffers by site, largest first: %zu of %zu sites (%llu buffers, %s; %s "
              "made by clone/contiguous/to)\n",
              n, groups.size(), static_cast<unsigned long long>(totals.matched),
              Bytes(totals.matched_bytes).c_str(), Bytes(totals.copy_bytes).c_str());
  TextTable t({"<DEVICE", "COUNT", "BYTES", "SHARE", "COPY BYTES", "OLDEST", "REFCOUNT",
               "<TENSORS", "<SITE"});
  for (size_t i = 0; i < n; ++i) {
    const SiteGroup& g = groups[i];
    t.Add({g.device->device, std::to_string(g.count), Bytes(g.bytes),
           FormatShare(g.bytes, g.device->total_bytes), g.copy_bytes ? Bytes(g.copy_bytes) : "-",
           FormatAge(g.oldest_age_ns), RefcountText(g.min_refcount, g.max_refcount),
           g.shapes.empty() ? "-" : g.shapes, snap.Site(g.site).where});
  }
  std::printf("%s", t.Render().c_str());
  if (n < groups.size()) std::printf("(%zu more sites; --top 0 shows all)\n", groups.size() - n);
  PrintArenaBuffers(snap, q, top);
  if (o.stacks) PrintStacks(snap, q, top);
  return kExitOk;
}

}  // namespace

void AddBuffersCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<BuffersOptions>();
  CLI::App* cmd = app.add_subcommand(
      "buffers", "Live buffers of a running process or a snapshot file, by site or one by one");
  cmd->add_option("source", o->source,
                  "http://HOST:PORT of a process serving /debug/snapshot, or a snapshot file")
      ->required();
  cmd->add_option("--token-file", o->token_file, "file holding the bearer token (http_token_file)");
  cmd->add_flag("--list", o->list, "one row per buffer instead of one per site");
  cmd->add_option("--device", o->device, "only this device, e.g. sim:0");
  cmd->add_option("--site", o->site, "only sites whose text (tag, file:line, kind) contains this");
  cmd->add_option("--min-bytes", o->min_bytes, "only buffers at least this large, e.g. 1MiB");
  cmd->add_option("--top", o->top, "rows to show (default 20; 0: all)");
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->add_flag("--stacks", o->stacks,
                "add the sampled stacks: each listed buffer's (--list) and the stacks by "
                "estimated live bytes, with their frames");
  cmd->callback([o, exit_code] { *exit_code = RunBuffers(*o); });
}

}  // namespace devmem::memtrace
