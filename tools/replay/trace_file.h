// tools/replay/trace_file.h: loads a trace file for the readers that parse it in place
// (tools/replay/trace_replay.cc, tools/timeline/timeline.cc), gzip-compressed or not.
//
// A file that starts with the gzip magic bytes (1f 8b) is decompressed (zlib; the
// repository's real traces are stored so: tests/data/traces/real/); any other file is
// read as it is. Either way the result is one padded buffer simdjson can parse in
// place. zlib writes straight into the padded buffer, sized from the size gzip
// records in the file, so a compressed file costs its decompressed size once (a file
// whose recorded size is wrong, or several files concatenated, costs up to 3x while the
// buffer grows). A file that would decompress to more than 200x its size plus 64 MiB
// is refused as a gzip bomb, with a message saying to gunzip a real one first.
//
// Errors name the file: unreadable, corrupt or truncated gzip data, or more than the
// memory available (std::bad_alloc is caught here, so a trace too large for a memory
// cap is an error with exit status 2, not an abort).
#pragma once

#include <simdjson.h>

#include <string>

#include "absl/status/statusor.h"

namespace devmem {

absl::StatusOr<simdjson::padded_string> LoadTraceFile(const std::string& path);

}  // namespace devmem
