// tools/fuzz/fuzz_runtime_json.cc: libFuzzer target for the runtime's JSON readers
// (runtime/json.h, runtime/json_reader.cc): SnapshotFromJson (snapshots and OOM dumps, with their site table
// and trace), TraceFromJsonl (trace files) and TraceEventFromJson (one event line).
// Errors, never crashes; and an event line that is read writes back to a line that
// reads back to the same line (the writer and the reader agree on everything they
// accept).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  devmem::SiteMap sites;
  std::vector<devmem::TraceEvent> trace;
  (void)devmem::SnapshotFromJson(text, &sites, &trace);
  (void)devmem::TraceFromJsonl(text, &sites);
  const std::string_view first_line = text.substr(0, text.find('\n'));
  absl::StatusOr<devmem::TraceEvent> e = devmem::TraceEventFromJson(first_line);
  if (e.ok()) {
    const std::string line = devmem::TraceEventToJson(*e);
    absl::StatusOr<devmem::TraceEvent> again = devmem::TraceEventFromJson(line);
    if (!again.ok() || devmem::TraceEventToJson(*again) != line) __builtin_trap();
  }
  return 0;
}
