// runtime/json_reader.cc: the readers of devmem's JSON formats (runtime/json.h): snapshots
// and OOM dumps, trace files and single event lines. The one reader of snapshots: the
// runtime's round trips, memtrace (tools/snapshot/ flattens a snapshot for its views,
// tools/memtrace/ exports one) and the fuzzers all use it.
//
// simdjson's DOM, because memtrace reads snapshots of 10^6 live buffers (hundreds of
// MiB) within seconds; nlohmann::json is used only once a parse has failed, to locate
// the syntax error (simdjson does not report positions).
//
// The helpers below throw ReadError naming the path of the offending field and what was
// expected; the entry points turn that into absl::InvalidArgumentError, prefixed with
// the input's name. A field's path ("devices[0].segments[2].blocks[1].size") is a
// chain of frames on the caller's stack, made into a string only when an error is
// reported: a 10^6-block file costs no string work on the happy path.
#include <simdjson.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "allocator/snapshot.h"
#include "allocator/stack_sampler.h"
#include "allocator/string_view_bridge.h"
#include "nlohmann/json.hpp"
#include "runtime/json.h"
#include "runtime/json_fields.h"

namespace devmem {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

struct ReadError {
  std::string message;  // "devices[0].size: expected ..."
};

// A field's path, as a chain of frames on the caller's stack. The root's key names the
// input's part ("" for a whole snapshot; "trace event"; "(top level)").
struct Path {
  const Path* parent = nullptr;
  const char* key = nullptr;  // a field name, or nullptr for an array index
  size_t index = 0;

  Path Field(const char* k) const { return Path{this, k, 0}; }
  Path At(size_t i) const { return Path{this, nullptr, i}; }
  std::string ToString() const {
    if (parent == nullptr) return key != nullptr ? key : "";
    std::string out = parent->ToString();
    if (key != nullptr) {
      if (!out.empty()) out += '.';
      out += key;
    } else {
      absl::StrAppend(&out, "[", index, "]");
    }
    return out;
  }
};

const char* TypeName(const element& e) {
  switch (e.type()) {
    case simdjson::dom::element_type::ARRAY: return "array";
    case simdjson::dom::element_type::OBJECT: return "object";
    case simdjson::dom::element_type::INT64: {
      // simdjson stores every integer that fits as INT64; only negative ones are
      // worth naming as such.
      int64_t v = 0;
      return e.get_int64().get(v) == simdjson::SUCCESS && v < 0 ? "negative integer"
                                                                 : "integer";
    }
    case simdjson::dom::element_type::UINT64: return "integer";
    case simdjson::dom::element_type::DOUBLE: return "number with a fraction or exponent";
    case simdjson::dom::element_type::STRING: return "string";
    case simdjson::dom::element_type::BOOL: return "boolean";
    case simdjson::dom::element_type::NULL_VALUE: return "null";
  }
  return "something else";
}

[[noreturn]] void Expected(const Path& path, std::string_view what, const element& got) {
  throw ReadError{absl::StrCat(path.ToString(), ": expected ", Av(what), ", got ",
                               TypeName(got))};
}

object Obj(const element& e, const Path& path) {
  object o;
  if (e.get_object().get(o) != simdjson::SUCCESS) Expected(path, "an object", e);
  return o;
}
array Arr(const element& e, const Path& path) {
  array a;
  if (e.get_array().get(a) != simdjson::SUCCESS) Expected(path, "an array", e);
  return a;
}
element Get(const object& o, const char* key, const Path& path) {
  element e;
  if (o.at_key(key).get(e) != simdjson::SUCCESS) {
    throw ReadError{absl::StrCat(path.Field(key).ToString(), ": missing (expected a field \"",
                                 key, "\")")};
  }
  return e;
}
// An optional field: false when absent.
bool Find(const object& o, const char* key, element* e) {
  return o.at_key(key).get(*e) == simdjson::SUCCESS;
}
uint64_t U64(const element& e, const Path& path) {
  uint64_t v;
  if (e.get_uint64().get(v) != simdjson::SUCCESS) Expected(path, "a non-negative integer", e);
  return v;
}
int64_t I64(const element& e, const Path& path) {
  int64_t v;
  if (e.get_int64().get(v) != simdjson::SUCCESS) Expected(path, "a 64-bit signed integer", e);
  return v;
}
uint32_t U32(const element& e, const Path& path) {
  const uint64_t v = U64(e, path);
  if (v > UINT32_MAX) {
    throw ReadError{absl::StrCat(path.ToString(), ": expected a 32-bit unsigned integer, got ", v)};
  }
  return static_cast<uint32_t>(v);
}
double Dbl(const element& e, const Path& path) {
  double v;
  if (e.get_double().get(v) != simdjson::SUCCESS) Expected(path, "a number", e);
  return v;
}
std::string Str(const element& e, const Path& path) {
  std::string_view v;
  if (e.get_string().get(v) != simdjson::SUCCESS) Expected(path, "a string", e);
  return std::string(v);
}
bool Bool(const element& e, const Path& path) {
  bool v;
  if (e.get_bool().get(v) != simdjson::SUCCESS) Expected(path, "true or false", e);
  return v;
}

// Field shorthands: U64F(o, "size", p) reads o.size with its path.
uint64_t U64F(const object& o, const char* k, const Path& p) { return U64(Get(o, k, p), p.Field(k)); }
int64_t I64F(const object& o, const char* k, const Path& p) { return I64(Get(o, k, p), p.Field(k)); }
uint32_t U32F(const object& o, const char* k, const Path& p) { return U32(Get(o, k, p), p.Field(k)); }
double DblF(const object& o, const char* k, const Path& p) { return Dbl(Get(o, k, p), p.Field(k)); }
std::string StrF(const object& o, const char* k, const Path& p) { return Str(Get(o, k, p), p.Field(k)); }
bool BoolF(const object& o, const char* k, const Path& p) { return Bool(Get(o, k, p), p.Field(k)); }
object ObjF(const object& o, const char* k, const Path& p) { return Obj(Get(o, k, p), p.Field(k)); }
array ArrF(const object& o, const char* k, const Path& p) { return Arr(Get(o, k, p), p.Field(k)); }

// Names to enums: the inverse of the *Name functions.
template <typename Enum, typename NameFn>
Enum EnumF(const object& o, const char* key, const Path& path, int count, NameFn name,
           std::string_view what) {
  const Path p = path.Field(key);
  const element e = Get(o, key, path);
  std::string_view text;
  if (e.get_string().get(text) != simdjson::SUCCESS) Expected(p, what, e);
  std::string choices;
  for (int i = 0; i < count; ++i) {
    const std::string_view n = name(static_cast<Enum>(i));
    if (n == text) return static_cast<Enum>(i);
    absl::StrAppend(&choices, i == 0 ? "" : ", ", Av(n));
  }
  throw ReadError{absl::StrCat(p.ToString(), ": expected ", Av(what), " (one of ", choices,
                               "), got \"", Av(text), "\"")};
}

DeviceId DeviceF(const object& o, const Path& path) {
  const std::string text = StrF(o, "device", path);
  absl::StatusOr<DeviceId> d = ParseDeviceId(text);
  if (!d.ok()) {
    throw ReadError{absl::StrCat(path.Field("device").ToString(),
                                 ": expected a device (\"cpu\", \"sim:N\", \"cuda:N\"), got \"",
                                 text, "\"")};
  }
  return *d;
}

// "devmem.snapshot/1" accepts "devmem.snapshot/1" and "devmem.snapshot/1.N".
bool SameMajor(std::string_view found, std::string_view expected) {
  return found == expected ||
         (found.size() > expected.size() + 1 && found.substr(0, expected.size()) == expected &&
          found[expected.size()] == '.');
}

// Checks "schema" of a top-level object: same family, same major version (any minor).
std::string CheckSchema(const object& o, std::string_view expected) {
  element se;
  std::string_view schema;
  if (!Find(o, "schema", &se) || se.get_string().get(schema) != simdjson::SUCCESS) {
    throw ReadError{absl::StrCat("missing \"schema\" (expected \"", Av(expected), "\")")};
  }
  if (!SameMajor(schema, expected)) {
    throw ReadError{absl::StrCat("schema \"", Av(schema),
                                 "\" is not supported (this reader reads \"", Av(expected),
                                 "\"; other major versions are refused)")};
  }
  return std::string(schema);
}

// Where nlohmann (which reports positions) finds the syntax error simdjson refused;
// empty when it accepts the text. Only runs on failure.
std::string SyntaxErrorAt(std::string_view text) {
  struct Sax : nlohmann::json::json_sax_t {
    explicit Sax(std::string_view text) : text_(text) {}
    std::string_view text_;
    std::string error;
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return true; }
    bool key(string_t&) override { return true; }
    bool end_object() override { return true; }
    bool start_array(std::size_t) override { return true; }
    bool end_array() override { return true; }
    bool parse_error(std::size_t position, const std::string&,
                     const nlohmann::detail::exception& ex) override {
      std::string what = ex.what();
      // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax ..."
      if (const size_t colon = what.find(": "); colon != std::string::npos) {
        what = what.substr(colon + 2);
      }
      const size_t at = position > 0 ? position - 1 : 0;
      // nlohmann takes a NUL byte for the end of the input; say what it really is.
      if (at < text_.size() && text_[at] == '\0') what = "a NUL byte (expected JSON text)";
      error = absl::StrCat("at byte ", at, ": ", what);
      return false;
    }
  } sax(text);
  nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  return sax.error;
}

// Parses `text` (padded when `padded`, else copied into the parser's buffer); the
// error says where the syntax breaks. `what` names the expected document.
element ParseText(simdjson::dom::parser& parser, std::string_view text, bool padded,
                  std::string_view what) {
  element root;
  const auto err = padded ? parser.parse(text.data(), text.size(), /*realloc_if_needed=*/false)
                                .get(root)
                          : parser.parse(text.data(), text.size()).get(root);
  if (err == simdjson::SUCCESS) return root;
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    throw ReadError{absl::StrCat("empty (expected ", Av(what), ")")};
  }
  std::string where = SyntaxErrorAt(text);
  if (where.empty()) where = simdjson::error_message(err);
  throw ReadError{absl::StrCat("not valid JSON, ", where)};
}

// --- snapshots ------------------------------------------------------------------------

Stat StatFrom(const element& e, const Path& path) {
  const object o = Obj(e, path);
  Stat s;
  s.current = I64F(o, "current", path);
  s.peak = I64F(o, "peak", path);
  s.allocated = I64F(o, "allocated", path);
  s.freed = I64F(o, "freed", path);
  return s;
}

DeviceStats StatsFrom(const object& v, const Path& path) {
  using namespace json_fields;
  DeviceStats stats;
  for (const StatArrayField& f : kStatArrays) {
    const Path p = path.Field(f.name);
    const object pools = ObjF(v, f.name, path);
    for (int i = 0; i < kNumStatPools; ++i) {
      (stats.*f.member)[i] = StatFrom(Get(pools, kPoolNames[i], p), p.Field(kPoolNames[i]));
    }
  }
  for (const StatField& f : kStats) {
    stats.*f.member = StatFrom(Get(v, f.name, path), path.Field(f.name));
  }
  for (const CounterField& f : kCounters) stats.*f.member = I64F(v, f.name, path);
  element e;
  for (const CounterField& f : kOptionalCounters) {
    if (Find(v, f.name, &e)) stats.*f.member = I64(e, path.Field(f.name));
  }
  // Optional: files written before driver calls were counted have none.
  if (Find(v, "driver_calls", &e)) {
    const Path pc = path.Field("driver_calls");
    const Path pn = path.Field("driver_ns");
    const object calls = Obj(e, pc);
    const object ns = ObjF(v, "driver_ns", path);
    for (int i = 0; i < kNumDriverCalls; ++i) {
      const std::string name(DriverCallName(static_cast<DriverCall>(i)));
      // Kinds added later (export, import) are 0 in files written before them.
      element unused;
      if (i >= kNumDriverCallsBeforeIpc && !Find(calls, name.c_str(), &unused)) continue;
      stats.driver.calls[i] = I64F(calls, name.c_str(), pc);
      stats.driver.ns[i] = I64F(ns, name.c_str(), pn);
    }
    stats.driver.handle_reserve_bytes = I64F(v, "handle_reserve_bytes", path);
  }
  return stats;
}

BlockInfo BlockFrom(const element& e, const Path& p, int64_t now_ns) {
  const object o = Obj(e, p);
  BlockInfo b;
  b.addr = static_cast<uintptr_t>(U64F(o, "addr", p));
  b.size = static_cast<size_t>(U64F(o, "size", p));
  b.requested = static_cast<size_t>(U64F(o, "requested", p));
  b.state = EnumF<BlockState>(o, "state", p, 3, BlockStateName, "a block state");
  b.stream.handle = static_cast<uintptr_t>(U64F(o, "stream", p));
  b.site = U32F(o, "site", p);
  element v;
  if (Find(o, "age_ns", &v) && !v.is_null()) b.alloc_time_ns = now_ns - I64(v, p.Field("age_ns"));
  if (Find(o, "stack", &v)) b.stack = U32(v, p.Field("stack"));
  return b;
}

SegmentInfo SegmentFrom(const element& e, const Path& p, int64_t now_ns) {
  const object o = Obj(e, p);
  SegmentInfo seg;
  seg.addr = static_cast<uintptr_t>(U64F(o, "addr", p));
  seg.size = static_cast<size_t>(U64F(o, "size", p));
  if (seg.addr + seg.size < seg.addr) {
    throw ReadError{absl::StrCat(
        p.Field("size").ToString(),
        ": expected a size that keeps the segment inside the address space, got ", seg.size)};
  }
  seg.stream.handle = static_cast<uintptr_t>(U64F(o, "stream", p));
  const std::string pool = StrF(o, "pool", p);
  if (pool != "small" && pool != "large") {
    throw ReadError{absl::StrCat(p.Field("pool").ToString(),
                                 ": expected \"small\" or \"large\", got \"", pool, "\"")};
  }
  seg.small_pool = pool == "small";
  seg.expandable = BoolF(o, "expandable", p);
  element v;
  if (Find(o, "private_pool", &v)) {  // optional: only private pools' segments have it
    const Path pp = p.Field("private_pool");
    const array ids = Arr(v, pp);
    if (ids.size() != 2) {
      throw ReadError{absl::StrCat(pp.ToString(), ": expected [first, second], got ",
                                   ids.size(), " numbers")};
    }
    uint64_t id[2] = {0, 0};
    size_t n = 0;
    for (element x : ids) {
      id[n] = U64(x, pp.At(n));
      ++n;
    }
    seg.private_pool.first = id[0];
    seg.private_pool.second = id[1];
  }
  const Path bp = p.Field("blocks");
  size_t k = 0;
  uintptr_t covered_to = seg.addr;  // end of the block before (blocks are in address order)
  for (element be : ArrF(o, "blocks", p)) {
    const Path blp = bp.At(k++);
    const BlockInfo& b = seg.blocks.emplace_back(BlockFrom(be, blp, now_ns));
    // Blocks lie inside their segment: the views (segment maps, shares) rely on it, and
    // a file that breaks it is not one devmem wrote. Written so that nothing wraps: a
    // block that starts past the segment's end made `seg.addr + seg.size - b.addr`
    // wrap to a huge bound and was accepted (found by the snapshot fuzzer's invariants:
    // segment maps then indexed past their cells).
    if (b.addr < seg.addr || b.addr - seg.addr > seg.size ||
        b.size > seg.size - (b.addr - seg.addr)) {
      throw ReadError{absl::StrCat(blp.ToString(), ": expected a block inside its segment [",
                                   seg.addr, ", +", seg.size, "), got addr ", b.addr, " size ",
                                   b.size)};
    }
    // Blocks tile the segment in address order (docs/formats.md): one that starts
    // before the previous one ends would be counted twice by buffers, diff and oom.
    if (b.addr < covered_to) {
      throw ReadError{absl::StrCat(blp.ToString(), ": overlaps the block before it (which ends at ",
                                   covered_to, "), got addr ", b.addr,
                                   ": blocks must tile their segment in address order")};
    }
    covered_to = b.addr + b.size;
  }
  return seg;
}

SampledStack SampledStackFrom(const element& e, const Path& p) {
  const object o = Obj(e, p);
  SampledStack s;
  s.stack = U32F(o, "stack", p);
  s.site = U32F(o, "site", p);
  s.samples = U64F(o, "samples", p);
  s.sampled_bytes = U64F(o, "sampled_bytes", p);
  const element est = Get(o, "estimated_bytes", p);
  double v = 0;
  if (est.get_double().get(v) != simdjson::SUCCESS || !(v >= 0)) {
    Expected(p.Field("estimated_bytes"), "a non-negative number", est);
  }
  s.estimated_bytes = v;
  const Path fp = p.Field("frames");
  size_t i = 0;
  for (element f : ArrF(o, "frames", p)) s.frames.push_back(Str(f, fp.At(i++)));
  return s;
}

// The optional "tensor" annotations of "live_buffers": what the tensor layer knew about
// each live buffer. Each must name an allocated block of the device: live_buffers lists
// them in segment order, so a cursor over those blocks finds each one in O(1); an
// address out of that order falls back to a lookup set.
BufferAnnotations AnnotationsFrom(const object& device, const Path& p,
                                  const AllocatorSnapshot& d) {
  BufferAnnotations out;
  element lb;
  if (!Find(device, "live_buffers", &lb)) return out;
  const Path lp = p.Field("live_buffers");
  size_t seg = 0, blk = 0;  // the cursor: the next allocated block to compare with
  absl::flat_hash_set<uintptr_t> allocated;  // built on first need
  auto is_allocated_block = [&](uintptr_t addr) {
    for (; seg < d.segments.size(); ++seg, blk = 0) {
      const std::vector<BlockInfo>& blocks = d.segments[seg].blocks;
      for (; blk < blocks.size(); ++blk) {
        if (blocks[blk].state != BlockState::kAllocated) continue;
        if (blocks[blk].addr == addr) return true;
        if (blocks[blk].addr > addr) break;
      }
      if (blk < blocks.size()) break;
    }
    if (allocated.empty()) {
      for (const SegmentInfo& s : d.segments) {
        for (const BlockInfo& b : s.blocks) {
          if (b.state == BlockState::kAllocated) allocated.insert(b.addr);
        }
      }
    }
    return allocated.contains(addr);
  };
  size_t k = 0;
  for (element be : Arr(lb, lp)) {
    const Path bp = lp.At(k++);
    const object bo = Obj(be, bp);
    element te;
    if (!Find(bo, "tensor", &te)) continue;
    const uintptr_t addr = static_cast<uintptr_t>(U64F(bo, "addr", bp));
    const Path tp = bp.Field("tensor");
    const object to = Obj(te, tp);
    BufferAnnotation a;
    a.refcount = U64F(to, "refcount", tp);
    a.dtype = StrF(to, "dtype", tp);
    const Path sp = tp.Field("shape");
    size_t i = 0;
    for (element dim : ArrF(to, "shape", tp)) a.shape.push_back(I64(dim, sp.At(i++)));
    if (!is_allocated_block(addr)) {
      throw ReadError{absl::StrCat(bp.Field("addr").ToString(),
                                   ": expected the address of an allocated block, got ", addr)};
    }
    out[addr] = std::move(a);
  }
  return out;
}

AllocatorSnapshot DeviceFrom(const element& e, const Path& p, BufferAnnotations* annotations) {
  const object o = Obj(e, p);
  AllocatorSnapshot d;
  d.device = DeviceF(o, p);
  d.time_ns = I64F(o, "time_ns", p);
  const Path ip = p.Field("info");
  const object info = ObjF(o, "info", p);
  d.info.name = StrF(info, "name", ip);
  d.info.uuid = StrF(info, "uuid", ip);
  d.info.backend = StrF(info, "backend", ip);
  const Path mp = p.Field("mem_info");
  const object mem = ObjF(o, "mem_info", p);
  d.mem_info.free_bytes = static_cast<size_t>(U64F(mem, "free_bytes", mp));
  d.mem_info.total_bytes = static_cast<size_t>(U64F(mem, "total_bytes", mp));
  d.stats = StatsFrom(ObjF(o, "stats", p), p.Field("stats"));
  const Path sp = p.Field("segments");
  size_t i = 0;
  for (element se : ArrF(o, "segments", p)) {
    d.segments.push_back(SegmentFrom(se, sp.At(i++), d.time_ns));
  }
  *annotations = AnnotationsFrom(o, p, d);
  element v;
  // Optional (files written before scoped arenas have none).
  if (Find(o, "arena_buffers", &v)) {
    const Path ap = p.Field("arena_buffers");
    size_t k = 0;
    for (element be : Arr(v, ap)) {
      const Path bp = ap.At(k++);
      const object bo = Obj(be, bp);
      ArenaBufferInfo b;
      b.addr = static_cast<uintptr_t>(U64F(bo, "addr", bp));
      b.size = static_cast<size_t>(U64F(bo, "size", bp));
      b.chunk = static_cast<uintptr_t>(U64F(bo, "chunk", bp));
      b.site = U32F(bo, "site", bp);
      b.arena = StrF(bo, "arena", bp);
      b.escaped = BoolF(bo, "escaped", bp);
      if (b.addr < b.chunk) {
        throw ReadError{absl::StrCat(bp.Field("addr").ToString(), ": ", b.addr,
                                     " lies below its chunk at ", b.chunk)};
      }
      d.arena_buffers.push_back(std::move(b));
    }
  }
  // Optional (files written before sampled stacks have none).
  if (Find(o, "stack_sample_bytes", &v)) d.stack_sample_bytes = U64(v, p.Field("stack_sample_bytes"));
  if (Find(o, "sampled_stacks", &v)) {
    const Path ssp = p.Field("sampled_stacks");
    size_t k = 0;
    for (element ge : Arr(v, ssp)) d.sampled_stacks.push_back(SampledStackFrom(ge, ssp.At(k++)));
  }
  return d;
}

void SitesFrom(const element& e, const Path& path, SiteMap* out) {
  size_t i = 0;
  for (element se : Arr(e, path)) {
    const Path p = path.At(i++);
    const object s = Obj(se, p);
    const SiteId id = U32F(s, "id", p);
    SiteInfo info;
    info.file = StrF(s, "file", p);
    info.line = U32F(s, "line", p);
    info.function = StrF(s, "function", p);
    info.tag = StrF(s, "tag", p);
    info.kind = EnumF<SiteKind>(s, "kind", p, kNumSiteKinds, SiteKindName, "a site kind");
    element oe;
    if (Find(s, "outer", &oe)) {  // optional: only sites with a ScopedSite frame
      const Path op = p.Field("outer");
      const object o = Obj(oe, op);
      info.outer_file = StrF(o, "file", op);
      info.outer_line = U32F(o, "line", op);
      info.outer_function = StrF(o, "function", op);
    }
    (*out)[id] = std::move(info);
  }
}

TraceEvent EventFrom(const element& e, const Path& p) {
  const object o = Obj(e, p);
  TraceEvent ev;
  ev.seq = U64F(o, "seq", p);
  ev.time_ns = I64F(o, "time_ns", p);
  ev.action = EnumF<AllocAction>(o, "action", p, kNumAllocActions, AllocActionName, "an action");
  ev.device = DeviceF(o, p);
  ev.stream.handle = static_cast<uintptr_t>(U64F(o, "stream", p));
  ev.addr = static_cast<uintptr_t>(U64F(o, "addr", p));
  ev.size = static_cast<size_t>(U64F(o, "size", p));
  ev.requested = static_cast<size_t>(U64F(o, "requested", p));
  ev.site = U32F(o, "site", p);
  ev.thread = U32F(o, "thread", p);
  return ev;
}

OomRecord OomFrom(const element& e, const Path& p) {
  const object o = Obj(e, p);
  OomRecord r;
  r.device = StrF(o, "device", p);
  r.stream = U64F(o, "stream", p);
  r.site = U32F(o, "site", p);
  r.requested_bytes = U64F(o, "requested_bytes", p);
  r.rounded_bytes = U64F(o, "rounded_bytes", p);
  r.segment_bytes = U64F(o, "segment_bytes", p);
  r.device_total = U64F(o, "device_total", p);
  r.driver_free = U64F(o, "driver_free", p);
  r.memory_limit = U64F(o, "memory_limit", p);
  r.allocated = U64F(o, "allocated", p);
  r.reserved = U64F(o, "reserved", p);
  r.pending = U64F(o, "pending", p);
  r.reserved_unallocated = U64F(o, "reserved_unallocated", p);
  r.largest_free_block = U64F(o, "largest_free_block", p);
  r.free_blocks = U64F(o, "free_blocks", p);
  r.segment_count = U64F(o, "segment_count", p);
  r.fragmentation = DblF(o, "fragmentation", p);
  const Path tp = p.Field("top_sites");
  size_t i = 0;
  for (element te : ArrF(o, "top_sites", p)) {
    const Path sp = tp.At(i++);
    const object so = Obj(te, sp);
    OomRecordSite t;
    t.site = U32F(so, "site", sp);
    t.where = StrF(so, "where", sp);
    t.kind = StrF(so, "kind", sp);
    t.copy = BoolF(so, "copy", sp);
    t.live_bytes = U64F(so, "live_bytes", sp);
    t.live_count = U64F(so, "live_count", sp);
    r.top_sites.push_back(std::move(t));
  }
  r.copy_bytes = U64F(o, "copy_bytes", p);
  r.copy_share = DblF(o, "copy_share", p);
  r.cause = StrF(o, "cause", p);
  r.remedy = StrF(o, "remedy", p);
  r.message = StrF(o, "message", p);
  return r;
}

SnapshotFile SnapshotFrom(const element& root) {
  const Path top;
  object o;
  if (root.get_object().get(o) != simdjson::SUCCESS) {
    Expected(Path{nullptr, "(top level)", 0}, "a JSON object", root);
  }
  SnapshotFile f;
  f.schema = CheckSchema(o, kSnapshotSchema);
  f.snap.time_ns = I64F(o, "time_ns", top);
  f.snap.unix_time_ns = I64F(o, "unix_time_ns", top);
  const Path dp = top.Field("devices");
  size_t i = 0;
  for (element de : ArrF(o, "devices", top)) {
    BufferAnnotations annotations;
    f.snap.devices.push_back(DeviceFrom(de, dp.At(i++), &annotations));
    if (!annotations.empty()) {  // kept only where a device has some
      f.snap.annotations.resize(f.snap.devices.size());
      f.snap.annotations.back() = std::move(annotations);
    }
  }
  if (!f.snap.annotations.empty()) f.snap.annotations.resize(f.snap.devices.size());
  SitesFrom(Get(o, "sites", top), top.Field("sites"), &f.sites);
  element v;
  if (Find(o, "trace", &v)) {
    const Path tp = top.Field("trace");
    size_t k = 0;
    for (element ee : Arr(v, tp)) f.trace.push_back(EventFrom(ee, tp.At(k++)));
  }
  if (Find(o, "oom", &v)) f.oom = OomFrom(v, top.Field("oom"));
  return f;
}

constexpr std::string_view kSnapshotWhat = "a JSON snapshot object";

absl::StatusOr<SnapshotFile> ParseSnapshotText(std::string_view text, bool padded,
                                               const std::string& name) {
  try {
    simdjson::dom::parser parser;
    return SnapshotFrom(ParseText(parser, text, padded, kSnapshotWhat));
  } catch (const ReadError& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", e.message));
  }
}

}  // namespace

absl::StatusOr<SnapshotFile> ParseSnapshotJson(std::string_view text, const std::string& name) {
  return ParseSnapshotText(text, /*padded=*/false, name);
}

absl::StatusOr<SnapshotFile> ReadSnapshotJsonFile(const std::string& path) {
  // Probed first for errno's words ("No such file or directory"), which simdjson's
  // load error does not carry.
  if (std::ifstream probe(path); !probe) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  if (std::error_code ec; std::filesystem::is_directory(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", path, ": a directory, not a snapshot file"));
  }
  simdjson::padded_string padded;
  if (const auto err = simdjson::padded_string::load(path).get(padded);
      err != simdjson::SUCCESS) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ",
                                            simdjson::error_message(err)));
  }
  return ParseSnapshotText(std::string_view(padded.data(), padded.size()), /*padded=*/true, path);
}

absl::StatusOr<RuntimeSnapshot> SnapshotFromJson(std::string_view text, SiteMap* sites,
                                                 std::vector<TraceEvent>* trace) {
  absl::StatusOr<SnapshotFile> f = ParseSnapshotJson(text, "snapshot");
  if (!f.ok()) return f.status();
  if (sites != nullptr) *sites = std::move(f->sites);
  if (trace != nullptr) *trace = std::move(f->trace);
  return std::move(f->snap);
}

// --- traces ---------------------------------------------------------------------------

absl::StatusOr<TraceEvent> TraceEventFromJson(std::string_view line) {
  try {
    simdjson::dom::parser parser;
    return EventFrom(ParseText(parser, line, /*padded=*/false, "a JSON trace event"),
                     Path{nullptr, "trace event", 0});
  } catch (const ReadError& e) {
    return absl::InvalidArgumentError(e.message.rfind("trace event", 0) == 0
                                          ? e.message
                                          : absl::StrCat("trace event: ", e.message));
  }
}

absl::StatusOr<std::vector<TraceEvent>> TraceFromJsonl(std::string_view text, SiteMap* sites) {
  std::vector<TraceEvent> events;
  SiteMap table;
  simdjson::dom::parser parser;  // reused: its buffers grow to the longest line
  size_t line_no = 0;
  size_t pos = 0;
  std::string where;
  try {
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      if (nl == std::string_view::npos) nl = text.size();
      const std::string_view line = text.substr(pos, nl - pos);
      pos = nl + 1;
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      where = absl::StrCat("trace line ", line_no);
      const element v = ParseText(parser, line, /*padded=*/false, "a JSON trace line");
      const Path lp{nullptr, where.c_str(), 0};
      object o;
      element se;
      if (v.get_object().get(o) == simdjson::SUCCESS && Find(o, "schema", &se)) {
        CheckSchema(o, kTraceSchema);  // the header line
        if (element st; Find(o, "sites", &st)) SitesFrom(st, lp.Field("sites"), &table);
        continue;
      }
      events.push_back(EventFrom(v, lp));
    }
  } catch (const ReadError& e) {
    return absl::InvalidArgumentError(
        e.message.rfind(where, 0) == 0 ? e.message : absl::StrCat(where, ": ", e.message));
  }
  if (sites != nullptr) *sites = std::move(table);
  return events;
}

}  // namespace devmem
