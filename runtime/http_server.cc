// runtime/http_server.cc: the civetweb listener, its access rules and its endpoints.
//
// Structure: Start() resolves and checks the address and the token (everything that
// can be refused is refused before a socket is opened), starts civetweb with one
// catch-all handler, and reads back the port it bound. Each request is answered in
// two steps: Route() computes the whole response (status, headers, body) while taking
// allocator locks only inside Runtime::snapshot() / allocators() / the metrics
// collector, each for as long as a copy takes; only then is the response written to
// the client (large bodies, /debug/snapshot's and /debug/trace's, are written from
// that copy while they are sent, in pieces). A slow or broken client therefore only ever holds one civetweb worker
// thread, never a lock that allocation needs, and civetweb's request_timeout_ms bounds
// how long it holds even that.
//
// Thread-safety: Impl is immutable after Start() except for what the members guard
// themselves (MetricsCollector is thread-safe); civetweb calls Handle() from its
// worker threads concurrently. ~HttpServer stops civetweb (joining its threads) before
// any member is destroyed.
#include "runtime/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <civetweb.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "allocator/config.h"
#include "allocator/string_view_bridge.h"
#include "allocator/types.h"
#include "runtime/http_request.h"
#include "runtime/json.h"
#include "runtime/metrics.h"
#include "runtime/runtime.h"
#include "runtime/size_histogram.h"
#include "runtime/trace.h"

namespace devmem {
namespace {

// How long civetweb waits for a client's whole request (and on each write of our
// response). Short, so that a client that connects and trickles its headers
// (slowloris) or never sends any holds a worker for seconds, not tens of seconds.
constexpr const char* kRequestTimeoutMs = "3000";
// Worker threads: each connection holds one from accept to close, slow clients
// included. Enough that a handful of slow or stalled clients leave most of them free
// for scrapes (tests/runtime_http_test.cc, SlowClientsDoNotStarveScrapes); each is
// a mostly idle thread with a small stack.
constexpr const char* kWorkerThreads = "16";

// /debug/trace: events per response when the request gives no `limit`, and the most
// it may ask for; a client reads a larger ring in pages, following X-Devmem-Next-Since
// while X-Devmem-More is 1. A page is copied out of the ring (64 bytes an event) and
// its JSON (about 200 bytes an event) is streamed in pieces of kStreamPieceBytes, so a
// request at the maximum costs about 6.4 MB, not the 20 MB its body would.
constexpr size_t kStreamPieceBytes = 64 * 1024;
constexpr size_t kTraceDefaultLimit = 10'000;
constexpr size_t kTraceMaxLimit = 100'000;

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // A streamed body instead of `body`: `stream_bytes` long, produced by `stream`, which
  // hands its pieces to `sink` in order and stops when the sink returns false (the
  // client is gone). The pieces must add up to stream_bytes exactly (Content-Length),
  // unless `chunked`: then the length is not known in advance and the body is sent
  // with Transfer-Encoding: chunked (only in answer to an HTTP/1.1 request).
  using Sink = std::function<bool(std::string_view)>;
  std::function<void(const Sink& sink)> stream;
  size_t stream_bytes = 0;
  bool chunked = false;
};

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 500: return "Internal Server Error";
    default: return "Error";
  }
}

Response Error(int status, std::string message) {
  Response r;
  r.status = status;
  r.body = std::move(message);
  r.body.push_back('\n');
  return r;
}

// Compares in time that depends only on the lengths, not on where the strings differ,
// so that a remote client cannot find the token byte by byte from response times.
bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// The address part of config.http resolved to a numeric address, and the port.
struct ListenAddress {
  std::string numeric;  // "127.0.0.1" or "::1"
  bool ipv6 = false;
  int port = 0;
  bool loopback = false;
};

absl::StatusOr<ListenAddress> ResolveListenAddress(const std::string& http) {
  std::string host;
  std::string port_text;
  if (!http.empty() && http[0] == '[') {
    const size_t close = http.find(']');
    if (close == std::string::npos || close + 1 >= http.size() || http[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("http: \"", http, "\" is not ADDRESS:PORT or [IPV6]:PORT"));
    }
    host = http.substr(1, close - 1);
    port_text = http.substr(close + 2);
  } else {
    const size_t colon = http.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("http: \"", http, "\" is not ADDRESS:PORT"));
    }
    host = http.substr(0, colon);
    port_text = http.substr(colon + 1);
  }
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("http: \"", http, "\" has a port that is not in 0..65535"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http: cannot resolve the address \"", host, "\" of \"", http, "\": ",
        gai_strerror(rc)));
  }
  // Prefer IPv4 (what "localhost" usually means to a scraper's configuration).
  const addrinfo* pick = found;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) { pick = a; break; }
  }
  ListenAddress out;
  out.port = port;
  char text[INET6_ADDRSTRLEN] = {};
  if (pick->ai_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(pick->ai_addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    out.loopback = (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  } else {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(pick->ai_addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    out.ipv6 = true;
    out.loopback = IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
  }
  freeaddrinfo(found);
  out.numeric = text;
  return out;
}

std::string_view QueryOf(const mg_request_info* ri) {
  return ri->query_string == nullptr ? std::string_view() : std::string_view(ri->query_string);
}

// What a file of this type is called in an error message.
const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symlink";
  return "not a regular file";
}

// The entries of http_allowed_hosts (separated by spaces or commas), each a host name
// or an IP literal as a Host header writes it, or "*". The error names the entry.
absl::StatusOr<std::vector<std::string>> AllowedHosts(const std::string& list) {
  std::vector<std::string> out;
  for (absl::string_view entry : absl::StrSplit(Av(list), absl::ByAnyChar(" \t,"),
                                                absl::SkipEmpty())) {
    if (entry == "*") {
      out.emplace_back("*");
      continue;
    }
    std::optional<HostHeader> h = ParseHostHeader(Sv(entry));
    if (!h.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "http_allowed_hosts: \"", entry,
          "\" is not a host name or IP address (separate entries with spaces; * = any)"));
    }
    out.push_back(h->host);
  }
  return out;
}

// Which Host header values the server answers: the protection against DNS rebinding,
// where a web page on a name the attacker controls makes the name resolve to 127.0.0.1
// and reads the endpoints with the browser's help. The browser then sends that name in
// Host, which no loopback name or address matches.
struct HostPolicy {
  bool any = false;                 // http_allowed_hosts holds "*"
  std::vector<std::string> names;   // the host name of `http`, http_allowed_hosts
  bool wildcard = false;            // bound to 0.0.0.0 or [::]: any IP literal is ours
  std::string bound;                // the bound address, as ParseHostHeader writes it

  bool Allows(const HostHeader& h) const {
    if (any) return true;
    if (h.host == "localhost" || absl::EndsWith(Av(h.host), ".localhost")) return true;
    if (h.ip) {
      if (wildcard || h.host == bound) return true;
      if (h.ipv6) {
        in6_addr a6{};
        if (inet_pton(AF_INET6, h.host.c_str(), &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6)) {
          return true;
        }
      } else {
        in_addr a4{};
        if (inet_pton(AF_INET, h.host.c_str(), &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127) {
          return true;
        }
      }
    }
    return std::find(names.begin(), names.end(), h.host) != names.end();
  }
};

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("http_token_file: \"", path, "\" ", Av(why)));
  };
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return bad(absl::StrCat("cannot be read: ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return bad(absl::StrCat("cannot be read: ", std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return bad(absl::StrCat("is ", FileTypeName(st.st_mode),
                            ", not a regular file holding the token"));
  }
  // One read past the bound tells a too-large file from one exactly at it.
  std::string contents(kMaxTokenFileBytes + 1, '\0');
  size_t got = 0;
  while (got < contents.size()) {
    const ssize_t n = read(fd, contents.data() + got, contents.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      close(fd);
      return bad(absl::StrCat("cannot be read: ", std::strerror(e)));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  if (got > kMaxTokenFileBytes) {
    return bad(absl::StrCat("is larger than ", kMaxTokenFileBytes,
                            " bytes; it should hold only the token"));
  }
  contents.resize(got);
  std::string token(absl::StripAsciiWhitespace(contents));
  if (token.empty()) return bad("holds no token (it is empty)");
  // A client sends the token in a header line: a NUL, CR, LF or other control byte
  // could never match, so such a token locks everyone out. Refuse it now.
  for (size_t i = 0; i < token.size(); ++i) {
    const auto c = static_cast<unsigned char>(token[i]);
    if (c < 0x20 || c == 0x7F) {
      return bad(absl::StrFormat(
          "holds a control byte 0x%02x at offset %d of the token; a token is one line "
          "of printable text",
          c, i));
    }
  }
  if ((st.st_mode & (S_IRGRP | S_IROTH)) != 0) {
    std::fprintf(stderr,
                 "devmem: warning: http_token_file \"%s\" is readable by %s (mode %04o); "
                 "chmod 600 it so that only its owner can read the token\n",
                 path.c_str(), (st.st_mode & S_IROTH) != 0 ? "others" : "its group",
                 static_cast<unsigned>(st.st_mode & 07777));
  }
  return token;
}

absl::Status ValidateHttpConfig(const Config& config) {
  if (config.http.empty() && !config.http_token_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http_token_file is set (\"", config.http_token_file,
        "\") but http is not, so nothing would use the token; set http:ADDRESS:PORT "
        "or remove http_token_file"));
  }
  if (config.http.empty() && !config.http_allowed_hosts.empty()) {
    return absl::InvalidArgumentError(
        "http_allowed_hosts is set but http is not; set http:ADDRESS:PORT or remove "
        "http_allowed_hosts");
  }
  if (config.http_metrics_token && config.http_token_file.empty()) {
    return absl::InvalidArgumentError(
        "http_metrics_token:true needs http_token_file (the token /metrics would require)");
  }
  if (absl::StatusOr<std::vector<std::string>> hosts = AllowedHosts(config.http_allowed_hosts);
      !hosts.ok()) {
    return hosts.status();
  }
  return absl::OkStatus();
}

namespace {
}  // namespace

struct HttpServer::Impl {
  Runtime* runtime = nullptr;
  std::optional<std::string> token;  // set when http_token_file is
  bool metrics_token = false;        // http_metrics_token: /metrics needs `token` too
  HostPolicy hosts;
  std::unique_ptr<MetricsCollector> metrics;
  mg_context* ctx = nullptr;
  ListenAddress address;
  int port = 0;

  static int Handle(mg_connection* conn, void* cbdata) {
    auto* self = static_cast<Impl*>(cbdata);
    Response r;
    try {
      r = self->Route(conn);
    } catch (const std::exception& e) {
      r = Error(500, absl::StrCat("internal error: ", e.what()));
    }
    self->Write(conn, r);
    return r.status;
  }

  // Computes the whole response; writes nothing.
  Response Route(mg_connection* conn) const {
    const mg_request_info* ri = mg_get_request_info(conn);
    if (ri == nullptr || ri->local_uri == nullptr || ri->request_method == nullptr) {
      return Error(400, "malformed request");
    }
    const std::string_view path(ri->local_uri);
    const std::string_view method(ri->request_method);
    const bool debug = path.substr(0, 7) == "/debug/";
    // The Host check comes first, for every path: a page that rebinds its own name to
    // this address must not learn anything here. No Host header (HTTP/1.0 tools) is
    // fine: a browser always sends one.
    if (const char* host = mg_get_header(conn, "Host"); host != nullptr) {
      std::optional<HostHeader> h = ParseHostHeader(host);
      if (!h.has_value()) {
        // Quoted escaped and cut: the value is the client's, and may be anything.
        const std::string_view value(host);
        return Error(400, absl::StrCat("malformed Host header \"",
                                       absl::CHexEscape(Av(value.substr(0, 64))), "\"",
                                       value.size() > 64 ? " (cut at 64 bytes)" : ""));
      }
      if (!hosts.Allows(*h)) {
        return Error(403, absl::StrCat(
                              "Host \"", h->host.substr(0, 253),
                              "\" is not this server's name (DNS rebinding protection); "
                              "add it to http_allowed_hosts to allow it"));
      }
    }
    // Under /debug/ (and /metrics with http_metrics_token), authentication comes next,
    // so that a client without the token learns nothing, not even which paths exist.
    const bool guarded = debug || (metrics_token && path == "/metrics");
    if (guarded && token.has_value()) {
      const char* auth = mg_get_header(conn, "Authorization");
      constexpr std::string_view kBearer = "bearer ";
      const std::string_view header = auth == nullptr ? std::string_view() : auth;
      const bool ok = header.size() > kBearer.size() &&
                      absl::AsciiStrToLower(Av(header.substr(0, kBearer.size()))) ==
                          Av(kBearer) &&
                      ConstantTimeEquals(
                          Sv(absl::StripAsciiWhitespace(Av(header.substr(kBearer.size())))),
                          *token);
      if (!ok) {
        Response r = Error(401, auth == nullptr
                                    ? absl::StrCat(debug ? "/debug/*" : "/metrics",
                                                   " needs \"Authorization: Bearer <token>\"")
                                    : std::string("the bearer token is wrong"));
        r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"devmem\"");
        return r;
      }
    }
    using Endpoint = Response (Impl::*)(const mg_request_info*) const;
    Endpoint endpoint = nullptr;
    if (path == "/metrics") endpoint = &Impl::Metrics;
    else if (path == "/healthz") endpoint = &Impl::Healthz;
    else if (path == "/debug/buffers") endpoint = &Impl::Buffers;
    else if (path == "/debug/snapshot") endpoint = &Impl::Snapshot;
    else if (path == "/debug/trace") endpoint = &Impl::Trace;
    if (endpoint == nullptr) {
      return Error(404, absl::StrCat("no such endpoint: ", Av(path),
                                     " (try /metrics, /healthz, /debug/buffers, "
                                     "/debug/snapshot, /debug/trace)"));
    }
    if (method != "GET") {
      Response r = Error(405, absl::StrCat("method ", Av(method), " not allowed; use GET"));
      r.headers.emplace_back("Allow", "GET");
      return r;
    }
    return (this->*endpoint)(ri);
  }

  Response Metrics(const mg_request_info* ri) const {
    absl::StatusOr<QueryParams> q =
        ParseQuery(QueryOf(ri), {});
    if (!q.ok()) return Error(400, std::string(q.status().message()));
    Response r;
    r.content_type = kPrometheusTextContentType;
    r.body = metrics->Text();
    return r;
  }

  Response Healthz(const mg_request_info*) const {
    Response r;
    r.body = "ok\n";
    return r;
  }

  // "" when `device` has an allocator in `snap`, else the 400's message.
  std::string UnknownDevice(DeviceId device, const RuntimeSnapshot& snap) const {
    std::string have;
    for (const AllocatorSnapshot& d : snap.devices) {
      if (d.device == device) return "";
      absl::StrAppend(&have, have.empty() ? "" : ", ", d.device.ToString());
    }
    const int sim_devices = runtime->config().sim_devices;
    if (device.type == DeviceType::kSim && device.index >= sim_devices) {
      return absl::StrCat("device: ", device.ToString(), " does not exist (sim_devices is ",
                          sim_devices, ": sim:0 .. sim:", sim_devices - 1, ")");
    }
    return absl::StrCat("device: ", device.ToString(), ": no allocator in this process (it has: ",
                        have.empty() ? "none" : have, ")");
  }

  Response Buffers(const mg_request_info* ri) const {
    absl::StatusOr<QueryParams> q =
        ParseQuery(QueryOf(ri), {"device", "site", "min_bytes", "limit"});
    if (!q.ok()) return Error(400, std::string(q.status().message()));
    BufferFilter filter;
    if (auto it = q->find("device"); it != q->end()) {
      absl::StatusOr<DeviceId> d = ParseDeviceId(it->second);
      if (!d.ok()) return Error(400, absl::StrCat("device: ", d.status().message()));
      filter.device = *d;
    }
    if (auto it = q->find("site"); it != q->end()) {
      if (it->second.empty()) return Error(400, "site: empty (give part of a site's text, "
                                                "\"file:line\" or function)");
      filter.site = it->second;
    }
    if (auto it = q->find("min_bytes"); it != q->end()) {
      absl::StatusOr<size_t> n = ParseSize(it->second);
      if (!n.ok()) return Error(400, absl::StrCat("min_bytes: ", n.status().message()));
      filter.min_bytes = *n;
    }
    if (auto it = q->find("limit"); it != q->end()) {
      absl::StatusOr<uint64_t> n = ParseCount("limit", it->second);
      if (!n.ok()) return Error(400, std::string(n.status().message()));
      filter.limit = static_cast<size_t>(*n);
    }
    RuntimeSnapshot snap = runtime->snapshot();
    if (filter.device) {
      // A device this process has no allocator for is a mistake in the query (as for
      // memtrace buffers --device), not an empty answer; the message lists the devices
      // it has, and says when the index is past the configured simulated devices.
      if (std::string why = UnknownDevice(*filter.device, snap); !why.empty()) {
        return Error(400, why);
      }
    }
    Response r;
    r.content_type = "application/json";
    r.body = LiveBuffersToJson(snap, filter);
    r.body.push_back('\n');
    return r;
  }

  Response Snapshot(const mg_request_info* ri) const {
    absl::StatusOr<QueryParams> q =
        ParseQuery(QueryOf(ri), {});
    if (!q.ok()) return Error(400, std::string(q.status().message()));
    Response r;
    r.content_type = "application/json";
    // Taken now (the only allocator locks), written as it is sent: in pieces
    // (WriteSnapshotJson), so that the whole text of a large snapshot (~21 MB at 10^5
    // live buffers) is never held, and the client reads while the rest is written.
    auto snap = std::make_shared<const RuntimeSnapshot>(runtime->snapshot());
    if (std::string_view(ri->http_version) == "1.0") {  // no chunked encoding there
      r.body = SnapshotToJson(*snap);
      r.body.push_back('\n');
      return r;
    }
    r.stream = [snap](const Response::Sink& sink) {
      if (WriteSnapshotJson(*snap, nullptr, kStreamPieceBytes, sink)) sink("\n");
    };
    r.chunked = true;
    return r;
  }

  Response Trace(const mg_request_info* ri) const {
    absl::StatusOr<QueryParams> q =
        ParseQuery(QueryOf(ri), {"since", "limit", "header"});
    if (!q.ok()) return Error(400, std::string(q.status().message()));
    uint64_t since = 0;
    size_t limit = kTraceDefaultLimit;
    if (auto it = q->find("since"); it != q->end()) {
      absl::StatusOr<uint64_t> n = ParseCount("since", it->second);
      if (!n.ok()) return Error(400, std::string(n.status().message()));
      since = *n;
    }
    if (auto it = q->find("limit"); it != q->end()) {
      absl::StatusOr<uint64_t> n = ParseCount("limit", it->second);
      if (!n.ok()) return Error(400, std::string(n.status().message()));
      if (*n > kTraceMaxLimit) {
        return Error(400, absl::StrCat("limit: ", *n, " is above the maximum, ",
                                       kTraceMaxLimit,
                                       "; read more in pages (since=X-Devmem-Next-Since)"));
      }
      limit = static_cast<size_t>(*n);
    }
    // header=1: the page starts with a trace header line naming the sites its events
    // name, so that a reader (memtrace timeline) can draw names, not ids.
    bool header = false;
    if (auto it = q->find("header"); it != q->end()) {
      if (it->second != "0" && it->second != "1") {
        return Error(400, absl::StrCat("header: expected 0 or 1, got \"", Av(it->second.substr(0, 40)), "\""));
      }
      header = it->second == "1";
    }
    const TraceRing* ring = runtime->trace();
    if (ring == nullptr) {
      return Error(404, "tracing is off (trace_entries:0 in the configuration): leave "
                        "trace_entries at its default, or set it, to record events");
    }
    uint64_t missed = 0, next_since = 0;
    auto events = std::make_shared<const std::vector<TraceEvent>>(
        ring->since(since, limit, &missed, &next_since));
    Response r;
    r.content_type = "application/x-ndjson";
    // Two passes over the copied events (the ring may have moved on): one for the
    // length the header needs, one that writes. Serializing twice costs CPU on a debug
    // endpoint; holding the whole body would cost 3x the memory.
    std::string first;  // the trace header line (header=1), sent before the events
    if (header) {
      first = TraceHeaderToJson(*events);
      first.push_back('\n');
    }
    r.stream_bytes = first.size();
    for (const TraceEvent& e : *events) r.stream_bytes += TraceEventToJson(e).size() + 1;
    r.stream = [events, first = std::move(first)](const Response::Sink& sink) {
      std::string piece = first;
      for (const TraceEvent& e : *events) {
        piece += TraceEventToJson(e);
        piece.push_back('\n');
        if (piece.size() >= kStreamPieceBytes) {
          if (!sink(piece)) return;
          piece.clear();
        }
      }
      if (!piece.empty()) sink(piece);
    };
    // Where to continue from: past the last number this page returned or counted
    // missed (TraceRing::since; a `since` past the newest event comes back as the
    // newest, so a client that is ahead resynchronises), whether more events were
    // already there, and how many were overwritten before this read.
    const uint64_t newest = ring->next_seq() - 1;
    r.headers.emplace_back("X-Devmem-Next-Since", std::to_string(next_since));
    r.headers.emplace_back("X-Devmem-More", next_since < newest ? "1" : "0");
    r.headers.emplace_back("X-Devmem-Missed", std::to_string(missed));
    return r;
  }

  // Writes a computed response. Holds no lock: only this worker waits on the client.
  // A stream that throws ends the connection early: the client sees a body cut short
  // of its Content-Length, or without its last chunk, never a complete-looking one.
  static void Write(mg_connection* conn, const Response& r) {
    const bool chunked = r.stream && r.chunked;
    std::string head = absl::StrCat("HTTP/1.1 ", r.status, " ", Reason(r.status),
                                    "\r\nContent-Type: ", r.content_type);
    if (chunked) {
      head += "\r\nTransfer-Encoding: chunked";
    } else {
      absl::StrAppend(&head, "\r\nContent-Length: ", r.stream ? r.stream_bytes : r.body.size());
    }
    head += "\r\nCache-Control: no-store\r\nConnection: close\r\n";
    for (const auto& [name, value] : r.headers) absl::StrAppend(&head, name, ": ", value, "\r\n");
    head += "\r\n";
    if (mg_write(conn, head.data(), head.size()) <= 0) return;  // client gone
    try {
      if (chunked) {
        WriteChunks(conn, r);
      } else if (r.stream) {
        r.stream([conn](std::string_view piece) {
          return mg_write(conn, piece.data(), piece.size()) > 0;
        });
      } else if (!r.body.empty()) {
        mg_write(conn, r.body.data(), r.body.size());
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "devmem: http: response cut short: %s\n", e.what());
    }
  }

  // r.stream's pieces as chunks (RFC 9112 7.1), framed into writes of at least
  // kStreamPieceBytes each: small pieces join the next, and the last write carries the
  // terminating chunk too, so no small write trails the body.
  static void WriteChunks(mg_connection* conn, const Response& r) {
    std::string pending;
    bool ok = true;
    r.stream([&](std::string_view piece) {
      if (piece.empty()) return true;  // an empty chunk would end the body
      if (pending.size() >= kStreamPieceBytes) {
        ok = mg_write(conn, pending.data(), pending.size()) > 0;
        pending.clear();
        if (!ok) return false;
      }
      char size[24];
      const int n = std::snprintf(size, sizeof(size), "%zx\r\n", piece.size());
      pending.append(size, static_cast<size_t>(n)).append(piece).append("\r\n");
      return true;
    });
    if (!ok) return;
    pending += "0\r\n\r\n";
    mg_write(conn, pending.data(), pending.size());
  }

  // Opens and closes one connection to the listener (see ~HttpServer).
  void Poke() const {
    sockaddr_storage storage{};
    socklen_t len = 0;
    if (address.ipv6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
      in6->sin6_family = AF_INET6;
      in6->sin6_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET6, address.numeric.c_str(), &in6->sin6_addr);
      if (IN6_IS_ADDR_UNSPECIFIED(&in6->sin6_addr)) in6->sin6_addr = in6addr_loopback;
      len = sizeof(sockaddr_in6);
    } else {
      auto* in = reinterpret_cast<sockaddr_in*>(&storage);
      in->sin_family = AF_INET;
      in->sin_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET, address.numeric.c_str(), &in->sin_addr);
      if (in->sin_addr.s_addr == htonl(INADDR_ANY)) in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof(sockaddr_in);
    }
    const int fd = socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    (void)connect(fd, reinterpret_cast<const sockaddr*>(&storage), len);
    close(fd);
  }

  // civetweb's own messages (client resets, timeouts) are not the program's business.
  static int Log(const mg_connection*, const char*) { return 1; }
};

namespace {

// Why binding `address` fails, as "Address already in use (EADDRINUSE)"; "" when a bind
// succeeds (civetweb failed for another reason). SO_REUSEADDR as civetweb sets it, so
// that a port in TIME_WAIT is not reported as in use.
std::string BindError(const ListenAddress& address) {
  sockaddr_storage storage{};
  socklen_t len = 0;
  if (address.ipv6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(address.port));
    if (inet_pton(AF_INET6, address.numeric.c_str(), &in6->sin6_addr) != 1) return "";
    len = sizeof(sockaddr_in6);
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&storage);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(address.port));
    if (inet_pton(AF_INET, address.numeric.c_str(), &in->sin_addr) != 1) return "";
    len = sizeof(sockaddr_in);
  }
  const int fd = socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  const int on = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  const int rc = bind(fd, reinterpret_cast<const sockaddr*>(&storage), len);
  const int err = errno;
  close(fd);
  if (rc == 0) return "";
  const char* name = strerrorname_np(err);
  return absl::StrCat(std::strerror(err), " (", name != nullptr ? name : "errno", " ", err, ")");
}

}  // namespace

bool HttpServer::Ipv6Supported() { return mg_check_feature(8) != 0; }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const Config& config,
                                                              Runtime* runtime) {
  if (runtime == nullptr) return absl::InvalidArgumentError("HttpServer: no runtime");
  if (config.http.empty()) {
    return absl::InvalidArgumentError("http: no address configured (http:ADDRESS:PORT)");
  }
  absl::StatusOr<ListenAddress> address = ResolveListenAddress(config.http);
  if (!address.ok()) return address.status();
  if (!address->loopback && config.http_token_file.empty() && !config.http_allow_remote) {
    return absl::InvalidArgumentError(absl::StrCat(
        "http: \"", config.http, "\" is not a loopback address; serving /debug/* to other "
        "hosts needs http_token_file (or http_allow_remote:true to allow it without one)"));
  }
  if (address->ipv6 && !Ipv6Supported()) {
    return absl::UnavailableError(absl::StrCat(
        "http: \"", config.http, "\" is an IPv6 address, and the civetweb this devmem "
        "links was built without IPv6 (USE_IPV6): listen on an IPv4 address instead, "
        "e.g. http:127.0.0.1:", address->port));
  }
  if (absl::Status s = ValidateHttpConfig(config); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->runtime = runtime;
  impl->address = *address;
  impl->metrics_token = config.http_metrics_token;
  {
    absl::StatusOr<std::vector<std::string>> allowed = AllowedHosts(config.http_allowed_hosts);
    if (!allowed.ok()) return allowed.status();
    for (std::string& name : *allowed) {
      if (name == "*") impl->hosts.any = true;
      else impl->hosts.names.push_back(std::move(name));
    }
    // The name `http` was given ("devbox:9400"), and the address it resolved to.
    const std::string host_part = config.http.substr(0, config.http.rfind(':'));
    if (std::optional<HostHeader> h = ParseHostHeader(host_part); h && !h->ip) {
      impl->hosts.names.push_back(h->host);
    }
    const std::string bound = address->ipv6 ? absl::StrCat("[", address->numeric, "]")
                                            : address->numeric;
    if (std::optional<HostHeader> h = ParseHostHeader(bound)) impl->hosts.bound = h->host;
    impl->hosts.wildcard = address->numeric == "0.0.0.0" || address->numeric == "::";
  }
  if (!config.http_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadTokenFile(config.http_token_file);
    if (!token.ok()) return token.status();
    impl->token = std::move(*token);
  }
  impl->metrics = std::make_unique<MetricsCollector>(
      [runtime] { return runtime->allocators(); },
      MetricsOptions{.site_top_k = config.site_top_k, .sizes = &SizeHistogram::Process()});

  static std::once_flag init_once;
  std::call_once(init_once, [] { mg_init_library(0); });
  const std::string ports =
      address->ipv6 ? absl::StrCat("[", address->numeric, "]:", address->port)
                    : absl::StrCat(address->numeric, ":", address->port);
  const char* options[] = {"listening_ports", ports.c_str(),
                           "num_threads", kWorkerThreads,
                           "request_timeout_ms", kRequestTimeoutMs,
                           "enable_keep_alive", "no",
                           nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = &Impl::Log;
  mg_init_data init{};
  init.callbacks = &callbacks;
  init.user_data = impl.get();
  init.configuration_options = options;
  char error_text[256] = {};
  unsigned error_code = 0;
  mg_error_data error{};
  error.code = &error_code;
  error.text = error_text;
  error.text_buffer_size = sizeof(error_text);
  impl->ctx = mg_start2(&init, &error);
  if (impl->ctx == nullptr) {
    // civetweb's text does not say why the socket could not be bound; a bind of our
    // own to the same address does (EADDRINUSE, EACCES, EADDRNOTAVAIL).
    const std::string why = BindError(*address);
    return absl::UnavailableError(absl::StrCat(
        "http: cannot listen on \"", config.http, "\": ",
        why.empty() ? (error_text[0] ? error_text : "civetweb failed to start") : why));
  }
  mg_server_port bound[4] = {};
  const int n = mg_get_server_ports(impl->ctx, 4, bound);
  impl->port = n > 0 ? bound[0].port : address->port;
  mg_set_request_handler(impl->ctx, "**", &Impl::Handle, impl.get());

  auto server = std::unique_ptr<HttpServer>(new HttpServer());
  server->impl_ = std::move(impl);
  if (!server->impl_->address.loopback) {
    std::fprintf(stderr,
                 "devmem: warning: http listens on %s, which other hosts can reach%s\n",
                 server->url().c_str(),
                 server->impl_->token ? "" : " (and /debug/* has no token: http_allow_remote)");
  }
  std::fprintf(stderr, "devmem: serving /metrics and /debug/* on %s\n",
               server->url().c_str());
  return server;
}

HttpServer::~HttpServer() {
  if (impl_ == nullptr || impl_->ctx == nullptr) return;
  // civetweb's listening thread notices the stop flag only when its poll() returns,
  // which without traffic takes up to two seconds: every shutdown (and every test)
  // would wait that long. A helper connects to the listener until mg_stop returns, so
  // the poll wakes at once; connections after the stop are simply refused.
  std::atomic<bool> stopped{false};
  std::thread waker([this, &stopped] {
    while (!stopped.load(std::memory_order_acquire)) {
      impl_->Poke();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  // Joins civetweb's threads; no handler runs after this, so Impl may go.
  mg_stop(impl_->ctx);
  stopped.store(true, std::memory_order_release);
  waker.join();
}

int HttpServer::port() const { return impl_->port; }

std::string HttpServer::url() const {
  return impl_->address.ipv6
             ? absl::StrCat("http://[", impl_->address.numeric, "]:", impl_->port)
             : absl::StrCat("http://", impl_->address.numeric, ":", impl_->port);
}

}  // namespace devmem
