// runtime/metrics.cc: turns the allocators' own counters into Prometheus families.
//
// One Collect() takes, per allocator, one stats() copy (its counters, the free-block
// summary included: no walk over blocks) and one site_stats() copy, each one short
// lock acquisition; memory and device info come from the backend outside the lock.
// Every family is then built from those copies without holding any lock.
#include "runtime/metrics.h"

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"
#include "prometheus/text_serializer.h"
#include "runtime/metrics_arena.h"

namespace devmem {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

constexpr const char* kPoolNames[] = {"", "small", "large"};
constexpr StatPool kPools[] = {kSmallPool, kLargePool};
constexpr SiteKind kCopyKinds[] = {SiteKind::kClone, SiteKind::kContiguous,
                                   SiteKind::kToDevice};

// Appends the UTF-8 encoding of U+FFFD (the replacement character).
void AppendReplacement(std::string* out) { out->append("\xEF\xBF\xBD"); }

// Length of the valid UTF-8 sequence starting at s[i], or 0 if it is not one.
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t min = 0;
  uint32_t cp = 0;
  if ((c & 0xE0) == 0xC0) { n = 2; min = 0x80; cp = c & 0x1F; }
  else if ((c & 0xF0) == 0xE0) { n = 3; min = 0x800; cp = c & 0x0F; }
  else if ((c & 0xF8) == 0xF0) { n = 4; min = 0x10000; cp = c & 0x07; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not valid UTF-8.
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

// Splits `text` (valid UTF-8) into its characters' byte offsets: starts[k] is where
// character k begins.
std::vector<size_t> CharStarts(std::string_view text) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < text.size(); i += Utf8SequenceLength(text, i)) starts.push_back(i);
  return starts;
}

std::string Pool(StatPool pool) { return kPoolNames[pool]; }

// Builds one family; keeps the code below one line per series.
class Family {
 public:
  Family(std::string name, MetricType type, std::string help) {
    family_.name = std::move(name);
    family_.type = type;
    family_.help = std::move(help);
  }
  void Add(Labels labels, double value) {
    ClientMetric& m = family_.metric.emplace_back();
    m.label = std::move(labels);
    if (family_.type == MetricType::Counter) {
      m.counter.value = value;
    } else {
      m.gauge.value = value;
    }
  }
  ClientMetric& AddRaw(Labels labels) {
    ClientMetric& m = family_.metric.emplace_back();
    m.label = std::move(labels);
    return m;
  }
  MetricFamily Take() { return std::move(family_); }

 private:
  MetricFamily family_;
};

// Everything read from one allocator for one scrape.
struct DeviceReading {
  std::string device;  // label value
  DeviceId id;
  DeviceStats stats;
  MemInfo mem_info;
  DeviceInfo info;
  std::vector<SiteStats> sites;
};

DeviceReading Read(const CachingAllocator& allocator) {
  DeviceReading r;
  r.id = allocator.device();
  r.device = SanitizeLabelValue(r.id.ToString());
  r.stats = allocator.stats();
  r.sites = allocator.site_stats();
  // Driver calls, made without the device lock (a Backend is thread-safe).
  r.mem_info = allocator.backend().mem_info();
  r.info = allocator.backend().info();
  return r;
}

double D(int64_t v) { return static_cast<double>(v); }
double D(size_t v) { return static_cast<double>(v); }

std::string SiteLabel(SiteId id) { return SanitizeLabelValue(GetSite(id).ToString()); }

}  // namespace

std::string SanitizeLabelValue(std::string_view value, size_t max_bytes) {
  std::string clean;
  clean.reserve(value.size());
  for (size_t i = 0; i < value.size();) {
    const size_t n = Utf8SequenceLength(value, i);
    if (n == 0) {
      AppendReplacement(&clean);
      ++i;
      continue;
    }
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (n == 1 && (c < 0x20 || c == 0x7F)) {
      clean.push_back(' ');
    } else {
      clean.append(value.substr(i, n));
    }
    i += n;
  }
  if (clean.size() <= max_bytes) return clean;
  // Keep the head and the tail (file names differ at the end, "...:120 (clone)" is the
  // most telling part), cut on character boundaries.
  constexpr std::string_view kEllipsis = "...";
  const size_t budget = max_bytes - kEllipsis.size();
  const std::vector<size_t> starts = CharStarts(clean);
  size_t head = 0;  // bytes of whole characters within budget / 2
  for (size_t s : starts) {
    if (s > budget / 2) break;
    head = s;
  }
  size_t tail = clean.size();  // start of the tail: whole characters, within the rest
  for (auto it = starts.rbegin(); it != starts.rend(); ++it) {
    if (clean.size() - *it > budget - head) break;
    tail = *it;
  }
  return clean.substr(0, head) + std::string(kEllipsis) + clean.substr(tail);
}

MetricsCollector::MetricsCollector(AllocatorSource allocators, MetricsOptions options)
    : allocators_(std::move(allocators)), options_(options) {
  options_.site_top_k = std::clamp(options_.site_top_k, 1, 1000);
}

MetricsCollector::~MetricsCollector() = default;

std::vector<SiteId> MetricsCollector::LabelledCopySites(
    DeviceId device, const std::vector<SiteId>& largest_first) const {
  MutexLock lock(&mu_);
  std::vector<SiteId>& chosen = copy_sites_[device];
  for (SiteId id : largest_first) {
    if (chosen.size() >= static_cast<size_t>(options_.site_top_k)) break;
    if (std::find(chosen.begin(), chosen.end(), id) == chosen.end()) chosen.push_back(id);
  }
  return chosen;
}

std::vector<MetricFamily> MetricsCollector::Collect() const {
  std::vector<DeviceReading> readings;
  for (const std::shared_ptr<CachingAllocator>& a : allocators_()) {
    if (a != nullptr) readings.push_back(Read(*a));
  }
  std::vector<MetricFamily> out;

  // --- per device and pool: gauges ------------------------------------------------
  struct PoolGauge {
    const char* name;
    const char* help;
    double (*value)(const DeviceReading&, StatPool);
  };
  const PoolGauge pool_gauges[] = {
      {"devmem_allocated_bytes", "Bytes of blocks handed to the program and not yet freed.",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.allocated_bytes[p].current); }},
      {"devmem_reserved_bytes", "Bytes of segments held from the driver.",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.reserved_bytes[p].current); }},
      {"devmem_active_bytes",
       "Bytes of allocated blocks plus blocks freed by the program that still wait for "
       "other streams (pending).",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.active_bytes[p].current); }},
      {"devmem_cached_bytes",
       "Reserved minus allocated bytes: free cached blocks (in the free sets and in "
       "per-thread caches) plus pending frees (the allocator's "
       "DeviceStats::cached_bytes() is reserved minus active; subtract "
       "devmem_pending_bytes for it).",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.reserved_bytes[p].current -
                  r.stats.allocated_bytes[p].current); }},
      {"devmem_pending_bytes",
       "Bytes freed by the program that wait for events on other streams before reuse.",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.pending_bytes[p].current); }},
      {"devmem_thread_cached_bytes",
       "Bytes of free blocks held in per-thread caches (small pool only): neither "
       "allocated nor in the free sets; drained on thread exit, empty_cache, trim and "
       "the OOM retry.",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.thread_cached_bytes[p].current); }},
      {"devmem_thread_cached_blocks", "Free blocks held in per-thread caches.",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.thread_cached[p].current); }},
      {"devmem_requested_bytes",
       "Bytes the program asked for (before rounding) of the allocated blocks.",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.requested_bytes[p].current); }},
      {"devmem_inactive_split_bytes",
       "Bytes of free blocks inside split segments (a measure of fragmentation).",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.inactive_split_bytes[p].current); }},
      {"devmem_live_buffers", "Allocated blocks (buffers the program holds).",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.allocation[p].current); }},
      {"devmem_segments", "Segments held from the driver.",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.segment[p].current); }},
      {"devmem_free_bytes",
       "Bytes of free blocks in the free sets, ready to be handed out to any thread "
       "(cached minus pending minus thread-cached).",
       [](const DeviceReading& r, StatPool p) { return D(r.stats.free_bytes[p]); }},
      {"devmem_free_blocks", "Free cached blocks.",
       [](const DeviceReading& r, StatPool p) { return D(r.stats.free_blocks[p]); }},
      {"devmem_largest_free_block_bytes",
       "Size of the largest free cached block (any stream).",
       [](const DeviceReading& r, StatPool p) { return D(r.stats.largest_free_block[p]); }},
      {"devmem_fragmentation_ratio",
       "1 - largest free block / total free cached bytes (0 when nothing is free).",
       [](const DeviceReading& r, StatPool p) {
         return r.stats.free_bytes[p] == 0
                    ? 0.0
                    : 1.0 - D(r.stats.largest_free_block[p]) / D(r.stats.free_bytes[p]); }},
  };
  for (const PoolGauge& g : pool_gauges) {
    Family f(g.name, MetricType::Gauge, g.help);
    for (const DeviceReading& r : readings) {
      for (StatPool p : kPools) f.Add({{"device", r.device}, {"pool", Pool(p)}}, g.value(r, p));
    }
    out.push_back(f.Take());
  }

  // --- per device and pool: counters ----------------------------------------------
  struct PoolCounter {
    const char* name;
    const char* help;
    double (*value)(const DeviceReading&, StatPool);
  };
  const PoolCounter pool_counters[] = {
      {"devmem_allocations_total", "Blocks handed to the program.",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.allocation[p].allocated); }},
      {"devmem_frees_total", "Blocks freed by the program.",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.allocation[p].freed); }},
      {"devmem_allocated_bytes_total", "Bytes of all blocks handed to the program.",
       [](const DeviceReading& r, StatPool p) {
         return D(r.stats.allocated_bytes[p].allocated); }},
  };
  for (const PoolCounter& c : pool_counters) {
    Family f(c.name, MetricType::Counter, c.help);
    for (const DeviceReading& r : readings) {
      for (StatPool p : kPools) f.Add({{"device", r.device}, {"pool", Pool(p)}}, c.value(r, p));
    }
    out.push_back(f.Take());
  }

  // --- per device only ------------------------------------------------------------
  struct DeviceValue {
    const char* name;
    MetricType type;
    const char* help;
    double (*value)(const DeviceReading&);
  };
  const DeviceValue device_values[] = {
      {"devmem_peak_allocated_bytes", MetricType::Gauge,
       "Highest devmem_allocated_bytes (both pools together) since start or the last "
       "peak reset.",
       [](const DeviceReading& r) {
         return D(r.stats.allocated_bytes[kAggregatePool].peak); }},
      {"devmem_peak_reserved_bytes", MetricType::Gauge,
       "Highest devmem_reserved_bytes (both pools together) since start or the last "
       "peak reset.",
       [](const DeviceReading& r) {
         return D(r.stats.reserved_bytes[kAggregatePool].peak); }},
      {"devmem_device_total_bytes", MetricType::Gauge,
       "Device memory in total, as the driver reports it.",
       [](const DeviceReading& r) { return D(r.mem_info.total_bytes); }},
      {"devmem_device_free_bytes", MetricType::Gauge,
       "Device memory free, as the driver reports it (other processes' use included).",
       [](const DeviceReading& r) { return D(r.mem_info.free_bytes); }},
      {"devmem_device_allocations_total", MetricType::Counter,
       "Segments taken from the driver (cudaMalloc, or a map of an expandable segment).",
       [](const DeviceReading& r) { return D(r.stats.num_device_alloc); }},
      {"devmem_device_frees_total", MetricType::Counter,
       "Segments returned to the driver (cudaFree, or an unmap of an expandable segment).",
       [](const DeviceReading& r) { return D(r.stats.num_device_free); }},
      {"devmem_cache_hits_total", MetricType::Counter,
       "Allocations served from cached blocks.",
       [](const DeviceReading& r) { return D(r.stats.cache_hits); }},
      {"devmem_cache_misses_total", MetricType::Counter,
       "Allocations that needed a new segment.",
       [](const DeviceReading& r) { return D(r.stats.cache_misses); }},
      {"devmem_alloc_retries_total", MetricType::Counter,
       "Times the caches were flushed to retry a failed segment allocation.",
       [](const DeviceReading& r) { return D(r.stats.num_alloc_retries); }},
      {"devmem_ooms_total", MetricType::Counter,
       "Out-of-memory errors thrown after the staged retry.",
       [](const DeviceReading& r) { return D(r.stats.num_ooms); }},
  };
  for (const DeviceValue& v : device_values) {
    Family f(v.name, v.type, v.help);
    for (const DeviceReading& r : readings) f.Add({{"device", r.device}}, v.value(r));
    out.push_back(f.Take());
  }

  // Private pools (CUDA graphs): one series per device and kind, whatever the number of
  // pools (their ids would be an unbounded label).
  {
    Family bytes("devmem_private_pool_bytes", MetricType::Gauge,
                 "Bytes of private pools (CUDA graphs): kind=\"reserved\" their segments, "
                 "kind=\"allocated\" their allocated blocks (both inside "
                 "devmem_reserved_bytes and devmem_allocated_bytes).");
    Family pools("devmem_private_pools", MetricType::Gauge,
                 "Private pools (CUDA graphs) that hold memory or are being allocated to.");
    for (const DeviceReading& r : readings) {
      bytes.Add({{"device", r.device}, {"kind", "reserved"}}, D(r.stats.private_reserved_bytes));
      bytes.Add({{"device", r.device}, {"kind", "allocated"}},
                D(r.stats.private_allocated_bytes));
      pools.Add({{"device", r.device}}, D(r.stats.private_pools));
    }
    out.push_back(bytes.Take());
    out.push_back(pools.Take());
  }

  {  // Driver calls by kind (allocator/driver_calls.h): `call` is a fixed, small set.
    Family calls("devmem_driver_calls_total", MetricType::Counter,
                 "Driver calls the backend made, by kind (call: malloc, free, "
                 "address_reserve, address_free, create, release, map, unmap, "
                 "set_access, export, import).");
    Family seconds("devmem_driver_seconds_total", MetricType::Counter,
                   "Time in those driver calls: measured on cuda, the driver cost "
                   "model's estimate on sim (never slept).");
    Family reserve("devmem_handle_reserve_bytes", MetricType::Gauge,
                   "Unmapped physical memory the backend keeps for the next map "
                   "(device memory still held; released by trim and empty_cache).");
    for (const DeviceReading& r : readings) {
      for (int i = 0; i < kNumDriverCalls; ++i) {
        Labels labels = {{"device", r.device},
                         {"call", std::string(DriverCallName(static_cast<DriverCall>(i)))}};
        calls.Add(labels, D(r.stats.driver.calls[i]));
        seconds.Add(std::move(labels), D(r.stats.driver.ns[i]) / 1e9);
      }
      reserve.Add({{"device", r.device}}, D(r.stats.driver.handle_reserve_bytes));
    }
    out.push_back(calls.Take());
    out.push_back(seconds.Take());
    out.push_back(reserve.Take());
  }

  {
    Family f("devmem_device_info", MetricType::Gauge,
             "Always 1; labels describe the device (join with dcgm-exporter on uuid).");
    for (const DeviceReading& r : readings) {
      f.Add({{"device", r.device},
             {"uuid", SanitizeLabelValue(r.info.uuid)},
             {"name", SanitizeLabelValue(r.info.name)},
             {"backend", SanitizeLabelValue(r.info.backend)}},
            1);
    }
    out.push_back(f.Take());
  }

  // --- per site ---------------------------------------------------------------------
  const size_t k = static_cast<size_t>(options_.site_top_k);
  {
    Family bytes("devmem_site_live_bytes", MetricType::Gauge,
                 "Live bytes allocated from a call site: the top site_top_k sites by "
                 "live bytes per device, the rest summed as site=\"other\".");
    Family buffers("devmem_site_live_buffers", MetricType::Gauge,
                   "Live blocks allocated from a call site (same sites as "
                   "devmem_site_live_bytes).");
    for (const DeviceReading& r : readings) {
      std::vector<std::pair<int64_t, SiteId>> live;
      for (size_t id = 0; id < r.sites.size(); ++id) {
        if (r.sites[id].live_count > 0) {
          live.emplace_back(r.sites[id].live_bytes, static_cast<SiteId>(id));
        }
      }
      std::sort(live.begin(), live.end(), [](const auto& a, const auto& b) {
        return a.first != b.first ? a.first > b.first : a.second < b.second;
      });
      // Sites whose descriptions read the same (one line, two columns) share a label.
      std::map<std::string, std::pair<int64_t, int64_t>> by_label;
      std::pair<int64_t, int64_t> other{0, 0};
      for (size_t i = 0; i < live.size(); ++i) {
        const SiteStats& s = r.sites[live[i].second];
        auto& slot = i < k ? by_label[SiteLabel(live[i].second)] : other;
        slot.first += s.live_bytes;
        slot.second += s.live_count;
      }
      by_label[kOtherSiteLabel] = other;
      for (const auto& [label, v] : by_label) {
        bytes.Add({{"device", r.device}, {"site", label}}, D(v.first));
        buffers.Add({{"device", r.device}, {"site", label}}, D(v.second));
      }
    }
    out.push_back(bytes.Take());
    out.push_back(buffers.Take());
  }
  {
    Family count("devmem_clones_total", MetricType::Counter,
                 "Explicit copies (kind clone, contiguous or to_device) made at a call "
                 "site: the first site_top_k copy sites per device (largest first), the "
                 "rest summed as site=\"other\".");
    Family bytes("devmem_clone_bytes_total", MetricType::Counter,
                 "Bytes allocated by explicit copies at a call site (same sites as "
                 "devmem_clones_total).");
    for (const DeviceReading& r : readings) {
      struct CopySite {
        SiteId id;
        SiteInfo info;
        const SiteStats* stats;
      };
      std::vector<CopySite> copies;
      for (size_t id = 1; id < r.sites.size(); ++id) {
        if (r.sites[id].total_count == 0) continue;
        SiteInfo info = GetSite(static_cast<SiteId>(id));
        if (IsCopyKind(info.kind)) {
          copies.push_back({static_cast<SiteId>(id), std::move(info), &r.sites[id]});
        }
      }
      std::sort(copies.begin(), copies.end(), [](const CopySite& a, const CopySite& b) {
        return a.stats->total_bytes != b.stats->total_bytes
                   ? a.stats->total_bytes > b.stats->total_bytes
                   : a.id < b.id;
      });
      std::vector<SiteId> largest_first;
      for (const CopySite& c : copies) largest_first.push_back(c.id);
      const std::vector<SiteId> chosen_list = LabelledCopySites(r.id, largest_first);
      const absl::flat_hash_set<SiteId> chosen(chosen_list.begin(), chosen_list.end());
      // (site label, kind) -> (count, bytes); "other" always present, per kind.
      std::map<std::pair<std::string, SiteKind>, std::pair<int64_t, int64_t>> series;
      for (SiteKind kind : kCopyKinds) series[{kOtherSiteLabel, kind}] = {0, 0};
      for (const CopySite& c : copies) {
        auto& v = series[{chosen.contains(c.id) ? SanitizeLabelValue(c.info.ToString())
                                                : std::string(kOtherSiteLabel),
                          c.info.kind}];
        v.first += c.stats->total_count;
        v.second += c.stats->total_bytes;
      }
      for (const auto& [key, v] : series) {
        Labels labels = {{"device", r.device},
                         {"site", key.first},
                         {"kind", std::string(SiteKindName(key.second))}};
        count.Add(labels, D(v.first));
        bytes.Add(std::move(labels), D(v.second));
      }
    }
    out.push_back(count.Take());
    out.push_back(bytes.Take());
  }

  // --- allocation sizes -------------------------------------------------------------
  if (options_.sizes != nullptr) {
    Family f("devmem_allocation_size_bytes", MetricType::Histogram,
             "Sizes the program asked for (before rounding), in power-of-two buckets.");
    const std::vector<SizeHistogram::Counts> counts = options_.sizes->counts();
    for (const DeviceReading& r : readings) {
      // Every reported device gets a histogram, empty if it allocated nothing yet.
      SizeHistogram::Counts c;
      for (const SizeHistogram::Counts& x : counts) {
        if (x.device == r.id) c = x;
      }
      ClientMetric& m = f.AddRaw({{"device", r.device}});
      uint64_t cumulative = 0;
      for (int i = 0; i < SizeHistogram::kNumFiniteBuckets; ++i) {
        cumulative += c.buckets[i];
        m.histogram.bucket.push_back(
            {cumulative, static_cast<double>(SizeHistogram::UpperBound(i))});
      }
      cumulative += c.buckets[SizeHistogram::kNumFiniteBuckets];
      m.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
      m.histogram.sample_count = cumulative;
      m.histogram.sample_sum = static_cast<double>(c.sum_bytes);
    }
    out.push_back(f.Take());
  }
  AppendArenaFamilies(allocators_(), &out);  // devmem_arena_* (metrics_arena.cc)
  return out;
}

std::string MetricsCollector::Text() const {
  std::ostringstream text;
  prometheus::TextSerializer().Serialize(text, Collect());
  return text.str();
}

}  // namespace devmem
