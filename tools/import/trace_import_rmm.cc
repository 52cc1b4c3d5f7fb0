// tools/import/trace_import_rmm.cc: RMM's logging_resource_adaptor CSV -> devmem trace
// (the format is described in tools/import/trace_import.h).
#include <array>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "tools/import/trace_import.h"
#include "tools/import/trace_import_writer.h"

namespace devmem {
namespace {

using import_internal::ParseUnsigned;
using import_internal::Split;
using import_internal::Strip;

absl::Status LineError(const std::string& name, uint64_t line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrFormat("%s:%d: %s", name, line, what));
}

constexpr int64_t kDayNs = int64_t{86400} * 1'000'000'000;
constexpr int64_t kHalfDayNs = kDayNs / 2;
constexpr int64_t kMaxDays = 10000;  // 27 years of passes over midnight

bool ParseDecimal(std::string_view text, uint64_t* value) {
  if (text.empty() || (text.size() > 2 && (text[1] == 'x' || text[1] == 'X'))) return false;
  return ParseUnsigned(text, value);
}

// "HH:MM:SS.ffffff" or "HH:MM:SS:ffffff" (any number of fraction digits) -> ns of day.
bool ParseTimeOfDay(std::string_view text, int64_t* ns) {
  std::vector<std::string_view> parts = Split(text, ":.");
  if (parts.size() != 3 && parts.size() != 4) return false;
  uint64_t h = 0, m = 0, s = 0, frac = 0;
  if (!ParseDecimal(parts[0], &h) || !ParseDecimal(parts[1], &m) ||
      !ParseDecimal(parts[2], &s) || h > 23 || m > 59 || s > 60) {
    return false;
  }
  int64_t frac_ns = 0;
  if (parts.size() == 4) {
    std::string_view f = parts[3];
    if (f.size() > 9 || !ParseDecimal(f, &frac)) return false;
    frac_ns = static_cast<int64_t>(frac);
    for (size_t i = f.size(); i < 9; ++i) frac_ns *= 10;
  }
  *ns = ((static_cast<int64_t>(h) * 60 + static_cast<int64_t>(m)) * 60 +
         static_cast<int64_t>(s)) * 1'000'000'000 + frac_ns;
  return true;
}

}  // namespace

absl::StatusOr<ImportStats> ImportRmmCsv(std::string_view text, const std::string& name,
                                         std::string* out, std::FILE* stream) {
  import_internal::TraceLineWriter writer(out, "rmm-csv:" + name, stream);
  // Column indices, found by name in the header so that column order does not matter.
  enum Column { kTime, kAction, kPointer, kSize, kStream, kColumns };
  static constexpr std::array<std::string_view, kColumns> kNames = {"Time", "Action", "Pointer",
                                                                   "Size", "Stream"};
  std::array<int, kColumns> col;
  col.fill(-1);
  bool have_header = false;
  int64_t first_ns = -1, last_of_day = -1;
  int64_t days = 0;  // passes over midnight so far
  uint64_t line_no = 0;
  // Line by line without a vector of all lines (16 bytes a line: 480 MB for a 2 GiB log).
  for (size_t pos = 0; pos <= text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    line = Strip(line);
    if (line.empty()) continue;
    std::vector<std::string_view> fields = Split(line, ",");
    for (auto& f : fields) f = Strip(f);
    if (!have_header) {
      for (size_t i = 0; i < fields.size(); ++i) {
        for (int c = 0; c < kColumns; ++c) {
          if (fields[i] == kNames[c]) col[c] = static_cast<int>(i);
        }
      }
      for (int c = 0; c < kColumns; ++c) {
        if (col[c] < 0 && c != kStream) {  // old RMM versions have no Stream column
          return LineError(name, line_no,
                           absl::StrFormat("expected the RMM log header "
                                           "\"Thread,Time,Action,Pointer,Size,Stream\" "
                                           "(no column \"%s\")",
                                           kNames[c]));
        }
      }
      have_header = true;
      continue;
    }
    auto field = [&](Column c) -> std::string_view {
      return col[c] >= 0 && static_cast<size_t>(col[c]) < fields.size() ? fields[col[c]]
                                                                         : std::string_view();
    };
    int64_t ns = 0;
    if (!ParseTimeOfDay(field(kTime), &ns)) {
      return LineError(name, line_no,
                       absl::StrFormat("Time \"%s\": expected HH:MM:SS.ffffff",
                                       std::string(field(kTime).substr(0, 40))));
    }
    // A time of day more than 12 h before the line before: the log passed midnight. A
    // smaller step back is lines out of order (RMM's threads log concurrently; 1 us
    // back used to add 24 h), which the writer keeps at the time before.
    if (last_of_day >= 0 && last_of_day - ns > kHalfDayNs) {
      if (++days > kMaxDays) {
        return LineError(name, line_no,
                         absl::StrFormat("Time \"%s\": more than %d passes over midnight "
                                         "(times jump back by over 12 h again and again)",
                                         std::string(field(kTime).substr(0, 40)), kMaxDays));
      }
    }
    last_of_day = ns;
    ns += days * kDayNs;  // at most 10^4 days: no overflow
    if (first_ns < 0) first_ns = ns;
    const int64_t t = ns - first_ns;
    uint64_t ptr = 0, size = 0, stream = 0;
    const std::string_view action = field(kAction);
    if (!field(kStream).empty() && !ParseUnsigned(field(kStream), &stream)) {
      return LineError(name, line_no,
                       absl::StrFormat("Stream \"%s\": expected a hex or decimal number",
                                       std::string(field(kStream).substr(0, 40))));
    }
    if (!ParseUnsigned(field(kSize), &size) || size > (uint64_t{1} << 50)) {
      return LineError(name, line_no,
                       absl::StrFormat("Size \"%s\": expected a byte count (at most 2^50)",
                                       std::string(field(kSize).substr(0, 40))));
    }
    if (action == "allocate failure") {
      writer.Oom(size, stream, t);
      continue;
    }
    if (action != "allocate" && action != "free") {
      return LineError(name, line_no,
                       absl::StrFormat("Action \"%s\": expected allocate, free or "
                                       "allocate failure",
                                       std::string(action.substr(0, 40))));
    }
    if (!ParseUnsigned(field(kPointer), &ptr)) {
      return LineError(name, line_no,
                       absl::StrFormat("Pointer \"%s\": expected a hex or decimal address",
                                       std::string(field(kPointer).substr(0, 40))));
    }
    if (action == "allocate") {
      if (!writer.Alloc(ptr, size, stream, t)) {
        return LineError(name, line_no,
                         absl::StrFormat("allocate of pointer 0x%x, which is already live",
                                         ptr));
      }
    } else {
      writer.Free(ptr, stream, t);
    }
  }
  if (!have_header) return LineError(name, line_no, "empty file: expected the RMM log header");
  if (!writer.Finish()) return absl::InternalError(absl::StrFormat("%s: cannot write the trace", name));
  return writer.stats();
}

}  // namespace devmem
