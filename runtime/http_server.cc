// runtime/http_server.cc: the civetweb listener, its access rules and its endpoints.
//
// Structure: Start() resolves and checks the address and the token (everything that
// can be refused is refused before a socket is opened), starts civetweb with one
// catch-all handler, and reads back the port it bound. Each request is answered in
// two steps: Route() computes the whole response (status, headers, body) while taking
// allocator locks only inside Runtime::snapshot() / allocators() / the metrics
// collector, each for as long as a copy takes; only then is the response written to
// the client. A slow or broken client therefore only ever holds one civetweb worker
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

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/config.h"
#include "allocator/string_view_bridge.h"
#include "allocator/types.h"
#include "runtime/json.h"
#include "runtime/metrics.h"
#include "runtime/runtime.h"
#include "runtime/size_histogram.h"
#include "runtime/trace.h"

namespace devmem {
namespace {

// How long civetweb waits on a client's request or on writing our response.
constexpr const char* kRequestTimeoutMs = "10000";
// Worker threads: scrapes and debug requests are rare; a few suffice, and each is a
// thread the process carries.
constexpr const char* kWorkerThreads = "4";

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
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

// The query string's parameters, decoded. An error names the offending parameter.
absl::StatusOr<absl::flat_hash_map<std::string, std::string>> ParseQuery(
    const char* query, std::initializer_list<std::string_view> allowed) {
  absl::flat_hash_map<std::string, std::string> params;
  if (query == nullptr) return params;
  const std::string_view q(query);
  size_t start = 0;
  while (start <= q.size()) {
    size_t end = q.find('&', start);
    if (end == std::string_view::npos) end = q.size();
    const std::string_view pair = q.substr(start, end - start);
    start = end + 1;
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    const std::string_view raw_key = pair.substr(0, eq);
    const std::string_view raw_value =
        eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1);
    std::string key(raw_key.size() + 1, '\0');
    std::string value(raw_value.size() + 1, '\0');
    const int key_len = mg_url_decode(raw_key.data(), static_cast<int>(raw_key.size()),
                                      key.data(), static_cast<int>(key.size()), 1);
    const int value_len =
        mg_url_decode(raw_value.data(), static_cast<int>(raw_value.size()), value.data(),
                      static_cast<int>(value.size()), 1);
    if (key_len < 0 || value_len < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed query parameter \"", Av(pair), "\""));
    }
    key.resize(static_cast<size_t>(key_len));
    value.resize(static_cast<size_t>(value_len));
    bool known = false;
    for (std::string_view a : allowed) known = known || a == key;
    if (!known) {
      std::string list;
      for (std::string_view a : allowed) {
        absl::StrAppend(&list, list.empty() ? "" : ", ", Av(a));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown parameter \"", key, "\" (this endpoint takes: ",
          list.empty() ? "none" : list, ")"));
    }
    if (!params.emplace(key, std::move(value)).second) {
      return absl::InvalidArgumentError(absl::StrCat("parameter \"", key, "\" given twice"));
    }
  }
  return params;
}

absl::StatusOr<uint64_t> ParseCount(std::string_view name, const std::string& text) {
  uint64_t v = 0;
  if (text.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(text[0])) ||
      !absl::SimpleAtoi(Av(text), &v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Av(name), ": \"", text, "\" is not a non-negative integer"));
  }
  return v;
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
  return absl::OkStatus();
}

namespace {
}  // namespace

struct HttpServer::Impl {
  Runtime* runtime = nullptr;
  std::optional<std::string> token;  // set when http_token_file is
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
    // Under /debug/, authentication comes first, so that a client without the token
    // learns nothing, not even which paths exist.
    if (debug && token.has_value()) {
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
                                    ? "/debug/* needs \"Authorization: Bearer <token>\""
                                    : "the bearer token is wrong");
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
    absl::StatusOr<absl::flat_hash_map<std::string, std::string>> q =
        ParseQuery(ri->query_string, {});
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

  Response Buffers(const mg_request_info* ri) const {
    absl::StatusOr<absl::flat_hash_map<std::string, std::string>> q =
        ParseQuery(ri->query_string, {"device", "site", "min_bytes", "limit"});
    if (!q.ok()) return Error(400, std::string(q.status().message()));
    BufferFilter filter;
    if (auto it = q->find("device"); it != q->end()) {
      absl::StatusOr<DeviceId> d = ParseDeviceId(it->second);
      if (!d.ok()) return Error(400, absl::StrCat("device: ", d.status().message()));
      filter.device = *d;
    }
    if (auto it = q->find("site"); it != q->end()) {
      if (it->second.empty()) return Error(400, "site: empty (give part of a site's "
                                                "\"file:line\" or its tag)");
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
    Response r;
    r.content_type = "application/json";
    r.body = LiveBuffersToJson(runtime->snapshot(), filter);
    r.body.push_back('\n');
    return r;
  }

  Response Snapshot(const mg_request_info* ri) const {
    absl::StatusOr<absl::flat_hash_map<std::string, std::string>> q =
        ParseQuery(ri->query_string, {});
    if (!q.ok()) return Error(400, std::string(q.status().message()));
    Response r;
    r.content_type = "application/json";
    r.body = SnapshotToJson(runtime->snapshot());
    r.body.push_back('\n');
    return r;
  }

  Response Trace(const mg_request_info* ri) const {
    absl::StatusOr<absl::flat_hash_map<std::string, std::string>> q =
        ParseQuery(ri->query_string, {"since", "limit"});
    if (!q.ok()) return Error(400, std::string(q.status().message()));
    uint64_t since = 0;
    size_t limit = SIZE_MAX;
    if (auto it = q->find("since"); it != q->end()) {
      absl::StatusOr<uint64_t> n = ParseCount("since", it->second);
      if (!n.ok()) return Error(400, std::string(n.status().message()));
      since = *n;
    }
    if (auto it = q->find("limit"); it != q->end()) {
      absl::StatusOr<uint64_t> n = ParseCount("limit", it->second);
      if (!n.ok()) return Error(400, std::string(n.status().message()));
      limit = static_cast<size_t>(*n);
    }
    const TraceRing* ring = runtime->trace();
    if (ring == nullptr) {
      return Error(404, "tracing is off: set trace_entries (e.g. DEVMEM_CONF="
                        "\"trace_entries:100000\") to record events");
    }
    uint64_t missed = 0;
    const std::vector<TraceEvent> events = ring->since(since, limit, &missed);
    Response r;
    r.content_type = "application/x-ndjson";
    for (const TraceEvent& e : events) {
      r.body += TraceEventToJson(e);
      r.body.push_back('\n');
    }
    // Where to continue from, and how many events were overwritten before this read.
    r.headers.emplace_back("X-Devmem-Next-Since",
                           std::to_string(events.empty() ? since : events.back().seq));
    r.headers.emplace_back("X-Devmem-Missed", std::to_string(missed));
    return r;
  }

  // Writes a computed response. Holds no lock: only this worker waits on the client.
  static void Write(mg_connection* conn, const Response& r) {
    std::string head = absl::StrCat("HTTP/1.1 ", r.status, " ", Reason(r.status),
                                    "\r\nContent-Type: ", r.content_type,
                                    "\r\nContent-Length: ", r.body.size(),
                                    "\r\nCache-Control: no-store\r\nConnection: close\r\n");
    for (const auto& [name, value] : r.headers) absl::StrAppend(&head, name, ": ", value, "\r\n");
    head += "\r\n";
    if (mg_write(conn, head.data(), head.size()) <= 0) return;  // client gone
    if (!r.body.empty()) mg_write(conn, r.body.data(), r.body.size());
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
  auto impl = std::make_unique<Impl>();
  impl->runtime = runtime;
  impl->address = *address;
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
    return absl::UnavailableError(absl::StrCat("http: cannot listen on \"", config.http,
                                               "\": ", error_text[0] ? error_text : "civetweb failed to start"));
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
