// tools/fuzz/fuzz_config.cc: libFuzzer target for the configuration string parser
// (ParseConfig, DEVMEM_CONF): errors, never crashes, and every configuration that
// parses round-trips through its canonical form (ToString).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "allocator/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<devmem::Config> config = devmem::ParseConfig(text);
  if (!config.ok()) return 0;
  absl::StatusOr<devmem::Config> again = devmem::ParseConfig(devmem::ToString(*config));
  if (!again.ok() || !(*again == *config)) std::abort();  // the documented round trip
  return 0;
}
