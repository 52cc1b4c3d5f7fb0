// tools/timeline/timeline.cc: reads a trace into memory-over-time series (tools/timeline/timeline.h):
// one pass of simdjson's DOM parser per line (errors name the line), then bucketing,
// with a replay through the allocator when the trace has no segment events.
#include "tools/timeline/timeline.h"

#include <simdjson.h>

#include <algorithm>
#include <numeric>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"
#include "tools/replay/trace_file.h"
#include "tools/replay/trace_replay.h"

namespace devmem {
namespace {

enum class Kind : uint8_t { kAlloc, kFree, kSegmentUp, kSegmentDown, kOom };

struct TimelineEvent {
  int64_t time;
  uint64_t addr;
  uint64_t size;
  uint32_t site;  // dense site index
  Kind kind;
};

absl::Status LineError(const std::string& name, uint64_t line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrFormat("%s:%d: %s", name, line, what));
}

// A site's name as drawn, and its kind ("alloc", "clone", ...: the field of the site
// table entry, "" when absent). The name is spelled as SiteInfo::ToString spells a
// site everywhere else (metrics, snapshots, OOM reports): `tag @ `, the outer frame
// (`outer.py:3 > `), then `file:line`, where a line of 0 (a named site's, such as an
// arena chunk's `step @ <arena>`) is left out; the timeline adds ` (function)` in the
// place of ToString's ` (kind)`, which its legend shows after the name.
std::pair<std::string, std::string> SiteName(simdjson::dom::object site) {
  std::string_view file, function, tag, kind, outer_file;
  uint64_t line = 0, outer_line = 0;
  // Every field is optional here: a missing one leaves the name shorter.
  if (site["file"].get_string().get(file)) file = {};
  if (site["function"].get_string().get(function)) function = {};
  if (site["tag"].get_string().get(tag)) tag = {};
  if (site["line"].get_uint64().get(line)) line = 0;
  if (site["kind"].get_string().get(kind)) kind = {};
  simdjson::dom::object outer;
  if (!site["outer"].get_object().get(outer)) {
    if (outer["file"].get_string().get(outer_file)) outer_file = {};
    if (outer["line"].get_uint64().get(outer_line)) outer_line = 0;
  }
  // std::string pieces: Debian's absl::StrCat does not take std::string_view.
  auto file_line = [](std::string_view f, uint64_t l) {
    return l == 0 ? std::string(f) : std::string(f) + ":" + std::to_string(l);
  };
  std::string where = file.empty() ? std::string(function) : file_line(file, line);
  if (!function.empty() && !file.empty()) where += " (" + std::string(function) + ")";
  if (!outer_file.empty()) where = file_line(outer_file, outer_line) + " > " + where;
  if (!tag.empty()) where = std::string(tag) + " @ " + where;
  return {where, std::string(kind)};
}

absl::StatusOr<Timeline> BuildPadded(const simdjson::padded_string& buffer,
                                     const std::string& name, const TimelineOptions& options) {
  const std::string_view text(buffer.data(), buffer.size());
  simdjson::dom::parser parser;
  std::vector<TimelineEvent> events;
  // trace site id -> name and kind
  absl::flat_hash_map<uint64_t, std::pair<std::string, std::string>> site_table;
  absl::flat_hash_map<uint64_t, uint32_t> dense;           // trace site id -> index
  std::vector<uint64_t> dense_ids;                         // index -> trace site id
  bool has_segments = false, has_time = false;
  // The trace rule shared with replay (tools/replay/trace_replay.h): an alloc of a live
  // address is an error naming the line; a free of an address that is not live is
  // counted and skipped (a trace cut from a ring may start with frees).
  // One exception: a ring trace read from a live process numbers the events it lost
  // (overwritten before a reader took them) and leaves their numbers out, so "seq"
  // jumps. A free lost in such a gap makes the address's next alloc look like a double
  // alloc; when a gap lies between the live alloc and this one, the lost free is implied
  // at this alloc (counted in `implied_frees`) instead of refusing the whole trace.
  absl::flat_hash_map<uint64_t, uint64_t> live_addrs;  // addr -> its alloc's gap count
  uint64_t unmatched_frees = 0, time_backwards = 0, implied_frees = 0;
  uint64_t prev_seq = 0, gaps = 0;
  int64_t last_time = INT64_MIN;
  TraceLines lines(text);
  std::string_view line;
  while (lines.Next(&line)) {
    const uint64_t line_no = lines.line_no();
    simdjson::dom::element doc;
    if (auto err = parser.parse(line.data(), line.size(), false).get(doc); err) {
      return LineError(name, line_no,
                       absl::StrFormat("not JSON (%s)", simdjson::error_message(err)));
    }
    simdjson::dom::object obj;
    if (doc.get_object().get(obj)) return LineError(name, line_no, "expected a JSON object");
    // One pass over the fields (keyed lookups would scan the object once per key).
    std::string_view schema, action;
    simdjson::dom::array sites;
    bool has_sites = false, has_addr = false, has_size = false;
    uint64_t site = 0, seq = 0;
    int64_t time = 0;
    TimelineEvent e{};
    for (const auto [key, value] : obj) {
      simdjson::error_code err = simdjson::SUCCESS;
      const char* expected = "an unsigned integer";
      if (key == "schema") {
        err = value.get_string().get(schema);
        expected = "a string";
      } else if (key == "sites") {
        err = value.get_array().get(sites);
        has_sites = true;
        expected = "an array";
      } else if (key == "action") {
        err = value.get_string().get(action);
        expected = "a string";
      } else if (key == "addr") {
        err = value.get_uint64().get(e.addr);
        has_addr = true;
      } else if (key == "size") {
        err = value.get_uint64().get(e.size);
        has_size = true;
      } else if (key == "site") {
        err = value.get_uint64().get(site);
      } else if (key == "seq") {
        err = value.get_uint64().get(seq);
      } else if (key == "time_ns") {
        err = value.get_int64().get(time);
        expected = "an integer";
      }
      if (err) {
        return LineError(name, line_no,
                         absl::StrFormat("field \"%s\": expected %s", std::string(key), expected));
      }
    }
    if (!schema.empty()) {
      if (schema != "devmem.trace/1" && schema.rfind("devmem.trace/1.", 0) != 0) {
        return LineError(name, line_no,
                         absl::StrFormat("schema \"%s\" is not one this memtrace reads "
                                         "(devmem.trace/1)",
                                         std::string(schema.substr(0, 60))));
      }
      if (has_sites) {
        for (simdjson::dom::element s : sites) {
          simdjson::dom::object so;
          uint64_t id = 0;
          if (s.get_object().get(so) || so["id"].get_uint64().get(id)) {
            return LineError(name, line_no, "sites: expected objects with an \"id\"");
          }
          site_table[id] = SiteName(so);
        }
      }
      continue;
    }
    if (action.empty()) return LineError(name, line_no, "missing field \"action\" (a string)");
    if (action == "alloc") {
      e.kind = Kind::kAlloc;
    } else if (action == "free") {
      e.kind = Kind::kFree;
    } else if (action == "segment_alloc" || action == "segment_map") {
      e.kind = Kind::kSegmentUp;
      has_segments = true;
    } else if (action == "segment_free" || action == "segment_unmap") {
      e.kind = Kind::kSegmentDown;
      has_segments = true;
    } else if (action == "oom") {
      e.kind = Kind::kOom;
    } else {
      continue;
    }
    if (!has_addr && e.kind != Kind::kOom) return LineError(name, line_no, "missing field \"addr\"");
    if (!has_size && e.kind != Kind::kFree) return LineError(name, line_no, "missing field \"size\"");
    if (e.size > (uint64_t{1} << 50)) {
      return LineError(name, line_no, "size is absurd (more than 2^50 bytes)");
    }
    if (seq != 0) {
      if (prev_seq != 0 && seq != prev_seq + 1) ++gaps;
      prev_seq = seq;
    }
    if (e.kind == Kind::kAlloc) {
      auto [live, inserted] = live_addrs.try_emplace(e.addr, gaps);
      if (!inserted) {
        if (live->second == gaps) {
          return LineError(name, line_no,
                           absl::StrFormat("alloc of addr %d, which is already live", e.addr));
        }
        // The free was lost in a gap: implied here, just before this alloc (below, the
        // free's time is this event's, clamped as any other).
        TimelineEvent lost = e;
        lost.kind = Kind::kFree;
        lost.time = std::max(time, last_time);
        auto [dit, dinserted] = dense.try_emplace(site, static_cast<uint32_t>(dense_ids.size()));
        if (dinserted) dense_ids.push_back(site);
        lost.site = dit->second;
        events.push_back(lost);
        ++implied_frees;
        live->second = gaps;
      }
    }
    if (e.kind == Kind::kFree && live_addrs.erase(e.addr) == 0) {
      ++unmatched_frees;
      continue;
    }
    // Time never goes backwards on the x axis: an event earlier than the one before
    // (threads' events merged slightly out of order) is drawn at the time before. Then
    // the interval index only grows, so there are at most max_points intervals (each
    // step back used to open one more).
    if (time < last_time) {
      time = last_time;
      ++time_backwards;
    }
    last_time = time;
    e.time = time;
    if (e.time != 0) has_time = true;
    auto [it, inserted] = dense.try_emplace(site, static_cast<uint32_t>(dense_ids.size()));
    if (inserted) dense_ids.push_back(site);
    e.site = it->second;
    events.push_back(e);
  }

  live_addrs = {};  // released: the pass below keeps its own table
  Timeline tl;
  tl.events = events.size();
  tl.unmatched_frees = unmatched_frees;
  tl.implied_frees = implied_frees;
  tl.time_backwards = time_backwards;
  tl.x_is_time = has_time;
  const int64_t x0 = events.empty() ? 0 : (has_time ? events.front().time : 0);
  auto x_of = [&](size_t i) { return has_time ? events[i].time - x0 : static_cast<int64_t>(i); };
  int64_t x_max = 0;
  for (size_t i = 0; i < events.size(); ++i) x_max = std::max(x_max, x_of(i));
  const int points = std::max(1, options.max_points);
  auto bucket_of = [&](int64_t x) {
    if (x_max <= 0) return 0;
    const __int128 b = static_cast<__int128>(std::max<int64_t>(x, 0)) * points / (x_max + 1);
    return static_cast<int>(std::min<__int128>(b, points - 1));
  };

  // Reserved bytes per event: from segment events, else from a replay.
  std::vector<uint64_t> bucket_reserved;  // per output interval, from the replay
  if (!has_segments && !events.empty()) {
    tl.reserved_from_replay = true;
    Trace trace;
    std::vector<size_t> op_event;  // op index -> event index
    absl::flat_hash_map<uint64_t, uint32_t> live;
    for (size_t i = 0; i < events.size(); ++i) {
      const TimelineEvent& e = events[i];
      if (e.kind == Kind::kAlloc) {
        live.try_emplace(e.addr, trace.allocations);  // the reader refused double allocs
        trace.ops.push_back(Trace::Op{e.size, trace.allocations++, 0, true});
        op_event.push_back(i);
      } else if (e.kind == Kind::kFree) {
        auto it = live.find(e.addr);
        if (it == live.end()) continue;
        trace.ops.push_back(Trace::Op{0, it->second, 0, false});
        live.erase(it);
        op_event.push_back(i);
      }
    }
    trace.streams = 1;
    std::vector<bool> read(static_cast<size_t>(points), false);
    bucket_reserved.assign(static_cast<size_t>(points), 0);
    // stats() is a lock and a copy: it is read only at the last op of each output
    // interval. That loses no peak: on an unbounded device nothing is ever flushed
    // (no OOM, no retry), so reserved bytes only grow within an interval.
    std::vector<bool> last_in_bucket(op_event.size(), false);
    for (size_t op = 0; op < op_event.size(); ++op) {
      last_in_bucket[op] = op + 1 == op_event.size() ||
                           bucket_of(x_of(op_event[op])) != bucket_of(x_of(op_event[op + 1]));
    }
    uint64_t current = 0;
    Replay(trace, options.config, kUnboundedCapacity, [&](size_t op, const CachingAllocator& a) {
      if (last_in_bucket[op]) {
        current = static_cast<uint64_t>(a.stats().reserved_bytes[kAggregatePool].current);
        const int b = bucket_of(x_of(op_event[op]));
        bucket_reserved[b] = current;
        read[b] = true;
      }
    });
    // Intervals without replayed ops keep the reading of the one before.
    for (int b = 1; b < points; ++b) {
      if (!read[b]) bucket_reserved[b] = bucket_reserved[b - 1];
    }
  }

  // The pass: allocated bytes and per-site bytes, sampled per interval. Per-site
  // samples are kept sparse: at each interval's end only the sites that changed in it
  // are recorded, so memory is O(events) however many sites there are (a dense
  // [point][site] table took 800 x 150,000 x 8 bytes = 960 MB for 150k sites).
  struct SiteChange {
    uint32_t point;
    uint32_t site;
    uint64_t bytes;
  };
  const size_t nsites = dense_ids.size();
  std::vector<uint64_t> site_live(nsites, 0);
  std::vector<uint64_t> peak(nsites, 0);       // each site's highest sampled bytes
  std::vector<uint32_t> dirty;                 // sites changed in the open interval
  std::vector<bool> is_dirty(nsites, false);
  std::vector<SiteChange> changes;             // in point order
  std::vector<uint64_t> allocated_at_end;      // per point: the sum over all sites
  absl::flat_hash_map<uint64_t, std::pair<uint64_t, uint32_t>> live;  // addr -> size, site
  uint64_t allocated = 0, reserved = 0;
  // The segment view's spans: blocks by address while live (index into block_spans),
  // mapped ranges by start (end, index into segment_spans).
  bool spans_on = has_segments;
  std::vector<uint32_t> block_span_site;  // dense site of each block span
  absl::flat_hash_map<uint64_t, size_t> open_block;
  absl::btree_map<uint64_t, std::pair<uint64_t, size_t>> open_range;
  auto open_segment_range = [&](uint64_t at, uint64_t end, int64_t x0) {
    tl.segment_spans.push_back(TimelineSpan{at, end - at, x0, -1, -1});
    open_range[at] = {end, tl.segment_spans.size() - 1};
  };
  // Closes [at, end) of the open ranges at x: each overlapped range ends there, and its
  // parts outside [at, end) go on from the range's own start.
  auto close_segment_range = [&](uint64_t at, uint64_t end, int64_t x) {
    auto it = open_range.upper_bound(at);
    if (it != open_range.begin() && std::prev(it)->second.first > at) --it;
    std::vector<std::pair<uint64_t, uint64_t>> left_over;
    std::vector<int64_t> left_over_x0;
    while (it != open_range.end() && it->first < end) {
      const uint64_t s0 = it->first, s1 = it->second.first;
      TimelineSpan& span = tl.segment_spans[it->second.second];
      const int64_t x0 = span.x0;
      // The closed span covers only the part unmapped now; the rest reopens.
      span.addr = std::max(s0, at);
      span.size = std::min(s1, end) - span.addr;
      span.x1 = x;
      if (s0 < at) { left_over.emplace_back(s0, at); left_over_x0.push_back(x0); }
      if (s1 > end) { left_over.emplace_back(end, s1); left_over_x0.push_back(x0); }
      it = open_range.erase(it);
    }
    for (size_t k = 0; k < left_over.size(); ++k) {
      open_segment_range(left_over[k].first, left_over[k].second, left_over_x0[k]);
    }
  };
  int current_bucket = -1;
  int64_t bucket_last_x = 0;  // x of the open interval's last event
  uint64_t bucket_alloc_max = 0, bucket_res_max = 0;
  auto touch = [&](uint32_t site) {
    if (!is_dirty[site]) {
      is_dirty[site] = true;
      dirty.push_back(site);
    }
  };
  // A point is the state after its interval's last event, at that event's x, so that
  // drawn as a step (held until the next point) it is exact wherever the trace is
  // quiet; the interval's highest values are kept beside it so that no peak is lost.
  auto close_bucket = [&]() {
    tl.x.push_back(bucket_last_x);
    tl.allocated.push_back(allocated);
    tl.reserved.push_back(reserved);
    tl.allocated_max.push_back(bucket_alloc_max);
    tl.reserved_max.push_back(bucket_res_max);
    const uint32_t point = static_cast<uint32_t>(tl.x.size() - 1);
    for (uint32_t s : dirty) {
      changes.push_back(SiteChange{point, s, site_live[s]});
      peak[s] = std::max(peak[s], site_live[s]);
      is_dirty[s] = false;
    }
    dirty.clear();
    allocated_at_end.push_back(allocated);
  };
  for (size_t i = 0; i < events.size(); ++i) {
    const TimelineEvent& e = events[i];
    const int b = bucket_of(x_of(i));
    if (b != current_bucket) {
      if (current_bucket >= 0) close_bucket();
      current_bucket = b;
      bucket_alloc_max = allocated;
      bucket_res_max = reserved;
    }
    bucket_last_x = x_of(i);
    switch (e.kind) {
      case Kind::kAlloc:
        if (live.try_emplace(e.addr, e.size, e.site).second) {
          allocated += e.size;
          site_live[e.site] += e.size;
          touch(e.site);
          if (spans_on && tl.block_spans.size() == kMaxSegmentViewSpans) {
            spans_on = false;
            tl.segment_view_note = absl::StrCat(
                "the segment view is left out: the trace has more than ",
                kMaxSegmentViewSpans, " allocations");
          }
          if (spans_on) {
            tl.block_spans.push_back(TimelineSpan{e.addr, e.size, x_of(i), -1, -1});
            block_span_site.push_back(e.site);
            open_block[e.addr] = tl.block_spans.size() - 1;
          }
        }
        break;
      case Kind::kFree: {
        auto it = live.find(e.addr);
        if (it != live.end()) {
          allocated -= it->second.first;
          site_live[it->second.second] -= it->second.first;
          touch(it->second.second);
          live.erase(it);
          if (spans_on) {
            auto open = open_block.find(e.addr);
            if (open != open_block.end()) {
              tl.block_spans[open->second].x1 = x_of(i);
              open_block.erase(open);
            }
          }
        }
        break;
      }
      case Kind::kSegmentUp:
        reserved += e.size;
        if (spans_on && e.size > 0) {
          // A map over a range still open (a trace that missed its unmap) replaces it.
          close_segment_range(e.addr, e.addr + e.size, x_of(i));
          open_segment_range(e.addr, e.addr + e.size, x_of(i));
        }
        break;
      case Kind::kSegmentDown:
        reserved -= std::min(reserved, e.size);
        if (spans_on && e.size > 0) close_segment_range(e.addr, e.addr + e.size, x_of(i));
        break;
      case Kind::kOom:
        tl.ooms.push_back(x_of(i));
        break;
    }
    if (tl.reserved_from_replay) reserved = bucket_reserved[b];
    bucket_alloc_max = std::max(bucket_alloc_max, allocated);
    bucket_res_max = std::max(bucket_res_max, reserved);
    tl.peak_allocated = std::max(tl.peak_allocated, allocated);
    tl.peak_reserved = std::max(tl.peak_reserved, reserved);
  }
  if (current_bucket >= 0) close_bucket();
  tl.x_end = x_max;

  live = {};
  site_live = {};
  open_block = {};
  open_range = {};
  if (!has_segments) {
    tl.segment_view_note =
        "the segment view needs a trace with segment events (segment_alloc, segment_map), "
        "as devmem records them; this one has none (reserved bytes come from a replay)";
  }
  if (!spans_on) {
    tl.block_spans = {};
    tl.segment_spans = {};
    block_span_site = {};
  }
  // Top sites by their highest sampled bytes; the rest summed as "other sites" (at each
  // point: all sites' bytes, which is allocated_at_end, less the top sites').
  std::vector<size_t> order(nsites);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return peak[a] != peak[b] ? peak[a] > peak[b] : dense_ids[a] < dense_ids[b];
  });
  size_t top = std::min<size_t>(order.size(), static_cast<size_t>(std::max(options.top_sites, 1)));
  while (top > 0 && peak[order[top - 1]] == 0) --top;
  const size_t npoints = tl.x.size();
  std::vector<int32_t> rank(nsites, -1);  // dense site -> its row among the top sites
  for (size_t k = 0; k < top; ++k) {
    const uint64_t id = dense_ids[order[k]];
    rank[order[k]] = static_cast<int32_t>(k);
    auto it = site_table.find(id);
    tl.site_names.push_back(it != site_table.end() ? it->second.first
                            : id == 0              ? std::string("unknown site")
                                                   : absl::StrCat("site ", id));
    tl.site_kinds.push_back(it != site_table.end() ? it->second.second : std::string());
    tl.site_ids.push_back(id);
    tl.site_peak_bytes.push_back(peak[order[k]]);
  }
  tl.by_site.assign(top, std::vector<uint64_t>(npoints, 0));
  std::vector<uint64_t> other(npoints, 0);
  std::vector<uint64_t> current(top, 0);
  uint64_t top_sum = 0, other_peak = 0;
  size_t next = 0;
  for (size_t p = 0; p < npoints; ++p) {
    for (; next < changes.size() && changes[next].point == p; ++next) {
      const int32_t k = rank[changes[next].site];
      if (k < 0) continue;
      top_sum = top_sum - current[k] + changes[next].bytes;
      current[k] = changes[next].bytes;
    }
    for (size_t k = 0; k < top; ++k) tl.by_site[k][p] = current[k];
    other[p] = allocated_at_end[p] - top_sum;
    other_peak = std::max(other_peak, other[p]);
  }
  if (top < order.size() && other_peak > 0) {
    tl.site_names.push_back("other sites");
    tl.site_kinds.push_back("");
    tl.site_ids.push_back(0);
    tl.has_other = true;
    tl.site_peak_bytes.push_back(other_peak);
    tl.by_site.push_back(std::move(other));
  }
  // Each block span drawn in its site's colour: a top site's series, else "other".
  for (size_t k = 0; k < tl.block_spans.size(); ++k) {
    const int32_t r = rank[block_span_site[k]];
    tl.block_spans[k].series =
        r >= 0 ? r : (tl.has_other ? static_cast<int32_t>(tl.by_site.size() - 1) : -1);
  }
  return tl;
}

}  // namespace

absl::StatusOr<Timeline> BuildTimeline(std::string_view text, const std::string& name,
                                       const TimelineOptions& options) {
  return BuildPadded(simdjson::padded_string(text), name, options);
}

absl::StatusOr<Timeline> ReadTimeline(const std::string& path, const TimelineOptions& options) {
  absl::StatusOr<simdjson::padded_string> text = LoadTraceFile(path);
  if (!text.ok()) return text.status();
  return BuildPadded(*text, path, options);  // in place: no second copy of a big file
}

}  // namespace devmem
