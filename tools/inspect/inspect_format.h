// tools/inspect/inspect_format.h: text helpers shared by memtrace's inspect commands: ages,
// shares, signed byte counts, and a column-aligned table for the human output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace devmem::memtrace {

// "950ms", "12.3s", "4m05s", "2h10m", "3d04h"; "-" for a negative (unknown) age.
std::string FormatAge(int64_t ns);
// "12.5%"; "-" when `total` is 0.
std::string FormatShare(uint64_t part, uint64_t total);
// "+1.50 MiB", "-512 B", "0 B".
std::string FormatDelta(int64_t bytes);
// FormatBytes (allocator/config.h) for uint64.
std::string Bytes(uint64_t bytes);

// A table printed with columns padded to their widest cell. Columns whose header starts
// with '<' are left-aligned (the '<' is not printed); others are right-aligned. The last
// column is never padded, so long site names do not make trailing blanks.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> headers);
  void Add(std::vector<std::string> row);
  // The table, one line per row, each line starting with `indent`.
  std::string Render(const std::string& indent = "") const;

 private:
  std::vector<std::string> headers_;
  std::vector<bool> left_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace devmem::memtrace
