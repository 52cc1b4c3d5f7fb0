// tests/runtime_http_request_test.cc: the request parsers of runtime/http_request.h
// (query strings, counts, Host headers) on their own; runtime_http_test.cc sees them
// through the server, tools/fuzz/fuzz_http_query.cc fuzzes them.
#include "runtime/http_request.h"

#include <gtest/gtest.h>

#include <string>

namespace devmem {
namespace {

TEST(ParseQueryTest, DecodesAndNamesWhatItRefuses) {
  absl::StatusOr<QueryParams> q =
      ParseQuery("site=tensor%2Fops.cc+x&&limit=5&device", {"site", "limit", "device"});
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->at("site"), "tensor/ops.cc x");
  EXPECT_EQ(q->at("limit"), "5");
  EXPECT_EQ(q->at("device"), "");
  EXPECT_TRUE(ParseQuery("", {}).ok());
  EXPECT_TRUE(ParseQuery("&&", {}).ok());

  struct Bad {
    const char* query;
    const char* says;
  };
  for (const Bad& bad : {Bad{"a=%zz", "malformed query parameter \"a=%zz\""},
                         Bad{"a=%4", "malformed"}, Bad{"a=%", "malformed"},
                         Bad{"b=1", "unknown parameter \"b\" (this endpoint takes: a)"},
                         Bad{"a=1&a=1", "parameter \"a\" given twice"}}) {
    absl::StatusOr<QueryParams> r = ParseQuery(bad.query, {"a"});
    ASSERT_FALSE(r.ok()) << bad.query;
    EXPECT_NE(r.status().message().find(bad.says), std::string::npos) << r.status();
  }
  // Client text is quoted boundedly and with control bytes escaped.
  const std::string huge = "k" + std::string(10000, 'x') + "\n=1";
  absl::StatusOr<QueryParams> r = ParseQuery(huge, {});
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 200u) << r.status();
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
}

TEST(ParseCountTest, DecimalDigitsThatFit) {
  EXPECT_EQ(*ParseCount("limit", "0"), 0u);
  EXPECT_EQ(*ParseCount("limit", "007"), 7u);
  EXPECT_EQ(*ParseCount("since", "18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", "18446744073709551616", "-1", "+1", " 1", "1 ", "0x10", "1e3"}) {
    absl::StatusOr<uint64_t> n = ParseCount("since", bad);
    ASSERT_FALSE(n.ok()) << bad;
    EXPECT_EQ(n.status().message().rfind("since: ", 0), 0u) << n.status();
  }
}

TEST(ParseHostHeaderTest, NamesAndLiteralsInOneSpelling) {
  std::optional<HostHeader> h = ParseHostHeader("Example.COM.:80");
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->host, "example.com");
  EXPECT_FALSE(h->ip);
  h = ParseHostHeader("[::0001]:9400");
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->host, "::1");
  EXPECT_TRUE(h->ip && h->ipv6);
  h = ParseHostHeader("127.0.0.1");
  ASSERT_TRUE(h.has_value());
  EXPECT_TRUE(h->ip && !h->ipv6);
  // Found by fuzz_http_query: "-27.." lost one dot per parse, so its canonical form
  // did not parse to itself. Empty labels are no name.
  for (const char* bad : {"", ":80", "a b", "a/b", "host:", "host:port", "host:123456",
                          "[::1", "[::1]x", "[nope]", "a..b", ".a", "-27..", "a:1:2"}) {
    EXPECT_FALSE(ParseHostHeader(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace devmem
