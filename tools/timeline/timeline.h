// tools/timeline/timeline.h: memory over time from a devmem trace, for `memtrace timeline`:
// allocated bytes stacked by the sites that hold the most, the allocated and reserved
// totals, and OOM marks, downsampled to a bounded number of points, then drawn as a
// self-contained SVG or HTML page (no network, no external scripts or fonts).
//
// Example:
//   absl::StatusOr<Timeline> t = BuildTimeline(text, "run.jsonl", TimelineOptions{});
//   std::string svg = TimelineSvg(*t, "run.jsonl");
//
// Input: the trace format of docs/formats.md (header with the site table, then events).
// Allocated bytes follow alloc/free, under the rule replay uses (tools/replay/trace_replay.h):
// an alloc of an address that is already live is an error naming the line; a free of
// an address that is not live is counted (`unmatched_frees`) and skipped, since a trace
// cut from a ring may start with frees. Where "seq" jumps (a live ring's lost events),
// an alloc of an address allocated before the jump implies its lost free
// (`implied_frees`) instead of being an error. An event whose time_ns is earlier than the one
// before is drawn at the earlier event's time (counted in `time_backwards`). Reserved bytes follow segment_alloc/segment_map (+size) and
// segment_free/segment_unmap (-size) when the trace has such events; when it has none
// (imported or synthetic traces) the trace is replayed through a fresh allocator with
// `config` on an unbounded sim device and its reserved bytes are sampled instead
// (`reserved_from_replay`). The x axis is time_ns (relative to the first event); when
// the trace has no times (all zero) it is the event number.
//
// Downsampling: the x range is cut into `max_points` equal intervals. Each point is the
// state after its interval's last event, at that event's x (allocated, reserved and
// per-site bytes alike, so the stacked sites add up to allocated at every point), plus
// the highest allocated and reserved bytes within the interval (so no peak is lost).
// Drawn as steps (a value holds until the next point), the picture is exact wherever
// the trace is quiet; within a busy interval, the *_max series show how high it went. Memory is O(events + sites): at most
// max_points intervals whatever the order of times, per-site samples stored sparsely.
//
// Segment view (HTML): when the trace has segment events, the lifetime of every mapped
// address range and every block is kept as a span, so the page can draw the segments
// live at the time under the pointer with their blocks (memory_viz's allocator state
// view). A segment_free/segment_unmap closes the part of the ranges it covers; the
// rest stays open from its original start. At most kMaxSegmentViewSpans block spans are
// kept: past that the view is left out, and `segment_view_note` says why (as it does
// for a trace without segment events).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/config.h"

namespace devmem {

struct TimelineOptions {
  int max_points = 800;
  int top_sites = 8;   // the rest are summed as "other sites"
  Config config;       // the policy replayed when the trace has no segment events
};

// The lifetime of a mapped address range or a block: live over [x0, x1) on the x axis,
// the same convention as the points (an event at x has happened at x).
struct TimelineSpan {
  uint64_t addr = 0;
  uint64_t size = 0;
  int64_t x0 = 0;
  int64_t x1 = -1;     // -1: still live at the end of the trace
  int32_t series = -1; // blocks: the site series (by_site index), -1: none drawn
};

inline constexpr size_t kMaxSegmentViewSpans = 200000;

struct Timeline {
  // Per point: the x of its interval's last event (ns since the first event, or the
  // event number), strictly increasing.
  std::vector<int64_t> x;
  int64_t x_end = 0;                          // the last event's x
  bool x_is_time = true;
  std::vector<uint64_t> allocated;            // after each interval's last event
  std::vector<uint64_t> reserved;             // after each interval's last event
  std::vector<uint64_t> allocated_max;        // the highest within each interval
  std::vector<uint64_t> reserved_max;         // the highest within each interval
  bool reserved_from_replay = false;
  std::vector<std::string> site_names;        // top sites, largest first, then "other"
  std::vector<std::string> site_kinds;        // "alloc", "clone", ... ("" when unknown)
  std::vector<uint64_t> site_ids;             // the trace's site ids (0: unknown/other)
  bool has_other = false;                     // the last series sums the other sites
  std::vector<uint64_t> site_peak_bytes;      // each series' highest sampled value
  std::vector<std::vector<uint64_t>> by_site; // [series][point], after the last event
  std::vector<int64_t> ooms;                  // x of each OOM event
  uint64_t events = 0;
  uint64_t unmatched_frees = 0;               // frees of addresses not live (skipped)
  uint64_t implied_frees = 0;                 // frees lost in a seq gap (see above)
  uint64_t time_backwards = 0;                // events earlier than the one before
  uint64_t peak_allocated = 0;
  uint64_t peak_reserved = 0;
  // The segment view's spans (empty with a note when it is not available).
  std::vector<TimelineSpan> segment_spans;
  std::vector<TimelineSpan> block_spans;
  std::string segment_view_note;
};

absl::StatusOr<Timeline> BuildTimeline(std::string_view text, const std::string& name,
                                       const TimelineOptions& options);
// The same from a file, parsed in place (errors name the file and line).
absl::StatusOr<Timeline> ReadTimeline(const std::string& path, const TimelineOptions& options);

// `title` is shown at the top (escaped). The SVG is one standalone document; the HTML
// page embeds it and adds a readout at the time under the pointer (every series, and
// the site whose band is under it), zoom on a dragged time range and a per-site toggle
// (tools/timeline/timeline_render.cc).
std::string TimelineSvg(const Timeline& timeline, const std::string& title);
std::string TimelineHtml(const Timeline& timeline, const std::string& title);

}  // namespace devmem
