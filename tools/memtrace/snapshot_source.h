// tools/memtrace/snapshot_source.h: where memtrace's inspect commands get a snapshot from: a
// file, or a running process's /debug/snapshot (SOURCE = http://HOST:PORT[/path]).
#pragma once

#include <string>

#include "tools/snapshot/snapshot_reader.h"

namespace devmem::memtrace {

struct LoadedSnapshot {
  Snapshot snap;
  std::string text;  // the JSON as fetched (kept only for URLs: `snapshot -o` writes it)
};

// True when `source` names a live process rather than a file.
bool IsUrl(const std::string& source);

// The URL of the snapshot endpoint: "http://h:p" and "http://h:p/" become
// "http://h:p/debug/snapshot"; a URL with another path is used as given.
std::string SnapshotUrl(const std::string& source);

// Loads `source`. On failure prints "memtrace <command>: <message>" on stderr and
// returns the exit status (kExitUnreachable when a process could not be reached or
// answered with an error, kExitBadInput for unreadable or malformed input); 0 on
// success. `token_file` may be empty.
int LoadSnapshot(const std::string& command, const std::string& source,
                 const std::string& token_file, LoadedSnapshot* out);

}  // namespace devmem::memtrace
