// tools/import/trace_import.h: converts other allocators' allocation logs into devmem traces
// (docs/formats.md, `devmem.trace/1`), so that `memtrace replay` answers "what would
// this workload cost under devmem?" for programs that never ran with devmem.
//
// Example:
//   std::string out;
//   absl::StatusOr<ImportStats> s = ImportRmmCsv(csv_text, "rmm.csv", &out);
//   // out: a header line, then one devmem trace event per line.
//
// Formats (what is read; everything else on a line is ignored):
//   rmm-csv  RMM's logging_resource_adaptor CSV: a header `Thread,Time,Action,Pointer,
//            Size,Stream`, then one line per call. Action `allocate` and `free` become
//            alloc/free; `allocate failure` becomes an `oom` event. Pointer and Stream
//            are hex (0x...) or decimal; Time is the time of day `HH:MM:SS.ffffff` (or
//            `HH:MM:SS:ffffff`), converted to nanoseconds from the first line; a time
//            more than 12 hours earlier than the line before is a pass over midnight
//            (at most 10,000 of them), a smaller step back is lines out of order (see
//            Output: times never go backwards).
//   umpire   Umpire's replay log (UMPIRE_REPLAY=On): one JSON object per line, lines
//            starting with '#' skipped. `"event": "allocate"` lines that carry
//            `"result": {"memory_ptr": P}` become alloc (size from `payload.size`,
//            a number or a numeric string); the same event without a result is the
//            call before it returned and is skipped, as are zero-byte allocations
//            (Umpire serves them from an allocator whose pointers alias real blocks). `"event": "deallocate"` with
//            `payload.memory_ptr` becomes free. `payload.allocator_ref` picks the
//            stream: each Umpire allocator becomes its own stream (0, 1, ... in order of
//            appearance), so their blocks stay apart as Umpire's pools keep them. Other
//            events (version, makeAllocator, ...) are skipped. `timestamp` (ns, at most
//            2^63 - 1) is made relative to the first alloc or free written.
// PyTorch snapshots (pickles) are converted by tools/import/import_pytorch_snapshot.py.
//
// Output: every event line carries the fields the runtime's reader requires (seq,
// time_ns, action, device, stream, addr, size, requested, site = 0, thread = 0); frees
// carry the size of the allocation they free. Times never go backwards: an event
// earlier than the one before (threads' lines interleaved) is written at the time
// before. Errors name the file and the line and what was expected there.
//
// Memory: the input is a view (memtrace maps the file); with `stream` given, the trace
// is written there in pieces of about 1 MiB as it is made, so *out never holds more
// than that (without it, *out receives the whole trace: tests and fuzzers).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace devmem {

struct ImportStats {
  uint64_t allocs = 0;
  uint64_t frees = 0;
  uint64_t ooms = 0;
  uint64_t skipped = 0;          // lines of other kinds
  uint64_t unmatched_frees = 0;  // frees of pointers not allocated in the log
};

// Each appends a whole devmem trace (header and events) to *out. `name` is used in
// error messages ("name:line: ...").
// With `stream`, write errors are reported as an error naming `name` too.
absl::StatusOr<ImportStats> ImportRmmCsv(std::string_view text, const std::string& name,
                                         std::string* out, std::FILE* stream = nullptr);
absl::StatusOr<ImportStats> ImportUmpire(std::string_view text, const std::string& name,
                                         std::string* out, std::FILE* stream = nullptr);

}  // namespace devmem
