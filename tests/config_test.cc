// tests/config_test.cc: ParseConfig, ApplyConfig, ConfigFromEnv, ToString, ParseSize,
// FormatBytes and ConfigKeys (allocator/config.h): every key with good and bad
// values, the grammar's edge cases, all-or-nothing, and the round trip.
#include "allocator/config.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/types.h"
#include "gtest/gtest.h"
#include "tests/text_assertions.h"

namespace devmem {
namespace {

constexpr size_t kSizeMax = std::numeric_limits<size_t>::max();

// --- good values ---------------------------------------------------------------------

struct GoodCase {
  std::string text;
  std::function<bool(const Config&)> check;
};

TEST(ParseConfigTest, EmptyAndBlankGiveTheBase) {
  Config base;
  base.site_top_k = 7;
  for (std::string_view text : {"", " ", " \t "}) {
    absl::StatusOr<Config> c = ParseConfig(text, base);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(*c, base);
  }
  absl::StatusOr<Config> d = ParseConfig("");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, Config{});
}

TEST(ParseConfigTest, EveryKeyWithGoodValues) {
  const std::vector<GoodCase> cases = {
      {"backend:auto", [](const Config& c) { return c.backend == BackendKind::kAuto; }},
      {"backend:cuda", [](const Config& c) { return c.backend == BackendKind::kCuda; }},
      {"backend:sim", [](const Config& c) { return c.backend == BackendKind::kSim; }},
      {"backend:cpu", [](const Config& c) { return c.backend == BackendKind::kCpu; }},
      {"backend:SIM", [](const Config& c) { return c.backend == BackendKind::kSim; }},
      {"sim_capacity:8GiB", [](const Config& c) { return c.sim_capacity == 8 * kGiB; }},
      {"sim_capacity:1MiB", [](const Config& c) { return c.sim_capacity == kMiB; }},
      {"sim_capacity:1024TiB",
       [](const Config& c) { return c.sim_capacity == (size_t{1} << 50); }},
      {"sim_capacity:1048576", [](const Config& c) { return c.sim_capacity == kMiB; }},
      {"sim_capacity:1.5G",
       [](const Config& c) { return c.sim_capacity == 3 * kGiB / 2; }},
      {"sim_capacity:2 MB", [](const Config& c) { return c.sim_capacity == 2 * kMiB; }},
      {"sim_alloc_latency_us:0",
       [](const Config& c) { return c.sim_alloc_latency_ns == 0; }},
      {"sim_alloc_latency_us:25",
       [](const Config& c) { return c.sim_alloc_latency_ns == 25'000; }},
      {"sim_alloc_latency_us:1000000",
       [](const Config& c) { return c.sim_alloc_latency_ns == 1'000'000'000; }},
      {"sim_free_latency_us:7",
       [](const Config& c) { return c.sim_free_latency_ns == 7'000; }},
      {"sim_free_latency_us:1000000",
       [](const Config& c) { return c.sim_free_latency_ns == 1'000'000'000; }},
      {"sim_fail_nth:3", [](const Config& c) { return c.sim_fail_nth == 3; }},
      {"sim_fail_nth:18446744073709551615",
       [](const Config& c) { return c.sim_fail_nth == UINT64_MAX; }},
      {"sim_fail_probability:0",
       [](const Config& c) { return c.sim_fail_probability == 0; }},
      {"sim_fail_probability:0.25",
       [](const Config& c) { return c.sim_fail_probability == 0.25; }},
      {"sim_fail_probability:1",
       [](const Config& c) { return c.sim_fail_probability == 1; }},
      {"sim_fail_probability:1e-3",
       [](const Config& c) { return c.sim_fail_probability == 1e-3; }},
      {"sim_seed:42", [](const Config& c) { return c.sim_seed == 42; }},
      {"sim_devices:1", [](const Config& c) { return c.sim_devices == 1; }},
      {"sim_devices:1024", [](const Config& c) { return c.sim_devices == 1024; }},
      {"sim_seed:18446744073709551615",
       [](const Config& c) { return c.sim_seed == UINT64_MAX; }},
      {"max_split_size_mb:20",
       [](const Config& c) { return c.max_split_size == 20 * kMiB; }},
      {"max_split_size_mb:256",
       [](const Config& c) { return c.max_split_size == 256 * kMiB; }},
      {"max_split_size_mb:none",
       [](const Config& c) { return c.max_split_size == kSizeMax; }},
      {"max_split_size_mb:inf",
       [](const Config& c) { return c.max_split_size == kSizeMax; }},
      {"max_split_size_mb:None",
       [](const Config& c) { return c.max_split_size == kSizeMax; }},
      {"garbage_collection_threshold:0",
       [](const Config& c) { return c.garbage_collection_threshold == 0; }},
      {"garbage_collection_threshold:0.8",
       [](const Config& c) { return c.garbage_collection_threshold == 0.8; }},
      {"garbage_collection_threshold:0.999999",
       [](const Config& c) { return c.garbage_collection_threshold == 0.999999; }},
      {"expandable_segments:true",
       [](const Config& c) { return c.expandable_segments == ExpandableMode::kOn; }},
      {"expandable_segments:True",
       [](const Config& c) { return c.expandable_segments == ExpandableMode::kOn; }},
      {"expandable_segments:1",
       [](const Config& c) { return c.expandable_segments == ExpandableMode::kOn; }},
      {"expandable_segments:yes",
       [](const Config& c) { return c.expandable_segments == ExpandableMode::kOn; }},
      {"expandable_segments:on",
       [](const Config& c) { return c.expandable_segments == ExpandableMode::kOn; }},
      {"expandable_segments:false",
       [](const Config& c) { return c.expandable_segments == ExpandableMode::kOff; }},
      {"expandable_segments:auto",
       [](const Config& c) { return c.expandable_segments == ExpandableMode::kAuto; }},
      {"expandable_segments: AUTO ",
       [](const Config& c) { return c.expandable_segments == ExpandableMode::kAuto; }},
      {"expandable_recycle_threshold:0",
       [](const Config& c) { return c.expandable_recycle_threshold == 0; }},
      {"expandable_recycle_threshold:0.25",
       [](const Config& c) { return c.expandable_recycle_threshold == 0.25; }},
      {"expandable_recycle_threshold:3",
       [](const Config& c) { return c.expandable_recycle_threshold == 3; }},
      {"expandable_recycle_threshold:none",
       [](const Config& c) { return std::isinf(c.expandable_recycle_threshold); }},
      {"expandable_recycle_threshold:inf",
       [](const Config& c) { return std::isinf(c.expandable_recycle_threshold); }},
      {"expandable_segments:0",
       [](const Config& c) { return c.expandable_segments == ExpandableMode::kOff; }},
      {"expandable_segments:no",
       [](const Config& c) { return c.expandable_segments == ExpandableMode::kOff; }},
      {"expandable_segments:OFF",
       [](const Config& c) { return c.expandable_segments == ExpandableMode::kOff; }},
      {"per_process_memory_fraction:0.5",
       [](const Config& c) { return c.per_process_memory_fraction == 0.5; }},
      {"per_process_memory_fraction:1",
       [](const Config& c) { return c.per_process_memory_fraction == 1; }},
      {"per_process_memory_fraction:0.0001",
       [](const Config& c) { return c.per_process_memory_fraction == 0.0001; }},
      {"thread_cache:false", [](const Config& c) { return !c.thread_cache; }},
      {"thread_cache:on", [](const Config& c) { return c.thread_cache; }},
      {"thread_cache_max_size:512",
       [](const Config& c) { return c.thread_cache_max_size == 512; }},
      {"thread_cache_max_size:1MiB",
       [](const Config& c) { return c.thread_cache_max_size == kMiB; }},
      {"thread_cache_max_size:32K",
       [](const Config& c) { return c.thread_cache_max_size == 32 * kKiB; }},
      {"thread_cache_max_bytes:512",
       [](const Config& c) { return c.thread_cache_max_bytes == 512; }},
      {"thread_cache_max_bytes:1GiB",
       [](const Config& c) { return c.thread_cache_max_bytes == kGiB; }},
      {"thread_cache_max_blocks:1",
       [](const Config& c) { return c.thread_cache_max_blocks == 1; }},
      {"thread_cache_max_blocks:65536",
       [](const Config& c) { return c.thread_cache_max_blocks == 65536; }},
      {"trace_entries:0", [](const Config& c) { return c.trace_entries == 0; }},
      {"trace_entries:100000000",
       [](const Config& c) { return c.trace_entries == 100'000'000; }},
      {"http:127.0.0.1:9400", [](const Config& c) { return c.http == "127.0.0.1:9400"; }},
      {"http:localhost:0", [](const Config& c) { return c.http == "localhost:0"; }},
      {"http:[::1]:0", [](const Config& c) { return c.http == "[::1]:0"; }},
      {"http:[::1]:65535", [](const Config& c) { return c.http == "[::1]:65535"; }},
      {"http:0.0.0.0:8080", [](const Config& c) { return c.http == "0.0.0.0:8080"; }},
      {"http:", [](const Config& c) { return c.http.empty(); }},
      {"http_token_file:/etc/devmem/token",
       [](const Config& c) { return c.http_token_file == "/etc/devmem/token"; }},
      {"http_token_file:", [](const Config& c) { return c.http_token_file.empty(); }},
      {"http_allow_remote:true", [](const Config& c) { return c.http_allow_remote; }},
      {"http_allow_remote:false", [](const Config& c) { return !c.http_allow_remote; }},
      {"http_allowed_hosts:devbox devbox.lan",
       [](const Config& c) { return c.http_allowed_hosts == "devbox devbox.lan"; }},
      {"http_metrics_token:true", [](const Config& c) { return c.http_metrics_token; }},
      {"oom_dump_dir:/tmp/devmem dumps",
       [](const Config& c) { return c.oom_dump_dir == "/tmp/devmem dumps"; }},
      {"oom_dump_dir:\"/tmp/a,b\"",
       [](const Config& c) { return c.oom_dump_dir == "/tmp/a,b"; }},
      {"oom_dump_dir:\" edge \\\" \\\\ \"",
       [](const Config& c) { return c.oom_dump_dir == " edge \" \\ "; }},
      {"site_top_k:1", [](const Config& c) { return c.site_top_k == 1; }},
      {"arena_max_waste:0", [](const Config& c) { return c.arena_max_waste == 0; }},
      {"arena_max_waste:0.25", [](const Config& c) { return c.arena_max_waste == 0.25; }},
      {"arena_max_waste:1e6", [](const Config& c) { return c.arena_max_waste == 1e6; }},
      {"site_top_k:1000", [](const Config& c) { return c.site_top_k == 1000; }},
      {"flight_recorder:/tmp/devmem.flight",
       [](const Config& c) { return c.flight_recorder == "/tmp/devmem.flight"; }},
  };
  for (const GoodCase& gc : cases) {
    absl::StatusOr<Config> c = ParseConfig(gc.text);
    ASSERT_TRUE(c.ok()) << gc.text << ": " << c.status();
    EXPECT_TRUE(gc.check(*c)) << gc.text;
  }
}

TEST(ParseConfigTest, SeveralKeysAndWhitespace) {
  absl::StatusOr<Config> c = ParseConfig(
      "  backend : sim ,sim_capacity:\t4 GiB,  max_split_size_mb: 128 ,"
      "expandable_segments:true,http: [::1]:9400 ");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->backend, BackendKind::kSim);
  EXPECT_EQ(c->sim_capacity, 4 * kGiB);
  EXPECT_EQ(c->max_split_size, 128 * kMiB);
  EXPECT_EQ(c->expandable_segments, ExpandableMode::kOn);
  EXPECT_EQ(c->http, "[::1]:9400");
  // Keys not named keep the base's values.
  EXPECT_EQ(c->site_top_k, Config{}.site_top_k);
}

TEST(ParseConfigTest, KeysNotGivenKeepTheBase) {
  Config base;
  base.backend = BackendKind::kCpu;
  base.oom_dump_dir = "/dumps";
  absl::StatusOr<Config> c = ParseConfig("site_top_k:3", base);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend, BackendKind::kCpu);
  EXPECT_EQ(c->oom_dump_dir, "/dumps");
  EXPECT_EQ(c->site_top_k, 3);
}

// --- bad values ------------------------------------------------------------------------

struct BadCase {
  std::string key;
  std::string value;
  std::string reason;  // a substring of the message
};

TEST(ParseConfigTest, EveryKeyRejectsBadValuesNamingKeyAndValue) {
  const std::vector<BadCase> cases = {
      {"backend", "gpu", "is not a backend"},
      {"backend", "", "is not a backend"},
      {"sim_capacity", "abc", "is not a size"},
      {"sim_capacity", "", "is not a size"},
      {"sim_capacity", "-1GiB", "is negative"},
      {"sim_capacity", "512KiB", "out of range"},
      {"sim_capacity", "1048575", "out of range"},
      {"sim_capacity", "1025TiB", "out of range"},
      {"sim_capacity", "99999999999999999999", "too large"},
      {"sim_capacity", "16777216TiB", "too large"},
      {"sim_capacity", "1.0000001", "whole number of bytes"},
      {"sim_capacity", "8 GiBs", "is not a size"},
      {"sim_capacity", "8XB", "is not a size"},
      {"sim_alloc_latency_us", "abc", "is not an integer"},
      {"sim_alloc_latency_us", "-1", "is negative"},
      {"sim_alloc_latency_us", "1000001", "out of range (0 .. 1000000)"},
      {"sim_alloc_latency_us", "1.5", "is not an integer"},
      {"sim_alloc_latency_us", "10us", "is not an integer"},
      {"sim_alloc_latency_us", "", "is empty"},
      {"sim_alloc_latency_us", "99999999999999999999", "too large"},
      {"sim_free_latency_us", "x", "is not an integer"},
      {"sim_free_latency_us", "-5", "is negative"},
      {"sim_free_latency_us", "2000000", "out of range"},
      {"sim_devices", "0", "out of range"},
      {"sim_devices", "1025", "out of range"},
      {"sim_devices", "-1", "is negative"},
      {"sim_fail_nth", "x", "is not an integer"},
      {"sim_fail_nth", "-3", "is negative"},
      {"sim_fail_nth", "18446744073709551616", "too large"},
      {"sim_fail_nth", "5abc", "is not an integer"},
      {"sim_fail_nth", "+5", "is not an integer"},
      {"sim_fail_nth", "0x10", "is not an integer"},
      {"sim_fail_probability", "1.5", "out of range (0 .. 1)"},
      {"sim_fail_probability", "-0.1", "out of range (0 .. 1)"},
      {"sim_fail_probability", "nan", "not a finite number"},
      {"sim_fail_probability", "inf", "not a finite number"},
      {"sim_fail_probability", "-inf", "not a finite number"},
      {"sim_fail_probability", "0.5x", "is not a number"},
      {"sim_fail_probability", "", "is empty"},
      {"sim_fail_probability", "1e999", "out of range"},
      {"sim_fail_probability", "half", "is not a number"},
      {"sim_seed", "-1", "is negative"},
      {"sim_seed", "abc", "is not an integer"},
      {"sim_seed", "18446744073709551616", "too large"},
      {"max_split_size_mb", "abc", "is not an integer number of MiB"},
      {"max_split_size_mb", "19", "too small"},
      {"max_split_size_mb", "0", "too small"},
      {"max_split_size_mb", "-20", "is negative"},
      {"max_split_size_mb", "20.5", "is not an integer"},
      {"max_split_size_mb", "8796093022208", "too large"},
      {"max_split_size_mb", "99999999999999999999", "too large"},
      {"max_split_size_mb", "", "is empty"},
      {"garbage_collection_threshold", "1", "out of range (0 <= x < 1)"},
      {"garbage_collection_threshold", "-0.5", "out of range"},
      {"garbage_collection_threshold", "nan", "not a finite number"},
      {"garbage_collection_threshold", "x", "is not a number"},
      {"expandable_segments", "maybe", "is not auto or a boolean"},
      {"expandable_segments", "2", "is not auto or a boolean"},
      {"expandable_segments", "", "is not auto or a boolean"},
      {"expandable_recycle_threshold", "-0.1", "out of range (x >= 0, or none)"},
      {"expandable_recycle_threshold", "nan", "not a finite number"},
      {"expandable_recycle_threshold", "lots", "is not a number"},
      {"expandable_recycle_threshold", "", "is empty"},
      {"per_process_memory_fraction", "0", "out of range (0 < x <= 1)"},
      {"per_process_memory_fraction", "1.01", "out of range"},
      {"per_process_memory_fraction", "-1", "out of range"},
      {"per_process_memory_fraction", "inf", "not a finite number"},
      {"per_process_memory_fraction", "NaN", "not a finite number"},
      {"per_process_memory_fraction", "50%", "is not a number"},
      {"thread_cache", "maybe", "is not a boolean"},
      {"thread_cache_max_size", "0", "out of range (512B .. 1MiB)"},
      {"thread_cache_max_size", "511", "out of range (512B .. 1MiB)"},
      {"thread_cache_max_size", "2MiB", "out of range (512B .. 1MiB)"},
      {"thread_cache_max_size", "1000", "not a multiple of 512B"},
      {"thread_cache_max_size", "big", "is not a size"},
      {"thread_cache_max_bytes", "100", "out of range (512B .. 1GiB)"},
      {"thread_cache_max_bytes", "2GiB", "out of range (512B .. 1GiB)"},
      {"thread_cache_max_bytes", "-1", "is negative"},
      {"thread_cache_max_blocks", "0", "out of range (1 .. 65536)"},
      {"thread_cache_max_blocks", "65537", "out of range (1 .. 65536)"},
      {"thread_cache_max_blocks", "1.5", "is not an integer"},
      {"trace_entries", "100000001", "out of range (0 .. 100000000)"},
      {"trace_entries", "-1", "is negative"},
      {"trace_entries", "x", "is not an integer"},
      {"http", "localhost", "is not ADDRESS:PORT"},
      {"http", ":8080", "empty address"},
      {"http", "::1:8080", "without brackets"},
      {"http", "[::1]", "is not ADDRESS:PORT"},
      {"http", "[::1]8080", "is not ADDRESS:PORT"},
      {"http", "[]:80", "empty address"},
      {"http", "[host]:80", "not an IPv6 address"},
      {"http", "host:65536", "port"},
      {"http", "host:abc", "port"},
      {"http", "host:", "port"},
      {"http", "host:-1", "port"},
      {"http", "host:123456", "port"},
      {"http", "[::1]:-1", "port"},
      {"http", "a b:80", "character"},
      {"http", "a/b:80", "character"},
      {"http", "user@host:80", "character"},
      {"http_allow_remote", "nah", "is not a boolean"},
      {"flight_recorder", "/tmp/dir/", "names a directory"},
      {"arena_max_waste", "-0.1", "out of range (0 <= x <= 1e6; 0 = off)"},
      {"arena_max_waste", "2e6", "out of range"},
      {"arena_max_waste", "inf", "not a finite number"},
      {"arena_max_waste", "tenth", "is not a number"},
      {"site_top_k", "0", "out of range (1 .. 1000)"},
      {"site_top_k", "1001", "out of range (1 .. 1000)"},
      {"site_top_k", "-1", "is negative"},
      {"site_top_k", "ten", "is not an integer"},
  };
  for (const BadCase& bc : cases) {
    std::string text = absl::StrCat(bc.key, ":", bc.value);
    absl::StatusOr<Config> c = ParseConfig(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << text;
    std::string message(c.status().message());
    EXPECT_CONTAINS(message, absl::StrCat("key \"", bc.key, "\": value \"",
                                                bc.value, "\" "))
        << text;
    EXPECT_CONTAINS(message, bc.reason) << text;
  }
}

TEST(ParseConfigTest, ErrorForALaterItemStillNamesIt) {
  absl::StatusOr<Config> c = ParseConfig("backend:sim,max_split_size_mb:abc");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "key \"max_split_size_mb\": value \"abc\" is not an integer number of MiB "
            "or \"none\"");
}

TEST(ParseConfigTest, UnknownKeySuggestsTheClosest) {
  absl::StatusOr<Config> c = ParseConfig("backnd:sim");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_STARTS_WITH(c.status().message(), "unknown key \"backnd\"");
  EXPECT_CONTAINS(c.status().message(), "did you mean \"backend\"?");
  EXPECT_CONTAINS(c.status().message(), "known keys: backend, sim_capacity");
  EXPECT_CONTAINS(c.status().message(), "site_top_k");

  c = ParseConfig("expandable_segment:true");
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), "did you mean \"expandable_segments\"?");

  c = ParseConfig("Max_Split_Size_MB:128");  // keys are case-sensitive
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), "did you mean \"max_split_size_mb\"?");

  // Too far for an edit, but a unique prefix.
  c = ParseConfig("max_split:128");
  ASSERT_FALSE(c.ok());
  EXPECT_STARTS_WITH(c.status().message(), "unknown key \"max_split\"");
  EXPECT_CONTAINS(c.status().message(), "did you mean \"max_split_size_mb\"?");

  // Nothing close: no suggestion, but the list.
  c = ParseConfig("zzzzzzzzzz:1");
  ASSERT_FALSE(c.ok());
  EXPECT_NOT_CONTAINS(c.status().message(), "did you mean");
  EXPECT_CONTAINS(c.status().message(), "known keys:");

  // An ambiguous prefix ("sim_" starts six keys) suggests nothing.
  c = ParseConfig("sim_:1");
  ASSERT_FALSE(c.ok());
  EXPECT_NOT_CONTAINS(c.status().message(), "did you mean");
}

TEST(ParseConfigTest, DuplicateKeysAreAnError) {
  absl::StatusOr<Config> c = ParseConfig("backend:sim,site_top_k:3,backend:cpu");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(c.status().message(), "duplicate key \"backend\"");
  EXPECT_CONTAINS(c.status().message(), "positions 1 and 3");
  // Also when the values agree, and across whitespace.
  c = ParseConfig("site_top_k:3, site_top_k :3");
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), "duplicate key \"site_top_k\"");
}

TEST(ParseConfigTest, EmptyItemsAreAnErrorNamingThePosition) {
  struct Case {
    std::string text;
    std::string expected;
  };
  for (const Case& tc : std::vector<Case>{
           {"backend:sim,,site_top_k:3", "empty item at position 2 (character 13)"},
           {"backend:sim,", "empty item at position 2 (character 13)"},
           {",backend:sim", "empty item at position 1 (character 1)"},
           {"backend:sim, ,site_top_k:3", "empty item at position 2"},
           {",", "empty item at position 1"},
       }) {
    absl::StatusOr<Config> c = ParseConfig(tc.text);
    ASSERT_FALSE(c.ok()) << tc.text;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(c.status().message(), tc.expected) << tc.text;
  }
}

TEST(ParseConfigTest, MalformedItems) {
  absl::StatusOr<Config> c = ParseConfig("backend");
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(),
                  "item \"backend\" at position 1 has no ':'");

  c = ParseConfig("backend:sim,expandable_segments");
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(),
                  "item \"expandable_segments\" at position 2 has no ':'");

  c = ParseConfig(":sim");
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), "position 1 (character 1) has an empty key");

  c = ParseConfig("oom_dump_dir:\"/tmp/x");
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), "key \"oom_dump_dir\"");
  EXPECT_CONTAINS(c.status().message(), "no closing quote");

  c = ParseConfig("oom_dump_dir:\"/tmp/x\"y,backend:sim");
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), "text after the closing quote");

  c = ParseConfig("oom_dump_dir:\"a\\nb\"");
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), "backslash");

  // A quoted value is literal; quotes inside a bare value are literal too.
  c = ParseConfig("oom_dump_dir:  \" x \"  ,http_token_file:a\"b");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->oom_dump_dir, " x ");
  EXPECT_EQ(c->http_token_file, "a\"b");

  // Quoted values of typed keys are parsed after unquoting.
  c = ParseConfig("backend:\"sim\",http:\"[::1]:0\"");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->backend, BackendKind::kSim);
  EXPECT_EQ(c->http, "[::1]:0");
}

TEST(ParseConfigTest, MessagesEscapeControlCharacters) {
  absl::StatusOr<Config> c = ParseConfig("backend:s\x01m");
  ASSERT_FALSE(c.ok());
  EXPECT_CONTAINS(c.status().message(), "value \"s\\x01m\"");
}

// A huge bad value is named by its start and its length, not echoed whole: a 10 KB
// value must not make a 10 KB message. Short values are still quoted in full.
TEST(ParseConfigTest, MessagesCutLongValuesAndSayTheirLength) {
  const std::string value = "x" + std::string(10 * 1024 - 1, 'y');
  for (const std::string& text :
       {"backend:" + value, "sim_capacity:" + value, "backend:\"" + value + "\""}) {
    absl::StatusOr<Config> c = ParseConfig(text);
    ASSERT_FALSE(c.ok());
    const std::string message(c.status().message());
    EXPECT_LT(message.size(), 400u) << message;
    EXPECT_CONTAINS(message, "\"xyyy");
    EXPECT_CONTAINS(message, "... (10240 bytes)");
  }
  absl::StatusOr<Config> c = ParseConfig("unknown_" + value + ":1");
  ASSERT_FALSE(c.ok());
  EXPECT_LT(c.status().message().size(), 1000u);
  EXPECT_CONTAINS(c.status().message(), "(10248 bytes)");
}

// --- all-or-nothing --------------------------------------------------------------------

TEST(ApplyConfigTest, AppliesInPlace) {
  Config config;
  ASSERT_TRUE(ApplyConfig("backend:cpu,site_top_k:4", &config).ok());
  EXPECT_EQ(config.backend, BackendKind::kCpu);
  EXPECT_EQ(config.site_top_k, 4);
  ASSERT_TRUE(ApplyConfig("site_top_k:5", &config).ok());
  EXPECT_EQ(config.backend, BackendKind::kCpu);  // kept from before
  EXPECT_EQ(config.site_top_k, 5);
}

TEST(ApplyConfigTest, ErrorLeavesTheConfigUnchanged) {
  Config config;
  config.backend = BackendKind::kSim;
  config.oom_dump_dir = "/before";
  config.garbage_collection_threshold = 0.3;
  const Config before = config;
  // Good items come before the bad one: none of them may be applied.
  for (std::string_view text :
       {"site_top_k:5,oom_dump_dir:/after,backend:bogus",
        "site_top_k:5,oom_dump_dir:/after,site_top_k:6",
        "site_top_k:5,oom_dump_dir:/after,nope:1",
        "site_top_k:5,oom_dump_dir:/after,,",
        "site_top_k:5,oom_dump_dir:\"/after"}) {
    absl::Status s = ApplyConfig(text, &config);
    EXPECT_FALSE(s.ok()) << text;
    EXPECT_EQ(config, before) << text;
  }
}

// --- ToString --------------------------------------------------------------------------

TEST(ToStringTest, DefaultsInCanonicalForm) {
  EXPECT_EQ(ToString(Config{}),
            "backend:auto,sim_capacity:16GiB,sim_alloc_latency_us:0,"
            "sim_free_latency_us:0,sim_fail_nth:0,sim_fail_probability:0,sim_seed:0,"
            "sim_devices:64,sim_driver_cost:a100,max_split_size_mb:none,"
            "garbage_collection_threshold:0,"
            "expandable_segments:auto,expandable_recycle_threshold:0.25,"
            "per_process_memory_fraction:1,thread_cache:true,"
            "thread_cache_max_size:32KiB,thread_cache_max_bytes:4MiB,"
            "thread_cache_max_blocks:256,arena_max_waste:0.1,"
            "trace_entries:131072,stack_sample_bytes:256MiB,"
            "http:,http_token_file:,http_allow_remote:false,http_allowed_hosts:,"
            "http_metrics_token:false,oom_dump_dir:,flight_recorder:,site_top_k:10");
}

TEST(ToStringTest, RoundTripsHandPickedValues) {
  Config c;
  c.backend = BackendKind::kCuda;
  c.sim_capacity = 3 * kGiB / 2;
  c.sim_alloc_latency_ns = 25'000;
  c.sim_free_latency_ns = 1'000'000'000;
  c.sim_fail_nth = UINT64_MAX;
  c.sim_fail_probability = 0.1 + 0.2;  // not 0.3: needs 17 digits
  c.sim_seed = 0x0123456789abcdefULL;
  c.sim_devices = 1024;
  c.max_split_size = 20 * kMiB;
  c.garbage_collection_threshold = std::nextafter(1.0, 0.0);
  c.expandable_segments = ExpandableMode::kOn;
  c.expandable_recycle_threshold = std::numeric_limits<double>::infinity();
  c.per_process_memory_fraction = std::numeric_limits<double>::denorm_min();
  c.trace_entries = 12345;
  c.http = "[::1]:0";
  c.http_token_file = "/path with spaces/,comma\"quote\\backslash";
  c.http_allow_remote = true;
  c.oom_dump_dir = "  leading and trailing  ";
  c.site_top_k = 1000;
  std::string text = ToString(c);
  absl::StatusOr<Config> back = ParseConfig(text);
  ASSERT_TRUE(back.ok()) << text << ": " << back.status();
  EXPECT_EQ(*back, c) << text;
  EXPECT_CONTAINS(text, "sim_capacity:1536MiB");
  EXPECT_CONTAINS(text, "sim_fail_probability:0.30000000000000004");
  EXPECT_CONTAINS(text, "max_split_size_mb:20,");
}

TEST(ToStringTest, RoundTripsRandomValidConfigs) {
  std::mt19937_64 rng(20240601);
  auto uniform = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  auto real = [&]() { return std::uniform_real_distribution<double>(0, 1)(rng); };
  const std::string alphabet = "ab/ ,\"\\:\t-_.é";
  auto random_string = [&]() {
    std::string s;
    size_t n = uniform(0, 12);
    for (size_t i = 0; i < n; ++i) s.push_back(alphabet[uniform(0, alphabet.size() - 1)]);
    return s;
  };
  const std::vector<std::string> addresses = {"", "127.0.0.1:0", "[::1]:9400",
                                              "localhost:65535", "[fe80::1%eth0]:80"};
  for (int i = 0; i < 2000; ++i) {
    Config c;
    c.backend = static_cast<BackendKind>(uniform(0, 3));
    c.sim_capacity = uniform(kMiB, size_t{1} << 50);
    if (i % 2) c.sim_capacity &= ~(kMiB - 1);  // unit forms too
    c.sim_alloc_latency_ns = uniform(0, 1'000'000) * 1000;
    c.sim_free_latency_ns = uniform(0, 1'000'000) * 1000;
    c.sim_fail_nth = rng();
    c.sim_fail_probability = i % 5 == 0 ? 1.0 : real();
    c.sim_seed = rng();
    c.sim_devices = static_cast<int>(uniform(1, 1024));
    c.max_split_size =
        i % 3 == 0 ? kSizeMax
                   : uniform(20, uint64_t{std::numeric_limits<int64_t>::max()} / kMiB) *
                         kMiB;
    c.garbage_collection_threshold = real();
    c.expandable_segments = static_cast<ExpandableMode>(uniform(0, 2));
    c.expandable_recycle_threshold =
        i % 4 == 0 ? std::numeric_limits<double>::infinity() : 4 * real();
    c.per_process_memory_fraction = 1.0 - real();  // (0, 1]
    c.thread_cache = uniform(0, 1);
    c.thread_cache_max_size = uniform(1, 2048) * 512;
    c.thread_cache_max_bytes = uniform(512, kGiB);
    c.thread_cache_max_blocks = uniform(1, 65536);
    c.arena_max_waste = i % 3 == 0 ? 0 : 10 * real();
    c.trace_entries = uniform(0, 100'000'000);
    c.http = addresses[uniform(0, addresses.size() - 1)];
    c.http_token_file = random_string();
    c.http_allow_remote = uniform(0, 1);
    c.oom_dump_dir = random_string();
    c.site_top_k = static_cast<int>(uniform(1, 1000));
    std::string text = ToString(c);
    absl::StatusOr<Config> back = ParseConfig(text);
    ASSERT_TRUE(back.ok()) << text << ": " << back.status();
    ASSERT_EQ(*back, c) << text;
    ASSERT_EQ(ToString(*back), text);
  }
}

// --- ConfigFromEnv ---------------------------------------------------------------------

class ConfigFromEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("DEVMEM_CONF")) saved_ = v;
  }
  void TearDown() override {
    if (saved_) {
      setenv("DEVMEM_CONF", saved_->c_str(), 1);
    } else {
      unsetenv("DEVMEM_CONF");
    }
  }
  std::optional<std::string> saved_;
};

TEST_F(ConfigFromEnvTest, UnsetAndEmptyGiveDefaults) {
  unsetenv("DEVMEM_CONF");
  absl::StatusOr<Config> c = ConfigFromEnv();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, Config{});
  setenv("DEVMEM_CONF", "", 1);
  c = ConfigFromEnv();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, Config{});
}

TEST_F(ConfigFromEnvTest, ReadsTheVariable) {
  setenv("DEVMEM_CONF", "backend:sim,sim_capacity:8GiB,max_split_size_mb:256", 1);
  absl::StatusOr<Config> c = ConfigFromEnv();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->backend, BackendKind::kSim);
  EXPECT_EQ(c->sim_capacity, 8 * kGiB);
  EXPECT_EQ(c->max_split_size, 256 * kMiB);
}

TEST_F(ConfigFromEnvTest, ErrorsArePrefixed) {
  setenv("DEVMEM_CONF", "backend:sim,max_split_size_mb:abc", 1);
  absl::StatusOr<Config> c = ConfigFromEnv();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            "DEVMEM_CONF: key \"max_split_size_mb\": value \"abc\" is not an integer "
            "number of MiB or \"none\"");
  setenv("DEVMEM_CONF", "max_split:128", 1);
  c = ConfigFromEnv();
  ASSERT_FALSE(c.ok());
  EXPECT_STARTS_WITH(c.status().message(), "DEVMEM_CONF: unknown key \"max_split\"");
}

// --- ParseSize and FormatBytes ------------------------------------------------------------

TEST(ParseSizeTest, GoodSizes) {
  struct Case {
    std::string text;
    size_t bytes;
  };
  for (const Case& tc : std::vector<Case>{
           {"0", 0},
           {"512", 512},
           {"512B", 512},
           {"512 b", 512},
           {"4k", 4 * kKiB},
           {"4K", 4 * kKiB},
           {"4KB", 4 * kKiB},
           {"4KiB", 4 * kKiB},
           {"2MiB", 2 * kMiB},
           {"2 MiB", 2 * kMiB},
           {"2mb", 2 * kMiB},
           {"8G", 8 * kGiB},
           {"8gb", 8 * kGiB},
           {"8GiB", 8 * kGiB},
           {"1T", size_t{1} << 40},
           {"3TB", size_t{3} << 40},
           {"1TiB", size_t{1} << 40},
           {"1.5GiB", 3 * kGiB / 2},
           {".5KiB", 512},
           {"1.KiB", kKiB},
           {"0.25 MiB", kMiB / 4},
           {"  16 GiB  ", 16 * kGiB},
           {"18446744073709551615", std::numeric_limits<size_t>::max()},
           {"16777215TiB", (size_t{16777215}) << 40},
       }) {
    absl::StatusOr<size_t> s = ParseSize(tc.text);
    ASSERT_TRUE(s.ok()) << tc.text << ": " << s.status();
    EXPECT_EQ(*s, tc.bytes) << tc.text;
  }
}

TEST(ParseSizeTest, BadSizesNameTheText) {
  struct Case {
    std::string text;
    std::string reason;
  };
  for (const Case& tc : std::vector<Case>{
           {"", "is not a size"},
           {"abc", "is not a size"},
           {"MiB", "is not a size"},
           {".", "is not a size"},
           {"-1", "is negative"},
           {"1.2.3", "is not a size"},
           {"5XB", "is not a size"},
           {"5 PiB", "is not a size"},
           {"1e3", "is not a size"},
           {"0x10", "is not a size"},
           {"0.3KiB", "whole number of bytes"},
           {"1.5", "whole number of bytes"},
           {"18446744073709551616", "too large"},
           {"16777216TiB", "too large"},
           {"1.0000000000000000001GiB", "too many decimal places"},
       }) {
    absl::StatusOr<size_t> s = ParseSize(tc.text);
    ASSERT_FALSE(s.ok()) << tc.text;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(s.status().message(), absl::StrCat("size \"", tc.text, "\""));
    EXPECT_CONTAINS(s.status().message(), tc.reason) << tc.text;
  }
}

TEST(FormatBytesTest, Examples) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(10 * kKiB), "10.0 KiB");
  EXPECT_EQ(FormatBytes(20 * kMiB), "20.0 MiB");
  EXPECT_EQ(FormatBytes(512 * kMiB), "512.0 MiB");
  EXPECT_EQ(FormatBytes(kMiB - 1), "1.00 MiB");  // 1023.999 KiB carries
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.50 GiB");
  EXPECT_EQ(FormatBytes(2 * kGiB), "2.00 GiB");
  EXPECT_EQ(FormatBytes(size_t{1} << 40), "1.00 TiB");
  EXPECT_EQ(FormatBytes(size_t{1} << 50), "1.00 PiB");
  EXPECT_EQ(FormatBytes(std::numeric_limits<size_t>::max()), "16.0 EiB");
}

TEST(FormatBytesTest, ReadsBackApproximately) {
  // FormatBytes is for people, but what it prints must parse and be within 0.5%.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) {
    size_t bytes = rng() >> (rng() % 60);
    std::string text = FormatBytes(bytes);
    std::string number = text.substr(0, text.find(' '));
    std::string unit = text.substr(text.find(' ') + 1);
    if (unit == "PiB" || unit == "EiB") continue;  // beyond ParseSize's units
    double value = std::stod(number);
    absl::StatusOr<size_t> unit_bytes = ParseSize(absl::StrCat("1", unit));
    ASSERT_TRUE(unit_bytes.ok()) << text;
    double back = value * static_cast<double>(*unit_bytes);
    EXPECT_NEAR(back, static_cast<double>(bytes), 0.005 * static_cast<double>(bytes) + 1)
        << text;
  }
}

// --- ConfigKeys and docs -----------------------------------------------------------------

// The items of a canonical form whose strings hold no commas.
std::vector<std::string> Items(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    items.push_back(text.substr(start, comma - start));
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

TEST(ConfigKeysTest, DocumentsEveryKeyInToStringOrder) {
  std::vector<std::string> printed;
  for (const std::string& item : Items(ToString(Config{}))) {
    printed.push_back(item.substr(0, item.find(':')));
  }
  const std::vector<ConfigKeyDoc>& docs = ConfigKeys();
  ASSERT_EQ(docs.size(), printed.size());
  for (size_t i = 0; i < docs.size(); ++i) {
    EXPECT_EQ(docs[i].key, printed[i]);
    EXPECT_FALSE(docs[i].type.empty()) << docs[i].key;
    EXPECT_FALSE(docs[i].meaning.empty()) << docs[i].key;
  }
}

// The value of `key` in the canonical form of `c`.
std::string CanonicalValue(const Config& c, std::string_view key) {
  for (const std::string& item : Items(ToString(c))) {
    if (item.substr(0, item.find(':')) == key) return item.substr(item.find(':') + 1);
  }
  return "<missing>";
}

TEST(ConfigKeysTest, DocumentedDefaultsAreTheDefaults) {
  // Start from a config where every field differs from its default, so that a key
  // whose parse does nothing is caught.
  Config base;
  base.backend = BackendKind::kCpu;
  base.sim_capacity = kGiB;
  base.sim_alloc_latency_ns = 1000;
  base.sim_free_latency_ns = 1000;
  base.sim_fail_nth = 1;
  base.sim_fail_probability = 0.5;
  base.sim_seed = 1;
  base.sim_devices = 2;
  base.sim_driver_cost = SimDriverCosts{};
  base.max_split_size = 64 * kMiB;
  base.garbage_collection_threshold = 0.5;
  base.expandable_segments = ExpandableMode::kOn;
  base.expandable_recycle_threshold = 0.5;
  base.per_process_memory_fraction = 0.5;
  base.thread_cache = false;
  base.thread_cache_max_size = 512;
  base.thread_cache_max_bytes = 512;
  base.thread_cache_max_blocks = 1;
  base.arena_max_waste = 0;
  base.trace_entries = 1;
  base.stack_sample_bytes = 1;
  base.http = "localhost:1";
  base.http_token_file = "x";
  base.http_allow_remote = true;
  base.http_allowed_hosts = "x";
  base.http_metrics_token = true;
  base.oom_dump_dir = "x";
  base.flight_recorder = "x";
  base.site_top_k = 1;
  for (const ConfigKeyDoc& doc : ConfigKeys()) {
    ASSERT_NE(CanonicalValue(base, doc.key), CanonicalValue(Config{}, doc.key)) << doc.key;
    EXPECT_EQ(CanonicalValue(Config{}, doc.key), doc.default_value) << doc.key;
    absl::StatusOr<Config> c =
        ParseConfig(std::string(doc.key) + ":" + std::string(doc.default_value), base);
    ASSERT_TRUE(c.ok()) << doc.key << ": " << c.status();
    EXPECT_EQ(CanonicalValue(*c, doc.key), doc.default_value) << doc.key;
  }
}

TEST(ConfigKeysTest, DocsConfigurationMdNamesEveryKeyAndDefault) {
  // __FILE__ is repository-relative (-ffile-prefix-map), so the build names the source
  // directory. The docs ship with the sources: a missing file is a failure, not a skip.
  const std::filesystem::path doc =
      std::filesystem::path(DEVMEM_SOURCE_DIR) / "docs" / "configuration.md";
  std::ifstream in(doc);
  ASSERT_TRUE(in) << "cannot read " << doc;
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  for (const ConfigKeyDoc& d : ConfigKeys()) {
    // Each key has a table row: | `key` | type | `default` | ... ("(empty)" for "").
    std::string default_cell = d.default_value.empty()
                                   ? std::string("(empty)")
                                   : "`" + std::string(d.default_value) + "`";
    std::string row_start = "| `" + std::string(d.key) + "` | " + std::string(d.type) +
                            " | " + default_cell + " |";
    EXPECT_CONTAINS(text, row_start) << d.key;
  }
}

TEST(BackendKindNameTest, Names) {
  EXPECT_EQ(BackendKindName(BackendKind::kAuto), "auto");
  EXPECT_EQ(BackendKindName(BackendKind::kCuda), "cuda");
  EXPECT_EQ(BackendKindName(BackendKind::kSim), "sim");
  EXPECT_EQ(BackendKindName(BackendKind::kCpu), "cpu");
}

}  // namespace
}  // namespace devmem
