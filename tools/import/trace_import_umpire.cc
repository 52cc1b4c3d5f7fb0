// tools/import/trace_import_umpire.cc: Umpire's replay log (JSON Lines) -> devmem trace (the
// fields read are listed in tools/import/trace_import.h). simdjson's DOM parser, one line at a
// time, so that errors name the line.
#include <simdjson.h>

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "tools/import/trace_import.h"
#include "tools/import/trace_import_writer.h"

namespace devmem {
namespace {

using import_internal::ParseUnsigned;

absl::Status LineError(const std::string& name, uint64_t line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrFormat("%s:%d: %s", name, line, what));
}

// Umpire writes pointers as strings ("0x2000...") and sizes as numbers or, in older
// versions, as numeric strings: both are accepted.
bool Unsigned(simdjson::dom::element e, uint64_t* value) {
  if (e.is_uint64()) return !e.get_uint64().get(*value);
  std::string_view s;
  if (e.get_string().get(s)) return false;
  return ParseUnsigned(s, value);
}

}  // namespace

absl::StatusOr<ImportStats> ImportUmpire(std::string_view text, const std::string& name,
                                         std::string* out, std::FILE* stream) {
  import_internal::TraceLineWriter writer(out, "umpire:" + name, stream);
  simdjson::dom::parser parser;
  absl::flat_hash_map<uint64_t, uint64_t> streams;  // allocator_ref -> stream
  int64_t first_ts = -1;
  uint64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = import_internal::Strip(text.substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    if (line.empty() || line[0] == '#') continue;  // Umpire's examples carry '#' headers
    simdjson::dom::element doc;
    if (auto err = parser.parse(line.data(), line.size()).get(doc); err) {
      return LineError(name, line_no,
                       absl::StrFormat("not JSON (%s): expected one Umpire replay event",
                                       simdjson::error_message(err)));
    }
    std::string_view event;
    if (doc["event"].get_string().get(event)) {
      return LineError(name, line_no, "expected an object with a string field \"event\"");
    }
    const bool is_alloc = event == "allocate";
    if (!is_alloc && event != "deallocate") {
      writer.Skip();
      continue;
    }
    simdjson::dom::element payload, result, e;
    if (doc["payload"].get(payload) || !payload.is_object()) {
      return LineError(name, line_no, "expected an object field \"payload\"");
    }
    if (is_alloc && doc["result"].get(result)) {
      writer.Skip();  // the call before it returned; the line with the result follows
      continue;
    }
    uint64_t ts = 0;
    if (!doc["timestamp"].get(e) &&
        (!Unsigned(e, &ts) || ts > static_cast<uint64_t>(INT64_MAX))) {
      return LineError(name, line_no, "\"timestamp\": expected nanoseconds (at most 2^63 - 1)");
    }
    // Times count from the first event written (skipped lines do not move the origin).
    // Both are in [0, 2^63 - 1], so the difference cannot overflow (it did, as the
    // difference of two casts of any uint64).
    auto rel = [&] {
      if (first_ts < 0) first_ts = static_cast<int64_t>(ts);
      return static_cast<int64_t>(ts) - first_ts;
    };
    uint64_t ref = 0;
    if (!payload["allocator_ref"].get(e) && !Unsigned(e, &ref)) {
      return LineError(name, line_no,
                       "\"payload.allocator_ref\": expected a pointer (\"0x...\")");
    }
    const uint64_t stream = streams.try_emplace(ref, streams.size()).first->second;
    uint64_t ptr = 0;
    if (is_alloc) {
      uint64_t size = 0;
      if (payload["size"].get(e) || !Unsigned(e, &size) || size > (uint64_t{1} << 50)) {
        return LineError(name, line_no,
                         "\"payload.size\": expected a byte count (at most 2^50)");
      }
      if (result["memory_ptr"].get(e) || !Unsigned(e, &ptr)) {
        return LineError(name, line_no,
                         "\"result.memory_ptr\": expected a pointer (\"0x...\")");
      }
      if (size == 0) {
        // Umpire serves zero-byte requests from a separate allocator whose pointers
        // alias real blocks (its tutorial log shows one): nothing to replay.
        writer.Skip();
        continue;
      }
      if (!writer.Alloc(ptr, size, stream, rel())) {
        return LineError(name, line_no,
                         absl::StrFormat("allocate returned 0x%x, which is already live", ptr));
      }
    } else {
      if (payload["memory_ptr"].get(e) || !Unsigned(e, &ptr)) {
        return LineError(name, line_no,
                         "\"payload.memory_ptr\": expected a pointer (\"0x...\")");
      }
      writer.Free(ptr, stream, rel());
    }
  }
  if (!writer.Finish()) return absl::InternalError(absl::StrFormat("%s: cannot write the trace", name));
  return writer.stats();
}

}  // namespace devmem
