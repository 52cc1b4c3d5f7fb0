// tools/fuzz/fuzz_device_id.cc: libFuzzer target for ParseDeviceId (allocator/types.h),
// which reads device names from the command line, the C ABI and files. Errors, never
// crashes; what parses is a device with an index in 0..1023 whose canonical name
// (ToString) is the input itself (up to leading zeros of the index), or "sim"/"cuda"
// standing for index 0, and parses back to the same device.
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
    if (id.status().message().empty()) std::abort();  // an error says what was wrong
    return 0;
  }
  if (id->index < 0 || id->index > 1023) std::abort();
  const std::string canonical = id->ToString();
  if (canonical != text && !(text == "sim" && canonical == "sim:0") &&
      !(text == "cuda" && canonical == "cuda:0")) {
    // Else only leading zeros may differ ("sim:007"): the same kind, then digits only
    // (no sign, no space) whose value is the index.
    const size_t colon = canonical.find(':');
    if (colon == std::string::npos ||
        text.substr(0, colon + 1) != std::string_view(canonical).substr(0, colon + 1)) {
      std::abort();
    }
    const std::string_view digits = text.substr(colon + 1);
    if (digits.empty() || digits.size() > 64) std::abort();
    long value = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') std::abort();
      value = value * 10 + (c - '0');
      if (value > 1023) std::abort();
    }
    if (value != id->index) std::abort();
  }
  absl::StatusOr<devmem::DeviceId> again = devmem::ParseDeviceId(canonical);
  if (!again.ok() || !(*again == *id)) std::abort();  // the round trip
  return 0;
}
