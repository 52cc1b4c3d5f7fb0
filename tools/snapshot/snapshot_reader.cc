// tools/snapshot/snapshot_reader.cc: simdjson-based reader of snapshots and OOM dumps for
// memtrace (what it keeps, and why not SnapshotFromJson: tools/snapshot/snapshot_reader.h).
//
// Field paths ("devices[0].segments[2].blocks[1].size") are built only when an error
// is reported: a Path is a chain of stack frames, so a 10^6-block file costs no string
// work on the happy path.
#include "tools/snapshot/snapshot_reader.h"

#include <simdjson.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <unordered_map>
#include <utility>

#include "nlohmann/json.hpp"

namespace devmem::memtrace {
namespace {

// Files at least this large get progress lines (when stderr is a terminal).
constexpr size_t kProgressBytes = size_t{64} << 20;

struct ReadError {
  std::string message;  // "devices[0].size: expected ..."
};

// A field's path, as a chain of frames on the caller's stack.
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
      out += '[' + std::to_string(index) + ']';
    }
    return out;
  }
};

const char* TypeName(const simdjson::dom::element& e) {
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

[[noreturn]] void Expected(const Path& path, const char* what,
                           const simdjson::dom::element& got) {
  throw ReadError{path.ToString() + ": expected " + what + ", got " + TypeName(got)};
}

simdjson::dom::object Obj(const simdjson::dom::element& e, const Path& path) {
  simdjson::dom::object o;
  if (e.get_object().get(o) != simdjson::SUCCESS) Expected(path, "an object", e);
  return o;
}
simdjson::dom::array Arr(const simdjson::dom::element& e, const Path& path) {
  simdjson::dom::array a;
  if (e.get_array().get(a) != simdjson::SUCCESS) Expected(path, "an array", e);
  return a;
}
simdjson::dom::element Get(const simdjson::dom::object& o, const char* key, const Path& path) {
  simdjson::dom::element e;
  if (o.at_key(key).get(e) != simdjson::SUCCESS) {
    throw ReadError{path.Field(key).ToString() + ": missing (expected a field \"" + key + "\")"};
  }
  return e;
}
uint64_t U64(const simdjson::dom::element& e, const Path& path) {
  uint64_t v;
  if (e.get_uint64().get(v) != simdjson::SUCCESS) {
    Expected(path, "a non-negative integer", e);
  }
  return v;
}
int64_t I64(const simdjson::dom::element& e, const Path& path) {
  int64_t v;
  if (e.get_int64().get(v) != simdjson::SUCCESS) {
    Expected(path, "a 64-bit signed integer", e);
  }
  return v;
}
uint32_t U32(const simdjson::dom::element& e, const Path& path) {
  const uint64_t v = U64(e, path);
  if (v > UINT32_MAX) {
    throw ReadError{path.ToString() + ": expected a 32-bit unsigned integer, got " +
                    std::to_string(v)};
  }
  return static_cast<uint32_t>(v);
}
double Dbl(const simdjson::dom::element& e, const Path& path) {
  double v;
  if (e.get_double().get(v) != simdjson::SUCCESS) Expected(path, "a number", e);
  return v;
}
std::string Str(const simdjson::dom::element& e, const Path& path) {
  std::string_view v;
  if (e.get_string().get(v) != simdjson::SUCCESS) Expected(path, "a string", e);
  return std::string(v);
}
bool Bool(const simdjson::dom::element& e, const Path& path) {
  bool v;
  if (e.get_bool().get(v) != simdjson::SUCCESS) Expected(path, "true or false", e);
  return v;
}

// Field shorthands: F(o, "size", p) reads o.size with its path.
uint64_t U64F(const simdjson::dom::object& o, const char* k, const Path& p) {
  return U64(Get(o, k, p), p.Field(k));
}
int64_t I64F(const simdjson::dom::object& o, const char* k, const Path& p) {
  return I64(Get(o, k, p), p.Field(k));
}
std::string StrF(const simdjson::dom::object& o, const char* k, const Path& p) {
  return Str(Get(o, k, p), p.Field(k));
}

// "[2, 3]" from an array of integers (the "shape" of a tensor annotation).
std::string ShapeText(const simdjson::dom::element& e, const Path& path) {
  const simdjson::dom::array a = Arr(e, path);
  std::string out = "[";
  size_t i = 0;
  for (simdjson::dom::element d : a) {
    if (i > 0) out += ", ";
    out += std::to_string(I64(d, path.At(i)));
    ++i;
  }
  return out + "]";
}

void ReadBlock(const simdjson::dom::element& e, const Path& p, SnapBlock* b) {
  const simdjson::dom::object o = Obj(e, p);
  b->addr = U64F(o, "addr", p);
  b->size = U64F(o, "size", p);
  b->requested = U64F(o, "requested", p);
  b->stream = U64F(o, "stream", p);
  b->site = U32(Get(o, "site", p), p.Field("site"));
  std::string_view state;
  const simdjson::dom::element se = Get(o, "state", p);
  if (se.get_string().get(state) != simdjson::SUCCESS) {
    Expected(p.Field("state"), "a block state (allocated, free, pending)", se);
  }
  if (state == "allocated") {
    b->state = BlockKind::kAllocated;
  } else if (state == "free") {
    b->state = BlockKind::kFree;
  } else if (state == "pending") {
    b->state = BlockKind::kPending;
  } else {
    throw ReadError{p.Field("state").ToString() +
                    ": expected a block state (one of allocated, free, pending), got \"" +
                    std::string(state) + "\""};
  }
  simdjson::dom::element v;
  if (o.at_key("age_ns").get(v) == simdjson::SUCCESS && !v.is_null()) {
    b->age_ns = I64(v, p.Field("age_ns"));
    b->has_age = true;
  }
  if (o.at_key("stack").get(v) == simdjson::SUCCESS) b->stack = U32(v, p.Field("stack"));
}

// The optional "stack_sample_bytes" and "sampled_stacks" (older files have neither).
void ReadSampledStacks(const simdjson::dom::object& device, const Path& p, SnapDevice* d) {
  simdjson::dom::element v;
  if (device.at_key("stack_sample_bytes").get(v) == simdjson::SUCCESS) {
    d->stack_sample_bytes = U64(v, p.Field("stack_sample_bytes"));
  }
  if (device.at_key("sampled_stacks").get(v) != simdjson::SUCCESS) return;
  const Path sp = p.Field("sampled_stacks");
  size_t k = 0;
  for (simdjson::dom::element ge : Arr(v, sp)) {
    const Path gp = sp.At(k++);
    const simdjson::dom::object go = Obj(ge, gp);
    SnapStack g;
    g.stack = U32(Get(go, "stack", gp), gp.Field("stack"));
    g.site = U32(Get(go, "site", gp), gp.Field("site"));
    g.samples = U64F(go, "samples", gp);
    g.sampled_bytes = U64F(go, "sampled_bytes", gp);
    g.estimated_bytes = Dbl(Get(go, "estimated_bytes", gp), gp.Field("estimated_bytes"));
    if (!(g.estimated_bytes >= 0)) {
      throw ReadError{gp.Field("estimated_bytes").ToString() +
                      ": expected a non-negative number, got " +
                      std::to_string(g.estimated_bytes)};
    }
    const Path fp = gp.Field("frames");
    size_t f = 0;
    for (simdjson::dom::element fe : Arr(Get(go, "frames", gp), fp)) {
      g.frames.push_back(Str(fe, fp.At(f++)));
    }
    d->stacks.push_back(std::move(g));
  }
}

// The optional "tensor" annotations of "live_buffers", attached to the blocks they
// name. live_buffers lists the allocated blocks in segment order, so a cursor finds
// each one in O(1); an address out of that order falls back to a lookup table.
void ReadAnnotations(const simdjson::dom::object& device, const Path& p, SnapDevice* d) {
  simdjson::dom::element lb;
  if (device.at_key("live_buffers").get(lb) != simdjson::SUCCESS) return;
  const Path lp = p.Field("live_buffers");
  size_t cursor = 0;
  std::unordered_map<uint64_t, size_t> by_addr;  // built on first need
  size_t k = 0;
  for (simdjson::dom::element be : Arr(lb, lp)) {
    const Path bp = lp.At(k++);
    const simdjson::dom::object bo = Obj(be, bp);
    simdjson::dom::element te;
    if (bo.at_key("tensor").get(te) != simdjson::SUCCESS) continue;
    const uint64_t addr = U64F(bo, "addr", bp);
    const Path tp = bp.Field("tensor");
    const simdjson::dom::object to = Obj(te, tp);
    TensorInfo t;
    t.refcount = U64F(to, "refcount", tp);
    t.dtype = StrF(to, "dtype", tp);
    t.shape = ShapeText(Get(to, "shape", tp), tp.Field("shape"));
    while (cursor < d->blocks.size() &&
           (d->blocks[cursor].state != BlockKind::kAllocated || d->blocks[cursor].addr < addr)) {
      ++cursor;
    }
    size_t index = cursor;
    if (cursor >= d->blocks.size() || d->blocks[cursor].addr != addr) {
      if (by_addr.empty()) {
        for (size_t i = 0; i < d->blocks.size(); ++i) {
          if (d->blocks[i].state == BlockKind::kAllocated) by_addr[d->blocks[i].addr] = i;
        }
      }
      auto it = by_addr.find(addr);
      if (it == by_addr.end()) {
        throw ReadError{bp.Field("addr").ToString() +
                        ": expected the address of an allocated block, got " +
                        std::to_string(addr)};
      }
      index = it->second;
    }
    d->blocks[index].tensor = static_cast<int32_t>(d->tensors.size());
    d->tensors.push_back(std::move(t));
  }
}

// The optional "arena_buffers" (files older than scoped arenas have none).
void ReadArenaBuffers(const simdjson::dom::object& device, const Path& p, SnapDevice* d) {
  simdjson::dom::element ab;
  if (device.at_key("arena_buffers").get(ab) != simdjson::SUCCESS) return;
  const Path ap = p.Field("arena_buffers");
  size_t k = 0;
  for (simdjson::dom::element be : Arr(ab, ap)) {
    const Path bp = ap.At(k++);
    const simdjson::dom::object bo = Obj(be, bp);
    SnapArenaBuffer b;
    b.addr = U64F(bo, "addr", bp);
    b.size = U64F(bo, "size", bp);
    b.chunk = U64F(bo, "chunk", bp);
    const uint64_t site = U64F(bo, "site", bp);
    if (site > UINT32_MAX) {
      throw ReadError{bp.Field("site").ToString() + ": expected a site id, got " +
                      std::to_string(site)};
    }
    b.site = static_cast<uint32_t>(site);
    b.arena = StrF(bo, "arena", bp);
    b.escaped = Bool(Get(bo, "escaped", bp), bp.Field("escaped"));
    d->arena_buffers.push_back(std::move(b));
  }
}

// The "current" of stats.<name>.all.
int64_t StatAll(const simdjson::dom::object& stats, const char* name, const Path& p) {
  const Path sp = p.Field(name);
  const simdjson::dom::object pools = Obj(Get(stats, name, p), sp);
  const Path ap = sp.Field("all");
  return I64F(Obj(Get(pools, "all", sp), ap), "current", ap);
}

void ReadDevice(const simdjson::dom::element& e, const Path& p, SnapDevice* d) {
  const simdjson::dom::object o = Obj(e, p);
  d->device = StrF(o, "device", p);
  d->time_ns = I64F(o, "time_ns", p);
  const Path ip = p.Field("info");
  const simdjson::dom::object info = Obj(Get(o, "info", p), ip);
  d->name = StrF(info, "name", ip);
  d->backend = StrF(info, "backend", ip);
  const Path mp = p.Field("mem_info");
  const simdjson::dom::object mem = Obj(Get(o, "mem_info", p), mp);
  d->free_bytes = U64F(mem, "free_bytes", mp);
  d->total_bytes = U64F(mem, "total_bytes", mp);
  const Path stp = p.Field("stats");
  const simdjson::dom::object stats = Obj(Get(o, "stats", p), stp);
  d->allocated_bytes = StatAll(stats, "allocated_bytes", stp);
  d->reserved_bytes = StatAll(stats, "reserved_bytes", stp);
  d->pending_bytes = StatAll(stats, "pending_bytes", stp);
  d->num_ooms = I64F(stats, "num_ooms", stp);
  const Path sp = p.Field("segments");
  const simdjson::dom::array segments = Arr(Get(o, "segments", p), sp);
  size_t i = 0;
  for (simdjson::dom::element se : segments) {
    const Path segp = sp.At(i++);
    const simdjson::dom::object so = Obj(se, segp);
    SnapSegment seg;
    seg.addr = U64F(so, "addr", segp);
    seg.size = U64F(so, "size", segp);
    if (seg.addr + seg.size < seg.addr) {
      throw ReadError{segp.Field("size").ToString() +
                      ": expected a size that keeps the segment inside the address space, got " +
                      std::to_string(seg.size)};
    }
    seg.stream = U64F(so, "stream", segp);
    const std::string pool = StrF(so, "pool", segp);
    if (pool != "small" && pool != "large") {
      throw ReadError{segp.Field("pool").ToString() + ": expected \"small\" or \"large\", got \"" +
                      pool + "\""};
    }
    seg.small_pool = pool == "small";
    seg.expandable = Bool(Get(so, "expandable", segp), segp.Field("expandable"));
    const Path bp = segp.Field("blocks");
    const simdjson::dom::array blocks = Arr(Get(so, "blocks", segp), bp);
    seg.first_block = d->blocks.size();
    size_t k = 0;
    uint64_t covered_to = seg.addr;  // end of the block before (blocks are in address order)
    for (simdjson::dom::element be : blocks) {
      const Path blp = bp.At(k++);
      SnapBlock& b = d->blocks.emplace_back();
      ReadBlock(be, blp, &b);
      // Blocks must lie inside their segment: the views (segment maps, shares) rely on
      // it, and a file that breaks it is not one devmem wrote.
      // Written so that nothing wraps: a block that starts past the segment's end made
      // `seg.addr + seg.size - b.addr` wrap to a huge bound and was accepted (found by
      // the snapshot fuzzer's invariants: segment maps then indexed past their cells).
      if (b.addr < seg.addr || b.addr - seg.addr > seg.size ||
          b.size > seg.size - (b.addr - seg.addr)) {
        throw ReadError{blp.ToString() + ": expected a block inside its segment [" +
                        std::to_string(seg.addr) + ", +" + std::to_string(seg.size) +
                        "), got addr " + std::to_string(b.addr) + " size " +
                        std::to_string(b.size)};
      }
      // Blocks tile the segment in address order (docs/formats.md): one that starts
      // before the previous one ends would be counted twice by buffers, diff and oom.
      if (b.addr < covered_to) {
        throw ReadError{blp.ToString() + ": overlaps the block before it (which ends at " +
                        std::to_string(covered_to) + "), got addr " + std::to_string(b.addr) +
                        ": blocks must tile their segment in address order"};
      }
      covered_to = b.addr + b.size;
    }
    seg.num_blocks = k;
    d->segments.push_back(seg);
  }
  ReadAnnotations(o, p, d);
  ReadArenaBuffers(o, p, d);
  ReadSampledStacks(o, p, d);
}

std::string WhereOf(const SnapSite& s) {
  std::string out;
  if (!s.tag.empty()) out += s.tag + " @ ";
  if (!s.outer_file.empty()) {  // as SiteInfo::ToString: outermost frame first
    out += s.outer_file;
    if (s.outer_line != 0) out += ":" + std::to_string(s.outer_line);
    out += " > ";
  }
  out += s.file;
  if (s.line != 0) out += ":" + std::to_string(s.line);
  return out + " (" + s.kind + ")";
}

bool IsCopyKindName(std::string_view kind) {
  return kind == "clone" || kind == "contiguous" || kind == "to_device";
}

void ReadSites(const simdjson::dom::element& e, const Path& p, Snapshot* snap) {
  const simdjson::dom::array a = Arr(e, p);
  size_t i = 0;
  for (simdjson::dom::element se : a) {
    const Path sp = p.At(i++);
    const simdjson::dom::object o = Obj(se, sp);
    SnapSite s;
    s.id = U32(Get(o, "id", sp), sp.Field("id"));
    s.file = StrF(o, "file", sp);
    s.line = U32(Get(o, "line", sp), sp.Field("line"));
    s.function = StrF(o, "function", sp);
    s.tag = StrF(o, "tag", sp);
    s.kind = StrF(o, "kind", sp);
    if (simdjson::dom::element oe; o["outer"].get(oe) == simdjson::SUCCESS) {
      const Path op = sp.Field("outer");
      const simdjson::dom::object oo = Obj(oe, op);
      s.outer_file = StrF(oo, "file", op);
      s.outer_line = U32(Get(oo, "line", op), op.Field("line"));
      s.outer_function = StrF(oo, "function", op);
    }
    s.copy = IsCopyKindName(s.kind);
    s.where = WhereOf(s);
    snap->sites[s.id] = std::move(s);
  }
}

void ReadOom(const simdjson::dom::element& e, const Path& p, OomInfo* r) {
  const simdjson::dom::object o = Obj(e, p);
  r->device = StrF(o, "device", p);
  r->stream = U64F(o, "stream", p);
  r->site = U32(Get(o, "site", p), p.Field("site"));
  r->requested_bytes = U64F(o, "requested_bytes", p);
  r->rounded_bytes = U64F(o, "rounded_bytes", p);
  r->segment_bytes = U64F(o, "segment_bytes", p);
  r->device_total = U64F(o, "device_total", p);
  r->driver_free = U64F(o, "driver_free", p);
  r->memory_limit = U64F(o, "memory_limit", p);
  r->allocated = U64F(o, "allocated", p);
  r->reserved = U64F(o, "reserved", p);
  r->pending = U64F(o, "pending", p);
  r->reserved_unallocated = U64F(o, "reserved_unallocated", p);
  r->largest_free_block = U64F(o, "largest_free_block", p);
  r->free_blocks = U64F(o, "free_blocks", p);
  r->segment_count = U64F(o, "segment_count", p);
  r->fragmentation = Dbl(Get(o, "fragmentation", p), p.Field("fragmentation"));
  const Path tp = p.Field("top_sites");
  size_t i = 0;
  for (simdjson::dom::element te : Arr(Get(o, "top_sites", p), tp)) {
    const Path sp = tp.At(i++);
    const simdjson::dom::object so = Obj(te, sp);
    OomTopSite t;
    t.site = U32(Get(so, "site", sp), sp.Field("site"));
    t.where = StrF(so, "where", sp);
    t.kind = StrF(so, "kind", sp);
    t.copy = Bool(Get(so, "copy", sp), sp.Field("copy"));
    t.live_bytes = U64F(so, "live_bytes", sp);
    t.live_count = U64F(so, "live_count", sp);
    r->top_sites.push_back(std::move(t));
  }
  r->copy_bytes = U64F(o, "copy_bytes", p);
  r->copy_share = Dbl(Get(o, "copy_share", p), p.Field("copy_share"));
  r->cause = StrF(o, "cause", p);
  r->remedy = StrF(o, "remedy", p);
  r->message = StrF(o, "message", p);
}

// "devmem.snapshot/1" accepts "devmem.snapshot/1" and "devmem.snapshot/1.N".
bool SameMajor(std::string_view found, std::string_view expected) {
  return found == expected ||
         (found.size() > expected.size() + 1 && found.substr(0, expected.size()) == expected &&
          found[expected.size()] == '.');
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
      error = "at byte " + std::to_string(at) + ": " + what;
      return false;
    }
  } sax(text);
  nlohmann::json::sax_parse(text.begin(), text.end(), &sax);
  return sax.error;
}

bool ProgressWanted(size_t bytes) { return bytes >= kProgressBytes && isatty(STDERR_FILENO); }

}  // namespace

const SnapSite& Snapshot::Site(uint32_t id) const {
  static const SnapSite* const kUnknown = [] {
    auto* s = new SnapSite;
    s->file = "<unknown>";
    s->kind = "alloc";
    s->where = "<unknown> (alloc)";
    return s;
  }();
  auto it = sites.find(id);
  return it == sites.end() ? *kUnknown : it->second;
}

namespace {

absl::StatusOr<Snapshot> ParsePadded(const simdjson::padded_string& padded,
                                     const std::string& name) {
  const std::string_view text(padded.data(), padded.size());
  const bool progress = ProgressWanted(text.size());
  if (progress) std::fprintf(stderr, "memtrace: parsing %s (%zu MiB)...\r", name.c_str(),
                             text.size() >> 20);
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (const auto err = parser.parse(padded).get(root); err != simdjson::SUCCESS) {
    if (progress) std::fprintf(stderr, "\x1b[2K");
    if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
      return absl::InvalidArgumentError(name + ": empty (expected a JSON snapshot object)");
    }
    std::string where = SyntaxErrorAt(text);
    if (where.empty()) where = simdjson::error_message(err);
    return absl::InvalidArgumentError(name + ": not valid JSON, " + where);
  }
  Snapshot snap;
  try {
    const Path top;
    const simdjson::dom::object o = Obj(root, Path{nullptr, "(top level)", 0});
    simdjson::dom::element se;
    std::string_view schema;
    if (o.at_key("schema").get(se) != simdjson::SUCCESS ||
        se.get_string().get(schema) != simdjson::SUCCESS) {
      throw ReadError{std::string("missing \"schema\" (expected \"") + kReaderSchema + "\")"};
    }
    if (!SameMajor(schema, kReaderSchema)) {
      throw ReadError{"schema \"" + std::string(schema) +
                      "\" is not supported (this reader reads \"" + kReaderSchema +
                      "\"; other major versions are refused)"};
    }
    snap.schema = std::string(schema);
    snap.time_ns = I64F(o, "time_ns", top);
    snap.unix_time_ns = I64F(o, "unix_time_ns", top);
    const Path dp = top.Field("devices");
    size_t i = 0;
    for (simdjson::dom::element de : Arr(Get(o, "devices", top), dp)) {
      ReadDevice(de, dp.At(i++), &snap.devices.emplace_back());
    }
    ReadSites(Get(o, "sites", top), top.Field("sites"), &snap);
    simdjson::dom::element oe;
    if (o.at_key("oom").get(oe) == simdjson::SUCCESS) {
      ReadOom(oe, top.Field("oom"), &snap.oom.emplace());
    }
  } catch (const ReadError& e) {
    if (progress) std::fprintf(stderr, "\x1b[2K");
    return absl::InvalidArgumentError(name + ": " + e.message);
  }
  if (progress) std::fprintf(stderr, "\x1b[2K");
  return snap;
}

}  // namespace

absl::StatusOr<Snapshot> ParseSnapshot(std::string_view text, const std::string& name) {
  return ParsePadded(simdjson::padded_string(text), name);
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError("cannot read " + path + ": " + std::strerror(errno));
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0) return absl::InvalidArgumentError("cannot read " + path + ": not a file");
  std::string text(static_cast<size_t>(size), '\0');
  if (ProgressWanted(text.size())) {
    std::fprintf(stderr, "memtrace: reading %s (%zu MiB)...\r", path.c_str(), text.size() >> 20);
  }
  in.read(text.data(), size);
  if (in.gcount() != size) {
    return absl::DataLossError("cannot read " + path + ": short read");
  }
  return text;
}

absl::StatusOr<Snapshot> ReadSnapshotFile(const std::string& path) {
  // Loaded straight into simdjson's padded buffer: one copy of a large file, not two.
  if (std::ifstream probe(path); !probe) {
    return absl::NotFoundError("cannot read " + path + ": " + std::strerror(errno));
  }
  simdjson::padded_string padded;
  if (const auto err = simdjson::padded_string::load(path).get(padded);
      err != simdjson::SUCCESS) {
    return absl::NotFoundError("cannot read " + path + ": " + simdjson::error_message(err));
  }
  return ParsePadded(padded, path);
}

}  // namespace devmem::memtrace
