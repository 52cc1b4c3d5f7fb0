// tools/import/trace_import_writer.cc: the shared devmem trace writer of the importers.
#include "tools/import/trace_import_writer.h"

#include <algorithm>
#include <charconv>

#include "absl/strings/str_format.h"

namespace devmem::import_internal {

namespace {
constexpr size_t kFlushBytes = size_t{1} << 20;
}  // namespace

TraceLineWriter::TraceLineWriter(std::string* out, const std::string& source, std::FILE* stream)
    : out_(out), stream_(stream) {
  // The source goes into the header as an extra field (readers ignore unknown fields);
  // escaping keeps a file name with quotes from breaking the JSON.
  std::string escaped;
  for (char c : source) {
    if (c == '"' || c == '\\') escaped += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    escaped += c;
  }
  absl::StrAppendFormat(out_, "{\"schema\":\"devmem.trace/1\",\"sites\":[],\"source\":\"%s\"}\n",
                        escaped);
}

void TraceLineWriter::Event(const char* action, uint64_t addr, uint64_t size, uint64_t stream,
                            int64_t time_ns) {
  time_ns = std::max(time_ns, last_time_ns_);
  last_time_ns_ = time_ns;
  absl::StrAppendFormat(out_,
                        "{\"seq\":%d,\"time_ns\":%d,\"action\":\"%s\",\"device\":\"cuda:0\","
                        "\"stream\":%d,\"addr\":%d,\"size\":%d,\"requested\":%d,\"site\":0,"
                        "\"thread\":0}\n",
                        ++seq_, time_ns, action, stream, addr, size, size);
  if (stream_ != nullptr && out_->size() >= kFlushBytes) Finish();
}

bool TraceLineWriter::Finish() {
  if (stream_ == nullptr) return true;
  if (!out_->empty() && std::fwrite(out_->data(), 1, out_->size(), stream_) != out_->size()) {
    write_failed_ = true;
  }
  out_->clear();
  return !write_failed_;
}

bool TraceLineWriter::Alloc(uint64_t addr, uint64_t size, uint64_t stream, int64_t time_ns) {
  if (!live_.try_emplace(addr, size).second) return false;
  ++stats_.allocs;
  Event("alloc", addr, size, stream, time_ns);
  return true;
}

void TraceLineWriter::Free(uint64_t addr, uint64_t stream, int64_t time_ns) {
  auto it = live_.find(addr);
  if (it == live_.end()) {
    // Logs often start after some allocations were made: kept (replay skips it).
    ++stats_.unmatched_frees;
    Event("free", addr, 0, stream, time_ns);
    return;
  }
  const uint64_t size = it->second;
  live_.erase(it);
  ++stats_.frees;
  Event("free", addr, size, stream, time_ns);
}

void TraceLineWriter::Oom(uint64_t size, uint64_t stream, int64_t time_ns) {
  ++stats_.ooms;
  Event("oom", 0, size, stream, time_ns);
}

std::string_view Strip(std::string_view text) {
  const size_t b = text.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const size_t e = text.find_last_not_of(" \t\r\n");
  return text.substr(b, e - b + 1);
}

std::vector<std::string_view> Split(std::string_view text, std::string_view any_of) {
  std::vector<std::string_view> parts;
  size_t pos = 0;
  while (true) {
    const size_t end = text.find_first_of(any_of, pos);
    if (end == std::string_view::npos) {
      parts.push_back(text.substr(pos));
      return parts;
    }
    parts.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
}

bool ParseUnsigned(std::string_view text, uint64_t* value) {
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    text.remove_prefix(2);
    base = 16;
  }
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value, base);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace devmem::import_internal
