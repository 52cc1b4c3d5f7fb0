// tools/fuzz/fuzz_snapshot.cc: libFuzzer target for memtrace's snapshot reader
// (ParseSnapshot, tools/snapshot_reader.h): errors, never crashes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tools/snapshot_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)devmem::memtrace::ParseSnapshot(text, "fuzz");
  return 0;
}
