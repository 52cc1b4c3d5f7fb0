// tools/memtrace.cc: memtrace, devmem's command-line tool for allocation traces and
// snapshots. Each subcommand lives in tools/memtrace_<name>.cc (see
// tools/memtrace_commands.h for how they plug in, and for the exit statuses).
//
//   memtrace replay TRACE [--conf DEVMEM_CONF_STRING] [--capacity BYTES]
//                         [--min-capacity] [--json]
//   memtrace SUBCOMMAND --help     what each one does
#include <CLI/CLI.hpp>

#include "tools/memtrace_commands.h"

int main(int argc, char** argv) {
  namespace mt = devmem::memtrace;
  CLI::App app{"memtrace: who holds the memory of a devmem process, and what a workload "
               "would cost elsewhere"};
  app.require_subcommand(1);
  int exit_code = mt::kExitOk;
  mt::AddReplayCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return mt::kExitBadInput;
  }
  return exit_code;
}
