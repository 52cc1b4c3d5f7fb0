// tools/inspect/inspect_format.cc: text helpers for memtrace's human output (see
// tools/inspect/inspect_format.h).
#include "tools/inspect/inspect_format.h"

#include <cstdio>

#include "allocator/config.h"

namespace devmem::memtrace {

std::string FormatAge(int64_t ns) {
  if (ns < 0) return "-";
  char buf[32];
  const int64_t ms = ns / 1000000;
  if (ms < 1000) {
    std::snprintf(buf, sizeof(buf), "%lldms", static_cast<long long>(ms));
  } else if (ms < 60000) {
    std::snprintf(buf, sizeof(buf), "%.1fs", static_cast<double>(ms) / 1000.0);
  } else if (ms < 3600000) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(ms / 60000),
                  static_cast<long long>(ms / 1000 % 60));
  } else if (ms < 86400000) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(ms / 3600000),
                  static_cast<long long>(ms / 60000 % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldd%02lldh", static_cast<long long>(ms / 86400000),
                  static_cast<long long>(ms / 3600000 % 24));
  }
  return buf;
}

std::string FormatShare(uint64_t part, uint64_t total) {
  if (total == 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%",
                100.0 * static_cast<double>(part) / static_cast<double>(total));
  return buf;
}

std::string Bytes(uint64_t bytes) { return FormatBytes(static_cast<size_t>(bytes)); }

std::string FormatDelta(int64_t bytes) {
  if (bytes == 0) return "0 B";
  const uint64_t mag = bytes < 0 ? 0 - static_cast<uint64_t>(bytes) : static_cast<uint64_t>(bytes);
  return (bytes < 0 ? "-" : "+") + Bytes(mag);
}

TextTable::TextTable(std::vector<std::string> headers) {
  for (std::string& h : headers) {
    const bool left = !h.empty() && h[0] == '<';
    left_.push_back(left);
    headers_.push_back(left ? h.substr(1) : h);
  }
}

void TextTable::Add(std::vector<std::string> row) {
  row.resize(headers_.size());
  rows_.push_back(std::move(row));
}

std::string TextTable::Render(const std::string& indent) const {
  std::vector<size_t> width(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) width[c] = headers_[c].size();
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string l = indent;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) l += "  ";
      const size_t pad = width[c] - cells[c].size();
      const bool last = c + 1 == cells.size();
      if (left_[c]) {
        l += cells[c];
        if (!last) l.append(pad, ' ');
      } else {
        l.append(pad, ' ');
        l += cells[c];
      }
    }
    while (!l.empty() && l.back() == ' ') l.pop_back();
    out += l + "\n";
  };
  line(headers_);
  for (const auto& row : rows_) line(row);
  return out;
}

}  // namespace devmem::memtrace
