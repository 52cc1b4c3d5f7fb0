#include "allocator/types.h"


#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "allocator/string_view_bridge.h"

namespace devmem {

std::string_view DeviceTypeName(DeviceType type) {
  switch (type) {
    case DeviceType::kCpu: return "cpu";
    case DeviceType::kSim: return "sim";
    case DeviceType::kCuda: return "cuda";
    case DeviceType::kCpuPinned: return "cpu_pinned";
  }
  return "unknown";
}

std::string DeviceId::ToString() const {
  if (type == DeviceType::kCpu) return "cpu";
  if (type == DeviceType::kCpuPinned) return "cpu_pinned";
  return absl::StrCat(Av(DeviceTypeName(type)), ":", index);
}

absl::StatusOr<DeviceId> ParseDeviceId(std::string_view text) {
  if (text == "cpu") return DeviceId{DeviceType::kCpu, 0};
  if (text == "cpu_pinned") return DeviceId{DeviceType::kCpuPinned, 0};
  // Messages quote the text cut to 64 bytes: it may come from a file or a client.
  const std::string quoted =
      text.size() <= 64 ? absl::StrCat("\"", Av(text), "\"")
                        : absl::StrCat("\"", Av(text.substr(0, 64)), "\"... (", text.size(),
                                       " bytes)");
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
        "device ", quoted, ": expected cpu, cpu_pinned, sim:N or cuda:N"));
  }
  // Digits only: "cuda:", "sim:+1" and "sim: 1" are errors, not index 0 or 1. The
  // canonical spelling only: "sim:007" is an error (a name is a key in snapshots,
  // metrics labels and filters, so two spellings of one device would not match).
  int index = 0;
  const bool has_colon = kind.size() != text.size();
  if (has_colon) {
    const char* end = index_text.data() + index_text.size();
    auto [ptr, ec] = std::from_chars(index_text.data(), end, index);
    // from_chars takes a '-' for a signed type: "sim:-0" must not pass as index 0.
    if (index_text.empty() || index_text.front() < '0' || index_text.front() > '9' ||
        ec != std::errc() || ptr != end || index < 0 || index > 1023) {
      return absl::InvalidArgumentError(
          absl::StrCat("device ", quoted, ": the index is not in 0..1023"));
    }
    if (index_text.size() > 1 && index_text.front() == '0') {
      return absl::InvalidArgumentError(absl::StrCat(
          "device ", quoted, ": the index has leading zeros (write ",
          Av(DeviceTypeName(type)), ":", index, ")"));
    }
  }
  return DeviceId{type, index};
}

}  // namespace devmem
