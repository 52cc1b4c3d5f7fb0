// tests/pickle_writer_test.cc: tools/export/pickle_writer.h byte for byte, in the cases the
// PyTorch snapshot export relies on: ints at every width boundary (addresses above 2^63
// included; the bytes are those of CPython 3.11's pickle.dumps(value, 2)), strings
// written once and referred to after, empty containers (these use other memo opcodes
// than CPython's writer; pickle.loads of each gives the value the test names), and the
// error for a container left open. tests/export_pytorch_test.py loads whole exports.
#include "tools/export/pickle_writer.h"

#include <string>

#include "gtest/gtest.h"

namespace devmem::memtrace {
namespace {

// The body of the pickle of one value: between PROTO 2 and STOP.
template <typename Fn>
std::string Body(Fn&& write) {
  PickleWriter p;
  write(p);
  absl::StatusOr<std::string> out = p.Finish();
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return "";
  EXPECT_EQ(out->substr(0, 2), std::string("\x80\x02", 2));
  EXPECT_EQ(out->back(), '.');
  return out->substr(2, out->size() - 3);
}

std::string Bytes(const char* s, size_t n) { return std::string(s, n); }

TEST(PickleWriterTest, IntsMatchPythonAtEveryWidth) {
  EXPECT_EQ(Body([](PickleWriter& p) { p.Int(-1); }), Bytes("J\xff\xff\xff\xff", 5));
  EXPECT_EQ(Body([](PickleWriter& p) { p.Int(-129); }), Bytes("J\x7f\xff\xff\xff", 5));
  EXPECT_EQ(Body([](PickleWriter& p) { p.Int(int64_t{1} << 31); }),
            Bytes("\x8a\x05\x00\x00\x00\x80\x00", 7));
  EXPECT_EQ(Body([](PickleWriter& p) { p.Int(-(int64_t{1} << 31) - 1); }),
            Bytes("\x8a\x05\xff\xff\xff\x7f\xff", 7));
  EXPECT_EQ(Body([](PickleWriter& p) { p.Int(int64_t{1} << 40); }),
            Bytes("\x8a\x06\x00\x00\x00\x00\x00\x01", 8));
  EXPECT_EQ(Body([](PickleWriter& p) { p.Int(-(int64_t{1} << 40)); }),
            Bytes("\x8a\x06\x00\x00\x00\x00\x00\xff", 8));
  EXPECT_EQ(Body([](PickleWriter& p) { p.UInt(uint64_t{1} << 63); }),
            Bytes("\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00", 11));
  EXPECT_EQ(Body([](PickleWriter& p) { p.UInt(7); }), Bytes("J\x07\x00\x00\x00", 5));
}

TEST(PickleWriterTest, StringsAreWrittenOnceThenReferred) {
  const std::string body = Body([](PickleWriter& p) {
    p.BeginList();
    p.Str("ab");
    p.Str("ab");
    p.EndList();
  });
  EXPECT_EQ(body, Bytes("](X\x02\x00\x00\x00" "ab" "r\x00\x00\x00\x00"
                        "j\x00\x00\x00\x00" "e", 20));
}

TEST(PickleWriterTest, ContainersAndScalars) {
  EXPECT_EQ(Body([](PickleWriter& p) {
              p.BeginDict();
              p.EndDict();
            }),
            "}(u");
  EXPECT_EQ(Body([](PickleWriter& p) {
              p.BeginTuple();
              p.Bool(true);
              p.None();
              p.EndTuple();
            }),
            Bytes("(\x88Nt", 4));
  EXPECT_EQ(Body([](PickleWriter& p) { p.Float(1.5); }),
            Bytes("G\x3f\xf8\x00\x00\x00\x00\x00\x00", 9));
}

TEST(PickleWriterTest, OpenContainerIsAnError) {
  PickleWriter p;
  p.BeginList();
  p.BeginDict();
  absl::StatusOr<std::string> out = p.Finish();
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("2 container(s) still open (list dict"),
            std::string::npos)
      << out.status();
}

}  // namespace
}  // namespace devmem::memtrace
