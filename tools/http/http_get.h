// tools/http/http_get.h: the small HTTP/1.1 client memtrace uses to read a live process's
// /debug/* endpoints (runtime/http_server.h). Plain HTTP over POSIX sockets: devmem
// serves loopback (or token-protected) addresses, so no TLS, no redirects, no proxies.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace devmem::memtrace {

struct HttpResponse {
  int status = 0;       // 200, 401, ...
  std::string reason;   // "OK"
  std::string body;     // de-chunked
  // The header fields in the order received, names lower-cased, values trimmed.
  std::vector<std::pair<std::string, std::string>> headers;
  // The first value of header `name` (lower case), or nullptr.
  const std::string* Header(std::string_view name) const {
    for (const auto& [n, v] : headers) {
      if (n == name) return &v;
    }
    return nullptr;
  }
};

// GET `url` ("http://HOST:PORT/path?query"), with "Authorization: Bearer <token>" when
// `token` is not empty. Connection: close; the body is framed by Content-Length,
// chunked encoding, or the end of the connection. Two limits: `timeout_s` of silence
// (no byte), and `deadline_s` for the whole exchange from the connect to the last
// byte, so a server that trickles a byte now and then cannot hold memtrace forever.
// Errors (bad URL, cannot connect, either limit, malformed answer, a body over 4 GiB)
// name the URL. A non-2xx status is not an error here: callers decide (HttpGetOk does).
inline constexpr int kHttpTimeoutS = 30;
inline constexpr int kHttpDeadlineS = 120;
absl::StatusOr<HttpResponse> HttpGet(const std::string& url, const std::string& token,
                                     int timeout_s = kHttpTimeoutS,
                                     int deadline_s = kHttpDeadlineS);

// HttpGet that also turns a non-2xx status into an error naming the URL, the status
// and the first line of the body ("GET http://...: HTTP 401 Unauthorized: ...").
absl::StatusOr<std::string> HttpGetOk(const std::string& url, const std::string& token,
                                      int timeout_s = kHttpTimeoutS,
                                      int deadline_s = kHttpDeadlineS);
// The same, keeping the whole response (for callers that read its headers).
absl::StatusOr<HttpResponse> HttpGetOkResponse(const std::string& url, const std::string& token,
                                               int timeout_s = kHttpTimeoutS,
                                               int deadline_s = kHttpDeadlineS);

// The response parser HttpGet uses, fed the bytes a server sent until it closed the
// connection (a separate function so that it can be tested and fuzzed without
// sockets). Takes `raw` by value and cuts the body out of it in place: no second copy
// of a large answer. Errors say what is malformed (without the URL: HttpGet adds it).
absl::StatusOr<HttpResponse> ParseHttpResponse(std::string raw);

// Reads a bearer token file (as http_token_file: the token, surrounding whitespace
// trimmed). The error names the file.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace devmem::memtrace
