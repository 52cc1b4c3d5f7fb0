// tools/replay/trace_replay.cc: trace parsing (simdjson's DOM parser, one line at a time so
// that errors name the line) and replay through CachingAllocator on a sim device.
#include "tools/replay/trace_replay.h"

#include <simdjson.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <stdexcept>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/errors.h"
#include "tools/replay/trace_file.h"

namespace devmem {
namespace {

constexpr uint64_t kMaxSize = uint64_t{1} << 50;  // 1 PiB: beyond any device
constexpr uint32_t kMaxStreams = 65535;
constexpr size_t kMaxDevices = 4096;

absl::Status LineError(const std::string& name, uint64_t line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrFormat("%s:%d: %s", name, line, what));
}

std::string Printable(std::string_view text) {
  std::string out(text.substr(0, 80));
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  if (text.size() > 80) out += "...";
  return out;
}

}  // namespace

namespace {

// Parses text that is followed by at least SIMDJSON_PADDING readable bytes (a
// padded_string): every line's view then has the rest of the buffer (and the padding)
// after it, as simdjson requires, so no line is copied.
// Progress on stderr while a large trace is read, only when stderr is a terminal (a
// log file or a pipe gets nothing). Rewrites one line; cleared when done.
class ReadProgress {
 public:
  ReadProgress(const std::string& name, size_t total)
      : name_(name), total_(total),
        enabled_(total >= (size_t{64} << 20) && isatty(STDERR_FILENO) != 0) {}
  ~ReadProgress() {
    if (shown_) std::fprintf(stderr, "\r%*s\r", 72, "");
  }
  // Cheap enough to call every line: prints at most every 1/100 of the input.
  void update(size_t done) {
    if (!enabled_ || done < next_) return;
    next_ = done + total_ / 100;
    std::fprintf(stderr, "\rmemtrace: reading %s: %3d%%", name_.c_str(),
                 static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total_)));
    shown_ = true;
  }

 private:
  const std::string& name_;
  const size_t total_;
  const bool enabled_;
  size_t next_ = 0;
  bool shown_ = false;
};

absl::StatusOr<Trace> ParsePadded(const simdjson::padded_string& buffer, const std::string& name) {
  const std::string_view text(buffer.data(), buffer.size());
  simdjson::dom::parser parser;
  Trace trace;
  // (device index, addr) -> dense id: an address is live on one device.
  absl::flat_hash_map<std::pair<uint32_t, uint64_t>, uint32_t> live;
  absl::flat_hash_map<std::string, uint32_t> device_index;  // device -> index in devices
  std::string last_device;  // the device of the last alloc/free, and its index
  uint32_t dev = 0;
  absl::flat_hash_map<uint64_t, uint16_t> streams; // trace stream -> dense index
  std::vector<uint64_t> sizes;                      // by id, while live
  uint64_t requested = 0;
  ReadProgress progress(name, buffer.size());
  TraceLines lines(text);
  std::string_view line;
  while (lines.Next(&line)) {
    progress.update(lines.pos());
    const uint64_t line_no = lines.line_no();
    // The DOM parser validates the whole line (trailing garbage is an error). The
    // line's view has the rest of the padded buffer after it, so no copy is needed.
    simdjson::dom::element doc;
    if (auto err = parser.parse(line.data(), line.size(), /*realloc_if_needed=*/false)
                       .get(doc);
        err) {
      return LineError(name, line_no, absl::StrFormat("not JSON (%s): %s",
                                                      simdjson::error_message(err),
                                                      Printable(line)));
    }
    simdjson::dom::object obj;
    if (doc.get_object().get(obj)) {
      return LineError(name, line_no, "expected a JSON object with \"action\" and \"addr\"");
    }
    std::string_view action, schema, device;
    uint64_t addr = 0, size = 0, stream = 0;
    bool has_addr = false, has_size = false;
    for (const auto [key, value] : obj) {
      simdjson::error_code err = simdjson::SUCCESS;
      if (key == "schema") {
        err = value.get_string().get(schema);
      } else if (key == "action") {
        err = value.get_string().get(action);
      } else if (key == "addr") {
        err = value.get_uint64().get(addr);
        has_addr = true;
      } else if (key == "size") {
        err = value.get_uint64().get(size);
        has_size = true;
      } else if (key == "stream") {
        err = value.get_uint64().get(stream);
      } else if (key == "device") {
        err = value.get_string().get(device);
      }
      if (err) {
        return LineError(name, line_no,
                         absl::StrFormat("field \"%s\": expected %s (%s)", std::string(key),
                                         key == "action" || key == "device"
                                             ? "a string"
                                             : "an unsigned integer",
                                         simdjson::error_message(err)));
      }
    }
    if (!schema.empty()) {
      // The header line of devmem's own trace files (docs/formats.md): any minor
      // version of major 1 is read; a newer major is refused, not guessed at.
      if (schema != "devmem.trace/1" && schema.rfind("devmem.trace/1.", 0) != 0) {
        return LineError(name, line_no,
                         absl::StrFormat("schema \"%s\" is not one this memtrace reads "
                                         "(devmem.trace/1)",
                                         std::string(schema)));
      }
      continue;
    }
    ++trace.lines;
    if (action.empty()) return LineError(name, line_no, "missing field \"action\"");
    const bool is_alloc = action == "alloc";
    if (!is_alloc && action != "free") {
      // The format's other actions are not replayed; an action outside it is counted
      // (the caller says so): a typo or a newer writer, never silently dropped.
      if (std::find(std::begin(kTraceActions), std::end(kTraceActions), action) ==
          std::end(kTraceActions)) {
        if (trace.unknown_actions++ == 0) {
          trace.first_unknown_action = Printable(action);
          trace.first_unknown_line = line_no;
        }
      }
      continue;
    }
    if (!has_addr) return LineError(name, line_no, "missing field \"addr\"");
    // Consecutive events are nearly always of one device: the map is looked up (and a
    // string made) only when the device changes.
    if (trace.devices.empty() || device != last_device) {
      auto [dit, new_device] = device_index.try_emplace(
          std::string(device), static_cast<uint32_t>(trace.devices.size()));
      if (new_device) {
        if (trace.devices.size() >= kMaxDevices) {
          return LineError(name, line_no, absl::StrFormat("more than %d devices", kMaxDevices));
        }
        trace.devices.push_back(Printable(device));
      }
      last_device.assign(device);
      dev = dit->second;
    }
    auto [sit, new_stream] = streams.try_emplace(stream, static_cast<uint16_t>(streams.size()));
    if (new_stream && streams.size() > kMaxStreams) {
      return LineError(name, line_no, absl::StrFormat("more than %d streams", kMaxStreams));
    }
    if (is_alloc) {
      if (!has_size) return LineError(name, line_no, "alloc without field \"size\"");
      if (size > kMaxSize) {
        return LineError(name, line_no,
                         absl::StrFormat("size %d is absurd (more than 2^50 bytes)", size));
      }
      if (trace.allocations == UINT32_MAX) {
        return LineError(name, line_no, "more than 2^32 allocations");
      }
      const uint32_t id = trace.allocations++;
      if (!live.try_emplace(std::make_pair(dev, addr), id).second) {
        return LineError(name, line_no,
                         absl::StrFormat("alloc of addr %d, which is already live%s", addr,
                                         device.empty() ? "" : " on " + Printable(device)));
      }
      sizes.push_back(size);
      requested += size;
      trace.peak_requested = std::max(trace.peak_requested, requested);
      trace.ops.push_back(Trace::Op{size, id, sit->second, true});
    } else {
      auto it = live.find(std::make_pair(dev, addr));
      if (it == live.end()) {
        ++trace.unmatched_frees;
        continue;
      }
      const uint32_t id = it->second;
      live.erase(it);
      requested -= sizes[id];
      trace.ops.push_back(Trace::Op{0, id, sit->second, false});
    }
  }
  trace.streams = static_cast<uint16_t>(streams.size());
  return trace;
}

}  // namespace

absl::StatusOr<Trace> ParseTrace(std::string_view text, const std::string& name) {
  return ParsePadded(simdjson::padded_string(text), name);
}

absl::StatusOr<Trace> ReadTrace(const std::string& path) {
  absl::StatusOr<simdjson::padded_string> text = LoadTraceFile(path);
  if (!text.ok()) return text.status();
  // Parsed in place: a second copy would double the memory a 10^7-event trace needs.
  return ParsePadded(*text, path);
}

std::vector<size_t> InferSteps(const Trace& trace, double swing) {
  std::vector<size_t> ends;
  const auto h = static_cast<uint64_t>(swing * static_cast<double>(trace.peak_requested));
  if (h == 0) return ends;
  std::vector<uint64_t> sizes(trace.allocations, 0);  // by id
  uint64_t live = 0;
  // Zigzag: `high` is the highest point since the last step end until live bytes fall
  // h below it; then `low`/`low_op` track the lowest point until they rise h above it.
  uint64_t high = 0, low = 0;
  size_t low_op = 0;
  bool falling = false;
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const Trace::Op& op = trace.ops[i];
    if (op.alloc) {
      sizes[op.id] = op.size;
      live += op.size;
    } else {
      live -= sizes[op.id];
    }
    if (!falling) {
      if (live > high) {
        high = live;
      } else if (high - live >= h) {
        falling = true;
        low = live;
        low_op = i;
      }
    } else if (live < low) {
      low = live;
      low_op = i;
    } else if (live - low >= h) {
      ends.push_back(low_op);
      falling = false;
      high = live;
    }
  }
  return ends;
}

absl::Status CheckArenaReplay(const ArenaReplay& arenas) {
  if (arenas.chunk_size % 512 != 0 || arenas.chunk_size < kMinArenaChunkSize ||
      arenas.chunk_size > kMaxArenaChunkSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "chunk_size %u: must be a multiple of 512 in [64 KiB, 1 GiB]", arenas.chunk_size));
  }
  // The negated test also refuses NaN.
  if (!(arenas.step_swing > 0 && arenas.step_swing <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("step_swing %g: must be in (0, 1]", arenas.step_swing));
  }
  return absl::OkStatus();
}

ReplayResult Replay(const Trace& trace, const Config& policy, uint64_t capacity,
                    const ReplayObserver& observe, const ArenaReplay& arenas) {
  if (arenas.enabled) {
    if (absl::Status s = CheckArenaReplay(arenas); !s.ok()) {
      throw InvalidArgumentError(std::string(s.message()));
    }
  }
  Config config = policy;
  config.backend = BackendKind::kSim;
  config.sim_capacity = capacity;
  config.sim_alloc_latency_ns = config.sim_free_latency_ns = 0;
  config.sim_fail_nth = 0;
  config.sim_fail_probability = 0;
  CachingAllocator alloc(MakeSimBackend(config), config);
  // Trace stream i (dense) runs on backend stream handles[i], made on first use:
  // releasing memory synchronizes the stream that freed it, so every stream the
  // allocator sees must be one the backend knows. Stream 0 is the default stream.
  std::vector<Stream> handles(std::max<size_t>(trace.streams, 1), Stream{});
  std::vector<bool> made(handles.size(), false);
  made[0] = true;
  auto backend_stream = [&](uint16_t index) {
    if (!made[index]) {
      absl::StatusOr<Stream> s = alloc.backend().create_stream();
      if (!s.ok()) throw std::runtime_error(std::string(s.status().message()));
      handles[index] = *s;
      made[index] = true;
    }
    return handles[index];
  };
  std::vector<void*> ptrs(trace.allocations, nullptr);
  int64_t ooms = 0;
  // Arenas: a scope per step, on the default stream (trace stream 0 is Stream{}).
  ReplayResult::Arenas arena_figures;
  const std::vector<size_t> step_ends =
      arenas.enabled ? InferSteps(trace, arenas.step_swing) : std::vector<size_t>{};
  size_t next_end = 0;
  std::optional<ArenaScope> scope;
  auto open_step = [&] {
    scope.emplace(alloc, "replay step",
                  ArenaOptions{.chunk_size = arenas.chunk_size, .stream = {},
                               .max_waste_fraction = {}});
    ++arena_figures.steps;
  };
  auto close_step = [&] {
    // The chunks held at the step's end (its own, escaped ones, retained ones) before
    // the close retires them: the arenas' largest footprint is at a step's end.
    const ArenaReport held = alloc.arena_report();
    arena_figures.peak_chunks = std::max(arena_figures.peak_chunks, held.chunks);
    arena_figures.peak_chunk_bytes = std::max(arena_figures.peak_chunk_bytes, held.chunk_bytes);
    scope->close();
    const ArenaScope::Summary s = scope->summary();
    arena_figures.escaped_bytes += s.escaped_bytes;
    arena_figures.escaped_buffers += s.escaped_buffers;
    arena_figures.max_step_escaped_bytes =
        std::max(arena_figures.max_step_escaped_bytes, s.escaped_bytes);
    arena_figures.bumps += s.allocations;
    arena_figures.bump_bytes += s.bytes;
    arena_figures.pool_chunk_allocs += s.pool_chunk_allocs;
    arena_figures.chunk_reuses += s.chunks - s.pool_chunk_allocs;
    arena_figures.spills += s.spills;
    arena_figures.spill_bytes += s.spill_bytes;
    scope.reset();
  };
  if (arenas.enabled) open_step();
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < trace.ops.size(); ++i) {
    const Trace::Op& op = trace.ops[i];
    if (op.alloc) {
      try {
        ptrs[op.id] = alloc.allocate(op.size, backend_stream(op.stream));
      } catch (const OutOfMemoryError&) {
        ++ooms;
      }
    } else if (ptrs[op.id] != nullptr) {
      alloc.free(ptrs[op.id]);
      ptrs[op.id] = nullptr;
    }
    if (observe) observe(i, alloc);
    if (next_end < step_ends.size() && step_ends[next_end] == i) {
      ++next_end;
      close_step();
      open_step();
    }
  }
  const auto stop = std::chrono::steady_clock::now();
  if (scope) close_step();
  for (void*& p : ptrs) {
    if (p != nullptr) alloc.free(p);  // allocations the trace never freed
  }
  const DeviceStats s = alloc.stats();
  ReplayResult r;
  r.capacity = capacity;
  r.peak_requested_bytes = trace.peak_requested;
  r.peak_reserved_bytes = static_cast<uint64_t>(s.reserved_bytes[kAggregatePool].peak);
  r.reserved_over_requested =
      trace.peak_requested == 0
          ? 0.0
          : static_cast<double>(r.peak_reserved_bytes) / static_cast<double>(trace.peak_requested);
  r.device_allocs = s.num_device_alloc;
  r.device_frees = s.num_device_free;
  r.ooms = ooms;
  r.alloc_retries = s.num_alloc_retries;
  r.driver = s.driver;
  r.ops = trace.ops.size();
  r.arenas = arena_figures;
  r.ns_per_op = trace.ops.empty()
                    ? 0.0
                    : std::chrono::duration<double, std::nano>(stop - start).count() /
                          static_cast<double>(trace.ops.size());
  return r;
}

MinCapacity FindMinCapacity(const Trace& trace, const Config& config, uint64_t resolution,
                            int max_scan, const ArenaReplay& arenas) {
  MinCapacity m;
  if (trace.peak_requested == 0) return m;
  resolution = std::max<uint64_t>(resolution, 1);
  auto fits = [&](uint64_t capacity) {
    ++m.runs;
    return Replay(trace, config, capacity, nullptr, arenas).ooms == 0;
  };
  ++m.runs;
  const uint64_t lo = trace.peak_requested;
  const uint64_t hi = std::max(
      Replay(trace, config, kUnboundedCapacity, nullptr, arenas).peak_reserved_bytes, lo);
  // Bisection. Invariant: `good` fits; every capacity below `bad + 1` is assumed not to.
  uint64_t bad = lo - 1, good = hi;
  while (good - bad > resolution) {
    const uint64_t mid = bad + (good - bad) / 2;
    if (fits(mid)) {
      good = mid;
    } else {
      bad = mid;
    }
  }
  m.smallest_fitting_bytes = good;
  // The downward scan from hi (which fits) to the first failure.
  m.step = std::max<uint64_t>(resolution, (hi - lo) / static_cast<uint64_t>(std::max(max_scan, 1)));
  uint64_t safe = hi;
  while (safe >= lo + m.step && fits(safe - m.step)) safe -= m.step;
  if (safe >= m.step && good < safe - m.step) {
    // A fitting capacity below a failing one (safe - step): not monotonic. The safe
    // threshold is the answer; the island below is reported beside it.
    m.monotonic = false;
    m.bytes = safe;
    m.smallest_fitting_bytes = good;
  } else if (good > safe) {
    // Bisection saw a failure above `safe` (off the scan's grid): not monotonic, and
    // `good` is the conservative answer.
    m.monotonic = false;
    m.bytes = good;
    m.smallest_fitting_bytes = safe;
  } else {
    // Consistent with a single threshold in (safe - step, good]: bisection is precise.
    m.bytes = good;
    m.smallest_fitting_bytes = good;
  }
  m.over_peak_requested = static_cast<double>(m.bytes) / static_cast<double>(lo);
  return m;
}

}  // namespace devmem
