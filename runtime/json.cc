// runtime/json.cc: devmem's JSON formats, written and read with nlohmann::json (the
// formats are documented field by field in docs/formats.md).
//
// Writers build nlohmann::ordered_json so that files list fields in a readable order
// ("schema" first). Readers parse into nlohmann::json and walk it with the helpers
// below, which throw ReadError naming the path of the offending field and what was
// expected; the public functions turn that into absl::InvalidArgumentError. The stats
// tables (kStatArrays, kStats, kCounters) drive both directions, so a field written is
// a field read.
#include "runtime/json.h"

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <fstream>
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

namespace devmem {
namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

// --- the stats tables -----------------------------------------------------------------

struct StatArrayField {
  const char* name;
  StatArray DeviceStats::*member;
};
constexpr StatArrayField kStatArrays[] = {
    {"allocation", &DeviceStats::allocation},
    {"segment", &DeviceStats::segment},
    {"active", &DeviceStats::active},
    {"inactive_split", &DeviceStats::inactive_split},
    {"allocated_bytes", &DeviceStats::allocated_bytes},
    {"reserved_bytes", &DeviceStats::reserved_bytes},
    {"active_bytes", &DeviceStats::active_bytes},
    {"inactive_split_bytes", &DeviceStats::inactive_split_bytes},
    {"requested_bytes", &DeviceStats::requested_bytes},
    {"pending_bytes", &DeviceStats::pending_bytes},
};
struct StatField {
  const char* name;
  Stat DeviceStats::*member;
};
constexpr StatField kStats[] = {
    {"oversize_allocations", &DeviceStats::oversize_allocations},
    {"oversize_segments", &DeviceStats::oversize_segments},
};
struct CounterField {
  const char* name;
  int64_t DeviceStats::*member;
};
constexpr CounterField kCounters[] = {
    {"num_alloc_retries", &DeviceStats::num_alloc_retries},
    {"num_ooms", &DeviceStats::num_ooms},
    {"num_device_alloc", &DeviceStats::num_device_alloc},
    {"num_device_free", &DeviceStats::num_device_free},
    {"num_sync_all_streams", &DeviceStats::num_sync_all_streams},
    {"cache_hits", &DeviceStats::cache_hits},
    {"cache_misses", &DeviceStats::cache_misses},
    {"num_frees", &DeviceStats::num_frees},
    {"max_split_size", &DeviceStats::max_split_size},
};
// Written always, read when present (files from before private pools have none).
constexpr CounterField kOptionalCounters[] = {
    {"private_pools", &DeviceStats::private_pools},
    {"private_reserved_bytes", &DeviceStats::private_reserved_bytes},
    {"private_allocated_bytes", &DeviceStats::private_allocated_bytes},
};
constexpr const char* kPoolNames[kNumStatPools] = {"all", "small", "large"};

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

  void Block(const BlockInfo& b, int64_t now_ns) {  // as BlockToJson
    out_ += "{\"addr\":";
    Uint(b.addr);
    Key("size");
    Uint(b.size);
    Key("requested");
    Uint(b.requested);
    Key("state");
    Name(BlockStateName(b.state));
    Key("stream");
    Uint(b.stream.handle);
    Key("site");
    Uint(b.site);
    Age(b, now_ns);
    if (b.stack != kNoStack) {
      Key("stack");
      Uint(b.stack);
    }
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
    Key("stream");
    Uint(b.stream.handle);
    Key("site");
    Uint(b.site);
    Age(b, now_ns);
    if (b.stack != kNoStack) {
      Key("stack");
      Uint(b.stack);
    }
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

// --- reading --------------------------------------------------------------------------

// Thrown by the helpers below; caught at the entry points.
struct ReadError {
  std::string message;
};

std::string Sub(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", Av(key));
}
std::string Idx(const std::string& path, size_t i) { return absl::StrCat(path, "[", i, "]"); }

[[noreturn]] void Expected(const std::string& path, std::string_view what, const json& got) {
  throw ReadError{absl::StrCat(path, ": expected ", Av(what), ", got ", got.type_name())};
}

const json& Field(const json& obj, std::string_view key, const std::string& path) {
  auto it = obj.find(std::string(key));
  if (it == obj.end()) {
    throw ReadError{absl::StrCat(Sub(path, key), ": missing (expected a field \"",
                                 Av(key), "\")")};
  }
  return *it;
}

const json& Object(const json& v, const std::string& path) {
  if (!v.is_object()) Expected(path, "an object", v);
  return v;
}
const json& Array(const json& v, const std::string& path) {
  if (!v.is_array()) Expected(path, "an array", v);
  return v;
}
uint64_t U64(const json& v, const std::string& path) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<uint64_t>();
  Expected(path, "a non-negative integer", v);
}
int64_t I64(const json& v, const std::string& path) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) {
      throw ReadError{absl::StrCat(path, ": expected a 64-bit signed integer, got ", u)};
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  Expected(path, "an integer", v);
}
uint32_t U32(const json& v, const std::string& path) {
  const uint64_t u = U64(v, path);
  if (u > UINT32_MAX) {
    throw ReadError{absl::StrCat(path, ": expected a 32-bit unsigned integer, got ", u)};
  }
  return static_cast<uint32_t>(u);
}
std::string Str(const json& v, const std::string& path) {
  if (!v.is_string()) Expected(path, "a string", v);
  return v.get<std::string>();
}
bool Bool(const json& v, const std::string& path) {
  if (!v.is_boolean()) Expected(path, "true or false", v);
  return v.get<bool>();
}

uint64_t U64F(const json& obj, std::string_view key, const std::string& path) {
  return U64(Field(obj, key, path), Sub(path, key));
}
int64_t I64F(const json& obj, std::string_view key, const std::string& path) {
  return I64(Field(obj, key, path), Sub(path, key));
}
std::string StrF(const json& obj, std::string_view key, const std::string& path) {
  return Str(Field(obj, key, path), Sub(path, key));
}

DeviceId DeviceF(const json& obj, const std::string& path) {
  const std::string text = StrF(obj, "device", path);
  absl::StatusOr<DeviceId> d = ParseDeviceId(text);
  if (!d.ok()) {
    throw ReadError{absl::StrCat(Sub(path, "device"),
                                 ": expected a device (\"cpu\", \"sim:N\", \"cuda:N\"), got \"",
                                 text, "\"")};
  }
  return *d;
}

// Names to enums: the inverse of the *Name functions.
template <typename Enum, typename NameFn>
Enum EnumF(const json& obj, std::string_view key, const std::string& path, int count,
           NameFn name, std::string_view what) {
  const std::string text = StrF(obj, key, path);
  std::string choices;
  for (int i = 0; i < count; ++i) {
    const std::string_view n = name(static_cast<Enum>(i));
    if (n == text) return static_cast<Enum>(i);
    absl::StrAppend(&choices, i == 0 ? "" : ", ", Av(n));
  }
  throw ReadError{absl::StrCat(Sub(path, key), ": expected ", Av(what), " (one of ", choices,
                               "), got \"", text, "\"")};
}

// Checks "schema": same family, same major version (any minor).
void CheckSchema(const json& root, std::string_view expected, std::string_view what) {
  if (!root.is_object()) Expected(std::string(what), "a JSON object", root);
  auto it = root.find("schema");
  if (it == root.end() || !it->is_string()) {
    throw ReadError{absl::StrCat(Av(what), ": missing \"schema\" (expected \"", Av(expected),
                                 "\")")};
  }
  const std::string found = it->get<std::string>();
  // "devmem.snapshot/1" accepts "devmem.snapshot/1" and "devmem.snapshot/1.N".
  const bool same = found == expected ||
                    (found.size() > expected.size() + 1 &&
                     std::string_view(found).substr(0, expected.size()) == expected &&
                     found[expected.size()] == '.');
  if (!same) {
    throw ReadError{absl::StrCat(Av(what), ": schema \"", found,
                                 "\" is not supported (this reader reads \"", Av(expected),
                                 "\"; other major versions are refused)")};
  }
}

json Parse(std::string_view text, std::string_view what) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number too large for any type ("1e999"
    // escaped as an uncaught exception: found by the fuzzer).
    throw ReadError{absl::StrCat(Av(what), ": not valid JSON (", e.what(), ")")};
  }
}

Stat StatFrom(const json& v, const std::string& path) {
  Object(v, path);
  Stat s;
  s.current = I64F(v, "current", path);
  s.peak = I64F(v, "peak", path);
  s.allocated = I64F(v, "allocated", path);
  s.freed = I64F(v, "freed", path);
  return s;
}

DeviceStats StatsFrom(const json& v, const std::string& path) {
  Object(v, path);
  DeviceStats stats;
  for (const StatArrayField& f : kStatArrays) {
    const std::string p = Sub(path, f.name);
    const json& pools = Object(Field(v, f.name, path), p);
    for (int i = 0; i < kNumStatPools; ++i) {
      (stats.*f.member)[i] = StatFrom(Field(pools, kPoolNames[i], p), Sub(p, kPoolNames[i]));
    }
  }
  for (const StatField& f : kStats) {
    stats.*f.member = StatFrom(Field(v, f.name, path), Sub(path, f.name));
  }
  for (const CounterField& f : kCounters) stats.*f.member = I64F(v, f.name, path);
  for (const CounterField& f : kOptionalCounters) {
    if (v.contains(f.name)) stats.*f.member = I64F(v, f.name, path);
  }
  // Optional: files written before driver calls were counted have none.
  if (v.contains("driver_calls")) {
    const std::string pc = Sub(path, "driver_calls");
    const std::string pn = Sub(path, "driver_ns");
    const json& calls = Object(Field(v, "driver_calls", path), pc);
    const json& ns = Object(Field(v, "driver_ns", path), pn);
    for (int i = 0; i < kNumDriverCalls; ++i) {
      const std::string name(DriverCallName(static_cast<DriverCall>(i)));
      stats.driver.calls[i] = I64F(calls, name, pc);
      stats.driver.ns[i] = I64F(ns, name, pn);
    }
    stats.driver.handle_reserve_bytes = I64F(v, "handle_reserve_bytes", path);
  }
  return stats;
}

BlockInfo BlockFrom(const json& v, const std::string& path, int64_t now_ns) {
  Object(v, path);
  BlockInfo b;
  b.addr = static_cast<uintptr_t>(U64F(v, "addr", path));
  b.size = static_cast<size_t>(U64F(v, "size", path));
  b.requested = static_cast<size_t>(U64F(v, "requested", path));
  b.state = EnumF<BlockState>(v, "state", path, 3, BlockStateName, "a block state");
  b.stream.handle = static_cast<uintptr_t>(U64F(v, "stream", path));
  b.site = U32(Field(v, "site", path), Sub(path, "site"));
  if (auto it = v.find("age_ns"); it != v.end() && !it->is_null()) {
    b.alloc_time_ns = now_ns - I64(*it, Sub(path, "age_ns"));
  }
  if (auto it = v.find("stack"); it != v.end()) b.stack = U32(*it, Sub(path, "stack"));
  return b;
}

SampledStack SampledStackFrom(const json& v, const std::string& path) {
  Object(v, path);
  SampledStack s;
  s.stack = U32(Field(v, "stack", path), Sub(path, "stack"));
  s.site = U32(Field(v, "site", path), Sub(path, "site"));
  s.samples = U64F(v, "samples", path);
  s.sampled_bytes = U64F(v, "sampled_bytes", path);
  const json& estimated = Field(v, "estimated_bytes", path);
  if (!estimated.is_number() || estimated.get<double>() < 0) {
    Expected(Sub(path, "estimated_bytes"), "a non-negative number", estimated);
  }
  s.estimated_bytes = estimated.get<double>();
  const std::string fp = Sub(path, "frames");
  const json& frames = Array(Field(v, "frames", path), fp);
  for (size_t i = 0; i < frames.size(); ++i) s.frames.push_back(Str(frames[i], Idx(fp, i)));
  return s;
}

AllocatorSnapshot DeviceFrom(const json& v, const std::string& path) {
  Object(v, path);
  AllocatorSnapshot d;
  d.device = DeviceF(v, path);
  d.time_ns = I64F(v, "time_ns", path);
  const std::string ip = Sub(path, "info");
  const json& info = Object(Field(v, "info", path), ip);
  d.info.name = StrF(info, "name", ip);
  d.info.uuid = StrF(info, "uuid", ip);
  d.info.backend = StrF(info, "backend", ip);
  const std::string mp = Sub(path, "mem_info");
  const json& mem = Object(Field(v, "mem_info", path), mp);
  d.mem_info.free_bytes = static_cast<size_t>(U64F(mem, "free_bytes", mp));
  d.mem_info.total_bytes = static_cast<size_t>(U64F(mem, "total_bytes", mp));
  d.stats = StatsFrom(Field(v, "stats", path), Sub(path, "stats"));
  const std::string sp = Sub(path, "segments");
  const json& segments = Array(Field(v, "segments", path), sp);
  for (size_t i = 0; i < segments.size(); ++i) {
    const std::string p = Idx(sp, i);
    const json& s = Object(segments[i], p);
    SegmentInfo seg;
    seg.addr = static_cast<uintptr_t>(U64F(s, "addr", p));
    seg.size = static_cast<size_t>(U64F(s, "size", p));
    seg.stream.handle = static_cast<uintptr_t>(U64F(s, "stream", p));
    const std::string pool = StrF(s, "pool", p);
    if (pool != "small" && pool != "large") {
      throw ReadError{absl::StrCat(Sub(p, "pool"), ": expected \"small\" or \"large\", got \"",
                                   pool, "\"")};
    }
    seg.small_pool = pool == "small";
    seg.expandable = Bool(Field(s, "expandable", p), Sub(p, "expandable"));
    if (auto pp = s.find("private_pool"); pp != s.end()) {  // optional
      const std::string ppp = Sub(p, "private_pool");
      const json& ids = Array(*pp, ppp);
      if (ids.size() != 2) {
        throw ReadError{absl::StrCat(ppp, ": expected [first, second], got ", ids.size(),
                                     " numbers")};
      }
      seg.private_pool.first = U64(ids[0], Idx(ppp, 0));
      seg.private_pool.second = U64(ids[1], Idx(ppp, 1));
    }
    const std::string bp = Sub(p, "blocks");
    const json& blocks = Array(Field(s, "blocks", p), bp);
    for (size_t k = 0; k < blocks.size(); ++k) {
      seg.blocks.push_back(BlockFrom(blocks[k], Idx(bp, k), d.time_ns));
    }
    d.segments.push_back(std::move(seg));
  }
  // Optional (files written before scoped arenas have none).
  if (auto ab = v.find("arena_buffers"); ab != v.end()) {
    const std::string ap = Sub(path, "arena_buffers");
    Array(*ab, ap);
    for (size_t i = 0; i < ab->size(); ++i) {
      const std::string p = Idx(ap, i);
      const json& a = Object((*ab)[i], p);
      ArenaBufferInfo b;
      b.addr = static_cast<uintptr_t>(U64F(a, "addr", p));
      b.size = static_cast<size_t>(U64F(a, "size", p));
      b.site = static_cast<SiteId>(U64F(a, "site", p));
      b.arena = StrF(a, "arena", p);
      b.chunk = static_cast<uintptr_t>(U64F(a, "chunk", p));
      b.escaped = Bool(Field(a, "escaped", p), Sub(p, "escaped"));
      if (b.addr < b.chunk) {
        throw ReadError{absl::StrCat(Sub(p, "addr"), ": ", b.addr,
                                     " lies below its chunk at ", b.chunk)};
      }
      d.arena_buffers.push_back(std::move(b));
    }
  }
  // Optional (files written before sampled stacks have none).
  if (auto it = v.find("stack_sample_bytes"); it != v.end()) {
    d.stack_sample_bytes = U64(*it, Sub(path, "stack_sample_bytes"));
  }
  if (auto ss = v.find("sampled_stacks"); ss != v.end()) {
    const std::string p = Sub(path, "sampled_stacks");
    Array(*ss, p);
    for (size_t i = 0; i < ss->size(); ++i) {
      d.sampled_stacks.push_back(SampledStackFrom((*ss)[i], Idx(p, i)));
    }
  }
  return d;
}

void SitesFrom(const json& v, const std::string& path, SiteMap* out) {
  Array(v, path);
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = Idx(path, i);
    const json& s = Object(v[i], p);
    const SiteId id = U32(Field(s, "id", p), Sub(p, "id"));
    SiteInfo info;
    info.file = StrF(s, "file", p);
    info.line = U32(Field(s, "line", p), Sub(p, "line"));
    info.function = StrF(s, "function", p);
    info.tag = StrF(s, "tag", p);
    info.kind = EnumF<SiteKind>(s, "kind", p, kNumSiteKinds, SiteKindName, "a site kind");
    if (s.contains("outer")) {  // optional: only sites with a ScopedSite frame
      const std::string op = Sub(p, "outer");
      const json& o = Object(s["outer"], op);
      info.outer_file = StrF(o, "file", op);
      info.outer_line = U32(Field(o, "line", op), Sub(op, "line"));
      info.outer_function = StrF(o, "function", op);
    }
    (*out)[id] = std::move(info);
  }
}

TraceEvent EventFrom(const json& v, const std::string& path) {
  Object(v, path);
  TraceEvent e;
  e.seq = U64F(v, "seq", path);
  e.time_ns = I64F(v, "time_ns", path);
  e.action = EnumF<AllocAction>(v, "action", path, kNumAllocActions, AllocActionName,
                                "an action");
  e.device = DeviceF(v, path);
  e.stream.handle = static_cast<uintptr_t>(U64F(v, "stream", path));
  e.addr = static_cast<uintptr_t>(U64F(v, "addr", path));
  e.size = static_cast<size_t>(U64F(v, "size", path));
  e.requested = static_cast<size_t>(U64F(v, "requested", path));
  e.site = U32(Field(v, "site", path), Sub(path, "site"));
  e.thread = U32(Field(v, "thread", path), Sub(path, "thread"));
  return e;
}

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

absl::StatusOr<RuntimeSnapshot> SnapshotFromJson(std::string_view text, SiteMap* sites,
                                                 std::vector<TraceEvent>* trace) {
  try {
    const json root = Parse(text, "snapshot");
    CheckSchema(root, kSnapshotSchema, "snapshot");
    RuntimeSnapshot snap;
    snap.time_ns = I64F(root, "time_ns", "");
    snap.unix_time_ns = I64F(root, "unix_time_ns", "");
    const json& devices = Array(Field(root, "devices", ""), "devices");
    for (size_t i = 0; i < devices.size(); ++i) {
      const std::string dp = Idx("devices", i);
      snap.devices.push_back(DeviceFrom(devices[i], dp));
      // "tensor" on live buffers (optional): what the tensor layer knew.
      BufferAnnotations annotations;
      if (auto lb = devices[i].find("live_buffers"); lb != devices[i].end()) {
        const std::string lp = Sub(dp, "live_buffers");
        Array(*lb, lp);
        for (size_t k = 0; k < lb->size(); ++k) {
          const std::string bp = Idx(lp, k);
          const json& buffer = Object((*lb)[k], bp);
          auto t = buffer.find("tensor");
          if (t == buffer.end()) continue;
          const std::string tp = Sub(bp, "tensor");
          const json& tensor = Object(*t, tp);
          BufferAnnotation a;
          a.refcount = U64F(tensor, "refcount", tp);
          a.dtype = StrF(tensor, "dtype", tp);
          const std::string sp = Sub(tp, "shape");
          const json& shape = Array(Field(tensor, "shape", tp), sp);
          for (size_t d = 0; d < shape.size(); ++d) a.shape.push_back(I64(shape[d], Idx(sp, d)));
          annotations[static_cast<uintptr_t>(U64F(buffer, "addr", bp))] = std::move(a);
        }
      }
      if (!annotations.empty()) {
        snap.annotations.resize(snap.devices.size());
        snap.annotations.back() = std::move(annotations);
      }
    }
    if (!snap.annotations.empty()) snap.annotations.resize(snap.devices.size());
    SiteMap table;
    SitesFrom(Field(root, "sites", ""), "sites", &table);
    std::vector<TraceEvent> events;
    if (auto it = root.find("trace"); it != root.end()) {
      Array(*it, "trace");
      for (size_t i = 0; i < it->size(); ++i) {
        events.push_back(EventFrom((*it)[i], Idx("trace", i)));
      }
    }
    if (sites != nullptr) *sites = std::move(table);
    if (trace != nullptr) *trace = std::move(events);
    return snap;
  } catch (const ReadError& e) {
    return absl::InvalidArgumentError(
        e.message.rfind("snapshot", 0) == 0 ? e.message : absl::StrCat("snapshot: ", e.message));
  } catch (const json::exception& e) {  // a conversion the checks above missed
    return absl::InvalidArgumentError(absl::StrCat("snapshot: malformed (", e.what(), ")"));
  }
}

std::string TraceEventToJson(const TraceEvent& event) { return TraceEventToObject(event).dump(); }

absl::StatusOr<TraceEvent> TraceEventFromJson(std::string_view line) {
  try {
    return EventFrom(Parse(line, "trace event"), "trace event");
  } catch (const ReadError& e) {
    return absl::InvalidArgumentError(e.message);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("trace event: malformed (", e.what(), ")"));
  }
}

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

absl::StatusOr<std::vector<TraceEvent>> TraceFromJsonl(std::string_view text, SiteMap* sites) {
  std::vector<TraceEvent> events;
  SiteMap table;
  size_t line_no = 0;
  size_t pos = 0;
  try {
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string_view::npos) nl = text.size();
      const std::string_view line = text.substr(pos, nl - pos);
      pos = nl + 1;
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const std::string where = absl::StrCat("trace line ", line_no);
      const json v = Parse(line, where);
      if (v.is_object() && v.contains("schema")) {  // the header line
        CheckSchema(v, kTraceSchema, where);
        if (auto it = v.find("sites"); it != v.end()) SitesFrom(*it, Sub(where, "sites"), &table);
        continue;
      }
      events.push_back(EventFrom(v, where));
    }
  } catch (const ReadError& e) {
    return absl::InvalidArgumentError(e.message);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace line ", line_no, ": malformed (", e.what(), ")"));
  }
  if (sites != nullptr) *sites = std::move(table);
  return events;
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
