// tools/memtrace_commands.h: how memtrace's subcommands plug into its command line.
//
// Each subcommand lives in its own file (tools/memtrace_<name>.cc) and exposes one
// function that adds itself to the CLI11 app. The subcommand's callback runs the
// command and stores its exit status in *exit_code.
//
// Exit statuses (every subcommand): 0 success; 1 the command ran and the answer is
// "no" (e.g. diff --fail-on-growth found growth); 2 bad command line, configuration or
// input (the message names the file, line or parameter); 3 a live process could not
// be reached or answered with an error.
#pragma once

#include <CLI/CLI.hpp>

namespace devmem::memtrace {

inline constexpr int kExitOk = 0;
inline constexpr int kExitNo = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitUnreachable = 3;

void AddReplayCommand(CLI::App& app, int* exit_code);
// Traces from other allocators' logs (tools/memtrace_import.cc).
void AddImportCommand(CLI::App& app, int* exit_code);
// Memory over time as SVG or HTML (tools/memtrace_timeline.cc).
void AddTimelineCommand(CLI::App& app, int* exit_code);
// Inspection of live processes, snapshots and OOM dumps (tools/memtrace_<name>.cc).
void AddBuffersCommand(CLI::App& app, int* exit_code);
void AddSnapshotCommand(CLI::App& app, int* exit_code);
void AddDiffCommand(CLI::App& app, int* exit_code);
void AddOomCommand(CLI::App& app, int* exit_code);
void AddWatchCommand(CLI::App& app, int* exit_code);
// Other tools' formats: PyTorch's memory snapshot (tools/memtrace_export.cc).
void AddExportCommand(CLI::App& app, int* exit_code);

}  // namespace devmem::memtrace
