// tests/runtime_http_test.cc: runtime/http_server.h over real loopback HTTP.
//
// Every endpoint, the access rules (token, loopback, methods), bad parameters, and
// scrapes running while two threads allocate and free as fast as they can.
//
// The runtime is process-wide: these tests install a fresh sim allocator with
// Runtime::set_allocator (the HttpServerTest fixture does it for each test) and start
// their own HttpServer with their own Config. The runtime they use is created with a
// trace ring of kRingEntries; ctest runs each test in its own process, so it is always
// theirs. A runtime without that ring (another test of the same process created it
// first: run the binary with --gtest_filter) is a failure of the trace tests, not a
// skip: a skip there could only hide breakage.
#include "runtime/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "runtime/json.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"
#include "tests/metrics_test_util.h"
#include "tests/test_util.h"
#include "tools/http/live_trace.h"
#include "tools/inspect/site_usage.h"
#include "tools/snapshot/snapshot_reader.h"
#include "tools/timeline/timeline.h"

namespace devmem {
namespace {

using testutil::ParsePrometheusText;
using testutil::PromtoolCheck;
using testutil::SampleValue;

struct HttpResponse {
  int status = 0;  // 0: no response (connection failed or closed early)
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{10, 0};  // a hung server fails the test instead of hanging it
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Decodes a chunked body (RFC 9112 7.1) in `body`, strictly: each chunk's hexadecimal
// size, CRLF, its bytes, CRLF, and at the end a zero-size chunk and an empty trailer,
// with nothing after it. False, leaving `body` unspecified, when it is not that.
bool Dechunk(std::string* body) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    const size_t eol = body->find("\r\n", pos);
    if (eol == std::string::npos || eol == pos) return false;
    size_t size = 0;
    for (size_t i = pos; i < eol; ++i) {
      const char c = (*body)[i];
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (digit < 0 || size > (size_t{1} << 40)) return false;
      size = size * 16 + static_cast<size_t>(digit);
    }
    pos = eol + 2;
    if (size == 0) {
      const bool whole = body->compare(pos, std::string::npos, "\r\n") == 0;
      *body = std::move(out);
      return whole;
    }
    if (body->size() < pos + size + 2 || body->compare(pos + size, 2, "\r\n") != 0) return false;
    out.append(*body, pos, size);
    pos += size + 2;
  }
}

// Sends `raw` as is and reads the response until the server closes; a chunked body is
// decoded (strictly: a malformed one fails the test).
HttpResponse RawRequest(int port, const std::string& raw) {
  HttpResponse r;
  const int fd = Connect(port);
  if (fd < 0) return r;
  size_t sent = 0;
  while (sent < raw.size()) {
    const ssize_t n = send(fd, raw.data() + sent, raw.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string data;
  char buf[65536];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t end = data.find("\r\n\r\n");
  // "HTTP/1.1 200 OK" (civetweb's own errors may say HTTP/1.0, or echo the version).
  const size_t space = data.find(' ');
  if (end == std::string::npos || data.compare(0, 5, "HTTP/") != 0 || space > end) return r;
  r.status = std::atoi(data.c_str() + space + 1);
  size_t line = data.find("\r\n") + 2;
  while (line < end) {
    const size_t eol = data.find("\r\n", line);
    const std::string header = data.substr(line, eol - line);
    const size_t colon = header.find(':');
    if (colon != std::string::npos) {
      r.headers[absl::AsciiStrToLower(header.substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(header.substr(colon + 1)));
    }
    line = eol + 2;
  }
  r.body = data.substr(end + 4);
  if (auto te = r.headers.find("transfer-encoding");
      te != r.headers.end() && te->second == "chunked" && !Dechunk(&r.body)) {
    ADD_FAILURE() << "malformed chunked body";
    r.status = 0;
  }
  return r;
}

HttpResponse Get(int port, const std::string& target, const std::string& extra_headers = "",
                 const std::string& method = "GET") {
  return RawRequest(port, method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                              extra_headers + "Connection: close\r\n\r\n");
}

// A GET with the given Host header line ("" sends none, as HTTP/1.0 clients may).
HttpResponse GetWithHost(int port, const std::string& target, const std::string& host) {
  return RawRequest(port, "GET " + target + " HTTP/1.1\r\n" +
                              (host.empty() ? "" : "Host: " + host + "\r\n") +
                              "Connection: close\r\n\r\n");
}

// The runtime these tests share (see the file comment), with a fresh sim:0 allocator.
// Larger than /debug/trace's default limit (10,000), so that paging can be tested.
constexpr size_t kRingEntries = 16384;

Runtime& FreshRuntime() {
  Config config =
      testutil::MakeSimConfig("trace_entries:" + std::to_string(kRingEntries));
  (void)Runtime::Init(config);  // FailedPrecondition: created before; use that one
  Runtime& rt = Runtime::Get();
  Config sim = testutil::MakeSimConfig("sim_capacity:1GiB");
  rt.set_allocator(std::make_shared<CachingAllocator>(MakeSimBackend(sim, 0), sim));
  return rt;
}

// The trace tests need the ring FreshRuntime asks for (see the file comment).
::testing::AssertionResult HasTheTestRing(const Runtime& rt) {
  if (rt.trace() != nullptr && rt.trace()->capacity() == kRingEntries) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "the process's runtime has no trace ring of " << kRingEntries
         << " entries: another test created it first; run this test in its own process "
            "(ctest does, or --gtest_filter)";
}

Config HttpConfig(std::string_view conf = "") {
  Config config = testutil::MakeSimConfig(conf);
  if (config.http.empty()) config.http = "127.0.0.1:0";
  return config;
}

std::unique_ptr<HttpServer> StartOrDie(const Config& config, Runtime& rt) {
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(config, &rt);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

std::string WriteTempFile(const std::string& contents) {
  char path[] = "/tmp/devmem_token_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << contents;
  return path;
}

SiteId TestSite(uint32_t line) {
  return InternNamedSite("tests/runtime_http_test.cc", line, "Test", SiteKind::kAlloc);
}

// Each HttpServerTest's runtime: FreshRuntime's, with its fresh sim:0 allocator (a_);
// Serve() starts the server under test (server_), a fatal test failure when it does
// not start. Members are destroyed in reverse order: the server stops first.
class HttpServerTest : public ::testing::Test {
 protected:
  void Serve(const Config& config) {
    server_ = StartOrDie(config, rt_);
    ASSERT_NE(server_, nullptr);
  }
  void Serve(std::string_view conf = "") { Serve(HttpConfig(conf)); }

  Runtime& rt_ = FreshRuntime();
  const std::shared_ptr<CachingAllocator> a_ = rt_.allocator(DeviceId{DeviceType::kSim, 0});
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, PortZeroPicksARealPortAndHealthzAnswers) {
  ASSERT_NO_FATAL_FAILURE(Serve());
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->url(), "http://127.0.0.1:" + std::to_string(server_->port()));
  HttpResponse r = Get(server_->port(), "/healthz");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "ok\n");
  EXPECT_EQ(r.headers["content-length"], "3");
}

TEST_F(HttpServerTest, MetricsAreServedAndPromtoolClean) {
  ASSERT_NO_FATAL_FAILURE(Serve());
  void* p = a_->allocate(5000, {}, TestSite(__LINE__));
  HttpResponse r = Get(server_->port(), "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(PromtoolCheck(r.body), "");
  const auto samples = ParsePrometheusText(r.body);
  EXPECT_EQ(SampleValue(samples, "devmem_allocations_total",
                        {{"device", "sim:0"}, {"pool", "small"}}),
            1);
  EXPECT_EQ(SampleValue(samples, "devmem_device_info", {{"device", "sim:0"}}), 1);
  EXPECT_NE(testutil::FindSample(samples, "devmem_allocation_size_bytes_count",
                                 {{"device", "sim:0"}}),
            nullptr);
  EXPECT_EQ(Get(server_->port(), "/metrics?x=1").status, 400);
  a_->free(p);
}

// Every config key of the server reaches it: site_top_k bounds the site labels of the
// served /metrics (the collector's own test cannot see the server drop the key).
TEST_F(HttpServerTest, ServedMetricsHonourSiteTopK) {
  std::vector<void*> held;
  for (uint32_t line = 0; line < 5; ++line) {
    held.push_back(a_->allocate(4096 * (line + 1), {}, TestSite(3000 + line)));
  }
  for (const auto& [conf, series] : {std::pair<const char*, size_t>{"site_top_k:2", 3},
                                     std::pair<const char*, size_t>{"site_top_k:4", 5},
                                     std::pair<const char*, size_t>{"", 6}}) {
    SCOPED_TRACE(conf);
    std::unique_ptr<HttpServer> server = StartOrDie(HttpConfig(conf), rt_);
    ASSERT_NE(server, nullptr);
    const auto samples = ParsePrometheusText(Get(server->port(), "/metrics").body);
    // K labelled sites plus "other" (the default, 10, labels all five).
    EXPECT_EQ(testutil::SamplesOf(samples, "devmem_site_live_bytes").size(), series);
  }
  for (void* p : held) a_->free(p);
}

// The runtime's observer forwards alloc events to SizeHistogram::Process(), which the
// served /metrics reads (runtime/size_histogram.h, "Wiring").
TEST_F(HttpServerTest, RuntimeAllocationsReachTheSizeHistogram) {
  ASSERT_NO_FATAL_FAILURE(Serve());
  const std::map<std::string, std::string> sim0 = {{"device", "sim:0"}};
  const double before = SampleValue(ParsePrometheusText(Get(server_->port(), "/metrics").body),
                                    "devmem_allocation_size_bytes_count", sim0);
  a_->free(a_->allocate(5000, {}, TestSite(__LINE__)));
  const double after = SampleValue(ParsePrometheusText(Get(server_->port(), "/metrics").body),
                                   "devmem_allocation_size_bytes_count", sim0);
  EXPECT_EQ(after, before + 1)
      << "the runtime's DeviceObserver::on_event must forward to SizeHistogram::Process()";
}

TEST_F(HttpServerTest, DebugBuffersFiltersAndRejectsBadParameters) {
  ASSERT_NO_FATAL_FAILURE(Serve());
  void* small = a_->allocate(1000, {}, TestSite(1001));
  void* big = a_->allocate(3 * kMiB, {}, TestSite(1002));
  const int port = server_->port();

  HttpResponse r = Get(port, "/debug/buffers");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "application/json");
  nlohmann::json j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["schema"], "devmem.buffers/1");
  EXPECT_EQ(j["buffers"].size(), 2u);

  r = Get(port, "/debug/buffers?device=sim:0&min_bytes=1MiB&limit=10");
  ASSERT_EQ(r.status, 200) << r.body;
  j = nlohmann::json::parse(r.body);
  ASSERT_EQ(j["buffers"].size(), 1u);
  EXPECT_EQ(j["buffers"][0]["size"], 3 * kMiB);
  r = Get(port, "/debug/buffers?limit=1");
  EXPECT_EQ(nlohmann::json::parse(r.body)["buffers"].size(), 1u);
  // A device without an allocator here is a 400 listing the devices there are (as
  // memtrace buffers --device), and one past sim_devices says so.
  r = Get(port, "/debug/buffers?device=sim%3A1");  // encoded ':'
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("sim:1: no allocator in this process (it has: sim:0)"),
            std::string::npos)
      << r.body;
  r = Get(port, "/debug/buffers?device=sim:" + std::to_string(rt_.config().sim_devices));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("does not exist (sim_devices is "), std::string::npos) << r.body;
  EXPECT_EQ(rt_.allocators().size(), 1u) << "a query must not create a device";

  struct Bad {
    const char* query;
    const char* names;
  };
  for (const Bad& bad : {Bad{"device=gpu:0", "device"}, Bad{"min_bytes=lots", "min_bytes"},
                         Bad{"limit=-1", "limit"}, Bad{"limit=ten", "limit"},
                         Bad{"site=", "site"}, Bad{"min_byte=5", "min_byte"},
                         Bad{"limit=1&limit=2", "limit"}, Bad{"device=%zz", ""}}) {
    r = Get(port, std::string("/debug/buffers?") + bad.query);
    EXPECT_EQ(r.status, 400) << bad.query;
    EXPECT_NE(r.body.find(bad.names), std::string::npos) << bad.query << ": " << r.body;
  }
  a_->free(small);
  a_->free(big);
}

// /debug/buffers?site= picks the buffers memtrace buffers --site picks from the same
// snapshot (one rule: allocator/site.h's SiteTextMatches): the site's text (kind and
// tag included), its file:line, its function. The server matched only file:line and
// the tag, so "(clone)" or a function name found nothing live but everything in memtrace.
TEST_F(HttpServerTest, DebugBuffersSiteMatchesWhatMemtraceBuffersSiteMatches) {
  ASSERT_NO_FATAL_FAILURE(Serve());
  void* plain = a_->allocate(4096, {}, TestSite(2001));
  void* copy = a_->allocate(8192, {},
                            InternNamedSite("tests/copies.cc", 77, "MakeTheCopyForSiteQueries",
                                            SiteKind::kClone, "optimizer"));
  const HttpResponse snap_text = Get(server_->port(), "/debug/snapshot");
  ASSERT_EQ(snap_text.status, 200);
  absl::StatusOr<memtrace::Snapshot> snap = memtrace::ParseSnapshot(snap_text.body, "live");
  ASSERT_TRUE(snap.ok()) << snap.status();
  for (const char* needle : {"(clone)", "MakeTheCopyForSiteQueries", "optimizer @ tests/copies",
                             "copies.cc:77", "runtime_http_test.cc:2001", "(alloc)", "Test",
                             "no such site"}) {
    SCOPED_TRACE(needle);
    memtrace::BufferQuery q;
    q.site = needle;
    memtrace::BufferTotals totals;
    const std::vector<memtrace::BufferRef> listed = memtrace::ListBuffers(*snap, q, &totals);
    std::string escaped;
    for (const char* c = needle; *c != '\0'; ++c) {
      escaped += *c == ' ' ? "%20" : *c == '@' ? "%40" : std::string(1, *c);
    }
    const HttpResponse r = Get(server_->port(), "/debug/buffers?site=" + escaped);
    ASSERT_EQ(r.status, 200) << r.body;
    const nlohmann::json j = nlohmann::json::parse(r.body);
    EXPECT_EQ(j["matched"], listed.size());
    ASSERT_EQ(j["buffers"].size(), listed.size());
    for (size_t i = 0; i < listed.size(); ++i) {
      EXPECT_EQ(j["buffers"][i]["addr"], listed[i].block->addr);
      EXPECT_EQ(j["buffers"][i]["where"], snap->Site(listed[i].block->site).where);
    }
  }
  EXPECT_EQ(nlohmann::json::parse(Get(server_->port(), "/debug/buffers?site=(clone)").body)
                ["buffers"][0]["where"],
            "optimizer @ tests/copies.cc:77 (clone)");
  a_->free(plain);
  a_->free(copy);
}

TEST_F(HttpServerTest, DebugSnapshotIsJson) {
  ASSERT_NO_FATAL_FAILURE(Serve());
  HttpResponse r = Get(server_->port(), "/debug/snapshot");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.headers["content-type"], "application/json");
  EXPECT_EQ(nlohmann::json::parse(r.body)["schema"], "devmem.snapshot/1");
  EXPECT_EQ(Get(server_->port(), "/debug/snapshot?all=1").status, 400);
}

// /debug/snapshot is written while it is sent: chunked to an HTTP/1.1 client (no
// Content-Length: the length is not known when the head goes out), whole with its
// Content-Length to an HTTP/1.0 one, which cannot read chunks; the same JSON either way.
TEST_F(HttpServerTest, DebugSnapshotIsChunkedToHttp11AndWholeToHttp10) {
  ASSERT_NO_FATAL_FAILURE(Serve());
  // Enough blocks for a body of many pieces (kSnapshotPieceBytes each).
  std::vector<void*> held;
  for (int i = 0; i < 3000; ++i) {
    held.push_back(a_->allocate(512 * (1 + i % 8), {}, TestSite(__LINE__)));
  }
  HttpResponse chunked = Get(server_->port(), "/debug/snapshot");
  ASSERT_EQ(chunked.status, 200);
  EXPECT_EQ(chunked.headers["transfer-encoding"], "chunked");
  EXPECT_EQ(chunked.headers.count("content-length"), 0u);
  EXPECT_GT(chunked.body.size(), 4 * kSnapshotPieceBytes);
  HttpResponse whole = RawRequest(server_->port(),
                                   "GET /debug/snapshot HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  ASSERT_EQ(whole.status, 200);
  EXPECT_EQ(whole.headers.count("transfer-encoding"), 0u);
  EXPECT_EQ(whole.headers["content-length"], std::to_string(whole.body.size()));
  for (const HttpResponse* r : {&chunked, &whole}) {
    ASSERT_FALSE(r->body.empty());
    EXPECT_EQ(r->body.back(), '\n');
    absl::StatusOr<RuntimeSnapshot> snap = SnapshotFromJson(r->body);
    ASSERT_TRUE(snap.ok()) << snap.status();
    size_t live = 0;
    for (const AllocatorSnapshot& d : snap->devices) {
      for (const SegmentInfo& s : d.segments) {
        for (const BlockInfo& b : s.blocks) live += b.state == BlockState::kAllocated;
      }
    }
    EXPECT_GE(live, held.size());
  }
  for (void* p : held) a_->free(p);
}

TEST_F(HttpServerTest, DebugTraceServesEventsSinceN) {
  ASSERT_TRUE(HasTheTestRing(rt_));
  ASSERT_NO_FATAL_FAILURE(Serve());
  const uint64_t start = rt_.trace()->next_seq() - 1;
  a_->free(a_->allocate(2048, {}, TestSite(__LINE__)));
  HttpResponse r = Get(server_->port(), "/debug/trace?since=" + std::to_string(start));
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<std::string> actions;
  uint64_t last = start;
  for (size_t pos = 0; pos < r.body.size();) {
    const size_t eol = r.body.find('\n', pos);
    const nlohmann::json e = nlohmann::json::parse(r.body.substr(pos, eol - pos));
    actions.push_back(e["action"]);
    EXPECT_GT(e["seq"].get<uint64_t>(), last);
    last = e["seq"];
    pos = eol + 1;
  }
  // segment_alloc, alloc, free (at least; other devices may add their own).
  EXPECT_NE(std::find(actions.begin(), actions.end(), "alloc"), actions.end());
  EXPECT_NE(std::find(actions.begin(), actions.end(), "free"), actions.end());
  EXPECT_EQ(r.headers["x-devmem-next-since"], std::to_string(last));
  // Nothing after the last one.
  r = Get(server_->port(), "/debug/trace?since=" + std::to_string(last));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "");
  EXPECT_EQ(Get(server_->port(), "/debug/trace?since=-3").status, 400);
  EXPECT_EQ(Get(server_->port(), "/debug/trace?since=abc").status, 400);
}

// The seq of every line of a /debug/trace body.
std::vector<uint64_t> TraceSeqs(const std::string& body) {
  std::vector<uint64_t> seqs;
  for (size_t pos = 0; pos < body.size();) {
    size_t eol = body.find('\n', pos);
    if (eol == std::string::npos) eol = body.size();
    seqs.push_back(nlohmann::json::parse(body.substr(pos, eol - pos))["seq"].get<uint64_t>());
    pos = eol + 1;
  }
  return seqs;
}

// A response is bounded without a `limit` (10,000 events), `limit` has a maximum
// (100,000), and X-Devmem-More / X-Devmem-Next-Since page through the rest.
TEST_F(HttpServerTest, DebugTraceIsBoundedAndPages) {
  ASSERT_TRUE(HasTheTestRing(rt_));
  ASSERT_NO_FATAL_FAILURE(Serve());
  const uint64_t start = rt_.trace()->next_seq() - 1;
  for (int i = 0; i < 6500; ++i) a_->free(a_->allocate(4096, {}, TestSite(__LINE__)));
  const uint64_t newest = rt_.trace()->next_seq() - 1;
  ASSERT_GE(newest - start, 13000u);

  HttpResponse r = Get(server_->port(), "/debug/trace?since=" + std::to_string(start));
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<uint64_t> seqs = TraceSeqs(r.body);
  ASSERT_EQ(seqs.size(), 10000u);
  // The page (about 2 MB) is streamed in pieces: its length was announced exactly.
  EXPECT_EQ(r.headers["content-length"], std::to_string(r.body.size()));
  EXPECT_EQ(r.body.back(), '\n');
  EXPECT_EQ(seqs.front(), start + 1);
  EXPECT_EQ(seqs.back(), start + 10000);
  EXPECT_EQ(r.headers["x-devmem-next-since"], std::to_string(start + 10000));
  EXPECT_EQ(r.headers["x-devmem-more"], "1");
  EXPECT_EQ(r.headers["x-devmem-missed"], "0");
  // The next page holds the rest and says there is no more.
  r = Get(server_->port(), "/debug/trace?since=" + r.headers["x-devmem-next-since"]);
  ASSERT_EQ(r.status, 200);
  seqs = TraceSeqs(r.body);
  ASSERT_FALSE(seqs.empty());
  EXPECT_EQ(seqs.front(), start + 10001);
  EXPECT_EQ(seqs.back(), newest);
  EXPECT_EQ(r.headers["x-devmem-more"], "0");

  r = Get(server_->port(), "/debug/trace?since=" + std::to_string(start) + "&limit=3");
  EXPECT_EQ(TraceSeqs(r.body).size(), 3u);
  EXPECT_EQ(Get(server_->port(), "/debug/trace?limit=100000").status, 200);
  r = Get(server_->port(), "/debug/trace?limit=100001");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("maximum, 100000"), std::string::npos) << r.body;
  a_->empty_cache();
}

// When the newest numbers are of lost events, X-Devmem-Next-Since goes past them and
// X-Devmem-More is 0. It used to name the last event, with More 1, so that memtrace's
// reader got the same page again and failed ("X-Devmem-More is 1 but ... did not move").
TEST_F(HttpServerTest, DebugTracePagesPastLostEventsThatAreTheNewest) {
  ASSERT_TRUE(HasTheTestRing(rt_));
  ASSERT_NO_FATAL_FAILURE(Serve());
  const uint64_t start = rt_.trace()->next_seq() - 1;
  a_->free(a_->allocate(4096, {}, TestSite(__LINE__)));
  // This thread's lane, which recorded the two events, loses three after them.
  const_cast<TraceRing*>(rt_.trace())->CountDroppedForTesting(3);
  const uint64_t newest = rt_.trace()->next_seq() - 1;
  HttpResponse r = Get(server_->port(), "/debug/trace?since=" + std::to_string(start));
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<uint64_t> seqs = TraceSeqs(r.body);
  ASSERT_GE(seqs.size(), 2u);  // the pair (and a segment's events if it mapped one)
  EXPECT_EQ(seqs.front(), start + 1);
  EXPECT_EQ(seqs.back() + 3, newest);
  EXPECT_EQ(r.headers["x-devmem-next-since"], std::to_string(newest));
  EXPECT_EQ(r.headers["x-devmem-more"], "0");
  EXPECT_EQ(r.headers["x-devmem-missed"], "3");
  r = Get(server_->port(), "/debug/trace?since=" + r.headers["x-devmem-next-since"]);
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "");
  EXPECT_EQ(r.headers["x-devmem-missed"], "0");
  EXPECT_EQ(r.headers["x-devmem-more"], "0");
  a_->empty_cache();
}

// since = 2^64 - 1 once wrapped to 0 (after + 1) and returned the whole ring.
TEST_F(HttpServerTest, DebugTraceSinceTheLargestSeqReturnsNothing) {
  ASSERT_TRUE(HasTheTestRing(rt_));
  ASSERT_NO_FATAL_FAILURE(Serve());
  a_->free(a_->allocate(2048, {}, TestSite(__LINE__)));
  const uint64_t newest = rt_.trace()->next_seq() - 1;
  for (const std::string& since : {std::string("18446744073709551615"),
                                  std::string("18446744073709551614"),
                                  std::to_string(newest), std::to_string(newest + 1000)}) {
    SCOPED_TRACE(since);
    HttpResponse r = Get(server_->port(), "/debug/trace?since=" + since);
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(r.body, "");
    EXPECT_EQ(r.headers["x-devmem-missed"], "0");
    EXPECT_EQ(r.headers["x-devmem-more"], "0");
    // A client that is ahead is told where the ring is.
    EXPECT_EQ(r.headers["x-devmem-next-since"], std::to_string(newest));
  }
  uint64_t missed = 7;
  EXPECT_TRUE(rt_.trace()->since(UINT64_MAX, SIZE_MAX, &missed).empty());
  EXPECT_EQ(missed, 0u);
  EXPECT_EQ(Get(server_->port(), "/debug/trace?since=18446744073709551616").status, 400);
}

// DNS rebinding: a page on evil.example that resolves its name to 127.0.0.1 sends
// "Host: evil.example"; nothing may answer it. Loopback names and addresses may.
TEST_F(HttpServerTest, HostHeaderMustNameThisServer) {
  ASSERT_NO_FATAL_FAILURE(Serve());
  const int port = server_->port();
  const std::string p = ":" + std::to_string(port);
  for (const char* path : {"/metrics", "/healthz", "/debug/snapshot", "/debug/trace"}) {
    SCOPED_TRACE(path);
    for (const std::string& host :
         {std::string("evil.example"), "evil.example" + p, std::string("127.0.0.1.evil.example"),
          std::string("localhost.evil.example"), std::string("10.1.2.3"),
          std::string("[fe80::1]")}) {
      HttpResponse r = GetWithHost(port, path, host);
      EXPECT_EQ(r.status, 403) << host;
      EXPECT_NE(r.body.find("http_allowed_hosts"), std::string::npos) << host << ": " << r.body;
    }
    for (const std::string& host :
         {"127.0.0.1" + p, std::string("127.0.0.1"), "localhost" + p, std::string("LocalHost."),
          "app.localhost" + p, "[::1]" + p, std::string("127.9.9.9"), std::string("")}) {
      EXPECT_EQ(GetWithHost(port, path, host).status, 200) << "Host: " << host;
    }
  }
  EXPECT_EQ(GetWithHost(port, "/healthz", "a b").status, 400);
  HttpResponse bad = GetWithHost(port, "/healthz", "host:port");
  EXPECT_EQ(bad.status, 400);
  // The refusal names the value it refused.
  EXPECT_NE(bad.body.find("\"host:port\""), std::string::npos) << bad.body;
}

TEST_F(HttpServerTest, HttpAllowedHostsWidensTheHostCheck) {
  ASSERT_NO_FATAL_FAILURE(Serve("http_allowed_hosts:devbox  Devbox.LAN"));
  EXPECT_EQ(GetWithHost(server_->port(), "/healthz", "devbox").status, 200);
  EXPECT_EQ(GetWithHost(server_->port(), "/healthz", "devbox.lan:80").status, 200);
  EXPECT_EQ(GetWithHost(server_->port(), "/healthz", "localhost").status, 200);
  EXPECT_EQ(GetWithHost(server_->port(), "/healthz", "evil.example").status, 403);
  ASSERT_NO_FATAL_FAILURE(Serve("http_allowed_hosts:*"));
  EXPECT_EQ(GetWithHost(server_->port(), "/healthz", "evil.example").status, 200);
  // The name given in `http` is accepted (it is how clients reach the server).
  ASSERT_NO_FATAL_FAILURE(Serve("http:localhost:0"));
  EXPECT_EQ(GetWithHost(server_->port(), "/healthz", "localhost").status, 200);

  Config bad = HttpConfig("http_allowed_hosts:good bad/name");
  absl::StatusOr<std::unique_ptr<HttpServer>> s = HttpServer::Start(bad, &rt_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("\"bad/name\""), std::string::npos) << s.status();
  Config no_http = testutil::MakeSimConfig("http_allowed_hosts:devbox");
  EXPECT_NE(ValidateHttpConfig(no_http).message().find("http_allowed_hosts"),
            std::string::npos);
}

TEST_F(HttpServerTest, HttpMetricsTokenGuardsMetricsToo) {
  const std::string token_file = WriteTempFile("s3cret-token\n");
  Config config = HttpConfig("http_metrics_token:true");
  config.http_token_file = token_file;
  ASSERT_NO_FATAL_FAILURE(Serve(config));
  HttpResponse r = Get(server_->port(), "/metrics");
  EXPECT_EQ(r.status, 401);
  EXPECT_NE(r.body.find("/metrics needs"), std::string::npos) << r.body;
  EXPECT_EQ(Get(server_->port(), "/metrics", "Authorization: Bearer wrong\r\n").status, 401);
  r = Get(server_->port(), "/metrics", "Authorization: Bearer s3cret-token\r\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("devmem_allocated_bytes"), std::string::npos);
  EXPECT_EQ(Get(server_->port(), "/healthz").status, 200);  // liveness stays open
  EXPECT_EQ(Get(server_->port(), "/debug/snapshot").status, 401);
  server_.reset();
  unlink(token_file.c_str());
  // Without a token there is nothing to require.
  absl::Status s = ValidateHttpConfig(HttpConfig("http_metrics_token:true"));
  EXPECT_NE(s.message().find("http_token_file"), std::string::npos) << s;
}

TEST_F(HttpServerTest, UnknownPathsAndMethodsAndMalformedRequestsGet4xx) {
  ASSERT_NO_FATAL_FAILURE(Serve());
  const int port = server_->port();
  HttpResponse r = Get(port, "/nope");
  EXPECT_EQ(r.status, 404);
  EXPECT_NE(r.body.find("/nope"), std::string::npos) << r.body;
  EXPECT_EQ(Get(port, "/debug/").status, 404);
  EXPECT_EQ(Get(port, "/").status, 404);
  r = Get(port, "/metrics", "Content-Length: 0\r\n", "POST");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(r.headers["allow"], "GET");
  EXPECT_EQ(Get(port, "/debug/snapshot", "", "DELETE").status, 405);
  for (const char* raw : {"GARBAGE\r\n\r\n", "GET\r\n\r\n", "GET /metrics HTTP/9.9\r\n\r\n",
                          "GET /metrics HTTP/1.1\r\nNo colon here\r\n\r\n"}) {
    r = RawRequest(port, raw);
    // civetweb answers these itself: 400, or 505 for an HTTP version it does not speak.
    EXPECT_TRUE(r.status == 400 || r.status == 505) << raw << ": " << r.status;
  }
  // Still serving after all that.
  EXPECT_EQ(Get(port, "/healthz").status, 200);
}

TEST_F(HttpServerTest, TokenGuardsDebugEndpointsOnly) {
  const std::string token_file = WriteTempFile("  s3cret-token\n");
  Config config = HttpConfig();
  config.http_token_file = token_file;
  ASSERT_NO_FATAL_FAILURE(Serve(config));
  const int port = server_->port();
  for (const char* path : {"/debug/snapshot", "/debug/buffers", "/debug/trace",
                           "/debug/nope"}) {
    SCOPED_TRACE(path);
    HttpResponse r = Get(port, path);
    EXPECT_EQ(r.status, 401);
    EXPECT_EQ(r.headers["www-authenticate"], "Bearer realm=\"devmem\"");
    EXPECT_EQ(Get(port, path, "Authorization: Bearer wrong\r\n").status, 401);
    EXPECT_EQ(Get(port, path, "Authorization: Bearer s3cret-toke\r\n").status, 401);
    EXPECT_EQ(Get(port, path, "Authorization: Bearer s3cret-token2\r\n").status, 401);
    EXPECT_EQ(Get(port, path, "Authorization: Basic s3cret-token\r\n").status, 401);
    EXPECT_EQ(Get(port, path, "Authorization: s3cret-token\r\n").status, 401);
  }
  EXPECT_EQ(Get(port, "/debug/snapshot", "Authorization: Bearer s3cret-token\r\n").status,
            200);
  EXPECT_EQ(Get(port, "/debug/buffers", "Authorization: bearer s3cret-token\r\n").status,
            200);
  EXPECT_EQ(Get(port, "/debug/nope", "Authorization: Bearer s3cret-token\r\n").status, 404);
  // /metrics and /healthz stay open (Prometheus scrapes without credentials).
  EXPECT_EQ(Get(port, "/metrics").status, 200);
  EXPECT_EQ(Get(port, "/healthz").status, 200);
  server_.reset();
  unlink(token_file.c_str());
}

TEST_F(HttpServerTest, StartRefusesWhatItCannotServeSafely) {
  Config config = HttpConfig();
  config.http_token_file = "/nonexistent/devmem-token";
  absl::StatusOr<std::unique_ptr<HttpServer>> s = HttpServer::Start(config, &rt_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("/nonexistent/devmem-token"), std::string::npos)
      << s.status();

  const std::string empty = WriteTempFile(" \n");
  config.http_token_file = empty;
  s = HttpServer::Start(config, &rt_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(empty), std::string::npos) << s.status();
  unlink(empty.c_str());

  config = HttpConfig("http:0.0.0.0:0");
  s = HttpServer::Start(config, &rt_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("http_allow_remote"), std::string::npos)
      << s.status();
  config.http_allow_remote = true;
  s = HttpServer::Start(config, &rt_);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Get((*s)->port(), "/healthz").status, 200);  // 0.0.0.0 includes loopback
  s->reset();

  // A port in use.
  std::unique_ptr<HttpServer> first = StartOrDie(HttpConfig(), rt_);
  ASSERT_NE(first, nullptr);
  config = HttpConfig("http:127.0.0.1:" + std::to_string(first->port()));
  s = HttpServer::Start(config, &rt_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(config.http), std::string::npos) << s.status();
  EXPECT_NE(s.status().message().find("Address already in use (EADDRINUSE " +
                                      std::to_string(EADDRINUSE) + ")"),
            std::string::npos)
      << s.status();

  // IPv6: served where civetweb has it, else refused with the reason (Debian's civetweb
  // is built without USE_IPV6, and failed with only "cannot bind").
  config = HttpConfig("http:[::1]:0");
  s = HttpServer::Start(config, &rt_);
  if (HttpServer::Ipv6Supported()) {
    EXPECT_TRUE(s.ok()) << s.status();
  } else {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("built without IPv6"), std::string::npos)
        << s.status();
    EXPECT_NE(s.status().message().find("http:127.0.0.1:0"), std::string::npos) << s.status();
  }
}

// Each file that is not a small one-line regular file is refused with the reason,
// promptly: a FIFO must not block start-up, /dev/zero must not be read until memory
// runs out, a directory is not "empty".
TEST(HttpTokenFileTest, RefusesWhatIsNotASmallOneLineRegularFile) {
  char dir_template[] = "/tmp/devmem_tokdir_XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  struct Bad {
    std::string path;
    std::string says;
  };
  const std::string big = WriteTempFile(std::string(kMaxTokenFileBytes + 1, 'a'));
  const std::string nul = WriteTempFile(std::string("abc\0def\n", 8));
  const std::string crlf = WriteTempFile("abc\r\ndef\n");
  for (const Bad& bad : {Bad{fifo, "is a FIFO"}, Bad{"/dev/zero", "is a character device"},
                         Bad{dir, "is a directory"},
                         Bad{big, "larger than " + std::to_string(kMaxTokenFileBytes)},
                         Bad{nul, "control byte 0x00 at offset 3"},
                         Bad{crlf, "control byte 0x0d at offset 3"}}) {
    absl::StatusOr<std::string> token = ReadTokenFile(bad.path);
    ASSERT_FALSE(token.ok()) << bad.path;
    EXPECT_NE(token.status().message().find(bad.path), std::string::npos) << token.status();
    EXPECT_NE(token.status().message().find(bad.says), std::string::npos) << token.status();
  }
  // Exactly at the bound, with edge whitespace: accepted and stripped.
  const std::string ok = WriteTempFile(" " + std::string(kMaxTokenFileBytes - 2, 't') + "\n");
  absl::StatusOr<std::string> token = ReadTokenFile(ok);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, std::string(kMaxTokenFileBytes - 2, 't'));
  for (const std::string& f : {big, nul, crlf, ok, fifo}) unlink(f.c_str());
  rmdir(dir.c_str());
}

TEST(HttpTokenFileTest, WarnsWhenGroupOrOthersCanReadIt) {
  const std::string file = WriteTempFile("s3cret\n");  // mkstemp: 0600
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(ReadTokenFile(file).ok());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ASSERT_EQ(chmod(file.c_str(), 0644), 0);
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(ReadTokenFile(file).ok());
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find(file), std::string::npos) << err;
  EXPECT_NE(err.find("readable by others (mode 0644)"), std::string::npos) << err;
  ASSERT_EQ(chmod(file.c_str(), 0640), 0);
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(ReadTokenFile(file).ok());
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("readable by its group"), std::string::npos) << err;
  unlink(file.c_str());
}

TEST(HttpTokenFileTest, ATokenFileWithoutHttpIsAnError) {
  Config config = testutil::MakeSimConfig("http_token_file:/etc/devmem/token");
  absl::Status s = ValidateHttpConfig(config);
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("http_token_file"), std::string::npos) << s;
  EXPECT_NE(s.message().find("/etc/devmem/token"), std::string::npos) << s;
  EXPECT_NE(s.message().find("http is not"), std::string::npos) << s;
  config.http = "127.0.0.1:0";
  EXPECT_TRUE(ValidateHttpConfig(config).ok());
  EXPECT_TRUE(ValidateHttpConfig(testutil::MakeSimConfig("")).ok());
}

TEST_F(HttpServerTest, AStalledClientDoesNotBlockAllocationOrOtherClients) {
  ASSERT_NO_FATAL_FAILURE(Serve());
  // Half a request, never finished, and a finished one whose response is never read.
  const int stalled = Connect(server_->port());
  ASSERT_GE(stalled, 0);
  ASSERT_GT(send(stalled, "GET /debug/snap", 15, MSG_NOSIGNAL), 0);
  const int unread = Connect(server_->port());
  ASSERT_GE(unread, 0);
  const std::string req = "GET /debug/snapshot HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_GT(send(unread, req.data(), req.size(), MSG_NOSIGNAL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 10000; ++i) a_->free(a_->allocate(4096));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(Get(server_->port(), "/metrics").status, 200);
  close(stalled);
  close(unread);
}

// Slow clients (connected, a partial request, then nothing) each hold a worker until
// the request timeout. A handful of them must not starve scrapes: with 4 workers and
// a 10 s timeout, 8 such clients once left /metrics answering 1 probe in 13.
TEST_F(HttpServerTest, SlowClientsDoNotStarveScrapes) {
  ASSERT_NO_FATAL_FAILURE(Serve());
  constexpr int kSlowClients = 8;
  std::vector<int> slow;
  for (int i = 0; i < kSlowClients; ++i) {
    const int fd = Connect(server_->port());
    ASSERT_GE(fd, 0);
    ASSERT_GT(send(fd, "GET /metrics HTTP/1.1\r\nHo", 25, MSG_NOSIGNAL), 0);
    slow.push_back(fd);
  }
  // The listener hands connections to workers in the order it accepted them, so every
  // probe queues behind the slow clients: it is answered at once only if free workers
  // remain (or after the slow clients time out, which this bound rules out).
  for (int probe = 0; probe < 5; ++probe) {
    const auto t0 = std::chrono::steady_clock::now();
    HttpResponse m = Get(server_->port(), "/metrics");
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(m.status, 200) << "probe " << probe;
    EXPECT_LT(took, std::chrono::milliseconds(1500)) << "probe " << probe;
    EXPECT_NE(testutil::FindSample(ParsePrometheusText(m.body), "devmem_allocated_bytes",
                                   {{"device", "sim:0"}}),
              nullptr);
  }
  for (int fd : slow) close(fd);
}

TEST_F(HttpServerTest, ScrapesRunConcurrentlyWithATwoThreadAllocationStorm) {
  ASSERT_NO_FATAL_FAILURE(Serve());
  // Bounded: 2 s or 100k operations per thread, whichever comes first.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> ops{0};
  std::atomic<int64_t> allocs{0};
  std::atomic<int64_t> frees{0};
  const auto total = [&](const std::vector<testutil::Sample>& samples, const char* name) {
    return SampleValue(samples, name, {{"device", "sim:0"}, {"pool", "small"}}) +
           SampleValue(samples, name, {{"device", "sim:0"}, {"pool", "large"}});
  };
  const std::vector<testutil::Sample> first =
      ParsePrometheusText(Get(server_->port(), "/metrics").body);
  const double allocs_before = total(first, "devmem_allocations_total");
  const double frees_before = total(first, "devmem_frees_total");
  auto storm = [&](uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<void*> held;
    for (int i = 0; i < 100000 && !stop.load(std::memory_order_relaxed); ++i) {
      if (held.size() < 64 && (held.empty() || rng() % 2 == 0)) {
        const size_t sizes[] = {512, 4000, 65536, 1 << 20, 3 << 20};
        held.push_back(a_->allocate(sizes[rng() % 5], {}, TestSite(2000 + rng() % 16)));
        allocs.fetch_add(1, std::memory_order_relaxed);
      } else {
        const size_t k = rng() % held.size();
        a_->free(held[k]);
        frees.fetch_add(1, std::memory_order_relaxed);
        held[k] = held.back();
        held.pop_back();
      }
      ops.fetch_add(1, std::memory_order_relaxed);
      if (std::chrono::steady_clock::now() > deadline) break;
    }
    for (void* p : held) a_->free(p);
    frees.fetch_add(static_cast<int64_t>(held.size()), std::memory_order_relaxed);
  };
  std::thread t1(storm, 1);
  std::thread t2(storm, 2);
  // Two scrapers, so that scrapes also race each other (the collector's own state).
  std::atomic<int> scrapes{0};
  std::atomic<int> busy_scrapes{0};  // scrapes that saw storm buffers live
  auto scrape = [&] {
    double last_allocations = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      HttpResponse m = Get(server_->port(), "/metrics");
      EXPECT_EQ(m.status, 200);
      if (m.status != 200) break;
      const auto samples = ParsePrometheusText(m.body);
      // Each scrape is one consistent reading per allocator (one snapshot): the
      // figures must agree with each other, whatever the storm does meanwhile.
      for (const char* pool : {"small", "large"}) {
        SCOPED_TRACE(pool);
        const std::map<std::string, std::string> lp = {{"device", "sim:0"}, {"pool", pool}};
        const double live = SampleValue(samples, "devmem_live_buffers", lp);
        EXPECT_EQ(live, SampleValue(samples, "devmem_allocations_total", lp) -
                            SampleValue(samples, "devmem_frees_total", lp));
        const double allocated = SampleValue(samples, "devmem_allocated_bytes", lp);
        EXPECT_LE(allocated, SampleValue(samples, "devmem_active_bytes", lp));
        EXPECT_LE(SampleValue(samples, "devmem_active_bytes", lp),
                  SampleValue(samples, "devmem_reserved_bytes", lp));
        EXPECT_EQ(SampleValue(samples, "devmem_cached_bytes", lp),
                  SampleValue(samples, "devmem_reserved_bytes", lp) - allocated);
      }
      if (total(samples, "devmem_live_buffers") > 0) busy_scrapes.fetch_add(1);
      const double allocations = total(samples, "devmem_allocations_total");
      EXPECT_GE(allocations, last_allocations);  // counters never go down
      last_allocations = allocations;
      EXPECT_EQ(Get(server_->port(), "/debug/buffers?limit=5").status, 200);
      EXPECT_EQ(Get(server_->port(), "/debug/snapshot").status, 200);
      scrapes.fetch_add(1, std::memory_order_relaxed);
    }
  };
  std::thread s1(scrape);
  std::thread s2(scrape);
  s1.join();
  s2.join();
  stop = true;
  t1.join();
  t2.join();
  // Scrapes ran while the storm held buffers, and the counters account for exactly
  // the storm's operations.
  EXPECT_GT(busy_scrapes.load(), 0) << scrapes.load() << " scrapes, " << ops.load() << " ops";
  EXPECT_TRUE(a_->validate().ok()) << a_->validate();
  HttpResponse m = Get(server_->port(), "/metrics");
  EXPECT_EQ(PromtoolCheck(m.body), "");
  const std::vector<testutil::Sample> last = ParsePrometheusText(m.body);
  EXPECT_EQ(total(last, "devmem_allocations_total") - allocs_before, allocs.load());
  EXPECT_EQ(total(last, "devmem_frees_total") - frees_before, frees.load());
  EXPECT_EQ(SampleValue(ParsePrometheusText(m.body), "devmem_allocated_bytes",
                        {{"device", "sim:0"}, {"pool", "small"}}),
            0);
}

// memtrace's live path (tools/http/live_trace.h) reads the whole ring, page after page, with
// the sites' names: it used to take one default page (the first 10,000 events) and no
// site table, so a live timeline stopped early and named its sites "site 17".
//
// The ring lives as long as the process: run with the whole binary, it holds the events
// of the tests before this one too, and may have wrapped. The fetch starts at seq 1, so
// what the ring no longer holds comes back as missed (before what it holds, or, for an
// earlier test's thread whose chunk was recycled after it exited, a gap where those
// events were: runtime/trace.cc), and what it holds (this test's 13,000 among them, all
// of them: more than one default page) must come back in order.
TEST_F(HttpServerTest, MemtraceReadsTheWholeTraceInPagesWithSiteNames) {
  ASSERT_TRUE(HasTheTestRing(rt_));
  ASSERT_NO_FATAL_FAILURE(Serve());
  const uint64_t before = rt_.trace()->next_seq() - 1;
  const uint32_t line = __LINE__;
  // One buffer of the site stays live throughout, so that every point of the timeline
  // holds bytes of it whichever events the points' intervals end on.
  void* held_buffer = a_->allocate(4096, {}, TestSite(line));
  for (int i = 0; i < 6500; ++i) a_->free(a_->allocate(4096, {}, TestSite(line)));
  const uint64_t newest = rt_.trace()->next_seq() - 1;
  ASSERT_GT(newest - before, 10000u);
  ASSERT_LE(newest - before, kRingEntries);  // this test's events are all in the ring
  const uint64_t held = std::min<uint64_t>(newest, kRingEntries);

  const std::string base = "http://127.0.0.1:" + std::to_string(server_->port());
  absl::StatusOr<memtrace::LiveTrace> live =
      memtrace::FetchLiveTrace(base, "", /*max_pages=*/100, /*page=*/4000);
  ASSERT_TRUE(live.ok()) << live.status();
  std::vector<uint64_t> seqs;
  size_t headers = 0;
  for (absl::string_view line : absl::StrSplit(live->text, '\n', absl::SkipEmpty())) {
    nlohmann::json j = nlohmann::json::parse(line.begin(), line.end());
    if (j.contains("schema")) {
      ++headers;
    } else {
      seqs.push_back(j["seq"].get<uint64_t>());
    }
  }
  EXPECT_EQ(headers, live->pages);
  EXPECT_EQ(live->pages, (seqs.size() + 3999) / 4000);
  EXPECT_EQ(seqs.size() + live->missed, newest);
  ASSERT_LE(seqs.size(), held);
  ASSERT_FALSE(seqs.empty());
  EXPECT_EQ(seqs.back(), newest);
  for (size_t i = 1; i < seqs.size(); ++i) ASSERT_LT(seqs[i - 1], seqs[i]);
  // This test's own events, the newest, are all held (not so while an exited thread's
  // lane kept its chunk out of the ring: one chunk of them short per such lane).
  ASSERT_GE(seqs.size(), newest - before);
  EXPECT_EQ(seqs[seqs.size() - (newest - before)], before + 1);

  // Every site with bytes is listed (earlier tests' sites may be larger than this one's),
  // and this test's is there by name.
  TimelineOptions options;
  options.top_sites = 1000;
  absl::StatusOr<Timeline> t = BuildTimeline(live->text, base, options);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string name = "tests/runtime_http_test.cc:" + std::to_string(line);
  size_t k = 0;
  while (k < t->site_names.size() && t->site_names[k].find(name) == std::string::npos) ++k;
  ASSERT_LT(k, t->site_names.size()) << name << " not among " << t->site_names.size()
                                     << " site names";
  EXPECT_EQ(t->site_kinds[k], "alloc");
  a_->free(held_buffer);

  // header= takes 0 or 1 only.
  HttpResponse r = Get(server_->port(), "/debug/trace?header=yes");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("header: expected 0 or 1"), std::string::npos) << r.body;
}

}  // namespace
}  // namespace devmem
