// tools/memtrace/memtrace_timeline.cc: `memtrace timeline SOURCE -o FILE.svg|FILE.html|-`: memory
// over time from a trace file, a flight record (flight_recorder:FILE: its rings) or a
// running process (its whole /debug/trace, page after
// page with the sites' names: tools/http/live_trace.h), stacked
// by the sites that hold the most, with allocated and reserved lines and OOM marks
// (tools/timeline/timeline.h says how it is computed and downsampled). The format follows the
// output's extension, or --format (required with `-o -`, which writes to stdout and
// moves the summary to stderr).
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "allocator/config.h"
#include "runtime/flight_record_reader.h"
#include "tools/http/http_get.h"
#include "tools/http/live_trace.h"
#include "tools/memtrace/memtrace_commands.h"
#include "tools/timeline/timeline.h"

namespace devmem::memtrace {
namespace {

struct TimelineArgs {
  std::string source, output, conf, token_file, format;
  int points = 800, top = 8;
  bool json = false;
};

int RunTimeline(const TimelineArgs& a) {
  const bool to_stdout = a.output == "-";
  bool html = false;
  if (!a.format.empty()) {
    if (a.format != "svg" && a.format != "html") {
      std::fprintf(stderr, "memtrace timeline: --format %s: expected svg or html\n",
                   a.format.c_str());
      return kExitBadInput;
    }
    html = a.format == "html";
  } else if (to_stdout) {
    std::fprintf(stderr,
                 "memtrace timeline: -o - (stdout) needs --format svg or --format html\n");
    return kExitBadInput;
  } else {
    html = absl::EndsWith(a.output, ".html") || absl::EndsWith(a.output, ".htm");
    if (!html && !absl::EndsWith(a.output, ".svg")) {
      std::fprintf(stderr,
                   "memtrace timeline: -o %s: expected a .svg or .html file name (or "
                   "--format svg|html)\n",
                   a.output.c_str());
      return kExitBadInput;
    }
  }
  if (a.points < 2 || a.points > 100000 || a.top < 1 || a.top > 64) {
    std::fprintf(stderr, "memtrace timeline: --points must be 2..100000, --top 1..64\n");
    return kExitBadInput;
  }
  TimelineOptions options;
  options.max_points = a.points;
  options.top_sites = a.top;
  absl::StatusOr<Config> config = CommandConfig(a.conf);
  if (!config.ok()) {
    std::fprintf(stderr, "memtrace timeline: --conf: %s\n",
                 std::string(config.status().message()).c_str());
    return kExitBadInput;
  }
  options.config = *config;
  absl::StatusOr<Timeline> t;
  if (absl::StartsWith(a.source, "http://")) {
    std::string token;
    if (!a.token_file.empty()) {
      absl::StatusOr<std::string> tok = ReadTokenFile(a.token_file);
      if (!tok.ok()) {
        std::fprintf(stderr, "memtrace timeline: %s\n", std::string(tok.status().message()).c_str());
        return kExitBadInput;
      }
      token = *tok;
    }
    std::string url = a.source;
    while (!url.empty() && url.back() == '/') url.pop_back();
    absl::StatusOr<LiveTrace> live = FetchLiveTrace(url, token);
    if (!live.ok()) {
      std::fprintf(stderr, "memtrace timeline: %s\n", std::string(live.status().message()).c_str());
      return kExitUnreachable;
    }
    if (live->missed > 0) {
      std::fprintf(stderr,
                   "memtrace timeline: %s: %llu events were overwritten in the ring before "
                   "they were read (raise trace_entries): the picture starts later\n",
                   a.source.c_str(), static_cast<unsigned long long>(live->missed));
    }
    t = BuildTimeline(live->text, a.source, options);
  } else if (IsFlightRecordFile(a.source)) {
    // A flight record (runtime/flight_recorder.h): its rings as one trace.
    absl::StatusOr<FlightRecord> record = ReadFlightRecord(a.source);
    if (!record.ok()) {
      std::fprintf(stderr, "memtrace timeline: %s\n", std::string(record.status().message()).c_str());
      return kExitBadInput;
    }
    if (!record->consistent()) {
      std::fprintf(stderr, "memtrace timeline: %s: warning: %llu damaged records skipped\n",
                   a.source.c_str(), static_cast<unsigned long long>(record->damaged));
    }
    t = BuildTimeline(FlightRecordToTraceJsonl(*record), a.source, options);
  } else {
    t = ReadTimeline(a.source, options);
  }
  if (!t.ok()) {
    std::fprintf(stderr, "memtrace timeline: %s\n", std::string(t.status().message()).c_str());
    return kExitBadInput;
  }
  WarnUnmatchedFrees("timeline", a.source, t->unmatched_frees);
  if (t->implied_frees > 0) {
    std::fprintf(stderr,
                 "memtrace timeline: %s: %llu frees were lost where the trace's seq jumps "
                 "(events the ring dropped); each is drawn at its address's next alloc\n",
                 a.source.c_str(), static_cast<unsigned long long>(t->implied_frees));
  }
  const std::string out = html ? TimelineHtml(*t, a.source) : TimelineSvg(*t, a.source);
  if (to_stdout) {
    std::fwrite(out.data(), 1, out.size(), stdout);
    if (std::fflush(stdout) != 0) {
      std::fprintf(stderr, "memtrace timeline: -o -: cannot write to stdout\n");
      return kExitBadInput;
    }
  } else {
    std::ofstream file(a.output, std::ios::binary | std::ios::trunc);
    file << out;
    file.flush();
    if (!file) {
      std::fprintf(stderr, "memtrace timeline: %s: cannot write\n", a.output.c_str());
      return kExitBadInput;
    }
  }
  // The summary goes to stderr when the picture itself is on stdout.
  FILE* report = to_stdout ? stderr : stdout;
  if (a.json) {
    std::fprintf(report, "{\"output\": \"%s\", \"events\": %llu, \"points\": %zu, "
                "\"peak_allocated_bytes\": %llu, \"peak_reserved_bytes\": %llu, "
                "\"reserved_from_replay\": %s, \"ooms\": %zu, \"sites\": %zu, "
                "\"unmatched_frees\": %llu, \"implied_frees\": %llu, \"time_backwards\": %llu}\n",
                a.output.c_str(), static_cast<unsigned long long>(t->events), t->x.size(),
                static_cast<unsigned long long>(t->peak_allocated),
                static_cast<unsigned long long>(t->peak_reserved),
                t->reserved_from_replay ? "true" : "false", t->ooms.size(),
                t->site_names.size(), static_cast<unsigned long long>(t->unmatched_frees),
                static_cast<unsigned long long>(t->implied_frees),
                static_cast<unsigned long long>(t->time_backwards));
  } else {
    std::fprintf(report, "%s: %llu events, %zu points, peak allocated %s, peak reserved %s%s, "
                "%zu OOMs\n",
                a.output.c_str(), static_cast<unsigned long long>(t->events), t->x.size(),
                FormatBytes(t->peak_allocated).c_str(), FormatBytes(t->peak_reserved).c_str(),
                t->reserved_from_replay ? " (replayed)" : "", t->ooms.size());
  }
  return kExitOk;
}

}  // namespace

void AddTimelineCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<TimelineArgs>();
  CLI::App* cmd = app.add_subcommand(
      "timeline", "Draw memory over time (by site, allocated, reserved, OOMs) as SVG or HTML");
  cmd->add_option("source", a->source,
                  "trace file (JSON Lines), flight record, or a running process's URL "
                  "(http://HOST:PORT)")
      ->required();
  cmd->add_option("-o,--output", a->output, "FILE.svg, FILE.html, or - for stdout")
      ->required();
  cmd->add_option("--format", a->format,
                  "svg or html (default: from the output's extension; required with -o -)");
  cmd->add_option("--points", a->points, "at most this many points along x (default 800)");
  cmd->add_option("--top", a->top, "sites drawn separately, the rest summed (default 8)");
  cmd->add_option("--conf", a->conf,
                  "configuration replayed for reserved bytes when the trace has no "
                  "segment events");
  cmd->add_option("--token-file", a->token_file, "bearer token for a process URL");
  cmd->add_flag("--json", a->json, "print a JSON summary");
  cmd->callback([a, exit_code] { *exit_code = RunTimeline(*a); });
}

}  // namespace devmem::memtrace
