// tools/export/pickle_writer.cc: the opcodes of pickle protocol 2 (Python's
// Lib/pickletools.py documents each) that plain data needs:
//   PROTO 2, STOP; NONE, NEWTRUE, NEWFALSE; BININT (int32), LONG1 (any other int, in
//   little-endian two's complement); BINFLOAT (big-endian double); BINUNICODE (UTF-8
//   with a 4-byte length); EMPTY_LIST/EMPTY_DICT + MARK ... APPENDS/SETITEMS, MARK ...
//   TUPLE; LONG_BINPUT/LONG_BINGET for the memo.
#include "tools/export/pickle_writer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "allocator/string_view_bridge.h"

namespace devmem::memtrace {
namespace {

constexpr char kProto = '\x80';
constexpr char kStop = '.';
constexpr char kNone = 'N';
constexpr char kNewTrue = '\x88';
constexpr char kNewFalse = '\x89';
constexpr char kBinInt = 'J';
constexpr char kLong1 = '\x8a';
constexpr char kBinFloat = 'G';
constexpr char kBinUnicode = 'X';
constexpr char kMark = '(';
constexpr char kEmptyList = ']';
constexpr char kAppends = 'e';
constexpr char kEmptyDict = '}';
constexpr char kSetItems = 'u';
constexpr char kTuple = 't';
constexpr char kLongBinPut = 'r';
constexpr char kLongBinGet = 'j';

}  // namespace

PickleWriter::PickleWriter() {
  out_.push_back(kProto);
  out_.push_back('\x02');
}

void PickleWriter::Opcode(char op) { out_.push_back(op); }

void PickleWriter::U32(uint32_t v) {
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void PickleWriter::None() { Opcode(kNone); }

void PickleWriter::Bool(bool value) { Opcode(value ? kNewTrue : kNewFalse); }

void PickleWriter::Int(int64_t value) {
  if (value >= INT32_MIN && value <= INT32_MAX) {
    Opcode(kBinInt);
    U32(static_cast<uint32_t>(static_cast<int32_t>(value)));
    return;
  }
  // LONG1: the fewest little-endian bytes whose two's complement is `value`.
  std::string bytes;
  uint64_t v = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  const char fill = value < 0 ? '\xff' : '\x00';
  while (bytes.size() > 1 && bytes.back() == fill &&
         ((bytes[bytes.size() - 2] & 0x80) != 0) == (value < 0)) {
    bytes.pop_back();
  }
  Opcode(kLong1);
  out_.push_back(static_cast<char>(bytes.size()));
  out_ += bytes;
}

void PickleWriter::UInt(uint64_t value) {
  if (value <= static_cast<uint64_t>(INT64_MAX)) {
    Int(static_cast<int64_t>(value));
    return;
  }
  // Above INT64_MAX: eight bytes and a zero byte, so that the sign bit stays clear.
  Opcode(kLong1);
  out_.push_back('\x09');
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  out_.push_back('\x00');
}

void PickleWriter::Float(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  Opcode(kBinFloat);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void PickleWriter::Str(std::string_view value) {
  auto it = strings_.find(Av(value));
  if (it != strings_.end()) {
    Ref(it->second);
    return;
  }
  Opcode(kBinUnicode);
  U32(static_cast<uint32_t>(value.size()));
  out_.append(value.data(), value.size());
  strings_.emplace(std::string(value), Memoize());
}

void PickleWriter::BeginList() {
  Opcode(kEmptyList);
  Opcode(kMark);
  open_.push_back('l');
}

void PickleWriter::EndList() {
  Opcode(kAppends);
  open_.pop_back();
}

void PickleWriter::BeginDict() {
  Opcode(kEmptyDict);
  Opcode(kMark);
  open_.push_back('d');
}

void PickleWriter::EndDict() {
  Opcode(kSetItems);
  open_.pop_back();
}

void PickleWriter::BeginTuple() {
  Opcode(kMark);
  open_.push_back('t');
}

void PickleWriter::EndTuple() {
  Opcode(kTuple);
  open_.pop_back();
}

uint32_t PickleWriter::Memoize() {
  Opcode(kLongBinPut);
  U32(next_memo_);
  return next_memo_++;
}

void PickleWriter::Ref(uint32_t handle) {
  Opcode(kLongBinGet);
  U32(handle);
}

absl::StatusOr<std::string> PickleWriter::Finish() {
  if (!open_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("pickle: ", open_.size(), " container(s) still open (",
                     absl::StrJoin(open_, "", [](std::string* o, char c) {
                       o->append(c == 'l' ? "list " : c == 'd' ? "dict " : "tuple ");
                     }),
                     ")"));
  }
  Opcode(kStop);
  return std::move(out_);
}

}  // namespace devmem::memtrace
