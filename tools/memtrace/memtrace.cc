// tools/memtrace/memtrace.cc: memtrace, devmem's command-line tool for allocation traces and
// snapshots. Each subcommand lives in tools/memtrace/memtrace_<name>.cc (see
// tools/memtrace/memtrace_commands.h for how they plug in, and for the exit statuses).
//
//   memtrace replay TRACE [--conf DEVMEM_CONF_STRING] [--capacity BYTES]
//                         [--min-capacity] [--json]
//   memtrace buffers SOURCE [--list] [--device D] [--site S] [--min-bytes N] [--top N]
//   memtrace snapshot URL -o FILE
//   memtrace diff A B [--fail-on-growth BYTES]
//   memtrace oom DUMP
//   memtrace watch URL [--interval S]
//   memtrace import --from rmm-csv|pytorch-snapshot|umpire FILE -o TRACE.jsonl
//   memtrace timeline SOURCE -o FILE.svg|FILE.html [--points N] [--top N]
//   memtrace export --to pytorch-snapshot SOURCE -o FILE.pickle [--device D]
//   memtrace postmortem FLIGHT_RECORD [--events N] [--top N]
//   (each with --json; SOURCE/URL may need --token-file)
//   memtrace SUBCOMMAND --help     what each one does
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "allocator/config.h"
#include "devmem/devmem_version.h"
#include "tools/memtrace/memtrace_commands.h"

int main(int argc, char** argv) {
  namespace mt = devmem::memtrace;
  // DEVMEM_CONF is validated before anything runs, as by every devmem executable (the
  // README's promise): a malformed value is exit status 2 with its message
  // (tools/memtrace/memtrace_commands.h says how it combines with --conf).
  if (absl::StatusOr<devmem::Config> env = devmem::ConfigFromEnv(); !env.ok()) {
    std::fprintf(stderr, "memtrace: %s\n", std::string(env.status().message()).c_str());
    return mt::kExitBadInput;
  }
  CLI::App app{"memtrace: who holds the memory of a devmem process, and what a workload "
               "would cost elsewhere"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "memtrace " DEVMEM_VERSION);
  int exit_code = mt::kExitOk;
  mt::AddReplayCommand(app, &exit_code);
  mt::AddImportCommand(app, &exit_code);
  mt::AddTimelineCommand(app, &exit_code);
  mt::AddBuffersCommand(app, &exit_code);
  mt::AddSnapshotCommand(app, &exit_code);
  mt::AddDiffCommand(app, &exit_code);
  mt::AddOomCommand(app, &exit_code);
  mt::AddWatchCommand(app, &exit_code);
  mt::AddExportCommand(app, &exit_code);
  mt::AddPostmortemCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return mt::kExitBadInput;
  }
  return exit_code;
}
