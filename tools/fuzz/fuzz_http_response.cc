// tools/fuzz/fuzz_http_response.cc: libFuzzer target for memtrace's HTTP response parser
// (ParseHttpResponse, tools/http/http_get.h), fed the bytes a server could send before
// closing: errors, never crashes, and what it accepts has a three-digit status and a
// body no longer than the input.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tools/http/http_get.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<devmem::memtrace::HttpResponse> r =
      devmem::memtrace::ParseHttpResponse(std::string(reinterpret_cast<const char*>(data), size));
  if (r.ok() && (r->status < 100 || r->status > 999 || r->body.size() > size)) __builtin_trap();
  return 0;
}
