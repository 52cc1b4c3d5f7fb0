// tests/trace_replay_test.cc: trace parsing, replay figures, determinism, and the
// minimum-capacity search (tools/replay/trace_replay.h).
#include "tools/replay/trace_replay.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "allocator/config.h"
#include "allocator/types.h"
#include "tests/text_assertions.h"

namespace devmem {
namespace {

std::string Alloc(uint64_t addr, uint64_t size, uint64_t stream = 0) {
  return "{\"action\":\"alloc\",\"addr\":" + std::to_string(addr) +
         ",\"size\":" + std::to_string(size) + ",\"stream\":" + std::to_string(stream) +
         ",\"time_ns\":0}\n";
}
std::string Free(uint64_t addr) {
  return "{\"action\":\"free\",\"addr\":" + std::to_string(addr) + ",\"stream\":0}\n";
}

TEST(TraceParseTest, CountsPeakRequestedAndReusesAddresses) {
  const std::string text = Alloc(1, 1000) + Alloc(2, 2000) + Free(1) + Alloc(1, 500) +
                           "{\"action\":\"segment_alloc\",\"addr\":9,\"size\":4096}\n" +
                           Free(2) + Free(1) + Free(77);
  absl::StatusOr<Trace> t = ParseTrace(text, "t.jsonl");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->lines, 8u);
  EXPECT_EQ(t->allocations, 3u);
  EXPECT_EQ(t->ops.size(), 6u);        // segment_alloc ignored, unmatched free skipped
  EXPECT_EQ(t->unmatched_frees, 1u);
  EXPECT_EQ(t->peak_requested, 3000u);  // 1000 + 2000 live together; then 2500
  EXPECT_EQ(t->streams, 1u);
}

TEST(TraceParseTest, ErrorsNameTheFileTheLineAndWhatWasExpected) {
  struct Case {
    std::string text;
    std::string needle;
  } cases[] = {
      {Alloc(1, 10) + "not json\n", "t.jsonl:2: not JSON"},
      {Alloc(1, 10) + "[1,2]\n", "t.jsonl:2: expected a JSON object"},
      {"{\"action\":\"alloc\",\"size\":5}\n", "t.jsonl:1: missing field \"addr\""},
      {"{\"action\":\"alloc\",\"addr\":5}\n", "t.jsonl:1: alloc without field \"size\""},
      {"{\"addr\":5}\n", "t.jsonl:1: missing field \"action\""},
      {"{\"action\":\"alloc\",\"addr\":5,\"size\":\"big\"}\n",
       "t.jsonl:1: field \"size\": expected an unsigned integer"},
      {"{\"action\":7,\"addr\":5}\n", "field \"action\": expected a string"},
      {"{\"action\":\"free\",\"addr\":-5}\n", "field \"addr\": expected an unsigned integer"},
      {"{\"action\":\"free\",\"addr\":5} trailing\n", "t.jsonl:1: not JSON"},
      {"{\"action\":\"alloc\",\"addr\":5,\"size\":10\n", "t.jsonl:1: not JSON"},
      {Alloc(1, 10) + Alloc(1, 10), "t.jsonl:2: alloc of addr 1, which is already live"},
      {Alloc(1, uint64_t{1} << 60), "absurd"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Trace> t = ParseTrace(c.text, "t.jsonl");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_CONTAINS(std::string(t.status().message()), c.needle);
  }
}

TEST(TraceParseTest, UnknownActionsAreCountedWithTheFirstOneAndItsLine) {
  // The format's other actions are not replayed and not counted; "alocate" (a typo) and
  // "prefetch" (a newer writer) are outside it: counted, the first one named.
  const std::string text = Alloc(1, 100) +
                           "{\"action\":\"segment_alloc\",\"addr\":9,\"size\":4096}\n"
                           "{\"action\":\"alocate\",\"addr\":2,\"size\":50}\n"
                           "{\"action\":\"oom\",\"addr\":0,\"size\":50}\n"
                           "{\"action\":\"prefetch\",\"addr\":1}\n" +
                           Free(1);
  absl::StatusOr<Trace> t = ParseTrace(text, "t.jsonl");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->unknown_actions, 2u);
  EXPECT_EQ(t->first_unknown_action, "alocate");
  EXPECT_EQ(t->first_unknown_line, 3u);
  EXPECT_EQ(t->ops.size(), 2u);
  absl::StatusOr<Trace> clean = ParseTrace(Alloc(1, 100) + Free(1), "t.jsonl");
  ASSERT_TRUE(clean.ok());
  EXPECT_EQ(clean->unknown_actions, 0u);
}

TEST(TraceParseTest, AnAddressIsLiveOnOneDeviceAndTheDevicesAreListed) {
  // Two devices hand out the same address: two allocations, not "already live"; a free
  // frees the one of its own device.
  auto on = [](const char* device, const char* action, uint64_t addr, uint64_t size) {
    return std::string("{\"action\":\"") + action + "\",\"device\":\"" + device +
           "\",\"addr\":" + std::to_string(addr) + ",\"size\":" + std::to_string(size) +
           "}\n";
  };
  const std::string text = on("cuda:0", "alloc", 4096, 1000) + on("cuda:1", "alloc", 4096, 300) +
                           on("cuda:1", "free", 4096, 0) + on("cuda:1", "free", 4096, 0) +
                           on("cuda:0", "free", 4096, 0);
  absl::StatusOr<Trace> t = ParseTrace(text, "t.jsonl");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->allocations, 2u);
  EXPECT_EQ(t->peak_requested, 1300u);
  EXPECT_EQ(t->unmatched_frees, 1u);  // cuda:1's second free; cuda:0's still matches
  EXPECT_EQ(t->devices, (std::vector<std::string>{"cuda:0", "cuda:1"}));
  absl::StatusOr<Trace> twice = ParseTrace(text.substr(0, text.find('\n') + 1) +
                                               text.substr(0, text.find('\n') + 1),
                                           "t.jsonl");
  ASSERT_FALSE(twice.ok());
  EXPECT_CONTAINS(std::string(twice.status().message()),
                  "t.jsonl:2: alloc of addr 4096, which is already live on cuda:0");
  // Events without a device: one unnamed device.
  absl::StatusOr<Trace> plain = ParseTrace(Alloc(1, 10) + Free(1), "t.jsonl");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->devices, (std::vector<std::string>{""}));
}

TEST(TraceParseTest, ReadsDevmemTraceFilesWithTheirHeaderLine) {
  const std::string header =
      "{\"schema\":\"devmem.trace/1\",\"sites\":[{\"id\":1,\"file\":\"a.cc\"}]}\n";
  absl::StatusOr<Trace> t = ParseTrace(header + Alloc(1, 100) + Free(1), "t.jsonl");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->allocations, 1u);
  EXPECT_EQ(t->lines, 2u);  // the header is not an event
  absl::StatusOr<Trace> newer =
      ParseTrace("{\"schema\":\"devmem.trace/2\"}\n" + Alloc(1, 100), "t.jsonl");
  ASSERT_FALSE(newer.ok());
  EXPECT_CONTAINS(std::string(newer.status().message()), "t.jsonl:1: schema \"devmem.trace/2\"");
}

TEST(TraceParseTest, MissingFileIsNamed) {
  absl::StatusOr<Trace> t = ReadTrace("/nonexistent/trace.jsonl");
  ASSERT_FALSE(t.ok());
  EXPECT_CONTAINS(std::string(t.status().message()), "/nonexistent/trace.jsonl");
}

TEST(TraceReplayTest, FiguresFollowThePolicyAndAreDeterministic) {
  // Four 1 MiB requests: small pool, two per 2 MiB segment.
  std::string text;
  for (int i = 1; i <= 4; ++i) text += Alloc(i, kMiB);
  for (int i = 1; i <= 4; ++i) text += Free(i);
  absl::StatusOr<Trace> t = ParseTrace(text, "t");
  ASSERT_TRUE(t.ok()) << t.status();
  const ReplayResult a = Replay(*t, Config{}, kUnboundedCapacity);
  EXPECT_EQ(a.peak_requested_bytes, 4 * kMiB);
  EXPECT_EQ(a.peak_reserved_bytes, 4 * kMiB);
  EXPECT_DOUBLE_EQ(a.reserved_over_requested, 1.0);
  EXPECT_EQ(a.device_allocs, 2);
  EXPECT_EQ(a.ooms, 0);
  EXPECT_EQ(a.ops, 8u);
  const ReplayResult b = Replay(*t, Config{}, kUnboundedCapacity);
  EXPECT_EQ(b.peak_reserved_bytes, a.peak_reserved_bytes);
  EXPECT_EQ(b.device_allocs, a.device_allocs);
}

// The driver time each configuration would cost: the sim's calls at the cost model's
// prices, so regular segments pay cudaMalloc and expandable ones cuMemCreate/Map/...
TEST(TraceReplayTest, ReportsTheEstimatedDriverTimeOfEachConfiguration) {
  std::string text = Alloc(1, 8 * kMiB) + Free(1) + Alloc(2, 8 * kMiB) + Free(2);
  absl::StatusOr<Trace> t = ParseTrace(text, "t");
  ASSERT_TRUE(t.ok()) << t.status();
  const SimDriverCosts c = A100Costs();
  auto cost = [&](DriverCall k) { return static_cast<int64_t>(c.ns[static_cast<int>(k)]); };
  Config regular;
  regular.expandable_segments = ExpandableMode::kOff;
  const ReplayResult r = Replay(*t, regular, kUnboundedCapacity);
  EXPECT_EQ(r.driver.count(DriverCall::kMalloc), 1) << "the segment is cached";
  EXPECT_EQ(r.driver.total_ns(), cost(DriverCall::kMalloc));
  const ReplayResult e = Replay(*t, Config{}, kUnboundedCapacity);  // expandable
  EXPECT_EQ(e.driver.count(DriverCall::kCreate), 4);
  EXPECT_EQ(e.driver.total_ns(), cost(DriverCall::kAddressReserve) +
                                     4 * cost(DriverCall::kCreate) +
                                     4 * cost(DriverCall::kMap) + cost(DriverCall::kSetAccess));
  Config free_calls;
  free_calls.sim_driver_cost = SimDriverCosts{};
  EXPECT_EQ(Replay(*t, free_calls, kUnboundedCapacity).driver.total_ns(), 0);
}

TEST(TraceReplayTest, TooSmallADeviceCountsOomsAndSkipsTheirFrees) {
  std::string text = Alloc(1, 8 * kMiB) + Alloc(2, 8 * kMiB) + Alloc(3, 8 * kMiB) + Free(1) +
                     Free(2) + Free(3);
  absl::StatusOr<Trace> t = ParseTrace(text, "t");
  ASSERT_TRUE(t.ok()) << t.status();
  const ReplayResult r = Replay(*t, Config{}, 20 * kMiB);
  EXPECT_GE(r.ooms, 1);
  EXPECT_LE(r.peak_reserved_bytes, 20 * kMiB);
}

TEST(TraceReplayTest, StreamsKeepTheirOwnSegments) {
  // The same size on two streams cannot share a block: two segments.
  std::string text = Alloc(1, 4096, 0) + Free(1) + Alloc(2, 4096, 7) + Free(2);
  absl::StatusOr<Trace> t = ParseTrace(text, "t");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->streams, 2u);
  EXPECT_EQ(Replay(*t, Config{}, kUnboundedCapacity).device_allocs, 2);
}

TEST(MinCapacityTest, OneLargeAllocationNeedsItsRoundedSegment) {
  absl::StatusOr<Trace> t = ParseTrace(Alloc(1, 20 * kMiB) + Free(1), "t");
  ASSERT_TRUE(t.ok()) << t.status();
  const MinCapacity m = FindMinCapacity(*t, Config{});
  EXPECT_GE(m.bytes, 20 * kMiB);
  EXPECT_LT(m.bytes, 21 * kMiB);
  EXPECT_TRUE(m.monotonic);
  EXPECT_EQ(Replay(*t, Config{}, m.bytes).ooms, 0);
  EXPECT_GT(Replay(*t, Config{}, m.bytes - kMiB).ooms, 0);
}

TEST(MinCapacityTest, TheAnswerFitsAndEverythingBelowThePeakFails) {
  // A fragmentation pattern: 8 x 3 MiB, free every other one, then 4 x 5 MiB.
  std::string text;
  for (int i = 1; i <= 8; ++i) text += Alloc(i, 3 * kMiB);
  for (int i = 1; i <= 8; i += 2) text += Free(i);
  for (int i = 11; i <= 14; ++i) text += Alloc(i, 5 * kMiB);
  for (int i = 2; i <= 8; i += 2) text += Free(i);
  for (int i = 11; i <= 14; ++i) text += Free(i);
  absl::StatusOr<Trace> t = ParseTrace(text, "t");
  ASSERT_TRUE(t.ok()) << t.status();
  const MinCapacity m = FindMinCapacity(*t, Config{});
  EXPECT_EQ(Replay(*t, Config{}, m.bytes).ooms, 0);
  EXPECT_GE(m.bytes, t->peak_requested);
  EXPECT_GT(Replay(*t, Config{}, t->peak_requested - 1).ooms, 0);
  EXPECT_GE(m.over_peak_requested, 1.0);
  EXPECT_GT(m.runs, 2);
}

// The real PyTorch traces, part of the repository (tests/data/traces/real/, gzip): a
// missing file fails here, never skips. The figures are their README's.
TEST(RealTraceTest, ResNet18FiguresMatchTheTraceReadme) {
  const std::filesystem::path path = std::filesystem::path(DEVMEM_SOURCE_DIR) / "tests" /
                                     "data" / "traces" / "real" / "resnet18_train.jsonl.gz";
  absl::StatusOr<Trace> t = ReadTrace(path.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->lines, 29332u);
  EXPECT_EQ(t->unmatched_frees, 0u);
  EXPECT_NEAR(static_cast<double>(t->peak_requested) / kMiB, 353.4, 0.05);
  const ReplayResult a = Replay(*t, Config{}, kUnboundedCapacity);
  const ReplayResult b = Replay(*t, Config{}, kUnboundedCapacity);
  EXPECT_EQ(a.peak_reserved_bytes, b.peak_reserved_bytes);
  EXPECT_EQ(a.device_allocs, b.device_allocs);
  EXPECT_EQ(a.ooms, 0);
  EXPECT_GE(a.peak_reserved_bytes, a.peak_requested_bytes);
}

// gzip traces (tools/replay/trace_file.h): members one after another are read in turn; a
// truncated or corrupt file is an error naming it, not a partial trace.
TEST(TraceFileTest, GzipMembersTruncationAndCorruption) {
  const std::filesystem::path real = std::filesystem::path(DEVMEM_SOURCE_DIR) / "tests" /
                                     "data" / "traces" / "real" / "resnet18_train.jsonl.gz";
  std::string gz;
  {
    std::FILE* f = std::fopen(real.c_str(), "rb");
    ASSERT_NE(f, nullptr) << real;
    char buf[65536];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) gz.append(buf, n);
    std::fclose(f);
  }
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("devmem_trace_file_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& bytes) {
    const std::string path = (dir / name).string();
    std::FILE* f = std::fopen(path.c_str(), "wb");
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    return path;
  };
  absl::StatusOr<Trace> t = ReadTrace(write("twice.jsonl.gz", gz + gz));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->lines, 2u * 29332);
  const std::string truncated = write("cut.jsonl.gz", gz.substr(0, gz.size() / 2));
  t = ReadTrace(truncated);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(truncated + ": truncated gzip data"), std::string::npos)
      << t.status();
  std::string bad = gz;
  for (size_t i = 100; i < 200; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  const std::string corrupt = write("bad.jsonl.gz", bad);
  t = ReadTrace(corrupt);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find(corrupt + ": corrupt gzip data"), std::string::npos)
      << t.status();
  std::filesystem::remove_all(dir);
}

// A file that decompresses far beyond any trace's ratio (a gzip bomb: 96 MiB of one
// byte is about 95 KiB) is refused with a message naming it, before it takes the
// memory it asks for.
TEST(TraceFileTest, GzipBombIsRefused) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("devmem_gzip_bomb_" + std::to_string(::getpid()) + ".jsonl.gz"))
                               .string();
  gzFile g = gzopen(path.c_str(), "wb9");
  ASSERT_NE(g, nullptr);
  const std::string spaces(1 << 20, ' ');
  for (int i = 0; i < 96; ++i) {
    ASSERT_EQ(gzwrite(g, spaces.data(), static_cast<unsigned>(spaces.size())),
              static_cast<int>(spaces.size()));
  }
  ASSERT_EQ(gzclose(g), Z_OK);
  absl::StatusOr<Trace> t = ReadTrace(path);
  std::filesystem::remove(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
  EXPECT_NE(t.status().message().find(path + ": decompresses to more than"),
            std::string::npos)
      << t.status();
  EXPECT_NE(t.status().message().find("gunzip"), std::string::npos) << t.status();
}

TEST(RealTraceTest, MobileNetV2FiguresMatchTheTraceReadme) {
  const std::filesystem::path path = std::filesystem::path(DEVMEM_SOURCE_DIR) / "tests" /
                                     "data" / "traces" / "real" / "mobilenet_v2_train.jsonl.gz";
  absl::StatusOr<Trace> t = ReadTrace(path.string());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->lines, 87780u);
  EXPECT_EQ(t->unmatched_frees, 0u);
  EXPECT_NEAR(static_cast<double>(t->peak_requested) / kMiB, 652.6, 0.05);
}

}  // namespace
}  // namespace devmem
