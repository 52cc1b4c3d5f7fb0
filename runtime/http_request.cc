// runtime/http_request.cc: query strings, counts and Host headers (see http_request.h).
#include "runtime/http_request.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/string_view_bridge.h"

namespace devmem {
namespace {

// Text from a client, quoted for an error message: at most kMaxQuoted bytes (a
// 10 KB bad value is not echoed whole), non-printable bytes as \xNN.
constexpr size_t kMaxQuoted = 64;

std::string Quote(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size() && i < kMaxQuoted; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c >= 0x7F || c == '"' || c == '\\') {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (text.size() > kMaxQuoted) absl::StrAppend(&out, "...");
  out.push_back('"');
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes one key or value of a form-encoded query; false on a bad escape.
bool Decode(std::string_view in, std::string* out) {
  out->clear();
  out->reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      out->push_back(' ');
    } else if (in[i] == '%') {
      if (i + 2 >= in.size()) return false;  // needs two more characters
      const int hi = HexValue(in[i + 1]);
      const int lo = HexValue(in[i + 2]);
      if (hi < 0 || lo < 0) return false;
      out->push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out->push_back(in[i]);
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<QueryParams> ParseQuery(std::string_view query,
                                       std::initializer_list<std::string_view> allowed) {
  QueryParams params;
  size_t start = 0;
  while (start <= query.size()) {
    size_t end = query.find('&', start);
    if (end == std::string_view::npos) end = query.size();
    const std::string_view pair = query.substr(start, end - start);
    start = end + 1;
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    const std::string_view raw_key = pair.substr(0, eq);
    const std::string_view raw_value =
        eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    std::string key;
    std::string value;
    if (!Decode(raw_key, &key) || !Decode(raw_value, &value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "malformed query parameter ", Quote(pair), " (a '%' must be followed by two hex "
          "digits)"));
    }
    bool known = false;
    for (std::string_view a : allowed) known = known || a == key;
    if (!known) {
      std::string list;
      for (std::string_view a : allowed) {
        absl::StrAppend(&list, list.empty() ? "" : ", ", Av(a));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown parameter ", Quote(key), " (this endpoint takes: ",
          list.empty() ? "none" : list, ")"));
    }
    if (!params.emplace(key, std::move(value)).second) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", Quote(key), " given twice"));
    }
  }
  return params;
}

absl::StatusOr<uint64_t> ParseCount(std::string_view name, std::string_view text) {
  uint64_t v = 0;
  bool digits = !text.empty();
  for (char c : text) digits = digits && absl::ascii_isdigit(static_cast<unsigned char>(c));
  if (!digits || !absl::SimpleAtoi(Av(text), &v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Av(name), ": ", Quote(text), " is not a non-negative integer below 2^64"));
  }
  return v;
}

std::optional<HostHeader> ParseHostHeader(std::string_view value) {
  value = Sv(absl::StripAsciiWhitespace(Av(value)));
  HostHeader h;
  std::string_view port;
  if (!value.empty() && value.front() == '[') {
    const size_t close = value.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    h.host = std::string(value.substr(1, close - 1));
    const std::string_view rest = value.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::nullopt;
      port = rest.substr(1);
      if (port.empty()) return std::nullopt;
    }
    in6_addr a6{};
    if (inet_pton(AF_INET6, h.host.c_str(), &a6) != 1) return std::nullopt;
    char text[INET6_ADDRSTRLEN] = {};
    inet_ntop(AF_INET6, &a6, text, sizeof(text));  // one spelling: "::0001" -> "::1"
    h.host = text;
    h.ip = true;
    h.ipv6 = true;
  } else {
    const size_t colon = value.find(':');
    h.host = std::string(value.substr(0, colon));
    if (colon != std::string_view::npos) {
      port = value.substr(colon + 1);
      if (port.empty()) return std::nullopt;
    }
    if (h.host.empty()) return std::nullopt;
    for (char c : h.host) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' &&
          c != '_') {
        return std::nullopt;
      }
    }
    absl::AsciiStrToLower(&h.host);
    // One trailing dot is the fully qualified spelling of the same name; an empty
    // label anywhere else ("a..b", ".a", "a..") is no name.
    if (h.host.size() > 1 && h.host.back() == '.') h.host.pop_back();
    if (h.host.front() == '.' || h.host.back() == '.' ||
        h.host.find("..") != std::string::npos) {
      return std::nullopt;
    }
    in_addr a4{};
    h.ip = inet_pton(AF_INET, h.host.c_str(), &a4) == 1;
    if (h.ip) {
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &a4, text, sizeof(text));
      h.host = text;
    }
  }
  for (char c : port) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return std::nullopt;
  }
  if (port.size() > 5) return std::nullopt;
  return h;
}

}  // namespace devmem
