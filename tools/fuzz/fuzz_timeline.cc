// tools/fuzz/fuzz_timeline.cc: libFuzzer target for memtrace timeline's trace reader
// and drawing (BuildTimeline, TimelineSvg, TimelineHtml): errors, never crashes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tools/timeline/timeline.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  devmem::TimelineOptions options;
  options.max_points = 16;
  absl::StatusOr<devmem::Timeline> t = devmem::BuildTimeline(text, "fuzz", options);
  if (t.ok()) {
    devmem::TimelineSvg(*t, "fuzz");
    devmem::TimelineHtml(*t, "fuzz");
  }
  return 0;
}
