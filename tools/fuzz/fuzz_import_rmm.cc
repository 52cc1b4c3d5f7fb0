// tools/fuzz/fuzz_import_rmm.cc: libFuzzer target for the RMM logging_resource_adaptor CSV importer
// (ImportRmmCsv): errors, never crashes, and whatever it accepts it turns into a trace
// that memtrace's own reader accepts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tools/import/trace_import.h"
#include "tools/replay/trace_replay.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string out;
  if (!devmem::ImportRmmCsv(text, "fuzz", &out).ok()) return 0;
  if (!devmem::ParseTrace(out, "imported").ok()) std::abort();
  return 0;
}
