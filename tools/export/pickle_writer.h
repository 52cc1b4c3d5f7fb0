// tools/export/pickle_writer.h: writes Python pickles (protocol 2) of plain data: None, bool,
// int (any 64-bit value, signed or not), float, str, list, dict and tuple. What
// `memtrace export --to pytorch-snapshot` needs to write PyTorch's snapshot format,
// which Python reads with pickle.load; no class is ever named, so loading the output
// executes nothing but building these built-in values.
//
// Streaming: values are written in order, containers between Begin* and End*; a dict's
// entries alternate key, value. Strings are memoized (each distinct string is written
// once, later uses refer to it), and any container can be memoized explicitly with
// Memoize() right after its End*, then referred to again with Ref(): PyTorch's snapshot
// repeats the same frames (call sites) in thousands of places.
//
// Invariant: Finish() is called with every container closed (checked: it returns the
// error naming the open ones). Not thread-safe; one writer per output.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace devmem::memtrace {

class PickleWriter {
 public:
  PickleWriter();

  void None();
  void Bool(bool value);
  void Int(int64_t value);
  void UInt(uint64_t value);
  void Float(double value);
  void Str(std::string_view value);

  void BeginList();
  void EndList();
  void BeginDict();
  void EndDict();
  void BeginTuple();
  void EndTuple();

  // Memoizes the value just written (a closed container, or a string) and returns the
  // handle Ref() writes it again with.
  uint32_t Memoize();
  void Ref(uint32_t handle);

  // The pickle: every container must be closed. FailedPrecondition otherwise.
  absl::StatusOr<std::string> Finish();

 private:
  void Opcode(char op);
  void U32(uint32_t v);
  void Put();

  std::string out_;
  std::vector<char> open_;  // 'l', 'd', 't' for each open container, innermost last
  uint32_t next_memo_ = 0;
  absl::flat_hash_map<std::string, uint32_t> strings_;
};

}  // namespace devmem::memtrace
