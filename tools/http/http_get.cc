// tools/http/http_get.cc: a blocking HTTP/1.1 GET over POSIX sockets (why not a library:
// tools/http/http_get.h). Every wait is a poll() bounded by the silence timeout and by what
// is left of the overall deadline, so neither a stuck nor a trickling server can hang
// memtrace.
#include "tools/http/http_get.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

namespace devmem::memtrace {
namespace {

constexpr uint64_t kMaxBody = uint64_t{4} << 30;

struct Url {
  std::string host, port, target;
};

absl::StatusOr<Url> ParseUrl(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  if (url.compare(0, kScheme.size(), kScheme) != 0) {
    return absl::InvalidArgumentError(url + ": expected a URL starting with http://");
  }
  const std::string rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  Url u;
  u.target = slash == std::string::npos ? "/" : rest.substr(slash);
  if (authority.empty()) return absl::InvalidArgumentError(url + ": no host");
  if (authority[0] == '[') {  // [::1]:8080
    const size_t close = authority.find(']');
    if (close == std::string::npos) return absl::InvalidArgumentError(url + ": bad IPv6 host");
    u.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size() && authority[close + 1] == ':') {
      u.port = authority.substr(close + 2);
    }
  } else {
    const size_t colon = authority.rfind(':');
    u.host = authority.substr(0, colon);
    if (colon != std::string::npos) u.port = authority.substr(colon + 1);
  }
  if (u.port.empty()) u.port = "80";
  if (u.port.find_first_not_of("0123456789") != std::string::npos || u.port.size() > 5) {
    return absl::InvalidArgumentError(url + ": bad port \"" + u.port + "\"");
  }
  return u;
}

using Clock = std::chrono::steady_clock;

// The two limits of one exchange: silence (per wait) and the overall deadline.
struct Limits {
  int timeout_s;
  Clock::time_point deadline;
  int deadline_s;
};

enum class Wait { kReady, kSilent, kDeadline };

// Waits for `events` on fd, at most the silence timeout and at most until the deadline.
Wait WaitFor(int fd, short events, const Limits& l) {
  pollfd p{fd, events, 0};
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(l.deadline -
                                                                            Clock::now());
    if (left.count() <= 0) return Wait::kDeadline;
    const bool deadline_first = left.count() < int64_t{l.timeout_s} * 1000;
    const int ms = static_cast<int>(deadline_first ? left.count() : int64_t{l.timeout_s} * 1000);
    const int rc = ::poll(&p, 1, ms);
    if (rc > 0) return Wait::kReady;
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) return Wait::kSilent;
    return deadline_first ? Wait::kDeadline : Wait::kSilent;
  }
}

std::string DeadlineMessage(const std::string& url, const Limits& l, size_t received) {
  return "GET " + url + ": no complete answer within " + std::to_string(l.deadline_s) +
         " s (" + std::to_string(received) + " bytes received)";
}

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

absl::StatusOr<std::string> Exchange(const std::string& url, const Url& u,
                                     const std::string& request, const Limits& limits) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(u.host.c_str(), u.port.c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError("GET " + url + ": cannot resolve " + u.host + ": " +
                                  gai_strerror(rc));
  }
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    int s = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (s < 0) continue;
    int rc = ::connect(s, a->ai_addr, a->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
      if (WaitFor(s, POLLOUT, limits) != Wait::kReady) {
        last_error = "connection timed out";
        ::close(s);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
      errno = err;
    }
    if (rc < 0) {
      last_error = std::strerror(errno);
      ::close(s);
      continue;
    }
    fd = s;
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    return absl::UnavailableError("GET " + url + ": cannot connect to " + u.host + ":" + u.port +
                                  ": " + last_error);
  }
  Socket sock(fd);
  size_t sent = 0;
  while (sent < request.size()) {
    if (WaitFor(fd, POLLOUT, limits) != Wait::kReady) {
      return absl::UnavailableError("GET " + url + ": timed out sending the request");
    }
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) {
      return absl::UnavailableError("GET " + url + ": send: " + std::strerror(errno));
    }
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[1 << 16];
  for (;;) {
    switch (WaitFor(fd, POLLIN, limits)) {
      case Wait::kReady:
        break;
      case Wait::kSilent:
        return absl::UnavailableError("GET " + url + ": no answer for " +
                                      std::to_string(limits.timeout_s) + " s");
      case Wait::kDeadline:
        return absl::UnavailableError(DeadlineMessage(url, limits, raw.size()));
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) {
      return absl::UnavailableError("GET " + url + ": recv: " + std::strerror(errno));
    }
    if (n == 0) break;
    // Growth by 8, not the doubling append does: a large answer (a 21 MB snapshot) is
    // then copied about 1/8 of its size in all and faults in ~1.4x its pages, not ~2.5x
    // (page faults were most of the client's CPU time: devmem-bench-snapshot). The
    // capacity never written costs address space only.
    if (raw.capacity() - raw.size() < static_cast<size_t>(n)) {
      raw.reserve(std::max<size_t>(raw.capacity() * 8, size_t{1} << 20));
    }
    raw.append(buf, static_cast<size_t>(n));
    if (raw.size() > kMaxBody) {
      return absl::UnavailableError("GET " + url + ": answer larger than 4 GiB");
    }
  }
  return raw;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// De-chunks b[from, size) into b[0, ...) in place (RFC 9112 7.1; the output is never
// longer than the input, so it is written over what was already read): the head before
// `from` is dropped in the same pass, rather than by a move of the whole body first.
// False if malformed.
bool DechunkInPlace(std::string* body, size_t from) {
  std::string& b = *body;
  size_t pos = from, out = 0;
  for (;;) {
    const size_t eol = b.find("\r\n", pos);
    if (eol == std::string::npos) return false;
    // Hex digits, then optional chunk extensions after ';'.
    size_t digits_end = pos;
    uint64_t size = 0;
    while (digits_end < eol && std::isxdigit(static_cast<unsigned char>(b[digits_end]))) {
      if (size > (kMaxBody >> 4)) return false;
      const char c = b[digits_end];
      size = size * 16 + static_cast<uint64_t>(std::isdigit(static_cast<unsigned char>(c))
                                                  ? c - '0'
                                                  : std::tolower(static_cast<unsigned char>(c)) - 'a' + 10);
      ++digits_end;
    }
    if (digits_end == pos || (digits_end < eol && b[digits_end] != ';' && b[digits_end] != ' ' &&
                              b[digits_end] != '\t')) {
      return false;
    }
    pos = eol + 2;
    if (size == 0) {
      b.resize(out);
      return true;
    }
    if (size > b.size() - pos || b.size() - pos - size < 2 || b.compare(pos + size, 2, "\r\n") != 0) {
      return false;
    }
    std::memmove(b.data() + out, b.data() + pos, size);
    out += size;
    pos += size + 2;
  }
}

}  // namespace

absl::StatusOr<HttpResponse> ParseHttpResponse(std::string raw) {
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) {
    return absl::UnavailableError("malformed answer (no end of headers)");
  }
  const std::string_view head(raw.data(), head_end);
  size_t line_end = head.find("\r\n");
  const std::string_view status_line = head.substr(0, line_end);
  HttpResponse r;
  // "HTTP/1.1 200 OK": a version, a space, three digits, then a space and the reason.
  if (status_line.size() < 12 || status_line.compare(0, 5, "HTTP/") != 0 ||
      status_line.find(' ') == std::string_view::npos) {
    return absl::UnavailableError("malformed status line \"" +
                                  std::string(status_line.substr(0, 80)) + "\"");
  }
  const size_t code_at = status_line.find(' ') + 1;
  // Three digits, the first 1-9 ("001" is no status: found by fuzz_http_response).
  if (status_line.size() < code_at + 3 || status_line[code_at] < '1' ||
      !std::isdigit(static_cast<unsigned char>(status_line[code_at])) ||
      !std::isdigit(static_cast<unsigned char>(status_line[code_at + 1])) ||
      !std::isdigit(static_cast<unsigned char>(status_line[code_at + 2])) ||
      (status_line.size() > code_at + 3 && status_line[code_at + 3] != ' ')) {
    return absl::UnavailableError("malformed status line \"" +
                                  std::string(status_line.substr(0, 80)) + "\"");
  }
  r.status = (status_line[code_at] - '0') * 100 + (status_line[code_at + 1] - '0') * 10 +
             (status_line[code_at + 2] - '0');
  if (status_line.size() > code_at + 4) r.reason = std::string(status_line.substr(code_at + 4));
  bool chunked = false;
  int64_t content_length = -1;
  while (line_end != std::string_view::npos) {
    const size_t start = line_end + 2;
    line_end = head.find("\r\n", start);
    const std::string_view line = head.substr(start, line_end == std::string_view::npos
                                                         ? std::string_view::npos
                                                         : line_end - start);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string name = Lower(std::string(line.substr(0, colon)));
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    r.headers.emplace_back(name, std::string(value));
    if (name == "transfer-encoding" && Lower(std::string(value)).find("chunked") != std::string::npos) {
      chunked = true;
    } else if (name == "content-length") {
      // Digits only: atoll took "-5" and "12abc".
      uint64_t n = 0;
      if (value.empty() || value.size() > 12 ||
          value.find_first_not_of("0123456789") != std::string_view::npos) {
        return absl::UnavailableError("malformed Content-Length \"" +
                                      std::string(value.substr(0, 40)) + "\"");
      }
      for (char c : value) n = n * 10 + static_cast<uint64_t>(c - '0');
      if (content_length >= 0 && static_cast<uint64_t>(content_length) != n) {
        return absl::UnavailableError("two different Content-Length headers");
      }
      content_length = static_cast<int64_t>(n);
    }
  }
  if (chunked) {  // the body, in place
    if (!DechunkInPlace(&raw, head_end + 4)) {
      return absl::UnavailableError("malformed chunked body");
    }
  } else if (raw.erase(0, head_end + 4); content_length >= 0) {
    if (static_cast<uint64_t>(content_length) > raw.size()) {
      return absl::UnavailableError("connection closed after " + std::to_string(raw.size()) +
                                    " of " + std::to_string(content_length) + " body bytes");
    }
    raw.resize(static_cast<size_t>(content_length));
  }
  r.body = std::move(raw);
  return r;
}

absl::StatusOr<HttpResponse> HttpGet(const std::string& url, const std::string& token,
                                     int timeout_s, int deadline_s) {
  absl::StatusOr<Url> u = ParseUrl(url);
  if (!u.ok()) return absl::InvalidArgumentError("GET " + std::string(u.status().message()));
  std::string request = "GET " + u->target + " HTTP/1.1\r\nHost: " + u->host + ":" + u->port +
                        "\r\nUser-Agent: memtrace\r\nAccept: */*\r\nConnection: close\r\n";
  if (!token.empty()) request += "Authorization: Bearer " + token + "\r\n";
  request += "\r\n";
  const Limits limits{std::max(timeout_s, 1), Clock::now() + std::chrono::seconds(deadline_s),
                      deadline_s};
  absl::StatusOr<std::string> raw = Exchange(url, *u, request, limits);
  if (!raw.ok()) return raw.status();
  absl::StatusOr<HttpResponse> r = ParseHttpResponse(*std::move(raw));
  if (!r.ok()) return absl::UnavailableError("GET " + url + ": " + std::string(r.status().message()));
  return r;
}

absl::StatusOr<std::string> HttpGetOk(const std::string& url, const std::string& token,
                                      int timeout_s, int deadline_s) {
  absl::StatusOr<HttpResponse> r = HttpGetOkResponse(url, token, timeout_s, deadline_s);
  if (!r.ok()) return r.status();
  return std::move(r->body);
}

absl::StatusOr<HttpResponse> HttpGetOkResponse(const std::string& url, const std::string& token,
                                               int timeout_s, int deadline_s) {
  absl::StatusOr<HttpResponse> r = HttpGet(url, token, timeout_s, deadline_s);
  if (!r.ok()) return r.status();
  if (r->status < 200 || r->status > 299) {
    std::string first = r->body.substr(0, r->body.find('\n'));
    if (first.size() > 200) first.resize(200);
    std::string msg = "GET " + url + ": HTTP " + std::to_string(r->status) + " " + r->reason;
    if (!first.empty()) msg += ": " + first;
    if (r->status == 401 && token.empty()) msg += " (pass the token with --token-file)";
    return absl::UnavailableError(msg);
  }
  return r;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError("--token-file " + path + ": " + std::strerror(errno));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::string token = ss.str();
  const size_t b = token.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) {
    return absl::InvalidArgumentError("--token-file " + path + ": empty");
  }
  token = token.substr(b, token.find_last_not_of(" \t\r\n") - b + 1);
  return token;
}

}  // namespace devmem::memtrace
