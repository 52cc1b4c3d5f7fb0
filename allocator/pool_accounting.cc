// allocator/pool_accounting.cc: see pool_accounting.h.
#include "allocator/pool_accounting.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <tuple>

#include "absl/strings/str_format.h"
#include "allocator/site.h"

namespace devmem::internal {
namespace {

absl::Status Violation(const std::string& what) {
  return absl::InternalError("devmem validate(): " + what);
}

absl::Status CompareStat(const char* name, const StatArray& stat,
                         const StatRecount::PerPool& recount) {
  static constexpr const char* kPoolNames[] = {"all", "small", "large"};
  for (int p = 0; p < kNumStatPools; ++p) {
    if (stat[p].current != recount[p]) {
      return Violation(absl::StrFormat("stat %s[%s].current is %d but a recount gives %d",
                                       name, kPoolNames[p], stat[p].current, recount[p]));
    }
    if (stat[p].current != stat[p].allocated - stat[p].freed) {
      return Violation(absl::StrFormat(
          "stat %s[%s]: current %d != allocated %d - freed %d", name, kPoolNames[p],
          stat[p].current, stat[p].allocated, stat[p].freed));
    }
    if (stat[p].peak < stat[p].current) {
      return Violation(absl::StrFormat("stat %s[%s]: peak %d < current %d", name,
                                       kPoolNames[p], stat[p].peak, stat[p].current));
    }
  }
  return absl::OkStatus();
}

// Applies a window to the small pool's and the aggregate's entries of `a`. With
// `sign` +1 the stat follows the window's running total (allocated, active,
// requested); with -1 its negation (thread_cached). The peak moves to the window's
// highest point above the current value, as if each change had been applied in turn.
// A window applied with -1 must have been taken with WindowCounter::sub (its `lo`).
void ApplyWindow(StatArray& a, const WindowCounter& w, int sign) {
  const int64_t up = sign > 0 ? w.up : w.down;
  const int64_t down = sign > 0 ? w.down : w.up;
  const int64_t hi = sign > 0 ? w.hi : -w.lo;
  for (const int p : {static_cast<int>(kAggregatePool), static_cast<int>(kSmallPool)}) {
    Stat& s = a[p];
    const int64_t peak_at = s.current + hi;
    if (peak_at > s.peak) s.peak = peak_at;
    s.current += up - down;
    s.allocated += up;
    s.freed += down;
  }
}

}  // namespace

void PoolAccounting::fold_thread_cache(const CacheCounters& c) {
  ApplyWindow(stats_.allocated_bytes, c.bytes, +1);
  ApplyWindow(stats_.active_bytes, c.bytes, +1);
  ApplyWindow(stats_.thread_cached_bytes, c.bytes, -1);
  ApplyWindow(stats_.allocation, c.count, +1);
  ApplyWindow(stats_.active, c.count, +1);
  ApplyWindow(stats_.thread_cached, c.count, -1);
  ApplyWindow(stats_.requested_bytes, c.requested, +1);
  stats_.cache_hits += c.count.up;  // one block per hit (cache_counters.h)
  stats_.num_frees += c.count.down;
  for (const SiteId id : c.dirty) {
    const SiteWindow& w = c.sites[id];
    SiteStats& ss = site_stats_[id];
    ss.peak_live_bytes = std::max(ss.peak_live_bytes, ss.live_bytes + w.hi_bytes);
    ss.live_bytes += w.live_bytes;
    ss.live_count += w.live_count;
    ss.total_bytes += w.total_bytes;
    ss.total_count += w.total_count;
  }
}

PoolAccounting::PoolAccounting(DeviceId device, size_t max_split_size) : device_(device) {
  stats_.max_split_size = max_split_size >= static_cast<size_t>(INT64_MAX)
                              ? INT64_MAX
                              : static_cast<int64_t>(max_split_size);
}

void PoolAccounting::segment_allocated(const Segment* s) {
  IncreaseStat(stats_.segment, s->small_pool, 1);
  IncreaseStat(stats_.reserved_bytes, s->small_pool, static_cast<int64_t>(s->size));
  if (s->oversize) stats_.oversize_segments.increase(1);
  ++stats_.num_device_alloc;
  if (observer_ != nullptr) {
    observer_->on_event(AllocEvent{AllocAction::kSegmentAlloc, device_, s->stream, s->addr,
                                   s->size, 0, kUnknownSite, nullptr, &trace_order_});
  }
}

void PoolAccounting::segment_releasing(const Segment* s) {
  if (observer_ != nullptr) {
    observer_->on_event(AllocEvent{AllocAction::kSegmentFree, device_, s->stream, s->addr,
                                   s->size, 0, kUnknownSite, nullptr, &trace_order_});
  }
}

void PoolAccounting::segment_released(const Segment* s) {
  if (s->oversize) stats_.oversize_segments.decrease(1);
  ++stats_.num_device_free;
  DecreaseStat(stats_.segment, s->small_pool, 1);
  DecreaseStat(stats_.reserved_bytes, s->small_pool, static_cast<int64_t>(s->size));
}

void PoolAccounting::segment_release_undone(const Segment* s) {
  if (s->oversize) stats_.oversize_segments.increase(1);
  --stats_.num_device_free;
  IncreaseStat(stats_.segment, s->small_pool, 1);
  IncreaseStat(stats_.reserved_bytes, s->small_pool, static_cast<int64_t>(s->size));
}

void PoolAccounting::unmap_undone(bool small, size_t bytes) {
  IncreaseStat(stats_.reserved_bytes, small, static_cast<int64_t>(bytes));
  --stats_.num_device_free;
}

void PoolAccounting::mapped(const Reservation* r, uintptr_t at, size_t bytes) {
  IncreaseStat(stats_.reserved_bytes, r->small_pool, static_cast<int64_t>(bytes));
  ++stats_.num_device_alloc;
  if (observer_ != nullptr) {
    observer_->on_event(AllocEvent{AllocAction::kSegmentMap, device_, r->stream, at, bytes,
                                   0, kUnknownSite, nullptr, &trace_order_});
  }
}

void PoolAccounting::unmapping(const Segment* s, uintptr_t at, size_t bytes) {
  if (observer_ != nullptr) {
    observer_->on_event(AllocEvent{AllocAction::kSegmentUnmap, device_, s->stream, at,
                                   bytes, 0, kUnknownSite, nullptr, &trace_order_});
  }
}

void PoolAccounting::unmapped(const Segment* s, size_t bytes) {
  DecreaseStat(stats_.reserved_bytes, s->small_pool, static_cast<int64_t>(bytes));
  ++stats_.num_device_free;
}

void PoolAccounting::out_of_memory(Stream stream, size_t size, size_t requested,
                                   SiteId site) {
  ++stats_.num_ooms;
  if (observer_ != nullptr) {
    observer_->on_event(
        AllocEvent{AllocAction::kOom, device_, stream, 0, size, requested, site, nullptr,
                   &trace_order_});
  }
}

std::vector<SiteUsage> PoolAccounting::top_sites(size_t k) const {
  std::vector<SiteUsage> usage;
  for (size_t id = 0; id < site_stats_.size(); ++id) {
    const SiteStats& s = site_stats_[id];
    if (s.live_count > 0) {
      usage.push_back(SiteUsage{static_cast<SiteId>(id),
                                static_cast<size_t>(s.live_bytes),
                                static_cast<size_t>(s.live_count)});
    }
  }
  auto larger = [](const SiteUsage& a, const SiteUsage& b) {
    return a.live_bytes != b.live_bytes ? a.live_bytes > b.live_bytes : a.site < b.site;
  };
  if (usage.size() > k) {
    std::partial_sort(usage.begin(), usage.begin() + static_cast<ptrdiff_t>(k),
                      usage.end(), larger);
    usage.resize(k);
  } else {
    std::sort(usage.begin(), usage.end(), larger);
  }
  return usage;
}

size_t PoolAccounting::copy_bytes() const {
  size_t bytes = 0;
  for (size_t id = 1; id < site_stats_.size(); ++id) {
    if (site_stats_[id].live_bytes > 0 &&
        IsCopyKind(GetSite(static_cast<SiteId>(id)).kind)) {
      bytes += static_cast<size_t>(site_stats_[id].live_bytes);
    }
  }
  return bytes;
}

void PoolAccounting::reset_peak() {
  ForEachStat(stats_, [](Stat& s) { s.reset_peak(); });
  for (SiteStats& s : site_stats_) s.peak_live_bytes = s.live_bytes;
}

void PoolAccounting::reset_accumulated() {
  ForEachStat(stats_, [](Stat& s) { s.reset_accumulated(); });
  stats_.num_alloc_retries = stats_.num_ooms = stats_.num_device_alloc = 0;
  stats_.num_device_free = stats_.num_sync_all_streams = 0;
  stats_.cache_hits = stats_.cache_misses = stats_.num_frees = 0;
  for (SiteStats& s : site_stats_) {
    s.total_bytes = s.live_bytes;
    s.total_count = s.live_count;
  }
}

absl::Status PoolAccounting::validate(const StatRecount& rc) const {
  for (const auto& [name, stat, recount] :
       std::initializer_list<
           std::tuple<const char*, const StatArray*, const StatRecount::PerPool*>>{
           {"allocation", &stats_.allocation, &rc.allocation},
           {"allocated_bytes", &stats_.allocated_bytes, &rc.allocated_bytes},
           {"requested_bytes", &stats_.requested_bytes, &rc.requested_bytes},
           {"active", &stats_.active, &rc.active},
           {"active_bytes", &stats_.active_bytes, &rc.active_bytes},
           {"pending_bytes", &stats_.pending_bytes, &rc.pending_bytes},
           {"segment", &stats_.segment, &rc.segment},
           {"reserved_bytes", &stats_.reserved_bytes, &rc.reserved_bytes},
           {"inactive_split", &stats_.inactive_split, &rc.inactive_split},
           {"inactive_split_bytes", &stats_.inactive_split_bytes,
            &rc.inactive_split_bytes},
           {"thread_cached", &stats_.thread_cached, &rc.thread_cached},
           {"thread_cached_bytes", &stats_.thread_cached_bytes, &rc.thread_cached_bytes}}) {
    if (absl::Status st = CompareStat(name, *stat, *recount); !st.ok()) return st;
  }
  if (stats_.oversize_allocations.current != rc.oversize_allocations ||
      stats_.oversize_segments.current != rc.oversize_segments) {
    return Violation("oversize counters differ from a recount");
  }
  for (int p = 0; p < kNumStatPools; ++p) {
    if (rc.reserved_bytes[p] != rc.allocated_bytes[p] + rc.pending_bytes[p] +
                                    rc.free_bytes[p] + rc.thread_cached_bytes[p]) {
      return Violation(absl::StrFormat(
          "reserved %d != allocated %d + pending %d + cached %d + thread-cached %d "
          "(pool %d)",
          rc.reserved_bytes[p], rc.allocated_bytes[p], rc.pending_bytes[p],
          rc.free_bytes[p], rc.thread_cached_bytes[p], p));
    }
  }
  for (size_t id = 0; id < site_stats_.size(); ++id) {
    if (site_stats_[id].live_bytes != rc.sites[id].live_bytes ||
        site_stats_[id].live_count != rc.sites[id].live_count) {
      return Violation(absl::StrFormat(
          "site %u: live %d bytes in %d blocks, recount %d bytes in %d blocks", id,
          site_stats_[id].live_bytes, site_stats_[id].live_count, rc.sites[id].live_bytes,
          rc.sites[id].live_count));
    }
  }
  return absl::OkStatus();
}

}  // namespace devmem::internal
