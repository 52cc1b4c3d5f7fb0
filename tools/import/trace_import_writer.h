// tools/import/trace_import_writer.h: the devmem trace writer the importers share: numbers the
// events, keeps the live allocations (so a free carries its allocation's size) and
// formats each event line with every field docs/formats.md requires.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "tools/import/trace_import.h"

namespace devmem::import_internal {

class TraceLineWriter {
 public:
  // Appends the header line; `source` names the converted format and file. With
  // `stream`, *out is a buffer flushed there whenever it passes about 1 MiB (and by
  // Finish()); without it, *out receives everything.
  TraceLineWriter(std::string* out, const std::string& source, std::FILE* stream = nullptr);

  // Returns false when `addr` is already live (the caller reports the line).
  bool Alloc(uint64_t addr, uint64_t size, uint64_t stream, int64_t time_ns);
  void Free(uint64_t addr, uint64_t stream, int64_t time_ns);
  void Oom(uint64_t size, uint64_t stream, int64_t time_ns);
  void Skip() { ++stats_.skipped; }

  // Flushes what is buffered to the stream; false if a write failed (then or before).
  bool Finish();

  const ImportStats& stats() const { return stats_; }

 private:
  void Event(const char* action, uint64_t addr, uint64_t size, uint64_t stream,
             int64_t time_ns);

  std::string* out_;
  std::FILE* stream_;
  bool write_failed_ = false;
  uint64_t seq_ = 0;
  int64_t last_time_ns_ = INT64_MIN;  // times written never go backwards
  absl::flat_hash_map<uint64_t, uint64_t> live_;  // addr -> size
  ImportStats stats_;
};

// std::string_view helpers: Debian's abseil has its own absl::string_view, which does
// not convert from std::string_view, so absl's StrSplit/Strip are not used here.
std::string_view Strip(std::string_view text);
std::vector<std::string_view> Split(std::string_view text, std::string_view any_of);

// Parses an unsigned integer, hex with a 0x/0X prefix or decimal; false if malformed.
bool ParseUnsigned(std::string_view text, uint64_t* value);

}  // namespace devmem::import_internal
