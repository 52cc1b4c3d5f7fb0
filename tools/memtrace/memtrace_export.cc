// tools/memtrace/memtrace_export.cc: `memtrace export --to pytorch-snapshot SOURCE -o FILE.pickle`:
// a snapshot, an OOM dump, a trace or a running process (http://HOST:PORT: its
// /debug/snapshot and its whole /debug/trace: tools/http/live_trace.h) in PyTorch's memory snapshot format, for
// pytorch.org/memory_viz and torch.cuda._memory_viz (tools/export/pytorch_snapshot.h says how;
// docs/formats.md lists the fields).
//
// Which kind a file is: a flight record when it starts with its magic, a trace when its
// first line is a trace header or event (JSON Lines), else a snapshot (an OOM dump is a
// snapshot with "oom").
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "allocator/config.h"
#include "runtime/flight_record_reader.h"
#include "runtime/json.h"
#include "tools/http/http_get.h"
#include "tools/http/live_trace.h"
#include "tools/memtrace/memtrace_commands.h"
#include "tools/export/pytorch_snapshot.h"

namespace devmem::memtrace {
namespace {

struct ExportArgs {
  std::string to, source, output, device, token_file;
  bool json = false;
};

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "memtrace export: %s\n", message.c_str());
  return code;
}

// True when the first non-blank line of `text` is a trace header or event.
bool LooksLikeTrace(const std::string& text) {
  size_t start = text.find_first_not_of(" \t\r\n");
  if (start == std::string::npos) return false;
  const size_t end = text.find('\n', start);
  const nlohmann::json first = nlohmann::json::parse(
      text.substr(start, end == std::string::npos ? std::string::npos : end - start), nullptr,
      /*allow_exceptions=*/false);
  if (!first.is_object()) return false;
  if (first.contains("action")) return true;
  auto schema = first.find("schema");
  return schema != first.end() && schema->is_string() && *schema == kTraceSchema;
}

// What the export takes from a snapshot or OOM dump, as the one reader read it
// (runtime/json.h's ParseSnapshotJson): the state, the sites, the trace, and an OOM
// dump's failed request (its "oom" object), which becomes an "oom" entry. Errors start
// with `name`, as the reader's do.
absl::Status TakeSnapshot(absl::StatusOr<SnapshotFile> read, const std::string& name,
                          PyTorchExportInput* in) {
  if (!read.ok()) return read.status();
  std::optional<PyTorchExportInput::Oom> oom;
  if (read->oom.has_value()) {
    const OomRecord& o = *read->oom;
    absl::StatusOr<DeviceId> device = ParseDeviceId(o.device);
    if (!device.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": oom.device: ", device.status().message()));
    }
    oom.emplace();
    oom->device = *device;
    oom->stream = Stream{static_cast<uintptr_t>(o.stream)};
    oom->site = o.site;
    oom->requested_bytes = o.requested_bytes;
    oom->driver_free = o.driver_free;
  }
  in->state = std::move(read->snap);
  in->sites = std::move(read->sites);
  in->trace = std::move(read->trace);
  in->oom = oom;
  return absl::OkStatus();
}

int ReadFileSource(const std::string& path, PyTorchExportInput* in) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Fail(absl::StrCat(path, ": cannot open"), kExitBadInput);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (LooksLikeFlightRecord(text)) {
    // A flight record: its rings are the trace, its site table the names; the state
    // is rebuilt from the events, as for a trace file.
    absl::StatusOr<FlightRecord> record = ParseFlightRecord(text, path);
    if (!record.ok()) return Fail(std::string(record.status().message()), kExitBadInput);
    in->trace = FlightRecordEvents(*record);
    in->sites = record->sites;
    return kExitOk;
  }
  if (LooksLikeTrace(text)) {
    absl::StatusOr<std::vector<TraceEvent>> trace = TraceFromJsonl(text, &in->sites);
    if (!trace.ok()) return Fail(absl::StrCat(path, ":", trace.status().message()), kExitBadInput);
    in->trace = std::move(*trace);
    return kExitOk;
  }
  absl::Status read = TakeSnapshot(ParseSnapshotJson(text, path), path, in);
  if (!read.ok()) return Fail(std::string(read.message()), kExitBadInput);
  return kExitOk;
}

// A running process: its snapshot, then its trace (the events up to the snapshot's
// time are kept). A process without tracing has no trace endpoint: the state alone.
int ReadUrlSource(const ExportArgs& a, PyTorchExportInput* in) {
  std::string token;
  if (!a.token_file.empty()) {
    absl::StatusOr<std::string> t = ReadTokenFile(a.token_file);
    if (!t.ok()) return Fail(std::string(t.status().message()), kExitBadInput);
    token = *t;
  }
  std::string base = a.source;
  while (!base.empty() && base.back() == '/') base.pop_back();
  absl::StatusOr<std::string> body = HttpGetOk(base + "/debug/snapshot", token);
  if (!body.ok()) return Fail(std::string(body.status().message()), kExitUnreachable);
  const std::string url = base + "/debug/snapshot";
  absl::Status read = TakeSnapshot(ParseSnapshotJson(*body, url), url, in);
  if (!read.ok()) return Fail(std::string(read.message()), kExitBadInput);
  if (in->trace.empty()) {
    // The whole ring, page after page, with the names of the sites its events name
    // (sites of buffers freed before the snapshot are not in the snapshot's table).
    absl::StatusOr<LiveTrace> lines = FetchLiveTrace(base, token);
    if (!lines.ok()) {
      std::fprintf(stderr, "memtrace export: no events (%s): the segments only\n",
                   std::string(lines.status().message()).c_str());
    } else {
      SiteMap trace_sites;
      absl::StatusOr<std::vector<TraceEvent>> trace = TraceFromJsonl(lines->text, &trace_sites);
      if (!trace.ok()) {
        return Fail(absl::StrCat(base, "/debug/trace:", trace.status().message()), kExitBadInput);
      }
      in->trace = std::move(*trace);
      in->sites.merge(trace_sites);  // the snapshot's entries win (the same ids anyway)
    }
  }
  return kExitOk;
}

int RunExport(const ExportArgs& a) {
  if (a.to != "pytorch-snapshot") {
    return Fail(absl::StrCat("--to ", a.to, ": unknown format (known: pytorch-snapshot)"),
                kExitBadInput);
  }
  PyTorchExportOptions options;
  if (!a.device.empty()) {
    absl::StatusOr<DeviceId> d = ParseDeviceId(a.device);
    if (!d.ok()) return Fail(absl::StrCat("--device: ", d.status().message()), kExitBadInput);
    options.device = *d;
  }
  PyTorchExportInput in;
  const bool url = a.source.rfind("http://", 0) == 0;
  if (!a.token_file.empty() && !url) {
    std::fprintf(stderr, "memtrace export: --token-file is ignored for a file source\n");
  }
  if (const int rc = url ? ReadUrlSource(a, &in) : ReadFileSource(a.source, &in); rc != kExitOk) {
    return rc;
  }
  PyTorchExportSummary summary;
  absl::StatusOr<std::string> pickle = PyTorchSnapshotPickle(in, options, &summary);
  if (!pickle.ok()) {
    return Fail(absl::StrCat(a.source, ": ", pickle.status().message()), kExitBadInput);
  }
  if (a.output == "-") {
    std::fwrite(pickle->data(), 1, pickle->size(), stdout);
    if (std::fflush(stdout) != 0) return Fail("-o -: cannot write to stdout", kExitBadInput);
  } else {
    std::ofstream file(a.output, std::ios::binary | std::ios::trunc);
    file << *pickle;
    file.flush();
    if (!file) return Fail(absl::StrCat(a.output, ": cannot write"), kExitBadInput);
  }
  // The summary goes to stderr when the pickle itself is on stdout.
  FILE* report = a.output == "-" ? stderr : stdout;
  std::string devices;
  for (const std::string& d : summary.devices) {
    absl::StrAppend(&devices, devices.empty() ? "" : ", ", a.json ? "\"" + d + "\"" : d);
  }
  const char* state = summary.state_from_trace ? "rebuilt from the trace" : "from the snapshot";
  if (a.json) {
    std::fprintf(report,
                 "{\"output\": \"%s\", \"format\": \"pytorch-snapshot\", \"devices\": [%s], "
                 "\"segments\": %zu, \"blocks\": %zu, \"trace_entries\": %zu, "
                 "\"state_from_trace\": %s, \"bytes\": %zu}\n",
                 a.output.c_str(), devices.c_str(), summary.segments, summary.blocks,
                 summary.trace_entries, summary.state_from_trace ? "true" : "false",
                 pickle->size());
  } else {
    std::fprintf(report,
                 "%s: PyTorch snapshot of %s: %zu segments, %zu blocks (%s), %zu trace "
                 "entries, %s; open it at pytorch.org/memory_viz\n",
                 a.output.c_str(), devices.empty() ? "no device" : devices.c_str(),
                 summary.segments, summary.blocks, state, summary.trace_entries,
                 FormatBytes(pickle->size()).c_str());
  }
  return kExitOk;
}

}  // namespace

void AddExportCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "export", "Write a snapshot, OOM dump, trace or live process in another tool's format "
                "(pytorch-snapshot: PyTorch's memory snapshot pickle, for memory_viz)");
  cmd->add_option("--to", a->to, "the format: pytorch-snapshot")->required();
  cmd->add_option("source", a->source,
                  "snapshot, OOM dump, trace or flight record file, or a running process's URL "
                  "(http://HOST:PORT)")
      ->required();
  cmd->add_option("-o,--output", a->output, "FILE.pickle (- for stdout)")->required();
  cmd->add_option("--device", a->device,
                  "only this device (sim:0, cuda:1, cpu); needed when two devices share "
                  "an index, which PyTorch's format cannot tell apart");
  cmd->add_option("--token-file", a->token_file, "bearer token for a process URL");
  cmd->add_flag("--json", a->json, "print a JSON summary");
  cmd->callback([a, exit_code] { *exit_code = RunExport(*a); });
}

}  // namespace devmem::memtrace
