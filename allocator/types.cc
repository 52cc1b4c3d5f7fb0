#include "allocator/types.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace devmem {

std::string_view DeviceTypeName(DeviceType type) {
  switch (type) {
    case DeviceType::kCpu: return "cpu";
    case DeviceType::kSim: return "sim";
    case DeviceType::kCuda: return "cuda";
  }
  return "unknown";
}

std::string DeviceId::ToString() const {
  if (type == DeviceType::kCpu) return "cpu";
  return absl::StrCat(DeviceTypeName(type), ":", index);
}

absl::StatusOr<DeviceId> ParseDeviceId(std::string_view text) {
  if (text == "cpu") return DeviceId{DeviceType::kCpu, 0};
  std::string_view kind = text;
  std::string_view index_text;
  if (size_t colon = text.find(':'); colon != std::string_view::npos) {
    kind = text.substr(0, colon);
    index_text = text.substr(colon + 1);
  }
  DeviceType type;
  if (kind == "sim") {
    type = DeviceType::kSim;
  } else if (kind == "cuda") {
    type = DeviceType::kCuda;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "device \"", text, "\": expected cpu, sim:N or cuda:N"));
  }
  int index = 0;
  if (!index_text.empty() &&
      (!absl::SimpleAtoi(index_text, &index) || index < 0 || index > 1023)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device \"", text, "\": index \"", index_text, "\" is not in 0..1023"));
  }
  return DeviceId{type, index};
}

}  // namespace devmem
