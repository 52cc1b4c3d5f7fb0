// allocator/string_view_bridge.h: crossing between std::string_view and absl::string_view.
//
// Debian's Abseil (20220623) is built with ABSL_OPTION_USE_STD_STRING_VIEW = 0, so
// absl::string_view is its own type and absl::StrCat, StrSplit, SimpleAtoi and friends
// do not accept a std::string_view. devmem's interfaces use std::string_view; these two
// functions cross the boundary without copying. Every file that hands a
// std::string_view to Abseil uses them (one definition, not one per file).
//
//   absl::StrCat("key \"", Av(key), "\"");
//   std::string_view piece = Sv(absl::StripAsciiWhitespace(Av(text)));
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace devmem {

inline absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view Sv(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace devmem
