// tools/memtrace/memtrace_commands.h: how memtrace's subcommands plug into its command line.
//
// Each subcommand lives in its own file (tools/memtrace/memtrace_<name>.cc) and exposes one
// function that adds itself to the CLI11 app. The subcommand's callback runs the
// command and stores its exit status in *exit_code. Every option needs a check in
// tests/memtrace_flags_test.py that fails when the option is ignored (the test reads
// the options from --help and fails on one it has no check for).
//
// Exit statuses (every subcommand): 0 success; 1 the command ran and the answer is
// "no" (diff --fail-on-growth found growth, replay had OOMs at its capacity); 2 bad
// command line, configuration or input (the message names the file, line or
// parameter); 3 a live process could not be reached or answered with an error.
//
// DEVMEM_CONF: memtrace reads and validates it before any subcommand runs (a malformed
// value: exit status 2, the message naming DEVMEM_CONF). The commands that build an
// allocator (replay, timeline's replay) take DEVMEM_CONF's keys as the base and the
// keys of --conf on top (a key in both: --conf wins); the sim device, its capacity and
// its fault/latency settings are replay's own (tools/replay/trace_replay.h).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "allocator/config.h"

namespace devmem::memtrace {

inline constexpr int kExitOk = 0;
inline constexpr int kExitNo = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitUnreachable = 3;

// The one rule of every command that reads traces (replay, timeline): a free of an
// address that is not live is skipped, and said once on stderr with the count, since
// it is legitimate at the start of a trace cut from a ring and a sign of a broken
// trace anywhere else. (An alloc of a live address is an error.)
inline void WarnUnmatchedFrees(const char* command, const std::string& source, uint64_t n) {
  if (n == 0) return;
  std::fprintf(stderr,
               "memtrace %s: %s: warning: skipped %llu free%s of addresses that were not "
               "live (expected only at the start of a trace cut from a ring)\n",
               command, source.c_str(), static_cast<unsigned long long>(n), n == 1 ? "" : "s");
}

// DEVMEM_CONF (already validated by main) with `conf_flag`'s keys applied on top. The
// error is --conf's (DEVMEM_CONF's own error is reported by main).
inline absl::StatusOr<Config> CommandConfig(std::string_view conf_flag) {
  absl::StatusOr<Config> base = ConfigFromEnv();
  if (!base.ok()) return base.status();
  return ParseConfig(conf_flag, *base);
}

void AddReplayCommand(CLI::App& app, int* exit_code);
// Traces from other allocators' logs (tools/memtrace/memtrace_import.cc).
void AddImportCommand(CLI::App& app, int* exit_code);
// Memory over time as SVG or HTML (tools/memtrace/memtrace_timeline.cc).
void AddTimelineCommand(CLI::App& app, int* exit_code);
// Inspection of live processes, snapshots and OOM dumps (tools/memtrace/memtrace_<name>.cc).
void AddBuffersCommand(CLI::App& app, int* exit_code);
void AddSnapshotCommand(CLI::App& app, int* exit_code);
void AddDiffCommand(CLI::App& app, int* exit_code);
void AddOomCommand(CLI::App& app, int* exit_code);
void AddWatchCommand(CLI::App& app, int* exit_code);
// Other tools' formats: PyTorch's memory snapshot (tools/memtrace/memtrace_export.cc).
void AddExportCommand(CLI::App& app, int* exit_code);
// What a dead process held, from its flight record (tools/memtrace/memtrace_postmortem.cc).
void AddPostmortemCommand(CLI::App& app, int* exit_code);

}  // namespace devmem::memtrace
