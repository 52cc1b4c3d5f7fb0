// tools/http_get.h: the small HTTP/1.1 client memtrace uses to read a live process's
// /debug/* endpoints (runtime/http_server.h). Plain HTTP over POSIX sockets: devmem
// serves loopback (or token-protected) addresses, so no TLS, no redirects, no proxies.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace devmem::memtrace {

struct HttpResponse {
  int status = 0;       // 200, 401, ...
  std::string reason;   // "OK"
  std::string body;     // de-chunked
};

// GET `url` ("http://HOST:PORT/path?query"), with "Authorization: Bearer <token>" when
// `token` is not empty. Connection: close; the body is framed by Content-Length,
// chunked encoding, or the end of the connection. Errors (bad URL, cannot connect,
// timeout after `timeout_s` of silence, malformed answer, a body over 4 GiB) name the
// URL. A non-2xx status is not an error here: callers decide (HttpGetOk does).
absl::StatusOr<HttpResponse> HttpGet(const std::string& url, const std::string& token,
                                     int timeout_s = 30);

// HttpGet that also turns a non-2xx status into an error naming the URL, the status
// and the first line of the body ("GET http://...: HTTP 401 Unauthorized: ...").
absl::StatusOr<std::string> HttpGetOk(const std::string& url, const std::string& token,
                                      int timeout_s = 30);

// Reads a bearer token file (as http_token_file: the token, surrounding whitespace
// trimmed). The error names the file.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace devmem::memtrace
