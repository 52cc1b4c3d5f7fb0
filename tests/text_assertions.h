// tests/text_assertions.h: EXPECT_CONTAINS, EXPECT_NOT_CONTAINS and EXPECT_STARTS_WITH
// for checking messages, with both texts printed on failure. Plain gtest (the test
// binary does not link gmock). Accepts std::string, std::string_view, absl::string_view
// (a distinct type with Debian's abseil) and C strings.
#pragma once

#include <string>
#include <string_view>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace devmem::text_assertions {

inline std::string Text(const std::string& s) { return s; }
inline std::string Text(std::string_view s) { return std::string(s); }
inline std::string Text(absl::string_view s) { return std::string(s.data(), s.size()); }
inline std::string Text(const char* s) { return s; }

template <typename H, typename N>
::testing::AssertionResult Contains(const char* haystack_expr, const char* needle_expr,
                                    const H& haystack, const N& needle) {
  const std::string h = Text(haystack), n = Text(needle);
  if (h.find(n) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << haystack_expr << " does not contain "
                                       << needle_expr << "\n  text:   " << h
                                       << "\n  wanted: " << n;
}

template <typename H, typename N>
::testing::AssertionResult NotContains(const char* haystack_expr, const char* needle_expr,
                                       const H& haystack, const N& needle) {
  const std::string h = Text(haystack), n = Text(needle);
  if (h.find(n) == std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << haystack_expr << " contains " << needle_expr
                                       << "\n  text:     " << h << "\n  unwanted: " << n;
}

template <typename H, typename N>
::testing::AssertionResult StartsWith(const char* haystack_expr, const char* prefix_expr,
                                      const H& haystack, const N& prefix) {
  const std::string h = Text(haystack), p = Text(prefix);
  if (h.compare(0, p.size(), p) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << haystack_expr << " does not start with "
                                       << prefix_expr << "\n  text:   " << h
                                       << "\n  wanted: " << p;
}

}  // namespace devmem::text_assertions

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_PRED_FORMAT2(::devmem::text_assertions::Contains, haystack, needle)
#define EXPECT_NOT_CONTAINS(haystack, needle) \
  EXPECT_PRED_FORMAT2(::devmem::text_assertions::NotContains, haystack, needle)
#define EXPECT_STARTS_WITH(haystack, prefix) \
  EXPECT_PRED_FORMAT2(::devmem::text_assertions::StartsWith, haystack, prefix)
