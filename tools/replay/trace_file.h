// tools/replay/trace_file.h: loads a trace file for the readers that parse it in place
// (tools/replay/trace_replay.cc, tools/timeline/timeline.cc), gzip-compressed or not.
//
// A file that starts with the gzip magic bytes (1f 8b) is decompressed (zlib; the
// repository's real traces are stored so: tests/data/traces/real/); any other file is
// read as it is. Either way the result is one padded buffer simdjson can parse in
// place. zlib writes straight into the padded buffer, sized from the size gzip
// records in the file, so a compressed file costs its decompressed size once (a file
// whose recorded size is wrong, or several files concatenated, costs up to 3x while the
// buffer grows). A file that would decompress to more than 200x its size plus 64 MiB
// is refused as a gzip bomb, with a message saying to gunzip a real one first.
//
// Errors name the file: unreadable, corrupt or truncated gzip data, or more than the
// memory available (std::bad_alloc is caught here, so a trace too large for a memory
// cap is an error with exit status 2, not an abort).
#pragma once

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace devmem {

absl::StatusOr<simdjson::padded_string> LoadTraceFile(const std::string& path);

// The lines of a trace's text (JSON Lines), for the readers that parse each one in
// place (replay, timeline): numbered from 1, trailing '\r' and ' ' cut, blank lines
// skipped (counted, so that errors name the line an editor shows). A line is a view
// into the text: where the text is a padded buffer, simdjson parses it without a copy
// (the rest of the buffer and its padding follow it). Inline: it runs once per event
// of traces of 10^7 events.
class TraceLines {
 public:
  explicit TraceLines(std::string_view text) : text_(text) {}

  // The next non-blank line; false at the end of the text.
  bool Next(std::string_view* line) {
    while (pos_ < text_.size()) {
      size_t end = text_.find('\n', pos_);
      if (end == std::string_view::npos) end = text_.size();
      ++line_no_;
      std::string_view l = text_.substr(pos_, end - pos_);
      pos_ = end + 1;
      while (!l.empty() && (l.back() == '\r' || l.back() == ' ')) l.remove_suffix(1);
      if (!l.empty()) {
        *line = l;
        return true;
      }
    }
    return false;
  }
  // The number of the line Next returned last (1 for the first line of the text).
  uint64_t line_no() const { return line_no_; }
  // Bytes of the text consumed so far (for progress).
  size_t pos() const { return pos_; }

 private:
  std::string_view text_;
  size_t pos_ = 0;
  uint64_t line_no_ = 0;
};

}  // namespace devmem
