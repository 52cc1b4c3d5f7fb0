// tools/trace_file.cc: plain or gzip-compressed trace files into one padded buffer
// (tools/trace_file.h).
#include "tools/trace_file.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "absl/strings/str_format.h"

namespace devmem {
namespace {

using File = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;

absl::Status CannotRead(const std::string& path, const char* why) {
  return absl::NotFoundError(absl::StrFormat("%s: cannot read (%s)", path, why));
}

absl::StatusOr<simdjson::padded_string> Inflate(const std::string& path, std::FILE* f) {
  z_stream z{};
  // 16 + MAX_WBITS: gzip framing. Members that follow one another are read in turn
  // (what `cat a.gz b.gz` makes).
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
    return absl::InternalError(absl::StrFormat("%s: zlib initialisation failed", path));
  }
  std::unique_ptr<z_stream, int (*)(z_stream*)> end(&z, &inflateEnd);
  std::vector<unsigned char> in(size_t{1} << 16);
  std::vector<char> out;
  size_t used = 0;
  int rc = Z_OK;
  bool eof = false;
  while (true) {
    if (z.avail_in == 0 && !eof) {
      const size_t n = std::fread(in.data(), 1, in.size(), f);
      if (n == 0) {
        if (std::ferror(f)) return CannotRead(path, std::strerror(errno));
        eof = true;
      }
      z.next_in = in.data();
      z.avail_in = static_cast<uInt>(n);
    }
    if (z.avail_in == 0 && eof) break;
    if (rc == Z_STREAM_END) inflateReset(&z);  // input follows the end of a member
    if (out.size() - used < (size_t{1} << 16)) {
      out.resize(std::max<size_t>(out.size() * 2, size_t{1} << 20));
    }
    z.next_out = reinterpret_cast<Bytef*>(out.data() + used);
    z.avail_out = static_cast<uInt>(std::min<size_t>(out.size() - used, UINT_MAX));
    const uInt avail = z.avail_out;
    rc = inflate(&z, Z_NO_FLUSH);
    used += avail - z.avail_out;
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: corrupt gzip data (zlib: %s)", path, z.msg != nullptr ? z.msg : zError(rc)));
    }
  }
  if (rc != Z_STREAM_END) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: truncated gzip data (the compressed stream does not end)", path));
  }
  simdjson::padded_string text(used);
  if (text.data() == nullptr) throw std::bad_alloc();
  std::memcpy(text.data(), out.data(), used);
  return text;
}

}  // namespace

absl::StatusOr<simdjson::padded_string> LoadTraceFile(const std::string& path) {
  try {
    File f(std::fopen(path.c_str(), "rb"), &std::fclose);
    if (f == nullptr) return CannotRead(path, std::strerror(errno));
    unsigned char magic[2] = {0, 0};
    const size_t n = std::fread(magic, 1, 2, f.get());
    if (n == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
      std::rewind(f.get());
      return Inflate(path, f.get());
    }
    f.reset();
    simdjson::padded_string text;
    if (auto err = simdjson::padded_string::load(path).get(text); err) {
      return CannotRead(path, simdjson::error_message(err));
    }
    return text;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: not enough memory to load it", path));
  }
}

}  // namespace devmem
