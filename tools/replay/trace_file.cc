// tools/replay/trace_file.cc: plain or gzip-compressed trace files into one padded buffer
// (tools/replay/trace_file.h).
#include "tools/replay/trace_file.h"

#include <sys/stat.h>
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

// Decompressed bytes a trace may have per compressed byte, beyond kInflateSlackBytes.
// JSON Lines traces compress 5-20x (the real ones in tests/data/traces/real/ about
// 9.5x); deflate's ceiling is about 1032x, which only input made to expand reaches (a
// "gzip bomb"), and it would take all memory before std::bad_alloc could say so.
constexpr size_t kMaxInflateRatio = 200;
constexpr size_t kInflateSlackBytes = size_t{64} << 20;

// The ISIZE field of the last gzip member: the decompressed size mod 2^32 of a file
// with one member, which is what gzip writes. Only a hint (a file may hold several
// members, or lie): it sizes the first buffer, never the bound.
size_t GzipSizeHint(std::FILE* f) {
  unsigned char b[4];
  if (std::fseek(f, -4, SEEK_END) != 0 || std::fread(b, 1, 4, f) != 4) return 0;
  std::rewind(f);
  return size_t{b[0]} | size_t{b[1]} << 8 | size_t{b[2]} << 16 | size_t{b[3]} << 24;
}

// Inflates straight into the padded buffer the parser needs, sized from the ISIZE
// hint, so a file gzip wrote costs its decompressed size once; a buffer that fills
// before the data ends grows by doubling (one copy each time), one too large is cut to
// size at the end (one copy).
absl::StatusOr<simdjson::padded_string> Inflate(const std::string& path, std::FILE* f) {
  struct stat st {};
  const size_t compressed =
      fstat(fileno(f), &st) == 0 && st.st_size > 0 ? static_cast<size_t>(st.st_size) : 0;
  const size_t limit = compressed * kMaxInflateRatio + kInflateSlackBytes;
  z_stream z{};
  // 16 + MAX_WBITS: gzip framing. Members that follow one another are read in turn
  // (what `cat a.gz b.gz` makes).
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
    return absl::InternalError(absl::StrFormat("%s: zlib initialisation failed", path));
  }
  std::unique_ptr<z_stream, int (*)(z_stream*)> end(&z, &inflateEnd);
  std::vector<unsigned char> in(size_t{1} << 16);
  simdjson::padded_string out(std::clamp<size_t>(GzipSizeHint(f), size_t{1} << 16, limit));
  if (out.data() == nullptr) throw std::bad_alloc();
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
    if (used > limit) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s: decompresses to more than %d bytes (%dx its %d compressed bytes, plus "
          "64 MiB): refused as a likely gzip bomb; if it is a real trace, decompress it "
          "first (gunzip)",
          path, limit, kMaxInflateRatio, compressed));
    }
    if (used == out.size()) {
      simdjson::padded_string bigger(std::min(out.size() * 2, limit + (size_t{1} << 16)));
      if (bigger.data() == nullptr) throw std::bad_alloc();
      std::memcpy(bigger.data(), out.data(), used);
      out = std::move(bigger);
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
  if (used == out.size()) return out;
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
