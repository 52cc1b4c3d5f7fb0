// tools/fuzz/fuzz_trace.cc: libFuzzer target for the trace parser (ParseTrace) and,
// for small traces that parse, the replay through the allocator: malformed traces must
// give errors, never crashes, and any trace that parses must replay.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tools/replay/trace_replay.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<devmem::Trace> trace = devmem::ParseTrace(text, "fuzz");
  if (trace.ok() && trace->ops.size() <= 256) {
    // A small device, so that OOM paths (retry, cache flush) are reached too.
    devmem::Replay(*trace, devmem::Config{}, uint64_t{1} << 30);
  }
  return 0;
}
