// runtime/metrics.h: devmem's Prometheus metrics, read at scrape time.
//
// Example:
//   MetricsCollector metrics(
//       [] { return Runtime::Get().allocators(); },
//       {.site_top_k = 10, .sizes = &SizeHistogram::Process()});
//   std::string text = metrics.Text();   // the text exposition format, for /metrics
//   // or: registry.Register(std::weak_ptr<prometheus::Collectable>(...))
//
// A prometheus::Collectable that, on each Collect(), asks every allocator for its own
// counters (CachingAllocator::stats(), which includes the free-block summary, and
// site_stats() for the per-site figures; memory and device info from its backend) and
// turns them into metric families, never copying a block or a segment. Nothing
// is updated through prometheus-cpp on the allocation path: the only cost of metrics
// between scrapes is the allocator's own bookkeeping (and SizeHistogram's relaxed
// counters, when attached).
//
// Every family, its type, labels and help text is listed in docs/metrics.md. In short:
// names start with devmem_, values are in base units (bytes, ratios), counters end in
// _total; `device` is on every series; `pool` ("small" / "large") is on the figures the
// allocator keeps per pool; `site` is bounded per device to the K sites holding the
// most live bytes (K = Config::site_top_k) plus "other" for gauges, and to the first K
// copy sites seen (largest first), plus "other", for the copy counters: a counter's
// label set must not change meaning between scrapes, or `other` would go down when a
// site is promoted out of it, which Prometheus reads as a counter reset.
//
// Label values are valid UTF-8 (invalid bytes become U+FFFD), free of control
// characters, and at most kMaxLabelValueBytes long (longer ones keep their beginning
// and end around "..."), so a strange file name cannot break the exposition or blow
// up its size.
//
// Thread-safety: Collect() and Text() may run concurrently from any threads and with
// allocation. They take each allocator's device lock only inside stats() and
// site_stats() (copies of counters; mem_info() is called outside it), and the
// collector's own mutex (a leaf) only to update the
// copy-site label set, never while calling an allocator. Lock order: the collector's
// mutex is never held while any other lock is taken.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "allocator/caching_allocator.h"
#include "allocator/mutex.h"
#include "allocator/site.h"
#include "allocator/types.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "runtime/size_histogram.h"

namespace devmem {

inline constexpr size_t kMaxLabelValueBytes = 160;
// The site label value of everything outside the labelled set.
inline constexpr const char* kOtherSiteLabel = "other";
// "text/plain; version=0.0.4; charset=utf-8": what /metrics serves.
inline constexpr const char* kPrometheusTextContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// `value` made safe for a label value: valid UTF-8 (each invalid byte becomes U+FFFD),
// control characters replaced by ' ', and at most `max_bytes` bytes (cut on character
// boundaries, the middle replaced by "..."). max_bytes must be >= 16.
std::string SanitizeLabelValue(std::string_view value,
                               size_t max_bytes = kMaxLabelValueBytes);

struct MetricsOptions {
  // Sites labelled per device (Config::site_top_k); 1 .. 1000.
  int site_top_k = 10;
  // Source of devmem_allocation_size_bytes; nullptr leaves that family out.
  const SizeHistogram* sizes = nullptr;
};

class MetricsCollector : public prometheus::Collectable {
 public:
  // Returns the allocators to report, called once per Collect() (for the runtime:
  // Runtime::allocators()).
  using AllocatorSource = std::function<std::vector<std::shared_ptr<CachingAllocator>>()>;

  MetricsCollector(AllocatorSource allocators, MetricsOptions options);
  ~MetricsCollector() override;
  MetricsCollector(const MetricsCollector&) = delete;
  MetricsCollector& operator=(const MetricsCollector&) = delete;

  std::vector<prometheus::MetricFamily> Collect() const override;
  // Collect() in the Prometheus text exposition format (version 0.0.4).
  std::string Text() const;

 private:
  // The copy sites (clone, contiguous, to_device) that get their own `site` label on
  // `device`: chosen once, at most site_top_k, and then kept (see the file comment).
  // `largest_first` are this scrape's copy sites, most bytes first; the new ones fill
  // the free places in that order.
  std::vector<SiteId> LabelledCopySites(DeviceId device,
                                        const std::vector<SiteId>& largest_first) const;

  AllocatorSource allocators_;
  MetricsOptions options_;
  mutable Mutex mu_;
  mutable absl::flat_hash_map<DeviceId, std::vector<SiteId>> copy_sites_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace devmem
