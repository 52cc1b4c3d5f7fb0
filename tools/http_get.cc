// tools/http_get.cc: a blocking HTTP/1.1 GET over POSIX sockets (why not a library:
// tools/http_get.h). Every wait is a poll() with a timeout, so a stuck server cannot
// hang memtrace.
#include "tools/http_get.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
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

// Waits for `events` on fd; false on timeout.
bool WaitFor(int fd, short events, int timeout_s) {
  pollfd p{fd, events, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, timeout_s * 1000);
  } while (rc < 0 && errno == EINTR);
  return rc > 0;
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
                                     const std::string& request, int timeout_s) {
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
      if (!WaitFor(s, POLLOUT, timeout_s)) {
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
    if (!WaitFor(fd, POLLOUT, timeout_s)) {
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
    if (!WaitFor(fd, POLLIN, timeout_s)) {
      return absl::UnavailableError("GET " + url + ": no answer for " +
                                    std::to_string(timeout_s) + " s");
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) {
      return absl::UnavailableError("GET " + url + ": recv: " + std::strerror(errno));
    }
    if (n == 0) break;
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

// De-chunks `body` (RFC 9112 7.1); false if malformed.
bool Dechunk(const std::string& body, std::string* out) {
  size_t pos = 0;
  for (;;) {
    const size_t eol = body.find("\r\n", pos);
    if (eol == std::string::npos) return false;
    const std::string size_text = body.substr(pos, eol - pos);
    char* end = nullptr;
    errno = 0;
    const unsigned long long size = std::strtoull(size_text.c_str(), &end, 16);
    if (end == size_text.c_str() || errno != 0) return false;
    pos = eol + 2;
    if (size == 0) return true;
    if (size > body.size() - pos) return false;
    out->append(body, pos, size);
    pos += size + 2;
    if (pos > body.size()) return false;
  }
}

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(const std::string& url, const std::string& token,
                                     int timeout_s) {
  absl::StatusOr<Url> u = ParseUrl(url);
  if (!u.ok()) return absl::InvalidArgumentError("GET " + std::string(u.status().message()));
  std::string request = "GET " + u->target + " HTTP/1.1\r\nHost: " + u->host + ":" + u->port +
                        "\r\nUser-Agent: memtrace\r\nAccept: */*\r\nConnection: close\r\n";
  if (!token.empty()) request += "Authorization: Bearer " + token + "\r\n";
  request += "\r\n";
  absl::StatusOr<std::string> raw = Exchange(url, *u, request, timeout_s);
  if (!raw.ok()) return raw.status();
  const size_t head_end = raw->find("\r\n\r\n");
  if (head_end == std::string::npos) {
    return absl::UnavailableError("GET " + url + ": malformed answer (no end of headers)");
  }
  std::istringstream head(raw->substr(0, head_end));
  std::string status_line;
  std::getline(head, status_line);
  if (!status_line.empty() && status_line.back() == '\r') status_line.pop_back();
  HttpResponse r;
  // "HTTP/1.1 200 OK"
  if (status_line.compare(0, 5, "HTTP/") != 0 || status_line.size() < 12) {
    return absl::UnavailableError("GET " + url + ": malformed status line \"" +
                                  status_line.substr(0, 80) + "\"");
  }
  r.status = std::atoi(status_line.c_str() + status_line.find(' ') + 1);
  const size_t reason_at = status_line.find(' ', status_line.find(' ') + 1);
  if (reason_at != std::string::npos) r.reason = status_line.substr(reason_at + 1);
  bool chunked = false;
  long long content_length = -1;
  std::string line;
  while (std::getline(head, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = Lower(line.substr(0, colon));
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    if (name == "transfer-encoding" && Lower(value).find("chunked") != std::string::npos) {
      chunked = true;
    } else if (name == "content-length") {
      content_length = std::atoll(value.c_str());
    }
  }
  std::string body = raw->substr(head_end + 4);
  if (chunked) {
    if (!Dechunk(body, &r.body)) {
      return absl::UnavailableError("GET " + url + ": malformed chunked body");
    }
  } else if (content_length >= 0) {
    if (static_cast<unsigned long long>(content_length) > body.size()) {
      return absl::UnavailableError("GET " + url + ": connection closed after " +
                                    std::to_string(body.size()) + " of " +
                                    std::to_string(content_length) + " body bytes");
    }
    body.resize(static_cast<size_t>(content_length));
    r.body = std::move(body);
  } else {
    r.body = std::move(body);
  }
  return r;
}

absl::StatusOr<std::string> HttpGetOk(const std::string& url, const std::string& token,
                                      int timeout_s) {
  absl::StatusOr<HttpResponse> r = HttpGet(url, token, timeout_s);
  if (!r.ok()) return r.status();
  if (r->status < 200 || r->status > 299) {
    std::string first = r->body.substr(0, r->body.find('\n'));
    if (first.size() > 200) first.resize(200);
    std::string msg = "GET " + url + ": HTTP " + std::to_string(r->status) + " " + r->reason;
    if (!first.empty()) msg += ": " + first;
    if (r->status == 401 && token.empty()) msg += " (pass the token with --token-file)";
    return absl::UnavailableError(msg);
  }
  return std::move(r->body);
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
