// runtime/metrics_arena.h: the devmem_arena_* families of MetricsCollector (an
// internal header of runtime/metrics.cc; docs/metrics.md lists the families).
//
// The `arena` label is the arena's name, bounded by the allocator itself
// (kMaxArenaNames per device, further names counted as "other"), so the label set
// stays small. Thread-safety: reads each allocator's arena_report() (its arenas'
// locks, never the device lock) and holds nothing else.
#pragma once

#include <memory>
#include <vector>

#include "allocator/caching_allocator.h"
#include "prometheus/metric_family.h"

namespace devmem {

void AppendArenaFamilies(const std::vector<std::shared_ptr<CachingAllocator>>& allocators,
                         std::vector<prometheus::MetricFamily>* out);

}  // namespace devmem
