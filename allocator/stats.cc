// allocator/stats.cc: DeviceStats as a readable table, in the shape of
// torch.cuda.memory_summary() so that PyTorch users find each figure where they expect
// it. Pure formatting; thread-safe (works on a copy the caller owns).
#include "allocator/stats.h"

#include <limits>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/config.h"

namespace devmem {
namespace {

constexpr int kMetricWidth = 27;
constexpr int kValueWidth = 12;
constexpr int kTableWidth = kMetricWidth + 2 + 4 * (kValueWidth + 1);  // one row

std::string Rule(char c) {
  return absl::StrCat("|", std::string(kTableWidth - 2, c), "|\n");
}

// Stats are never negative when the allocator is correct; print a sign anyway rather
// than a huge unsigned number, so that a bug is visible.
std::string Bytes(int64_t v) {
  if (v < 0) return absl::StrCat("-", FormatBytes(static_cast<size_t>(-v)));
  return FormatBytes(static_cast<size_t>(v));
}
std::string Count(int64_t v) { return absl::StrCat(v); }

void AppendRow(std::string* out, std::string_view metric, const Stat& s,
               std::string (*format)(int64_t)) {
  absl::StrAppendFormat(out, "| %-*s|%*s |%*s |%*s |%*s |\n", kMetricWidth - 1, metric,
                        kValueWidth - 1, format(s.current), kValueWidth - 1,
                        format(s.peak), kValueWidth - 1, format(s.allocated),
                        kValueWidth - 1, format(s.freed));
}

void AppendStat(std::string* out, std::string_view metric, const StatArray& stat,
                std::string (*format)(int64_t)) {
  AppendRow(out, metric, stat[kAggregatePool], format);
  AppendRow(out, "      from large pool", stat[kLargePool], format);
  AppendRow(out, "      from small pool", stat[kSmallPool], format);
  *out += Rule('-');
}

void AppendPair(std::string* out, absl::string_view left, int64_t left_value,
                absl::string_view right, int64_t right_value) {
  const int half = (kTableWidth - 3) / 2;
  std::string l = absl::StrCat(left, ": ", left_value);
  std::string r = absl::StrCat(right, ": ", right_value);
  absl::StrAppendFormat(out, "| %-*s| %-*s|\n", half - 1, l, kTableWidth - 3 - half - 1,
                        r);
}

}  // namespace

std::string DeviceStats::ToString() const {
  std::string out;
  out += Rule('=');
  absl::StrAppendFormat(&out, "|%s|\n",
                        std::string((kTableWidth - 2 - 21) / 2, ' ') +
                            "devmem memory summary" +
                            std::string(kTableWidth - 2 - 21 - (kTableWidth - 2 - 21) / 2,
                                        ' '));
  out += Rule('-');
  AppendPair(&out, "OOMs", num_ooms, "alloc retries", num_alloc_retries);
  std::string max_split =
      max_split_size == std::numeric_limits<int64_t>::max() || max_split_size <= 0
          ? std::string("none")
          : Bytes(max_split_size);
  absl::StrAppendFormat(&out, "| %-*s|\n", kTableWidth - 3,
                        absl::StrCat("max_split_size: ", max_split));
  out += Rule('=');
  absl::StrAppendFormat(&out, "| %-*s|%*s |%*s |%*s |%*s |\n", kMetricWidth - 1, "Metric",
                        kValueWidth - 1, "Cur Usage", kValueWidth - 1, "Peak Usage",
                        kValueWidth - 1, "Tot Alloc", kValueWidth - 1, "Tot Freed");
  out += Rule('-');
  AppendStat(&out, "Allocated memory", allocated_bytes, Bytes);
  AppendStat(&out, "Active memory", active_bytes, Bytes);
  AppendStat(&out, "Requested memory", requested_bytes, Bytes);
  AppendStat(&out, "Reserved memory", reserved_bytes, Bytes);
  AppendStat(&out, "Inactive split memory", inactive_split_bytes, Bytes);
  AppendStat(&out, "Pending memory", pending_bytes, Bytes);
  AppendStat(&out, "Thread-cached memory", thread_cached_bytes, Bytes);
  AppendStat(&out, "Allocations", allocation, Count);
  AppendStat(&out, "Active allocs", active, Count);
  AppendStat(&out, "Reserved segments", segment, Count);
  AppendStat(&out, "Inactive split blocks", inactive_split, Count);
  AppendRow(&out, "Oversize allocations", oversize_allocations, Count);
  AppendRow(&out, "Oversize segments", oversize_segments, Count);
  out += Rule('=');
  AppendPair(&out, "device allocs", num_device_alloc, "device frees", num_device_free);
  AppendPair(&out, "cache hits", cache_hits, "cache misses", cache_misses);
  AppendPair(&out, "user frees", num_frees, "syncs of all streams", num_sync_all_streams);
  absl::StrAppendFormat(&out, "| %-*s|\n", kTableWidth - 3,
                        absl::StrCat("cached (reserved - active): ",
                                     Bytes(cached_bytes())));
  // Driver calls: only the kinds this device made, and their time.
  std::string calls;
  for (int i = 0; i < kNumDriverCalls; ++i) {
    if (driver.calls[i] == 0) continue;
    absl::StrAppend(&calls, calls.empty() ? "" : ", ",
                    std::string(DriverCallName(static_cast<DriverCall>(i))), " ",
                    driver.calls[i]);
  }
  if (!calls.empty()) {
    absl::StrAppendFormat(&out, "| %-*s|\n", kTableWidth - 3,
                          absl::StrFormat("driver calls (%.1f ms): %s",
                                          static_cast<double>(driver.total_ns()) / 1e6,
                                          calls));
  }
  out += Rule('=');
  return out;
}

}  // namespace devmem
