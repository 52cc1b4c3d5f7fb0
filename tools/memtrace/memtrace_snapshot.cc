// tools/memtrace/memtrace_snapshot.cc: `memtrace snapshot URL -o FILE`: saves a running
// process's /debug/snapshot to a file after checking it is a snapshot this memtrace
// reads (schema major, every field), so that a saved file is one `buffers`, `diff` and
// `oom` accept. The file is written under a temporary name and renamed: it is complete
// when it appears. `-o -` writes the snapshot to stdout (and the summary to stderr).
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "tools/inspect/inspect_format.h"
#include "tools/memtrace/memtrace_commands.h"
#include "tools/memtrace/snapshot_source.h"

namespace devmem::memtrace {
namespace {

struct SnapshotOptions {
  std::string url, token_file, output;
  bool json = false;
};

int RunSnapshot(const SnapshotOptions& o) {
  if (!IsUrl(o.url)) {
    std::fprintf(stderr, "memtrace snapshot: \"%s\": expected the URL of a running process "
                 "(http://HOST:PORT)\n", o.url.c_str());
    return kExitBadInput;
  }
  LoadedSnapshot loaded;
  if (int rc = LoadSnapshot("snapshot", o.url, o.token_file, &loaded); rc != kExitOk) return rc;
  const bool to_stdout = o.output == "-";
  if (to_stdout) {
    // The snapshot itself is the output: the summary below goes to stderr.
    std::fwrite(loaded.text.data(), 1, loaded.text.size(), stdout);
    if (loaded.text.empty() || loaded.text.back() != '\n') std::fputc('\n', stdout);
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      std::fprintf(stderr, "memtrace snapshot: -o -: cannot write to stdout\n");
      return kExitBadInput;
    }
  } else {
    const std::string tmp = o.output + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << loaded.text;
      if (loaded.text.empty() || loaded.text.back() != '\n') out << '\n';
      out.flush();
      if (!out) {
        std::fprintf(stderr, "memtrace snapshot: cannot write %s\n", tmp.c_str());
        std::remove(tmp.c_str());
        return kExitBadInput;
      }
    }
    if (std::rename(tmp.c_str(), o.output.c_str()) != 0) {
      std::fprintf(stderr, "memtrace snapshot: cannot rename %s to %s\n", tmp.c_str(),
                   o.output.c_str());
      std::remove(tmp.c_str());
      return kExitBadInput;
    }
  }
  uint64_t live = 0, live_bytes = 0;
  for (const SnapDevice& d : loaded.snap.devices) {
    for (const SnapBlock& b : d.blocks) {
      if (b.state != BlockKind::kAllocated) continue;
      ++live;
      live_bytes += b.size;
    }
  }
  std::FILE* report = to_stdout ? stderr : stdout;
  if (o.json) {
    nlohmann::ordered_json j{{"url", SnapshotUrl(o.url)}, {"file", o.output},
                             {"schema", loaded.snap.schema}, {"bytes", loaded.text.size()},
                             {"devices", loaded.snap.devices.size()},
                             {"live_buffers", live}, {"live_bytes", live_bytes}};
    std::fprintf(report, "%s\n", j.dump(1).c_str());
  } else {
    std::fprintf(report, "wrote %s: %s from %s, %zu devices, %llu live buffers (%s)\n",
                o.output.c_str(), loaded.snap.schema.c_str(), SnapshotUrl(o.url).c_str(),
                loaded.snap.devices.size(), static_cast<unsigned long long>(live),
                Bytes(live_bytes).c_str());
  }
  return kExitOk;
}

}  // namespace

void AddSnapshotCommand(CLI::App& app, int* exit_code) {
  auto o = std::make_shared<SnapshotOptions>();
  CLI::App* cmd = app.add_subcommand(
      "snapshot", "Save a running process's snapshot (/debug/snapshot) to a file, validated");
  cmd->add_option("url", o->url, "http://HOST:PORT of the process (or the full snapshot URL)")
      ->required();
  cmd->add_option("-o,--output", o->output,
                  "file to write (- for stdout; the summary then goes to stderr)")
      ->required();
  cmd->add_option("--token-file", o->token_file, "file holding the bearer token (http_token_file)");
  cmd->add_flag("--json", o->json, "print what was written as one JSON object");
  cmd->callback([o, exit_code] { *exit_code = RunSnapshot(*o); });
}

}  // namespace devmem::memtrace
