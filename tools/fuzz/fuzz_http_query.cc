// tools/fuzz/fuzz_http_query.cc: libFuzzer target for what devmem's HTTP server parses
// from a request itself (runtime/http_request.h): the query string of /debug/*, each
// value the way the endpoints read it (ParseCount for since/limit, ParseDeviceId for
// device, ParseSize for min_bytes), and the Host header. Errors, never crashes, and
// what parses keeps the documented promises (checked; a broken one aborts).
#include <arpa/inet.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "allocator/config.h"
#include "allocator/types.h"
#include "runtime/http_request.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<devmem::QueryParams> q = devmem::ParseQuery(
      text, {"device", "site", "min_bytes", "limit", "since"});
  if (q.ok()) {
    for (const auto& [key, value] : *q) {
      Check(key == "device" || key == "site" || key == "min_bytes" || key == "limit" ||
            key == "since");
      if (key == "limit" || key == "since") {
        absl::StatusOr<uint64_t> n = devmem::ParseCount(key, value);
        // A count is decimal digits only (any up to 19 of them fit), and reads back as
        // the same number.
        if (AllDigits(value) && value.size() <= 19) Check(n.ok());
        if (n.ok()) {
          Check(AllDigits(value));
          size_t first = value.find_first_not_of('0');
          const std::string digits = first == std::string::npos ? "0" : value.substr(first);
          Check(std::to_string(*n) == digits);
        }
      } else if (key == "device") {
        absl::StatusOr<devmem::DeviceId> d = devmem::ParseDeviceId(value);
        if (d.ok()) Check(d->index >= 0);
      } else if (key == "min_bytes") {
        (void)devmem::ParseSize(value);
      }
    }
  } else {
    // Error messages quote client text boundedly.
    Check(q.status().message().size() < 512);
  }
  // An endpoint that takes no parameters accepts only an empty query (or "&&&").
  absl::StatusOr<devmem::QueryParams> none = devmem::ParseQuery(text, {});
  if (none.ok()) Check(none->empty());

  std::optional<devmem::HostHeader> h = devmem::ParseHostHeader(text);
  if (h.has_value()) {
    Check(!h->host.empty());
    Check(!h->ipv6 || h->ip);
    if (h->ip) {
      unsigned char addr[16];
      Check(inet_pton(h->ipv6 ? AF_INET6 : AF_INET, h->host.c_str(), addr) == 1);
    } else {
      for (char c : h->host) Check(!(c >= 'A' && c <= 'Z'));  // lower-cased
    }
    // The canonical form parses to itself.
    std::optional<devmem::HostHeader> again =
        devmem::ParseHostHeader(h->ipv6 ? "[" + h->host + "]" : h->host);
    Check(again.has_value() && again->host == h->host && again->ip == h->ip);
  }
  return 0;
}
