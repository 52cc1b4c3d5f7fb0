// tools/memtrace/memtrace_oom.cc: `memtrace oom DUMP`: explains an OOM dump (the file
// oom_dump_dir makes: a snapshot of the failing device plus the OomReport under "oom",
// docs/formats.md): the request and the device's state at the failure, the cause,
// where the memory went (top sites, the share made by explicit copies), a map of each
// segment (tools/inspect/segment_map.h) so fragmentation can be seen, and the remedy.
#include <cstdio>
#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "tools/inspect/inspect_format.h"
#include "tools/memtrace/memtrace_commands.h"
#include "tools/inspect/segment_map.h"
#include "tools/inspect/site_usage.h"
#include "tools/snapshot/snapshot_reader.h"

namespace devmem::memtrace {
namespace {

using ojson = nlohmann::ordered_json;

// Segments listed at most (a dump of a device with thousands of small segments would
// otherwise be pages of dots); the rest are summed up.
constexpr size_t kMaxSegments = 64;

struct OomOptions {
  std::string path;
  int columns = 64;
  bool json = false;
};

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

int RunOom(const OomOptions& o) {
  if (o.columns < 8 || o.columns > 512) {
    std::fprintf(stderr, "memtrace oom: --columns %d: expected 8..512\n", o.columns);
    return kExitBadInput;
  }
  absl::StatusOr<Snapshot> loaded = ReadSnapshotFile(o.path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "memtrace oom: %s\n", std::string(loaded.status().message()).c_str());
    return kExitBadInput;
  }
  const Snapshot& snap = *loaded;
  if (!snap.oom) {
    std::fprintf(stderr, "memtrace oom: %s: not an OOM dump (no \"oom\" field; it is a plain "
                 "snapshot: try memtrace buffers)\n", o.path.c_str());
    return kExitBadInput;
  }
  const OomInfo& r = *snap.oom;
  // The devices to map: the failing one (a dump normally holds only it).
  std::vector<const SnapDevice*> devices;
  for (const SnapDevice& d : snap.devices) {
    if (d.device == r.device) devices.push_back(&d);
  }
  if (devices.empty()) {
    for (const SnapDevice& d : snap.devices) devices.push_back(&d);
  }
  const SnapSite& request_site = snap.Site(r.site);
  if (o.json) {
    ojson top = ojson::array();
    for (const OomTopSite& t : r.top_sites) {
      top.push_back(ojson{{"site", t.site}, {"where", t.where}, {"kind", t.kind},
                          {"copy", t.copy}, {"live_bytes", t.live_bytes},
                          {"live_count", t.live_count}});
    }
    ojson devs = ojson::array();
    for (const SnapDevice* d : devices) {
      const uint64_t cell = ChooseCellBytes(*d, o.columns);
      ojson segs = ojson::array();
      for (const SnapSegment& s : d->segments) {
        const SegmentBytes sb = SegmentStateBytes(*d, s);
        segs.push_back(ojson{{"addr", s.addr}, {"size", s.size}, {"stream", s.stream},
                             {"pool", s.small_pool ? "small" : "large"},
                             {"expandable", s.expandable}, {"allocated_bytes", sb.allocated},
                             {"free_bytes", sb.free}, {"pending_bytes", sb.pending},
                             {"map", SegmentMap(*d, s, cell, o.columns)}});
      }
      devs.push_back(ojson{{"device", d->device}, {"cell_bytes", cell},
                           {"segments", std::move(segs)}});
    }
    ojson out{{"file", o.path}, {"device", r.device}, {"stream", r.stream},
              {"site", r.site}, {"where", request_site.where},
              {"requested_bytes", r.requested_bytes}, {"rounded_bytes", r.rounded_bytes},
              {"segment_bytes", r.segment_bytes}, {"device_total", r.device_total},
              {"driver_free", r.driver_free}, {"memory_limit", r.memory_limit},
              {"allocated", r.allocated}, {"reserved", r.reserved}, {"pending", r.pending},
              {"reserved_unallocated", r.reserved_unallocated},
              {"largest_free_block", r.largest_free_block}, {"free_blocks", r.free_blocks},
              {"segment_count", r.segment_count}, {"fragmentation", r.fragmentation},
              {"cause", r.cause}, {"remedy", r.remedy}, {"copy_bytes", r.copy_bytes},
              {"copy_share", r.copy_share}, {"top_sites", std::move(top)},
              {"devices", std::move(devs)}, {"message", r.message}};
    std::printf("%s\n", out.dump(1).c_str());
    return kExitOk;
  }
  std::printf("OOM dump %s\n\n", o.path.c_str());
  std::printf("request        %s (rounded %s; needed a %s segment) on %s, stream %llu\n",
              Bytes(r.requested_bytes).c_str(), Bytes(r.rounded_bytes).c_str(),
              Bytes(r.segment_bytes).c_str(), r.device.c_str(),
              static_cast<unsigned long long>(r.stream));
  std::printf("asked by       %s\n", request_site.where.c_str());
  std::printf("device total   %s, driver free %s", Bytes(r.device_total).c_str(),
              Bytes(r.driver_free).c_str());
  if (r.memory_limit != 0 && r.memory_limit < r.device_total) {
    std::printf(", process limit %s", Bytes(r.memory_limit).c_str());
  }
  std::printf("\nallocated      %s (%s of the device)\n", Bytes(r.allocated).c_str(),
              FormatShare(r.allocated, r.device_total).c_str());
  std::printf("reserved       %s; reserved but unallocated %s (pending %s)\n",
              Bytes(r.reserved).c_str(), Bytes(r.reserved_unallocated).c_str(),
              Bytes(r.pending).c_str());
  std::printf("free cache     largest block %s of %llu free blocks, fragmentation %.1f%%, "
              "%llu segments\n",
              Bytes(r.largest_free_block).c_str(), static_cast<unsigned long long>(r.free_blocks),
              100.0 * r.fragmentation, static_cast<unsigned long long>(r.segment_count));
  std::printf("cause          %s\n", r.cause.c_str());
  std::printf("\nwhere the memory went (largest live holders first):\n");
  if (r.top_sites.empty()) {
    std::printf("  (the report names none)\n");
  } else {
    TextTable t({"COUNT", "BYTES", "OF ALLOCATED", "COPY", "<SITE"});
    for (const OomTopSite& s : r.top_sites) {
      t.Add({std::to_string(s.live_count), Bytes(s.live_bytes),
             FormatShare(s.live_bytes, r.allocated), s.copy ? "yes" : "no", s.where});
    }
    std::printf("%s", t.Render("  ").c_str());
  }
  std::printf("explicit copies (clone/contiguous/to) hold %s, %.1f%% of allocated\n",
              Bytes(r.copy_bytes).c_str(), 100.0 * r.copy_share);
  for (const SnapDevice* d : devices) {
    const uint64_t cell = ChooseCellBytes(*d, o.columns);
    std::printf("\nsegments of %s (one character = %s: '#' allocated, '.' free, 'p' pending):\n",
                d->device.c_str(), Bytes(cell).c_str());
    if (d->segments.empty()) std::printf("  (no segments)\n");
    size_t shown = 0;
    SegmentBytes rest;
    size_t rest_count = 0;
    for (const SnapSegment& s : d->segments) {
      const SegmentBytes sb = SegmentStateBytes(*d, s);
      if (shown == kMaxSegments) {
        rest.allocated += sb.allocated;
        rest.free += sb.free;
        rest.pending += sb.pending;
        ++rest_count;
        continue;
      }
      ++shown;
      std::printf("  %s %s %s%s: %s allocated, %s free%s\n", Hex(s.addr).c_str(),
                  Bytes(s.size).c_str(), s.small_pool ? "small" : "large",
                  s.expandable ? " expandable" : "", Bytes(sb.allocated).c_str(),
                  Bytes(sb.free).c_str(),
                  sb.pending ? (", " + Bytes(sb.pending) + " pending").c_str() : "");
      for (const std::string& line : SegmentMap(*d, s, cell, o.columns)) {
        std::printf("    |%s|\n", line.c_str());
      }
    }
    if (rest_count > 0) {
      std::printf("  ... %zu more segments: %s allocated, %s free, %s pending\n", rest_count,
                  Bytes(rest.allocated).c_str(), Bytes(rest.free).c_str(),
                  Bytes(rest.pending).c_str());
    }
  }
  std::printf("\nremedy         %s\n", r.remedy.c_str());
  return kExitOk;
}

}  // namespace

void AddOomCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<OomOptions>();
  CLI::App* cmd = app.add_subcommand(
      "oom", "Explain an OOM dump (oom_dump_dir): the request, the cause, who holds the "
             "memory, a map of the segments, the remedy");
  cmd->add_option("dump", o->path, "devmem-oom-*.json file")->required();
  cmd->add_option("--columns", o->columns, "cells per line of the segment maps (default 64)");
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->callback([o, exit_code] { *exit_code = RunOom(*o); });
}

}  // namespace devmem::memtrace
