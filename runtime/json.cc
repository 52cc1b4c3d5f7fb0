// runtime/json.cc: the writers of devmem's JSON formats, with nlohmann::json (the
// formats are documented field by field in docs/formats.md; their readers are in
// runtime/json_reader.cc).
//
// Writers build nlohmann::ordered_json so that files list fields in a readable order
// ("schema" first). The stats tables (runtime/json_fields.h) drive both the writer and
// the reader, so a field written is a field read.
#include "runtime/json.h"

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "allocator/snapshot.h"
#include "allocator/stack_sampler.h"
#include "allocator/stats.h"
#include "allocator/string_view_bridge.h"
#include "nlohmann/json.hpp"
#include "runtime/json_fields.h"

namespace devmem {
namespace {

using ojson = nlohmann::ordered_json;

// The stats tables (runtime/json_fields.h), shared with the reader.
using json_fields::CounterField;
using json_fields::kCounters;
using json_fields::kOptionalCounters;
using json_fields::kPoolNames;
using json_fields::kStatArrays;
using json_fields::kStats;
using json_fields::StatArrayField;
using json_fields::StatField;

// --- writing --------------------------------------------------------------------------

ojson StatToJson(const Stat& s) {
  ojson j;
  j["current"] = s.current;
  j["peak"] = s.peak;
  j["allocated"] = s.allocated;
  j["freed"] = s.freed;
  return j;
}

ojson StatsToJson(const DeviceStats& stats) {
  ojson j = ojson::object();
  for (const StatArrayField& f : kStatArrays) {
    ojson pools;
    for (int p = 0; p < kNumStatPools; ++p) {
      pools[kPoolNames[p]] = StatToJson((stats.*f.member)[p]);
    }
    j[f.name] = std::move(pools);
  }
  for (const StatField& f : kStats) j[f.name] = StatToJson(stats.*f.member);
  for (const CounterField& f : kCounters) j[f.name] = stats.*f.member;
  for (const CounterField& f : kOptionalCounters) j[f.name] = stats.*f.member;
  // The backend's driver calls (allocator/driver_calls.h): counts and nanoseconds by
  // kind, every kind present.
  ojson calls = ojson::object();
  ojson ns = ojson::object();
  for (int i = 0; i < kNumDriverCalls; ++i) {
    const std::string name(DriverCallName(static_cast<DriverCall>(i)));
    calls[name] = stats.driver.calls[i];
    ns[name] = stats.driver.ns[i];
  }
  j["driver_calls"] = std::move(calls);
  j["driver_ns"] = std::move(ns);
  j["handle_reserve_bytes"] = stats.driver.handle_reserve_bytes;
  return j;
}

ojson SiteToJson(SiteId id, const SiteInfo& info) {
  ojson j;
  j["id"] = id;
  j["file"] = info.file;
  j["line"] = info.line;
  j["function"] = info.function;
  j["tag"] = info.tag;
  j["kind"] = std::string(SiteKindName(info.kind));
  if (info.has_outer()) {  // the outermost ScopedSite frame (docs/formats.md)
    j["outer"] = ojson{{"file", info.outer_file},
                       {"line", info.outer_line},
                       {"function", info.outer_function}};
  }
  return j;
}

// The sites a file names: collected while its blocks, buffers and events are written
// (one hash-set insert each, not a tree's: a snapshot of 10^5 blocks makes 2*10^5),
// listed by id.
class SiteSet {
 public:
  void add(SiteId id) {
    if (id != kUnknownSite) ids_.insert(id);
  }
  std::vector<SiteId> sorted() const {
    std::vector<SiteId> v(ids_.begin(), ids_.end());
    std::sort(v.begin(), v.end());
    return v;
  }

 private:
  absl::flat_hash_set<SiteId> ids_;
};

ojson SiteTableToJson(const SiteSet& ids) {
  ojson sites = ojson::array();
  for (SiteId id : ids.sorted()) sites.push_back(SiteToJson(id, GetSite(id)));
  return sites;
}

// Ages are relative to the device snapshot's time; blocks without an allocation time
// (free ones) have no "age_ns".
void PutAge(ojson& j, const BlockInfo& b, int64_t now_ns) {
  if (b.alloc_time_ns != 0) j["age_ns"] = now_ns - b.alloc_time_ns;
}

ojson BlockToJson(const BlockInfo& b, int64_t now_ns) {
  ojson j;
  j["addr"] = static_cast<uint64_t>(b.addr);
  j["size"] = static_cast<uint64_t>(b.size);
  j["requested"] = static_cast<uint64_t>(b.requested);
  j["state"] = std::string(BlockStateName(b.state));
  j["stream"] = static_cast<uint64_t>(b.stream.handle);
  j["site"] = b.site;
  PutAge(j, b, now_ns);
  if (b.stack != kNoStack) j["stack"] = b.stack;
  return j;
}

// Adds "tensor": {"refcount", "dtype", "shape"} when the annotating layer knows `addr`.
void PutAnnotation(ojson& j, uintptr_t addr, const BufferAnnotations* annotations) {
  if (annotations == nullptr) return;
  auto it = annotations->find(addr);
  if (it == annotations->end()) return;
  const BufferAnnotation& a = it->second;
  j["tensor"] = ojson{{"refcount", a.refcount}, {"dtype", a.dtype}, {"shape", a.shape}};
}

ojson LiveBufferToJson(const BlockInfo& b, int64_t now_ns,
                       const BufferAnnotations* annotations) {
  ojson j;
  j["addr"] = static_cast<uint64_t>(b.addr);
  j["size"] = static_cast<uint64_t>(b.size);
  j["requested"] = static_cast<uint64_t>(b.requested);
  j["stream"] = static_cast<uint64_t>(b.stream.handle);
  j["site"] = b.site;
  PutAge(j, b, now_ns);
  if (b.stack != kNoStack) j["stack"] = b.stack;
  PutAnnotation(j, b.addr, annotations);
  return j;
}

// One group of sampled stacks (docs/formats.md). `symbolize`: its id is this process's,
// so its frames are looked up now (symbolized once per stack, outside every allocator
// lock: the snapshot was taken before); else the frames are those it carries.
ojson SampledStackToJson(const SampledStack& s, bool symbolize) {
  ojson j;
  j["stack"] = s.stack;
  j["site"] = s.site;
  j["samples"] = s.samples;
  j["sampled_bytes"] = s.sampled_bytes;
  j["estimated_bytes"] = s.estimated_bytes;
  j["frames"] = symbolize && s.frames.empty() ? stack_sampler::StackFrames(s.stack) : s.frames;
  return j;
}

// Scoped arenas' buffers: inside allocated chunk blocks of kind-arena sites.
ojson ArenaBuffersToJson(const AllocatorSnapshot& d, const BufferAnnotations* annotations,
                         SiteSet* sites) {
  ojson arena = ojson::array();
  for (const ArenaBufferInfo& b : d.arena_buffers) {
    ojson a;
    a["addr"] = static_cast<uint64_t>(b.addr);
    a["size"] = static_cast<uint64_t>(b.size);
    a["site"] = b.site;
    a["arena"] = b.arena;
    a["chunk"] = static_cast<uint64_t>(b.chunk);
    a["escaped"] = b.escaped;
    PutAnnotation(a, b.addr, annotations);
    sites->add(b.site);
    arena.push_back(std::move(a));
  }
  return arena;
}

ojson SampledStacksToJson(const AllocatorSnapshot& d, SiteSet* sites) {
  ojson stacks = ojson::array();
  for (const SampledStack& s : d.sampled_stacks) {
    stacks.push_back(SampledStackToJson(s, d.local_stacks));
    sites->add(s.site);
  }
  return stacks;
}

ojson DeviceToJson(const AllocatorSnapshot& d, const BufferAnnotations* annotations,
                   SiteSet* sites) {
  ojson j;
  j["device"] = d.device.ToString();
  j["time_ns"] = d.time_ns;
  j["info"] = ojson{{"name", d.info.name}, {"uuid", d.info.uuid}, {"backend", d.info.backend}};
  j["mem_info"] = ojson{{"free_bytes", static_cast<uint64_t>(d.mem_info.free_bytes)},
                        {"total_bytes", static_cast<uint64_t>(d.mem_info.total_bytes)}};
  j["stats"] = StatsToJson(d.stats);
  ojson segments = ojson::array();
  ojson live = ojson::array();
  for (const SegmentInfo& s : d.segments) {
    ojson seg;
    seg["addr"] = static_cast<uint64_t>(s.addr);
    seg["size"] = static_cast<uint64_t>(s.size);
    seg["stream"] = static_cast<uint64_t>(s.stream.handle);
    seg["pool"] = s.small_pool ? "small" : "large";
    seg["expandable"] = s.expandable;
    if (!s.private_pool.is_default()) {  // only private pools' segments have it
      seg["private_pool"] = ojson::array({s.private_pool.first, s.private_pool.second});
    }
    ojson blocks = ojson::array();
    for (const BlockInfo& b : s.blocks) {
      blocks.push_back(BlockToJson(b, d.time_ns));
      sites->add(b.site);
      if (b.state == BlockState::kAllocated) {
        live.push_back(LiveBufferToJson(b, d.time_ns, annotations));
      }
    }
    seg["blocks"] = std::move(blocks);
    segments.push_back(std::move(seg));
  }
  j["segments"] = std::move(segments);
  j["live_buffers"] = std::move(live);
  j["arena_buffers"] = ArenaBuffersToJson(d, annotations, sites);
  j["stack_sample_bytes"] = d.stack_sample_bytes;
  j["sampled_stacks"] = SampledStacksToJson(d, sites);
  return j;
}

ojson TraceEventToObject(const TraceEvent& e) {
  ojson j;
  j["seq"] = e.seq;
  j["time_ns"] = e.time_ns;
  j["action"] = std::string(AllocActionName(e.action));
  j["device"] = e.device.ToString();
  j["stream"] = static_cast<uint64_t>(e.stream.handle);
  j["addr"] = static_cast<uint64_t>(e.addr);
  j["size"] = static_cast<uint64_t>(e.size);
  j["requested"] = static_cast<uint64_t>(e.requested);
  j["site"] = e.site;
  j["thread"] = e.thread;
  return j;
}

ojson SnapshotObject(const RuntimeSnapshot& snap, const std::vector<TraceEvent>* trace,
                     SiteSet* sites) {
  ojson j;
  j["schema"] = kSnapshotSchema;
  j["time_ns"] = snap.time_ns;
  j["unix_time_ns"] = snap.unix_time_ns;
  ojson devices = ojson::array();
  for (size_t i = 0; i < snap.devices.size(); ++i) {
    const BufferAnnotations* annotations =
        i < snap.annotations.size() ? &snap.annotations[i] : nullptr;
    devices.push_back(DeviceToJson(snap.devices[i], annotations, sites));
  }
  j["devices"] = std::move(devices);
  if (trace != nullptr) {
    ojson events = ojson::array();
    for (const TraceEvent& e : *trace) {
      events.push_back(TraceEventToObject(e));
      sites->add(e.site);
    }
    j["trace"] = std::move(events);
  }
  return j;
}

// SnapshotToJson's writer: the text SnapshotObject(...).dump() gives, written straight
// into one string for the bulk (segments' blocks, live buffers, trace events: numbers
// and names from fixed tables, which need no escaping) and through nlohmann for the
// rest (stats, infos, annotations, arena buffers, stacks, sites: few, and with strings
// to escape). Why: a DOM of 10^5 blocks and live buffers took ~1.4 s to build and dump
// (target: /debug/snapshot served in <= 50 ms, scripts/bench_snapshot.sh). The DOM
// writer stays for OOM dumps (indented; one per OOM); runtime_json_test.cc checks that
// the two agree on every field.
class SnapshotWriter {
 public:
  SnapshotWriter(const RuntimeSnapshot& snap, const std::vector<TraceEvent>* trace)
      : snap_(snap), trace_(trace) {}

  std::string Write() {
    size_t blocks = 0;
    for (const AllocatorSnapshot& d : snap_.devices) {
      for (const SegmentInfo& seg : d.segments) blocks += seg.blocks.size();
    }
    // ~130 bytes a block and ~110 a live buffer; ~150 an event.
    out_.reserve(4096 + blocks * 240 + (trace_ != nullptr ? trace_->size() * 150 : 0));
    out_ += "{\"schema\":";
    Dom(kSnapshotSchema);
    Key("time_ns");
    Int(snap_.time_ns);
    Key("unix_time_ns");
    Int(snap_.unix_time_ns);
    Key("devices");
    out_ += '[';
    for (size_t i = 0; i < snap_.devices.size(); ++i) {
      if (i > 0) out_ += ',';
      Device(snap_.devices[i],
             i < snap_.annotations.size() ? &snap_.annotations[i] : nullptr);
    }
    out_ += ']';
    if (trace_ != nullptr) {
      Key("trace");
      out_ += '[';
      bool first = true;
      for (const TraceEvent& e : *trace_) {
        if (!first) out_ += ',';
        first = false;
        Event(e);
      }
      out_ += ']';
    }
    Key("sites");
    out_ += SiteTableToJson(sites_).dump();
    out_ += '}';
    return std::move(out_);
  }

 private:
  // ,"key":  (the first key of an object is written with its brace by the caller)
  void Key(std::string_view key) {
    out_ += ",\"";
    out_ += key;
    out_ += "\":";
  }
  void Uint(uint64_t v) {
    char buf[24];
    out_.append(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
  }
  void Int(int64_t v) {
    char buf[24];
    out_.append(buf, std::to_chars(buf, buf + sizeof(buf), v).ptr);
  }
  // A name from a fixed table (block states, pools, actions, device names): letters,
  // digits, '_' and ':' only, so no escaping.
  void Name(std::string_view name) {
    out_ += '"';
    out_ += name;
    out_ += '"';
  }
  void Dom(const ojson& j) { out_ += j.dump(); }

  void Age(const BlockInfo& b, int64_t now_ns) {  // as PutAge
    if (b.alloc_time_ns == 0) return;
    Key("age_ns");
    Int(now_ns - b.alloc_time_ns);
  }
  void Annotation(uintptr_t addr, const BufferAnnotations* annotations) {  // as PutAnnotation
    if (annotations == nullptr) return;
    auto it = annotations->find(addr);
    if (it == annotations->end()) return;
    const BufferAnnotation& a = it->second;
    Key("tensor");
    Dom(ojson{{"refcount", a.refcount}, {"dtype", a.dtype}, {"shape", a.shape}});
  }

  void Device(const AllocatorSnapshot& d, const BufferAnnotations* annotations) {
    out_ += "{\"device\":";
    Name(d.device.ToString());
    Key("time_ns");
    Int(d.time_ns);
    Key("info");
    Dom(ojson{{"name", d.info.name}, {"uuid", d.info.uuid}, {"backend", d.info.backend}});
    Key("mem_info");
    Dom(ojson{{"free_bytes", static_cast<uint64_t>(d.mem_info.free_bytes)},
              {"total_bytes", static_cast<uint64_t>(d.mem_info.total_bytes)}});
    Key("stats");
    Dom(StatsToJson(d.stats));
    Key("segments");
    out_ += '[';
    for (size_t i = 0; i < d.segments.size(); ++i) {
      const SegmentInfo& s = d.segments[i];
      if (i > 0) out_ += ',';
      out_ += "{\"addr\":";
      Uint(s.addr);
      Key("size");
      Uint(s.size);
      Key("stream");
      Uint(s.stream.handle);
      Key("pool");
      Name(s.small_pool ? "small" : "large");
      Key("expandable");
      out_ += s.expandable ? "true" : "false";
      if (!s.private_pool.is_default()) {  // as DeviceToJson
        Key("private_pool");
        Dom(ojson::array({s.private_pool.first, s.private_pool.second}));
      }
      Key("blocks");
      out_ += '[';
      for (size_t k = 0; k < s.blocks.size(); ++k) {
        const BlockInfo& b = s.blocks[k];
        if (k > 0) out_ += ',';
        Block(b, d.time_ns);
        sites_.add(b.site);
      }
      out_ += "]}";
    }
    out_ += ']';
    Key("live_buffers");
    out_ += '[';
    bool first = true;
    for (const SegmentInfo& s : d.segments) {
      for (const BlockInfo& b : s.blocks) {
        if (b.state != BlockState::kAllocated) continue;
        if (!first) out_ += ',';
        first = false;
        LiveBuffer(b, d.time_ns, annotations);
      }
    }
    out_ += ']';
    Key("arena_buffers");
    Dom(ArenaBuffersToJson(d, annotations, &sites_));
    Key("stack_sample_bytes");
    Uint(d.stack_sample_bytes);
    Key("sampled_stacks");
    Dom(SampledStacksToJson(d, &sites_));
    out_ += '}';
  }

  // The fields a block and a live buffer end with alike: stream, site, age, stack.
  void Placement(const BlockInfo& b, int64_t now_ns) {
    Key("stream");
    Uint(b.stream.handle);
    Key("site");
    Uint(b.site);
    Age(b, now_ns);
    if (b.stack != kNoStack) {
      Key("stack");
      Uint(b.stack);
    }
  }

  void Block(const BlockInfo& b, int64_t now_ns) {  // as BlockToJson
    out_ += "{\"addr\":";
    Uint(b.addr);
    Key("size");
    Uint(b.size);
    Key("requested");
    Uint(b.requested);
    Key("state");
    Name(BlockStateName(b.state));
    Placement(b, now_ns);
    out_ += '}';
  }

  void LiveBuffer(const BlockInfo& b, int64_t now_ns,
                  const BufferAnnotations* annotations) {  // as LiveBufferToJson
    out_ += "{\"addr\":";
    Uint(b.addr);
    Key("size");
    Uint(b.size);
    Key("requested");
    Uint(b.requested);
    Placement(b, now_ns);
    Annotation(b.addr, annotations);
    out_ += '}';
  }

  void Event(const TraceEvent& e) {  // as TraceEventToObject
    out_ += "{\"seq\":";
    Uint(e.seq);
    Key("time_ns");
    Int(e.time_ns);
    Key("action");
    Name(AllocActionName(e.action));
    Key("device");
    Name(e.device.ToString());
    Key("stream");
    Uint(e.stream.handle);
    Key("addr");
    Uint(e.addr);
    Key("size");
    Uint(e.size);
    Key("requested");
    Uint(e.requested);
    Key("site");
    Uint(e.site);
    Key("thread");
    Uint(e.thread);
    out_ += '}';
    sites_.add(e.site);
  }

  const RuntimeSnapshot& snap_;
  const std::vector<TraceEvent>* trace_;
  SiteSet sites_;
  std::string out_;
};
ojson OomToJson(const OomReport& r) {
  ojson j;
  j["device"] = r.device.ToString();
  j["stream"] = static_cast<uint64_t>(r.stream.handle);
  j["site"] = r.site;
  j["requested_bytes"] = static_cast<uint64_t>(r.requested_bytes);
  j["rounded_bytes"] = static_cast<uint64_t>(r.rounded_bytes);
  j["segment_bytes"] = static_cast<uint64_t>(r.segment_bytes);
  j["device_total"] = static_cast<uint64_t>(r.device_total);
  j["driver_free"] = static_cast<uint64_t>(r.driver_free);
  j["memory_limit"] = static_cast<uint64_t>(r.memory_limit);
  j["allocated"] = static_cast<uint64_t>(r.allocated);
  j["reserved"] = static_cast<uint64_t>(r.reserved);
  j["pending"] = static_cast<uint64_t>(r.pending);
  j["reserved_unallocated"] = static_cast<uint64_t>(r.reserved_unallocated);
  j["largest_free_block"] = static_cast<uint64_t>(r.largest_free_block);
  j["free_blocks"] = static_cast<uint64_t>(r.free_blocks);
  j["fragmentation"] = r.fragmentation;
  j["segment_count"] = static_cast<uint64_t>(r.segment_count);
  ojson top = ojson::array();
  for (const SiteUsage& u : r.top_sites) {
    const SiteInfo info = GetSite(u.site);
    ojson t;
    t["site"] = u.site;
    t["where"] = info.ToString();
    t["kind"] = std::string(SiteKindName(info.kind));
    t["copy"] = IsCopyKind(info.kind);
    t["live_bytes"] = static_cast<uint64_t>(u.live_bytes);
    t["live_count"] = static_cast<uint64_t>(u.live_count);
    top.push_back(std::move(t));
  }
  j["top_sites"] = std::move(top);
  j["stack_sample_bytes"] = r.stack_sample_bytes;
  ojson stacks = ojson::array();
  for (const SampledStack& s : r.top_stacks) {
    ojson t = SampledStackToJson(s, /*symbolize=*/false);  // AttachTopStacks did
    t["where"] = GetSite(s.site).ToString();
    stacks.push_back(std::move(t));
  }
  j["top_stacks"] = std::move(stacks);
  j["copy_bytes"] = static_cast<uint64_t>(r.copy_bytes);
  j["copy_share"] = r.allocated == 0 ? 0.0
                                     : static_cast<double>(r.copy_bytes) /
                                           static_cast<double>(r.allocated);
  j["arena_live_bytes"] = static_cast<uint64_t>(r.arena_live_bytes);
  j["arena_escaped_bytes"] = static_cast<uint64_t>(r.arena_escaped_bytes);
  j["arena_retained_bytes"] = static_cast<uint64_t>(r.arena_retained_bytes);
  j["cause"] = std::string(OomCauseName(r.cause));
  j["remedy"] = r.remedy;
  j["message"] = r.ToString();
  return j;
}

}  // namespace

std::string SnapshotToJson(const RuntimeSnapshot& snap, const std::vector<TraceEvent>* trace) {
  return SnapshotWriter(snap, trace).Write();
}

std::string OomDumpToJson(const RuntimeSnapshot& snap, const OomReport& report,
                          const std::vector<TraceEvent>* trace) {
  SiteSet sites;
  ojson j = SnapshotObject(snap, trace, &sites);
  sites.add(report.site);
  for (const SiteUsage& u : report.top_sites) sites.add(u.site);
  for (const SampledStack& s : report.top_stacks) sites.add(s.site);
  j["sites"] = SiteTableToJson(sites);
  j["oom"] = OomToJson(report);
  return j.dump(1);
}

std::string TraceEventToJson(const TraceEvent& event) { return TraceEventToObject(event).dump(); }

std::string TraceHeaderToJson(const std::vector<TraceEvent>& events) {
  SiteSet sites;
  for (const TraceEvent& e : events) sites.add(e.site);
  ojson j;
  j["schema"] = kTraceSchema;
  j["sites"] = SiteTableToJson(sites);
  return j.dump();
}

std::string TraceHeaderFromSites(const SiteMap& sites) {
  ojson j;
  j["schema"] = kTraceSchema;
  ojson table = ojson::array();
  for (const auto& [id, info] : sites) table.push_back(SiteToJson(id, info));
  j["sites"] = std::move(table);
  return j.dump();
}

absl::Status WriteTraceFile(const std::string& path, const std::vector<TraceEvent>& events) {
  std::ofstream out(path, std::ios::out | std::ios::trunc);
  if (!out) {
    return absl::UnavailableError(
        absl::StrCat("cannot write trace file ", path, ": ", std::strerror(errno)));
  }
  out << TraceHeaderToJson(events) << '\n';
  for (const TraceEvent& e : events) out << TraceEventToJson(e) << '\n';
  out.flush();
  if (!out) {
    return absl::UnavailableError(absl::StrCat("error writing trace file ", path));
  }
  return absl::OkStatus();
}

std::string DeviceStatsToJson(DeviceId device, const DeviceStats& stats,
                              const std::vector<SiteStats>& sites) {
  ojson j;
  j["schema"] = kStatsSchema;
  j["device"] = device.ToString();
  j["stats"] = StatsToJson(stats);
  ojson list = ojson::array();
  for (size_t id = 0; id < sites.size(); ++id) {
    const SiteStats& s = sites[id];
    if (s.total_count == 0) continue;
    const SiteInfo info = GetSite(static_cast<SiteId>(id));
    ojson e = SiteToJson(static_cast<SiteId>(id), info);
    e["where"] = info.ToString();
    e["live_bytes"] = s.live_bytes;
    e["live_count"] = s.live_count;
    e["peak_live_bytes"] = s.peak_live_bytes;
    e["total_bytes"] = s.total_bytes;
    e["total_count"] = s.total_count;
    list.push_back(std::move(e));
  }
  j["sites"] = std::move(list);
  return j.dump();
}

std::string LiveBuffersToJson(const RuntimeSnapshot& snap, const BufferFilter& filter) {
  struct Buffer {
    const AllocatorSnapshot* device;
    const BlockInfo* block;
    const BufferAnnotations* annotations;
  };
  std::map<SiteId, SiteInfo> infos;  // looked up once per site
  auto info_of = [&](SiteId id) -> const SiteInfo& {
    auto it = infos.find(id);
    if (it == infos.end()) it = infos.emplace(id, GetSite(id)).first;
    return it->second;
  };
  std::map<SiteId, bool> site_passes;  // decided once per site
  auto site_matches = [&](SiteId id) {
    if (!filter.site) return true;
    auto it = site_passes.find(id);
    if (it == site_passes.end()) {
      const SiteInfo& info = info_of(id);
      it = site_passes
               .emplace(id, SiteTextMatches(info.ToString(), info.file, info.line,
                                            info.function, *filter.site))
               .first;
    }
    return it->second;
  };
  std::vector<Buffer> matched;
  uint64_t matched_bytes = 0;
  for (size_t i = 0; i < snap.devices.size(); ++i) {
    const AllocatorSnapshot& d = snap.devices[i];
    const BufferAnnotations* annotations =
        i < snap.annotations.size() ? &snap.annotations[i] : nullptr;
    if (filter.device && d.device != *filter.device) continue;
    for (const SegmentInfo& s : d.segments) {
      for (const BlockInfo& b : s.blocks) {
        if (b.state != BlockState::kAllocated || b.size < filter.min_bytes) continue;
        if (!site_matches(b.site)) continue;
        matched.push_back({&d, &b, annotations});
        matched_bytes += b.size;
      }
    }
  }
  std::stable_sort(matched.begin(), matched.end(), [](const Buffer& a, const Buffer& b) {
    if (a.block->size != b.block->size) return a.block->size > b.block->size;
    return a.block->addr < b.block->addr;
  });
  const size_t count = std::min(matched.size(), filter.limit);
  ojson buffers = ojson::array();
  SiteSet sites;
  for (size_t i = 0; i < count; ++i) {
    const BlockInfo& b = *matched[i].block;
    ojson j;
    j["device"] = matched[i].device->device.ToString();
    j["addr"] = static_cast<uint64_t>(b.addr);
    j["size"] = static_cast<uint64_t>(b.size);
    j["requested"] = static_cast<uint64_t>(b.requested);
    j["stream"] = static_cast<uint64_t>(b.stream.handle);
    j["site"] = b.site;
    j["where"] = info_of(b.site).ToString();
    PutAge(j, b, matched[i].device->time_ns);
    PutAnnotation(j, b.addr, matched[i].annotations);
    buffers.push_back(std::move(j));
    sites.add(b.site);
  }
  ojson j;
  j["schema"] = kBuffersSchema;
  j["time_ns"] = snap.time_ns;
  j["matched"] = static_cast<uint64_t>(matched.size());
  j["matched_bytes"] = matched_bytes;
  j["returned"] = static_cast<uint64_t>(count);
  j["buffers"] = std::move(buffers);
  j["sites"] = SiteTableToJson(sites);
  return j.dump();
}

}  // namespace devmem
