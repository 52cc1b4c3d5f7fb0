// tests/trace_import_test.cc: the RMM and Umpire importers (tools/import/trace_import.h): their
// output is a devmem trace that ParseTrace reads and Replay runs, and malformed input is
// refused with the file, the line and what was expected.
#include "tools/import/trace_import.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "tools/replay/trace_replay.h"

namespace devmem {
namespace {

using ::testing::HasSubstr;

// A tiny RMM log: three allocations on two streams, one freed twice over (the second
// free is of a pointer no longer live), a failure, and a free of a pointer allocated
// before the log started.
constexpr char kRmm[] =
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "140202091583232,10:34:42.498346,allocate,0x7f8b6e000000,1048576,0x0\n"
    "140202091583232,10:34:42.498400,allocate,0x7f8b6e100000,2097152,0x5604\n"
    "140202091583232,10:34:42.498500,free,0x7f8b6e000000,1048576,0x0\n"
    "140202091583232,10:34:42.498600,allocate failure,0x0,1099511627776,0x0\n"
    "140202091583232,10:34:42:498700,allocate,0x7f8b6e000000,4096,0x0\n"
    "140202091583232,10:34:42.498800,free,0x7f8b6e100000,2097152,0x5604\n"
    "140202091583232,10:34:42.498900,free,0x7f8b6e000000,4096,0x0\n"
    "140202091583232,10:34:42.499000,free,0x7f8b60000000,512,0x0\n";

TEST(TraceImportTest, RmmCsvReplays) {
  std::string out;
  absl::StatusOr<ImportStats> s = ImportRmmCsv(kRmm, "rmm.csv", &out);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->allocs, 3u);
  EXPECT_EQ(s->frees, 3u);
  EXPECT_EQ(s->ooms, 1u);
  EXPECT_EQ(s->unmatched_frees, 1u);
  EXPECT_THAT(out, HasSubstr("\"schema\":\"devmem.trace/1\""));
  // Times are relative to the first line; the free carries the allocation's size.
  EXPECT_THAT(out, HasSubstr("\"seq\":2,\"time_ns\":54000,\"action\":\"alloc\""));
  EXPECT_THAT(out, HasSubstr("\"action\":\"free\",\"device\":\"cuda:0\",\"stream\":0,"
                             "\"addr\":140236822675456,\"size\":1048576"));
  absl::StatusOr<Trace> trace = ParseTrace(out, "imported");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->allocations, 3u);
  EXPECT_EQ(trace->streams, 2);
  EXPECT_EQ(trace->peak_requested, 3u << 20);
  EXPECT_EQ(trace->unmatched_frees, 1u);
  Config config;
  EXPECT_EQ(Replay(*trace, config, kUnboundedCapacity).ooms, 0);
}

TEST(TraceImportTest, RmmCsvErrorsNameFileAndLine) {
  struct Case {
    std::string text, needle;
  };
  const std::string header = "Thread,Time,Action,Pointer,Size,Stream\n";
  const Case cases[] = {
      {"", "rmm.csv:1: empty file"},
      {"a,b,c\n", "rmm.csv:1: expected the RMM log header"},
      {header + "1,10:00:00.0,allocate,0x10,16,0x0\n1,garbage\n", "rmm.csv:3: Time"},
      {header + "1,10:00:00.0,reallocate,0x10,16,0x0\n", "rmm.csv:2: Action \"reallocate\""},
      {header + "1,10:00:00.0,allocate,0xzz,16,0x0\n", "rmm.csv:2: Pointer \"0xzz\""},
      {header + "1,10:00:00.0,allocate,0x10,-1,0x0\n", "rmm.csv:2: Size"},
      {header + "1,10:00:00.0,allocate,0x10,99999999999999999999,0x0\n", "rmm.csv:2: Size"},
      {header + "1,10:00:00.0,allocate,0x10,16,0x0\n1,10:00:00.1,allocate,0x10,16,0x0\n",
       "rmm.csv:3: allocate of pointer 0x10, which is already live"},
  };
  for (const Case& c : cases) {
    std::string out;
    absl::StatusOr<ImportStats> s = ImportRmmCsv(c.text, "rmm.csv", &out);
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.needle)) << c.text;
  }
}

// A tiny Umpire replay log in the shape of Umpire's tutorial log: a comment header,
// version and makeAllocator events, each allocate twice (the call, then the result),
// a zero-byte allocation and two allocators.
constexpr char kUmpire[] =
    "# Umpire replay log\n"
    R"({ "kind":"replay", "uid":1, "timestamp":1000, "event": "version", "payload": { "major":0, "minor":3, "patch":3 } })" "\n"
    R"({ "kind":"replay", "uid":1, "timestamp":1100, "event": "makeAllocator", "payload": { "type":"umpire::strategy::DynamicPool", "args": [ "DEVICE" ] }, "result": { "allocator_ref":"0x108a8730" } })" "\n"
    R"({ "kind":"replay", "uid":1, "timestamp":2000, "event": "allocate", "payload": { "allocator_ref": "0x108a8730", "size": 0 } })" "\n"
    R"({ "kind":"replay", "uid":1, "timestamp":2100, "event": "allocate", "payload": { "allocator_ref": "0x108a8730", "size": 0 }, "result": { "memory_ptr": "0x200040000010" } })" "\n"
    R"({ "kind":"replay", "uid":1, "timestamp":3000, "event": "allocate", "payload": { "allocator_ref": "0x108a8730", "size": 8388608 } })" "\n"
    R"({ "kind":"replay", "uid":1, "timestamp":3100, "event": "allocate", "payload": { "allocator_ref": "0x108a8730", "size": 8388608 }, "result": { "memory_ptr": "0x200040000010" } })" "\n"
    R"({ "kind":"replay", "uid":1, "timestamp":4100, "event": "allocate", "payload": { "allocator_ref": "0x2000", "size": "4096" }, "result": { "memory_ptr": "0x300000000000" } })" "\n"
    R"({ "kind":"replay", "uid":1, "timestamp":5000, "event": "deallocate", "payload": { "allocator_ref": "0x108a8730", "memory_ptr": "0x200040000010" } })" "\n"
    R"({ "kind":"replay", "uid":1, "timestamp":6000, "event": "deallocate", "payload": { "allocator_ref": "0x2000", "memory_ptr": "0x300000000000" } })" "\n";

TEST(TraceImportTest, UmpireReplays) {
  std::string out;
  absl::StatusOr<ImportStats> s = ImportUmpire(kUmpire, "umpire.log", &out);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->allocs, 2u);
  EXPECT_EQ(s->frees, 2u);
  EXPECT_EQ(s->unmatched_frees, 0u);
  EXPECT_EQ(s->skipped, 5u);  // version, makeAllocator, two calls, one zero-byte result
  EXPECT_THAT(out, HasSubstr("\"time_ns\":0,\"action\":\"alloc\",\"device\":\"cuda:0\","
                             "\"stream\":0,\"addr\":35185445830672,\"size\":8388608"));
  EXPECT_THAT(out, HasSubstr("\"stream\":1,\"addr\":52776558133248,\"size\":4096"));
  absl::StatusOr<Trace> trace = ParseTrace(out, "imported");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->allocations, 2u);
  EXPECT_EQ(trace->streams, 2);
  EXPECT_EQ(trace->peak_requested, 8388608u + 4096u);
}

TEST(TraceImportTest, UmpireErrorsNameFileAndLine) {
  struct Case {
    std::string text, needle;
  };
  const Case cases[] = {
      {"{oops\n", "u.log:1: not JSON"},
      {"# c\n[1,2]\n", "u.log:2: expected an object with a string field \"event\""},
      {R"({"event":"allocate"})", "u.log:1: expected an object field \"payload\""},
      {R"({"event":"allocate","payload":{"size":"x"},"result":{"memory_ptr":"0x1"}})",
       "u.log:1: \"payload.size\""},
      {R"({"event":"allocate","payload":{"size":8},"result":{"memory_ptr":7.5}})",
       "u.log:1: \"result.memory_ptr\""},
      {R"({"event":"deallocate","payload":{}})", "u.log:1: \"payload.memory_ptr\""},
      {R"({"event":"deallocate","payload":{"memory_ptr":"0x1","allocator_ref":[]}})",
       "u.log:1: \"payload.allocator_ref\""},
  };
  for (const Case& c : cases) {
    std::string out;
    absl::StatusOr<ImportStats> s = ImportUmpire(c.text, "u.log", &out);
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_THAT(std::string(s.status().message()), HasSubstr(c.needle)) << c.text;
  }
}

// The largest time_ns in a trace the importers wrote, and whether times never go back.
int64_t MaxTime(const std::string& trace, bool* monotone) {
  int64_t last = 0, max = 0;
  *monotone = true;
  for (size_t pos = trace.find("\"time_ns\":"); pos != std::string::npos;
       pos = trace.find("\"time_ns\":", pos + 1)) {
    const int64_t t = std::stoll(trace.substr(pos + 10, 24));
    if (t < last) *monotone = false;
    last = t;
    max = std::max(max, t);
  }
  return max;
}

TEST(TraceImportTest, RmmLinesOutOfOrderAreNotAPassOverMidnight) {
  // The second line is 1 us earlier (two threads logging): it used to add 24 h.
  std::string out;
  absl::StatusOr<ImportStats> s = ImportRmmCsv(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,10:00:00.000002,allocate,0x1000,512,0x0\n"
      "2,10:00:00.000001,allocate,0x2000,512,0x0\n"
      "1,10:00:00.000003,free,0x1000,512,0x0\n",
      "rmm.csv", &out);
  ASSERT_TRUE(s.ok()) << s.status();
  bool monotone = false;
  EXPECT_EQ(MaxTime(out, &monotone), 1000);
  EXPECT_TRUE(monotone);
  // A real pass over midnight still adds the day.
  out.clear();
  s = ImportRmmCsv(
      "Thread,Time,Action,Pointer,Size,Stream\n"
      "1,23:59:59.900000,allocate,0x1000,512,0x0\n"
      "1,00:00:00.100000,free,0x1000,512,0x0\n",
      "rmm.csv", &out);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(MaxTime(out, &monotone), 200'000'000);
}

TEST(TraceImportTest, RmmEndlessPassesOverMidnightAreRefusedNotOverflowed) {
  // Each 23:59:59 -> 00:00:00 pair is one more day: 10^5 of them overflowed int64 ns
  // (signed-overflow UB). Refused after 10,000, naming the line.
  std::string text = "Thread,Time,Action,Pointer,Size,Stream\n";
  for (int i = 0; i < 10001; ++i) {
    text += "1,23:59:59.000000,allocate failure,0x0,512,0x0\n"
            "1,00:00:00.000000,allocate failure,0x0,512,0x0\n";
  }
  std::string out;
  absl::StatusOr<ImportStats> s = ImportRmmCsv(text, "rmm.csv", &out);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("rmm.csv:20003: Time \"00:00:00.000000\": more than 10000 passes over midnight"));
}

TEST(TraceImportTest, UmpireTimestampsBeyondInt64AreRefusedAndTimesNeverGoBack) {
  std::string out;
  absl::StatusOr<ImportStats> s = ImportUmpire(
      R"({"event":"allocate","payload":{"size":8},"result":{"memory_ptr":"0x10"},"timestamp":18446744073709551615})",
      "u.log", &out);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("u.log:1: \"timestamp\""));
  // The largest allowed first, then 0: in range, no overflow, and written at the time
  // before (0), not at -2^63.
  out.clear();
  s = ImportUmpire(
      "{\"event\":\"allocate\",\"payload\":{\"size\":8},\"result\":{\"memory_ptr\":\"0x10\"},"
      "\"timestamp\":9223372036854775807}\n"
      "{\"event\":\"deallocate\",\"payload\":{\"memory_ptr\":\"0x10\"},\"timestamp\":0}\n",
      "u.log", &out);
  ASSERT_TRUE(s.ok()) << s.status();
  bool monotone = false;
  EXPECT_EQ(MaxTime(out, &monotone), 0);
  EXPECT_TRUE(monotone);
}

TEST(TraceImportTest, WithAStreamTheBufferStaysSmallAndTheTraceIsTheSame) {
  std::string text = "Thread,Time,Action,Pointer,Size,Stream\n";
  for (int i = 0; i < 40000; ++i) {
    text += "1,10:00:00.000001,allocate," + std::to_string(4096 * (i + 1)) + ",512,0x0\n";
  }
  std::string whole;
  ASSERT_TRUE(ImportRmmCsv(text, "rmm.csv", &whole).ok());
  ASSERT_GT(whole.size(), size_t{4} << 20);
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  std::string buffer;
  ASSERT_TRUE(ImportRmmCsv(text, "rmm.csv", &buffer, f).ok());
  EXPECT_TRUE(buffer.empty());  // flushed at the end
  std::string written;
  std::rewind(f);
  char chunk[65536];
  for (size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) written.append(chunk, n);
  std::fclose(f);
  EXPECT_EQ(written, whole);
}

}  // namespace
}  // namespace devmem
