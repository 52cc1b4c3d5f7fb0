// runtime/json.h: devmem's JSON formats (documented in docs/formats.md).
//
//   snapshot   {"schema": "devmem.snapshot/1", ...}: per device its stats, segments
//              with their blocks (allocated / free / pending), live buffers (address,
//              size, requested size, stream, site, age), the site table, optionally
//              the trace.
//   trace      JSON Lines: a header line {"schema": "devmem.trace/1", "sites": [...]},
//              then one event an object: {"seq", "time_ns", "action", "device",
//              "stream", "addr", "size", "requested", "site", "thread"}.
//   buffers    {"schema": "devmem.buffers/1", "buffers": [...]} (what /debug/buffers
//              serves), filtered and largest first.
//   OOM dump   a snapshot of the failing device plus {"oom": <OomReport>}.
//   stats      {"schema": "devmem.stats/1", "device", "stats", "sites"}: one device's
//              statistics and per-site counters (libdevmem.so's devmem_stats_json).
// Snapshots and traces describe buffers, never their contents. Written with
// nlohmann::json (runtime/json.cc), read with simdjson (runtime/json_reader.cc; the
// snapshot reader is also memtrace's, fast enough for a snapshot of 10^6 buffers).
// Readers accept any minor version of their major version ("devmem.snapshot/1" and
// "devmem.snapshot/1.3") and refuse other majors, naming the schema they found and the
// one they read; unknown fields are ignored. Their errors start with the input's name
// (a file, a URL, or "snapshot" / "trace line N"), then the path of the offending field
// and what was expected there, or the byte offset of a JSON syntax error.
//
// Thread-safety: every function is a pure function of its arguments, except that the
// writers read the process's site table (allocator/site.h), which is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/oom_report.h"
#include "allocator/site.h"
#include "allocator/stats.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"

namespace devmem {

inline constexpr const char* kSnapshotSchema = "devmem.snapshot/1";
inline constexpr const char* kBuffersSchema = "devmem.buffers/1";
inline constexpr const char* kTraceSchema = "devmem.trace/1";
inline constexpr const char* kStatsSchema = "devmem.stats/1";

// A site table as files carry it: the writer's site ids and what they name. Ids are the
// writing process's; a reader keeps them as they are and looks names up here.
using SiteMap = std::map<SiteId, SiteInfo>;

// The snapshot of `snap`, with the site table of every site its blocks name and, when
// `trace` is given, its events.
std::string SnapshotToJson(const RuntimeSnapshot& snap,
                           const std::vector<TraceEvent>* trace = nullptr);

// Where a writer hands its text, piece by piece, in order; returns false to stop it
// (a client gone).
using JsonSink = std::function<bool(std::string_view)>;
// The text SnapshotToJson returns, handed to `sink` in pieces of at most `piece_bytes`
// (at least 256) as it is written, so that a server sends a large snapshot without
// holding its whole text (/debug/snapshot). Returns false when the sink stopped it.
inline constexpr size_t kSnapshotPieceBytes = 64 * 1024;
bool WriteSnapshotJson(const RuntimeSnapshot& snap, const std::vector<TraceEvent>* trace,
                       size_t piece_bytes, const JsonSink& sink);

// One top site of an OOM dump's "oom" object, as the file carries it.
struct OomRecordSite {
  uint32_t site = 0;
  std::string where, kind;
  bool copy = false;
  uint64_t live_bytes = 0, live_count = 0;
};

// The "oom" object of an OOM dump (docs/formats.md "OOM dump") as the file carries it:
// the writer's words and figures (its `message` and `remedy`, its site texts), which
// a reader shows as they are rather than recomputes.
struct OomRecord {
  std::string device;
  uint64_t stream = 0;
  uint32_t site = 0;
  uint64_t requested_bytes = 0, rounded_bytes = 0, segment_bytes = 0;
  uint64_t device_total = 0, driver_free = 0, memory_limit = 0;
  uint64_t allocated = 0, reserved = 0, pending = 0, reserved_unallocated = 0;
  uint64_t largest_free_block = 0, free_blocks = 0, segment_count = 0;
  double fragmentation = 0;
  std::vector<OomRecordSite> top_sites;
  uint64_t copy_bytes = 0;
  double copy_share = 0;
  std::string cause, remedy, message;
};

// Everything a snapshot file or OOM dump holds.
struct SnapshotFile {
  std::string schema;        // as found ("devmem.snapshot/1" or a minor of it)
  RuntimeSnapshot snap;
  SiteMap sites;             // the writer's site table
  std::vector<TraceEvent> trace;  // "trace" (optional; absent: empty)
  std::optional<OomRecord> oom;   // "oom": the file is an OOM dump
};

// Reads a snapshot or OOM dump. `name` (the file or URL) starts every error message.
// Besides the types of the fields, it checks what the views of a snapshot rely on:
// every block lies inside its segment and the blocks tile it in address order, every
// "tensor" annotation names an allocated block, an arena buffer lies above its chunk.
// InvalidArgument on malformed input (nothing is returned then).
absl::StatusOr<SnapshotFile> ParseSnapshotJson(std::string_view text, const std::string& name);
// The same for a file, read straight into the parser's buffer (one copy of a large
// file); NotFound when it cannot be read, naming the file and why.
absl::StatusOr<SnapshotFile> ReadSnapshotJsonFile(const std::string& path);

// ParseSnapshotJson(json, "snapshot"), for callers that want the runtime's types only.
// `sites` (if given) receives the site table, `trace` (if given) the events.
absl::StatusOr<RuntimeSnapshot> SnapshotFromJson(std::string_view json,
                                                 SiteMap* sites = nullptr,
                                                 std::vector<TraceEvent>* trace = nullptr);

// An OOM dump: SnapshotToJson(snap, trace) plus "oom": the report (docs/formats.md).
std::string OomDumpToJson(const RuntimeSnapshot& snap, const OomReport& report,
                          const std::vector<TraceEvent>* trace = nullptr);

// One trace event as one line of JSON (no trailing newline).
std::string TraceEventToJson(const TraceEvent& event);
// Reads one event line back; the error names the field and what was expected.
absl::StatusOr<TraceEvent> TraceEventFromJson(std::string_view line);
// The header line of a trace file (no trailing newline): the schema and the site table
// of every site `events` name.
std::string TraceHeaderToJson(const std::vector<TraceEvent>& events);
// The same with a given site table (one read from a file, not this process's).
std::string TraceHeaderFromSites(const SiteMap& sites);
// Writes `events` as JSON Lines to `path` (created or truncated): the header line, then
// one line per event. The error names the path.
absl::Status WriteTraceFile(const std::string& path, const std::vector<TraceEvent>& events);
// Reads a trace file's text (header line optional; blank lines skipped). The error
// names the line number, the field and what was expected.
absl::StatusOr<std::vector<TraceEvent>> TraceFromJsonl(std::string_view text,
                                                       SiteMap* sites = nullptr);

// One device's statistics (docs/formats.md, devmem.stats/1; what libdevmem.so's
// devmem_stats_json returns): the device, `stats` as in a snapshot, and the counters
// of every site in `sites` (indexed by SiteId, as CachingAllocator::site_stats()
// returns them) that has allocated, with its site table entry and its text.
std::string DeviceStatsToJson(DeviceId device, const DeviceStats& stats,
                              const std::vector<SiteStats>& sites);

// Live buffers of a snapshot, filtered as /debug/buffers and memtrace do.
struct BufferFilter {
  std::optional<DeviceId> device;
  // A substring of the site's text ("where"), "file:line" or function
  // (allocator/site.h's SiteTextMatches: the rule of memtrace buffers --site).
  std::optional<std::string> site;
  size_t min_bytes = 0;
  size_t limit = SIZE_MAX;
};
std::string LiveBuffersToJson(const RuntimeSnapshot& snap, const BufferFilter& filter);

}  // namespace devmem
