// runtime/metrics_arena.cc: see metrics_arena.h.
#include "runtime/metrics_arena.h"

#include <string>
#include <utility>

#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"
#include "runtime/metrics.h"

namespace devmem {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

struct Reading {
  std::string device;  // label value
  ArenaReport report;
};

void Add(MetricFamily* f, std::vector<ClientMetric::Label> labels, int64_t value) {
  ClientMetric& m = f->metric.emplace_back();
  m.label = std::move(labels);
  if (f->type == MetricType::Counter) {
    m.counter.value = static_cast<double>(value);
  } else {
    m.gauge.value = static_cast<double>(value);
  }
}

}  // namespace

void AppendArenaFamilies(const std::vector<std::shared_ptr<CachingAllocator>>& allocators,
                         std::vector<MetricFamily>* out) {
  std::vector<Reading> readings;
  for (const auto& a : allocators) {
    if (a != nullptr) {
      readings.push_back({SanitizeLabelValue(a->device().ToString()), a->arena_report()});
    }
  }
  // Per device and arena name.
  struct PerArena {
    const char* name;
    MetricType type;
    const char* help;
    int64_t (*value)(const ArenaStats&);
  };
  const PerArena per_arena[] = {
      {"devmem_arena_live_bytes", MetricType::Gauge,
       "Bytes of live buffers in a scoped arena's chunks (escaped ones included).",
       [](const ArenaStats& s) { return s.live_bytes; }},
      {"devmem_arena_escaped_bytes", MetricType::Gauge,
       "Live bytes of arena buffers that outlived their scope (each pins its chunk).",
       [](const ArenaStats& s) { return s.escaped_bytes; }},
      {"devmem_arena_chunk_bytes", MetricType::Gauge,
       "Bytes of the chunks an arena holds: open scopes' chunks and chunks pinned by "
       "escaped buffers (retained empty chunks are devmem_arena_retained_bytes).",
       [](const ArenaStats& s) { return s.chunk_bytes; }},
      {"devmem_arena_open_scopes", MetricType::Gauge, "Open scopes of an arena name.",
       [](const ArenaStats& s) { return s.open_scopes; }},
      {"devmem_arena_scopes_total", MetricType::Counter, "Scopes of an arena name closed.",
       [](const ArenaStats& s) { return s.scopes_closed; }},
      {"devmem_arena_allocations_total", MetricType::Counter,
       "Allocations served by bumping in an arena (counted when their scope closes).",
       [](const ArenaStats& s) { return s.allocations; }},
      {"devmem_arena_allocated_bytes_total", MetricType::Counter,
       "Bytes bumped in an arena (counted when their scope closes).",
       [](const ArenaStats& s) { return s.bytes_allocated; }},
      {"devmem_arena_escapes_total", MetricType::Counter,
       "Buffers still alive when their arena scope closed.",
       [](const ArenaStats& s) { return s.escapes; }},
      {"devmem_arena_pool_chunks_total", MetricType::Counter,
       "Chunks an arena took from the pool (the rest of its chunks were reused).",
       [](const ArenaStats& s) { return s.pool_chunk_allocs; }},
      {"devmem_arena_spills_total", MetricType::Counter,
       "Requests an arena sent to the pool's normal path because its chunks' dead space "
       "exceeded the waste bound (arena_max_waste; counted when their scope closes).",
       [](const ArenaStats& s) { return s.spills; }},
  };
  for (const PerArena& p : per_arena) {
    MetricFamily f;
    f.name = p.name;
    f.type = p.type;
    f.help = p.help;
    for (const Reading& r : readings) {
      for (const ArenaStats& s : r.report.arenas) {
        Add(&f, {{"device", r.device}, {"arena", SanitizeLabelValue(s.name)}}, p.value(s));
      }
    }
    out->push_back(std::move(f));
  }
  // Per device.
  MetricFamily retained;
  retained.name = "devmem_arena_retained_bytes";
  retained.type = MetricType::Gauge;
  retained.help =
      "Bytes of empty arena chunks kept for the next scope (given back on empty_cache, "
      "trim and under memory pressure).";
  MetricFamily returned;
  returned.name = "devmem_arena_chunks_returned_total";
  returned.type = MetricType::Counter;
  returned.help = "Arena chunks given back to the pool.";
  for (const Reading& r : readings) {
    Add(&retained, {{"device", r.device}}, r.report.retained_bytes);
    Add(&returned, {{"device", r.device}}, r.report.chunks_returned);
  }
  out->push_back(std::move(retained));
  out->push_back(std::move(returned));
}

}  // namespace devmem
