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
#include <optional>
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

// Decimal digits, faster than std::to_chars for the long numbers snapshots are made of
// (addresses: 15 digits; ages: 10-12): 64-bit values are cut into 8-digit parts with
// two divisions, and each part is written as digit pairs from a table with 32-bit
// arithmetic (std::to_chars divides the 64-bit value by 100 once per pair, after a
// loop that counts its digits).
constexpr char kDigitPairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

inline void PutPair(char* p, uint32_t n) { std::memcpy(p, &kDigitPairs[2 * n], 2); }

// n < 10^8, as exactly 8 digits (leading zeros kept).
inline char* Put8Digits(char* p, uint32_t n) {
  const uint32_t hi = n / 10000, lo = n % 10000;
  PutPair(p, hi / 100);
  PutPair(p + 2, hi % 100);
  PutPair(p + 4, lo / 100);
  PutPair(p + 6, lo % 100);
  return p + 8;
}

// n < 10^4, without leading zeros.
inline char* PutUpTo4Digits(char* p, uint32_t n) {
  if (n < 10) {
    *p = static_cast<char>('0' + n);
    return p + 1;
  }
  if (n < 100) {
    PutPair(p, n);
    return p + 2;
  }
  if (n < 1000) {
    *p = static_cast<char>('0' + n / 100);
    PutPair(p + 1, n % 100);
    return p + 3;
  }
  PutPair(p, n / 100);
  PutPair(p + 2, n % 100);
  return p + 4;
}

// n < 10^8, without leading zeros.
inline char* PutUpTo8Digits(char* p, uint32_t n) {
  if (n < 10000) return PutUpTo4Digits(p, n);
  p = PutUpTo4Digits(p, n / 10000);
  const uint32_t lo = n % 10000;
  PutPair(p, lo / 100);
  PutPair(p + 2, lo % 100);
  return p + 4;
}

// `v` in decimal at `p` (room for 20 characters); returns the end.
inline char* PutDecimal(char* p, uint64_t v) {
  constexpr uint64_t k8 = 100'000'000;
  if (v < k8) return PutUpTo8Digits(p, static_cast<uint32_t>(v));
  if (v < k8 * k8) {
    p = PutUpTo8Digits(p, static_cast<uint32_t>(v / k8));
    return Put8Digits(p, static_cast<uint32_t>(v % k8));
  }
  p = PutUpTo4Digits(p, static_cast<uint32_t>(v / (k8 * k8)));  // < 1845
  p = Put8Digits(p, static_cast<uint32_t>(v / k8 % k8));
  return Put8Digits(p, static_cast<uint32_t>(v % k8));
}

// The text of a file written in pieces: bounded writes go straight into a buffer through
// a pointer (one room check each, no std::string append per token), and whenever the
// buffer is full its text is handed to the sink, which sends it on (HTTP) or appends it
// to a string. Stops writing, for good, once the sink returns false.
class PieceOut {
 public:
  PieceOut(size_t piece_bytes, const JsonSink& sink)
      : buf_(std::max<size_t>(piece_bytes, kMaxBounded)), sink_(sink) {
    p_ = buf_.data();
    end_ = p_ + buf_.size();
  }

  // The longest bounded write: a number, a key or a short name (device names, states).
  static constexpr size_t kMaxBounded = 256;

  bool ok() const { return ok_; }
  // Hands what is buffered to the sink. False once the sink said stop.
  bool flush() {
    if (ok_ && p_ != buf_.data()) ok_ = sink_(std::string_view(buf_.data(), p_ - buf_.data()));
    p_ = buf_.data();
    return ok_;
  }

  void ch(char c) {
    room(1);
    *p_++ = c;
  }
  // A literal (keys, punctuation): its length is known at compile time.
  template <size_t N>
  void lit(const char (&s)[N]) {
    static_assert(N - 1 <= kMaxBounded);
    room(N - 1);
    std::memcpy(p_, s, N - 1);
    p_ += N - 1;
  }
  void u64(uint64_t v) {
    room(20);
    p_ = PutDecimal(p_, v);
  }
  void i64(int64_t v) {
    room(21);
    if (v < 0) {
      *p_++ = '-';
      p_ = PutDecimal(p_, ~static_cast<uint64_t>(v) + 1);  // also for INT64_MIN
    } else {
      p_ = PutDecimal(p_, static_cast<uint64_t>(v));
    }
  }
  // Any text, already JSON (a dumped DOM, a quoted name): copied through the buffer.
  void text(std::string_view s) {
    while (!s.empty()) {
      if (p_ == end_) flush();
      const size_t n = std::min(s.size(), static_cast<size_t>(end_ - p_));
      std::memcpy(p_, s.data(), n);
      p_ += n;
      s.remove_prefix(n);
    }
  }

 private:
  void room(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) [[unlikely]] flush();
  }

  std::vector<char> buf_;
  char* p_;
  char* end_;
  const JsonSink& sink_;
  bool ok_ = true;
};

// The sites a straight writer names: ids below kDense in a byte map (site ids are
// interned densely from 1, so this is one store a block), others in a hash set (a file
// read back may carry any ids).
class DenseSiteSet {
 public:
  void add(SiteId id) {
    if (id < seen_.size()) [[likely]] {
      seen_[id] = 1;
    } else if (id < kDense) {
      seen_.resize(std::max<size_t>(id + 1, seen_.size() * 2), 0);
      seen_[id] = 1;
    } else {
      sparse_.add(id);
    }
  }
  SiteSet all() const {
    SiteSet set = sparse_;
    for (size_t id = 0; id < seen_.size(); ++id) {
      if (seen_[id]) set.add(static_cast<SiteId>(id));
    }
    return set;
  }

 private:
  static constexpr SiteId kDense = SiteId{1} << 22;
  std::vector<uint8_t> seen_;
  SiteSet sparse_;
};

// SnapshotToJson's writer: the text SnapshotObject(...).dump() gives, written straight
// into pieces for the bulk (segments' blocks, live buffers, trace events: numbers and
// names from fixed tables, which need no escaping) and through nlohmann for the rest
// (stats, infos, annotations, arena buffers, stacks, sites: few, and with strings to
// escape). Why: a DOM of 10^5 blocks and live buffers took ~1.4 s to build and dump
// (target: /debug/snapshot served in <= 50 ms, scripts/bench_snapshot.sh). The DOM
// writer stays for OOM dumps (indented; one per OOM); runtime_json_test.cc checks that
// the two agree on every field.
class SnapshotWriter {
 public:
  SnapshotWriter(const RuntimeSnapshot& snap, const std::vector<TraceEvent>* trace,
                 size_t piece_bytes, const JsonSink& sink)
      : snap_(snap), trace_(trace), out_(piece_bytes, sink) {}

  bool Write() {
    out_.lit("{\"schema\":");
    Dom(kSnapshotSchema);
    out_.lit(",\"time_ns\":");
    out_.i64(snap_.time_ns);
    out_.lit(",\"unix_time_ns\":");
    out_.i64(snap_.unix_time_ns);
    out_.lit(",\"devices\":[");
    for (size_t i = 0; i < snap_.devices.size() && out_.ok(); ++i) {
      if (i > 0) out_.ch(',');
      Device(snap_.devices[i],
             i < snap_.annotations.size() ? &snap_.annotations[i] : nullptr);
    }
    out_.ch(']');
    if (trace_ != nullptr) {
      out_.lit(",\"trace\":[");
      for (size_t i = 0; i < trace_->size() && out_.ok(); ++i) {
        if (i > 0) out_.ch(',');
        Event((*trace_)[i]);
      }
      out_.ch(']');
    }
    out_.lit(",\"sites\":");
    out_.text(SiteTableToJson(sites_.all()).dump());
    out_.ch('}');
    return out_.flush();
  }

 private:
  // A name from a fixed table (block states, pools, actions, device names): letters,
  // digits, '_' and ':' only, so no escaping; short (PieceOut::kMaxBounded).
  void Name(std::string_view name) {
    out_.ch('"');
    out_.text(name);
    out_.ch('"');
  }
  void Dom(const ojson& j) { out_.text(j.dump()); }
  // Device names, formatted once per device rather than once per event.
  const std::string& DeviceName(DeviceId d) {
    if (!device_name_ || d != device_name_->first) device_name_.emplace(d, d.ToString());
    return device_name_->second;
  }

  void Age(const BlockInfo& b, int64_t now_ns) {  // as PutAge
    if (b.alloc_time_ns == 0) return;
    out_.lit(",\"age_ns\":");
    out_.i64(now_ns - b.alloc_time_ns);
  }
  void Annotation(uintptr_t addr, const BufferAnnotations* annotations) {  // as PutAnnotation
    if (annotations == nullptr) return;
    auto it = annotations->find(addr);
    if (it == annotations->end()) return;
    const BufferAnnotation& a = it->second;
    out_.lit(",\"tensor\":");
    Dom(ojson{{"refcount", a.refcount}, {"dtype", a.dtype}, {"shape", a.shape}});
  }

  void Device(const AllocatorSnapshot& d, const BufferAnnotations* annotations) {
    out_.lit("{\"device\":");
    Name(DeviceName(d.device));
    out_.lit(",\"time_ns\":");
    out_.i64(d.time_ns);
    out_.lit(",\"info\":");
    Dom(ojson{{"name", d.info.name}, {"uuid", d.info.uuid}, {"backend", d.info.backend}});
    out_.lit(",\"mem_info\":");
    Dom(ojson{{"free_bytes", static_cast<uint64_t>(d.mem_info.free_bytes)},
              {"total_bytes", static_cast<uint64_t>(d.mem_info.total_bytes)}});
    out_.lit(",\"stats\":");
    Dom(StatsToJson(d.stats));
    out_.lit(",\"segments\":[");
    for (size_t i = 0; i < d.segments.size() && out_.ok(); ++i) {
      const SegmentInfo& s = d.segments[i];
      if (i > 0) out_.ch(',');
      out_.lit("{\"addr\":");
      out_.u64(s.addr);
      out_.lit(",\"size\":");
      out_.u64(s.size);
      out_.lit(",\"stream\":");
      out_.u64(s.stream.handle);
      out_.lit(",\"pool\":");
      if (s.small_pool) {
        out_.lit("\"small\"");
      } else {
        out_.lit("\"large\"");
      }
      out_.lit(",\"expandable\":");
      if (s.expandable) {
        out_.lit("true");
      } else {
        out_.lit("false");
      }
      if (!s.private_pool.is_default()) {  // as DeviceToJson
        out_.lit(",\"private_pool\":");
        Dom(ojson::array({s.private_pool.first, s.private_pool.second}));
      }
      out_.lit(",\"blocks\":[");
      for (size_t k = 0; k < s.blocks.size(); ++k) {
        const BlockInfo& b = s.blocks[k];
        if (k > 0) out_.ch(',');
        Block(b, d.time_ns);
        sites_.add(b.site);
      }
      out_.lit("]}");
    }
    out_.lit("],\"live_buffers\":[");
    bool first = true;
    for (const SegmentInfo& s : d.segments) {
      if (!out_.ok()) break;
      for (const BlockInfo& b : s.blocks) {
        if (b.state != BlockState::kAllocated) continue;
        if (!first) out_.ch(',');
        first = false;
        LiveBuffer(b, d.time_ns, annotations);
      }
    }
    out_.lit("],\"arena_buffers\":");
    SiteSet arena_sites;
    Dom(ArenaBuffersToJson(d, annotations, &arena_sites));
    out_.lit(",\"stack_sample_bytes\":");
    out_.u64(d.stack_sample_bytes);
    out_.lit(",\"sampled_stacks\":");
    Dom(SampledStacksToJson(d, &arena_sites));
    for (SiteId id : arena_sites.sorted()) sites_.add(id);
    out_.ch('}');
  }

  // The fields a block and a live buffer end with alike: stream, site, age, stack.
  void Placement(const BlockInfo& b, int64_t now_ns) {
    out_.lit(",\"stream\":");
    out_.u64(b.stream.handle);
    out_.lit(",\"site\":");
    out_.u64(b.site);
    Age(b, now_ns);
    if (b.stack != kNoStack) {
      out_.lit(",\"stack\":");
      out_.u64(b.stack);
    }
  }

  // The fields a block and a live buffer start with alike: {addr, size, requested.
  void Extent(const BlockInfo& b) {
    out_.lit("{\"addr\":");
    out_.u64(b.addr);
    out_.lit(",\"size\":");
    out_.u64(b.size);
    out_.lit(",\"requested\":");
    out_.u64(b.requested);
  }

  void Block(const BlockInfo& b, int64_t now_ns) {  // as BlockToJson
    Extent(b);
    out_.lit(",\"state\":");
    Name(BlockStateName(b.state));
    Placement(b, now_ns);
    out_.ch('}');
  }

  void LiveBuffer(const BlockInfo& b, int64_t now_ns,
                  const BufferAnnotations* annotations) {  // as LiveBufferToJson
    Extent(b);
    Placement(b, now_ns);
    Annotation(b.addr, annotations);
    out_.ch('}');
  }

  void Event(const TraceEvent& e) {  // as TraceEventToObject
    out_.lit("{\"seq\":");
    out_.u64(e.seq);
    out_.lit(",\"time_ns\":");
    out_.i64(e.time_ns);
    out_.lit(",\"action\":");
    Name(AllocActionName(e.action));
    out_.lit(",\"device\":");
    Name(DeviceName(e.device));
    out_.lit(",\"stream\":");
    out_.u64(e.stream.handle);
    out_.lit(",\"addr\":");
    out_.u64(e.addr);
    out_.lit(",\"size\":");
    out_.u64(e.size);
    out_.lit(",\"requested\":");
    out_.u64(e.requested);
    out_.lit(",\"site\":");
    out_.u64(e.site);
    out_.lit(",\"thread\":");
    out_.u64(e.thread);
    out_.ch('}');
    sites_.add(e.site);
  }

  const RuntimeSnapshot& snap_;
  const std::vector<TraceEvent>* trace_;
  DenseSiteSet sites_;
  std::optional<std::pair<DeviceId, std::string>> device_name_;
  PieceOut out_;
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
  size_t blocks = 0;
  for (const AllocatorSnapshot& d : snap.devices) {
    for (const SegmentInfo& seg : d.segments) blocks += seg.blocks.size();
  }
  // ~130 bytes a block and ~110 a live buffer; ~150 an event.
  std::string text;
  text.reserve(4096 + blocks * 240 + (trace != nullptr ? trace->size() * 150 : 0));
  const JsonSink sink = [&text](std::string_view piece) {
    text.append(piece);
    return true;
  };
  WriteSnapshotJson(snap, trace, kSnapshotPieceBytes, sink);
  return text;
}

bool WriteSnapshotJson(const RuntimeSnapshot& snap, const std::vector<TraceEvent>* trace,
                       size_t piece_bytes, const JsonSink& sink) {
  return SnapshotWriter(snap, trace, piece_bytes, sink).Write();
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
