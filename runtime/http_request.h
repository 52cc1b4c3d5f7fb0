// runtime/http_request.h: the parts of an HTTP request that devmem's server checks
// itself, as pure functions over text (no sockets, no civetweb), so that they can be
// tested and fuzzed alone (tools/fuzz/fuzz_http_query.cc):
//
//   absl::StatusOr<QueryParams> q = ParseQuery("since=5&limit=10", {"since", "limit"});
//   absl::StatusOr<uint64_t> n = ParseCount("limit", q->at("limit"));
//   std::optional<HostHeader> h = ParseHostHeader("localhost:9400");
//
// Errors name the offending parameter and quote (a bounded prefix of) its text. Every
// function is thread-safe and takes any bytes, including invalid UTF-8 and NULs.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace devmem {

using QueryParams = absl::flat_hash_map<std::string, std::string>;

// The query string's parameters ("a=1&b=x%20y"), percent-decoded ('+' is a space).
// Empty items ("a=1&&b=2") are skipped; an item without '=' has the empty value. An
// error for: a malformed percent escape, a key not in `allowed`, a key given twice.
absl::StatusOr<QueryParams> ParseQuery(std::string_view query,
                                       std::initializer_list<std::string_view> allowed);

// A non-negative decimal integer that fits in 64 bits ("0", "42"); signs, spaces,
// hex and overflow are errors naming `name`.
absl::StatusOr<uint64_t> ParseCount(std::string_view name, std::string_view text);

// A Host header value taken apart: "Example.COM:80" -> {host "example.com", ip false};
// "[::1]:9400" -> {host "::1", ip true, ipv6 true}; "127.0.0.1" -> {host "127.0.0.1",
// ip true}. The host is lower-cased without its one trailing dot, IP literals in their
// canonical spelling ("[::0001]" -> "::1"). nullopt when the value is not host[:port]
// (empty, an empty label as in "a..b", a bad port, stray characters).
struct HostHeader {
  std::string host;
  bool ip = false;    // an IPv4 or IPv6 literal (not a DNS name)
  bool ipv6 = false;
};
std::optional<HostHeader> ParseHostHeader(std::string_view value);

}  // namespace devmem
