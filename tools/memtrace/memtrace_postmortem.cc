// tools/memtrace/memtrace_postmortem.cc: `memtrace postmortem FILE`: what a process held when it
// died, from the flight record it kept (flight_recorder:FILE; runtime/flight_recorder.h):
// per allocator the live bytes by site (named from the file's own site table), the
// stats, the newest events, and whether the record is consistent: a write torn by the
// death is detected and skipped (said, not an error); a damaged record is skipped and
// listed with its offset, and makes the record inconsistent.
//
// A record whose process still runs (it holds the file's lock) is read all the same:
// its state now, said on the first line.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/config.h"
#include "nlohmann/json.hpp"
#include "runtime/flight_record_reader.h"
#include "tools/inspect/inspect_format.h"
#include "tools/memtrace/memtrace_commands.h"

namespace devmem::memtrace {
namespace {

using ojson = nlohmann::ordered_json;

struct PostmortemArgs {
  std::string path;
  int events = 20;
  int top = 20;
  bool json = false;
};

// True while a process holds the record's lock (it is still running).
bool WriterAlive(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  const bool alive = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  close(fd);
  return alive;
}

std::string SiteName(const FlightRecord& r, SiteId site) {
  auto it = r.sites.find(site);
  if (it == r.sites.end()) return absl::StrCat("site ", site, " (name not recorded)");
  return absl::StrCat(it->second.ToString(), " · site ", site);
}

std::string UtcTime(int64_t unix_ns) {
  const time_t secs = static_cast<time_t>(unix_ns / 1'000'000'000);
  struct tm tm {};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// The sites of one region, largest first (ties by id).
std::vector<FlightRecord::SiteLive> BySize(const FlightRecord::Device& d) {
  std::vector<FlightRecord::SiteLive> sites = d.sites;
  std::sort(sites.begin(), sites.end(), [](const auto& a, const auto& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.site < b.site;
  });
  return sites;
}

ojson SiteJson(const FlightRecord& r, const FlightRecord::SiteLive& s) {
  ojson j;
  j["site"] = s.site;
  j["where"] = SiteName(r, s.site);
  if (auto it = r.sites.find(s.site); it != r.sites.end()) {
    j["file"] = it->second.file;
    j["line"] = it->second.line;
    j["function"] = it->second.function;
    j["tag"] = it->second.tag;
    j["kind"] = std::string(SiteKindName(it->second.kind));
  }
  j["live_bytes"] = s.bytes;
  j["live_count"] = s.count;
  j["allocs"] = s.allocs;
  return j;
}

ojson Json(const FlightRecord& r, const PostmortemArgs& a, bool alive) {
  ojson j;
  j["schema"] = "devmem.postmortem/2";
  j["file"] = a.path;
  j["pid"] = r.pid;
  j["start_unix_ns"] = r.start_unix_ns;
  j["process_running"] = alive;
  j["consistent"] = r.consistent();
  j["torn"] = r.torn;
  j["damaged"] = r.damaged;
  j["clock_calibrated"] = r.clock_calibrated;
  ojson problems = ojson::array();
  for (const FlightRecord::Problem& p : r.problems) {
    problems.push_back({{"offset", p.offset}, {"torn", p.torn}, {"what", p.what}});
  }
  j["problems"] = std::move(problems);
  ojson devices = ojson::array();
  for (const FlightRecord::Device& d : r.devices) {
    ojson dj;
    dj["device"] = d.device.ToString();
    dj["region"] = d.slot;
    dj["events_recorded"] = d.claimed;
    dj["torn"] = d.torn;
    ojson lanes = ojson::array();
    for (const FlightRecord::Lane& l : d.lanes) {
      lanes.push_back({{"lane", l.lane}, {"events_recorded", l.claimed},
                       {"last_seq", l.last_seq}, {"peak_bytes", l.peak}, {"torn", l.torn}});
    }
    dj["lanes"] = std::move(lanes);
    dj["stats"] = {{"allocated_bytes", d.allocated},   {"peak_allocated_bytes", d.peak_allocated},
                   {"allocations", d.allocations},     {"alloc_count", d.alloc_count},
                   {"free_count", d.free_count},       {"reserved_bytes", d.reserved},
                   {"peak_reserved_bytes", d.peak_reserved}, {"segments", d.segments},
                   {"mapped_bytes", d.mapped},         {"device_allocs", d.device_allocs},
                   {"device_frees", d.device_frees},   {"ooms", d.ooms}};
    ojson sites = ojson::array();
    for (const FlightRecord::SiteLive& s : BySize(d)) sites.push_back(SiteJson(r, s));
    dj["sites"] = std::move(sites);
    ojson events = ojson::array();
    const size_t n = std::min(d.events.size(), static_cast<size_t>(a.events));
    for (size_t i = d.events.size() - n; i < d.events.size(); ++i) {
      ojson e = ojson::parse(TraceEventToJson(d.events[i]));
      e["lane"] = d.event_lanes[i];  // seq is the lane's number
      events.push_back(std::move(e));
    }
    dj["events"] = std::move(events);
    devices.push_back(std::move(dj));
  }
  j["devices"] = std::move(devices);
  return j;
}

void PrintText(const FlightRecord& r, const PostmortemArgs& a, bool alive) {
  int64_t last_ns = r.start_mono_ns;
  for (const FlightRecord::Device& d : r.devices) last_ns = std::max(last_ns, d.last_event_ns);
  std::printf("flight record %s: process %u, started %s; the last event %s after the start%s\n",
              a.path.c_str(), r.pid, UtcTime(r.start_unix_ns).c_str(),
              FormatAge(last_ns - r.start_mono_ns).c_str(),
              alive ? " (the process is still running: this is its state now)" : "");
  if (!r.consistent()) {
    std::printf("record: INCONSISTENT: %llu damaged record%s skipped (not read as values):\n",
                static_cast<unsigned long long>(r.damaged), r.damaged == 1 ? "" : "s");
  } else if (r.torn > 0) {
    std::printf("record: consistent; %llu torn write%s skipped (the write in flight when the "
                "process stopped, or racing this read)\n",
                static_cast<unsigned long long>(r.torn), r.torn == 1 ? "" : "s");
  } else {
    std::printf("record: consistent (no torn or damaged record)\n");
  }
  for (const FlightRecord::Problem& p : r.problems) {
    std::printf("  offset %zu: %s%s\n", p.offset, p.what.c_str(), p.torn ? " (torn)" : "");
  }
  if (!r.clock_calibrated) {
    std::printf("times: uncalibrated (the process lived too briefly): ticks, not ns\n");
  }
  if (r.devices.empty()) std::printf("no allocator recorded an event\n");
  for (const FlightRecord::Device& d : r.devices) {
    // With several lanes the peak is the sum of theirs: an upper bound (reader.h).
    const char* peak = d.lanes.size() > 1 ? "peak at most" : "peak";
    std::printf("\n%s (region %u): allocated %s in %lld buffers (%s %s), reserved %s "
                "(peak %s): %lld segments + %s mapped; %lld OOMs; %llu events recorded in %zu "
                "lane%s\n",
                d.device.ToString().c_str(), d.slot, Bytes(static_cast<uint64_t>(d.allocated)).c_str(),
                static_cast<long long>(d.allocations), peak,
                Bytes(static_cast<uint64_t>(d.peak_allocated)).c_str(),
                Bytes(static_cast<uint64_t>(d.reserved)).c_str(),
                Bytes(static_cast<uint64_t>(d.peak_reserved)).c_str(),
                static_cast<long long>(d.segments), Bytes(static_cast<uint64_t>(d.mapped)).c_str(),
                static_cast<long long>(d.ooms), static_cast<unsigned long long>(d.claimed),
                d.lanes.size(), d.lanes.size() == 1 ? "" : "s");
    const std::vector<FlightRecord::SiteLive> sites = BySize(d);
    if (sites.empty()) {
      std::printf("  nothing held\n");
    } else {
      std::printf("  held, by site:\n");
      TextTable t({"live bytes", "buffers", "share", "<site"});
      const size_t n = std::min(sites.size(), static_cast<size_t>(a.top));
      for (size_t i = 0; i < n; ++i) {
        t.Add({Bytes(static_cast<uint64_t>(sites[i].bytes)), absl::StrCat(sites[i].count),
               FormatShare(static_cast<uint64_t>(std::max<int64_t>(0, sites[i].bytes)),
                           static_cast<uint64_t>(std::max<int64_t>(0, d.allocated))),
               SiteName(r, sites[i].site)});
      }
      std::printf("%s", t.Render("    ").c_str());
      if (sites.size() > n) std::printf("    ... %zu more sites (--top)\n", sites.size() - n);
    }
    const size_t n = std::min(d.events.size(), static_cast<size_t>(a.events));
    if (n == 0) continue;
    std::printf("  the last %zu events:\n", n);
    TextTable t({"lane", "seq", "time", "thread", "<action", "addr", "size", "<site"});
    for (size_t i = d.events.size() - n; i < d.events.size(); ++i) {
      const TraceEvent& e = d.events[i];
      t.Add({absl::StrCat(d.event_lanes[i]), absl::StrCat(e.seq), FormatAge(e.time_ns - r.start_mono_ns), absl::StrCat(e.thread),
             std::string(AllocActionName(e.action)), absl::StrFormat("0x%x", e.addr),
             Bytes(e.size), e.site == kUnknownSite ? "-" : SiteName(r, e.site)});
    }
    std::printf("%s", t.Render("    ").c_str());
  }
}

int RunPostmortem(const PostmortemArgs& a) {
  if (a.events < 0 || a.events > 1'000'000 || a.top < 1 || a.top > 100'000) {
    std::fprintf(stderr, "memtrace postmortem: --events must be 0..1000000, --top 1..100000\n");
    return kExitBadInput;
  }
  absl::StatusOr<FlightRecord> r = ReadFlightRecord(a.path);
  if (!r.ok()) {
    std::fprintf(stderr, "memtrace postmortem: %s\n", std::string(r.status().message()).c_str());
    return kExitBadInput;
  }
  const bool alive = WriterAlive(a.path);
  if (a.json) {
    std::printf("%s\n", Json(*r, a, alive).dump(2, ' ', false, ojson::error_handler_t::replace).c_str());
  } else {
    PrintText(*r, a, alive);
  }
  if (!r->consistent()) {
    std::fprintf(stderr, "memtrace postmortem: %s: warning: %llu damaged records were skipped\n",
                 a.path.c_str(), static_cast<unsigned long long>(r->damaged));
  }
  return kExitOk;
}

}  // namespace

void AddPostmortemCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<PostmortemArgs>();
  CLI::App* cmd = app.add_subcommand(
      "postmortem", "What a dead (or running) process held, from its flight record "
                    "(flight_recorder:FILE): live bytes by site, stats, the last events");
  cmd->add_option("file", a->path, "the flight record file")->required();
  cmd->add_option("--events", a->events, "newest events shown per allocator (default 20)");
  cmd->add_option("--top", a->top, "sites shown per allocator (default 20)");
  cmd->add_flag("--json", a->json, "one JSON document (devmem.postmortem/1)");
  cmd->callback([a, exit_code] { *exit_code = RunPostmortem(*a); });
}

}  // namespace devmem::memtrace
