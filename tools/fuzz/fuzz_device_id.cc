// tools/fuzz/fuzz_device_id.cc: libFuzzer target for ParseDeviceId (allocator/types.h),
// which reads device names from the command line, the C ABI and files. Errors, never
// crashes; what parses is a device with an index in 0..1023 whose canonical name
// (ToString) is the input itself, or "sim"/"cuda" standing for index 0, and parses
// back to the same device.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "allocator/types.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<devmem::DeviceId> id = devmem::ParseDeviceId(text);
  if (!id.ok()) {
    // An error says what was wrong, briefly (the text is quoted cut to 64 bytes).
    if (id.status().message().empty() || id.status().message().size() > 300) std::abort();
    return 0;
  }
  if (id->index < 0 || id->index > 1023) std::abort();
  const std::string canonical = id->ToString();
  if (canonical != text && !(text == "sim" && canonical == "sim:0") &&
      !(text == "cuda" && canonical == "cuda:0")) {
    std::abort();  // one spelling a device
  }
  absl::StatusOr<devmem::DeviceId> again = devmem::ParseDeviceId(canonical);
  if (!again.ok() || !(*again == *id)) std::abort();  // the round trip
  return 0;
}
