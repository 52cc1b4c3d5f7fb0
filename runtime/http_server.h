// runtime/http_server.h: devmem's one HTTP listener (civetweb), off unless configured.
//
//   DEVMEM_CONF="http:127.0.0.1:0"        port 0 picks a free port (logged, and port())
//
// Endpoints:
//   /metrics          Prometheus text format (runtime/metrics.h)
//   /healthz          "ok"
//   /debug/buffers    live buffers as JSON; ?device=sim:0&site=...&min_bytes=N&limit=N
//   /debug/snapshot   the snapshot JSON (runtime/json.h), chunked (Transfer-Encoding) to
//                     HTTP/1.1 clients: written while it is sent
//   /debug/trace      trace events as JSON Lines; ?since=N (events with seq > N)&limit=N
//                     (default 10,000, at most 100,000); headers X-Devmem-Next-Since
//                     (the seq to ask after next), X-Devmem-More (1: more events were
//                     already there; ask again) and X-Devmem-Missed (events overwritten
//                     before this read); 404 when trace_entries is 0 (it is on by default)
// Every endpoint answers GET only (405 otherwise, with Allow: GET); an unknown or
// repeated query parameter is a 400 naming it, like a bad value.
// Every request whose Host header names something other than localhost, a loopback
// address, the bound address or a name of http / http_allowed_hosts gets 403 (DNS
// rebinding protection). With http_token_file set, /debug/* (and /metrics with
// http_metrics_token) needs "Authorization: Bearer <token>" (401 otherwise). Binding a
// non-loopback address needs http_token_file or http_allow_remote:true, and logs a
// warning. Malformed requests, unknown paths and bad parameters get a 4xx with a
// message. Handlers take snapshots under the allocators' locks for as long as a copy
// takes, and write to the client after releasing them, so a slow or broken client
// never blocks allocation; 16 workers and a 3 s request timeout keep a few slow
// clients from starving scrapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/config.h"

namespace devmem {

class Runtime;

// The most bytes a token file may hold (a token is one line; anything larger is not a
// token file, and reading it must not take unbounded memory).
inline constexpr size_t kMaxTokenFileBytes = 4096;

// Reads the bearer token from `path` (http_token_file): a regular file (a FIFO, a
// device such as /dev/zero or a directory is refused, without blocking or reading it
// whole) of at most kMaxTokenFileBytes, edge whitespace stripped, not empty and free
// of control bytes (NUL, CR, LF, ...: no client could send them). A file readable by
// group or others gets a warning on stderr. The error names the file and the reason.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The rules between the http keys that parsing one key at a time cannot see, checked
// by the runtime before it starts anything: http_token_file needs http. The error
// names the keys.
absl::Status ValidateHttpConfig(const Config& config);

class HttpServer {
 public:
  // Starts listening on config.http. The error names the address (bad syntax, port in
  // use with the errno's name, remote address without a token or http_allow_remote,
  // unreadable token file, an IPv6 address when civetweb was built without IPv6).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const Config& config,
                                                           Runtime* runtime);
  ~HttpServer();  // stops the listener and joins its threads
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Whether the civetweb linked in listens on IPv6 (Debian's is built without it: then
  // an IPv6 `http` address is refused at Start with that reason).
  static bool Ipv6Supported();

  // The port actually bound (useful with port 0).
  int port() const;
  // "http://127.0.0.1:PORT"
  std::string url() const;

 private:
  HttpServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace devmem
