// tools/bench/shipped_path.h: what a program using devmem pays: the runtime's allocator
// for sim:0 with the runtime's observer attached (trace ring when configured, the
// /metrics size histogram), a site interned per allocation from 256 call sites in
// rotation, and the tensor layer on top.
//
// Every function takes the runtime's allocator (Runtime::Get().allocator(sim:0), after
// Runtime::Init with SimConfig) so that what is timed is what ships, thread caches and
// all once they exist. Figures are medians of kRepetitions passes after a warm-up.
//
// Thread-safety: call from one thread at a time; ShippedOps from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/site.h"
#include "tools/bench/bench_util.h"

namespace devmem::devbench {

// The shipped path's pair: a site interned per allocation, request i from Sites()
// i % kNumSites (tools/bench/threads2.cc runs it on two threads).
struct ShippedOps {
  CachingAllocator& alloc;
  void* allocate(size_t n, size_t i) const {
    return alloc.allocate(n, {}, InternSite(Sites()[i % kNumSites], SiteKind::kAlloc));
  }
  void free(void* p) const { alloc.free(p); }
};

struct ShippedPairFigures {
  double devmem_ns = 0;                  // tcache_pair_ns
  std::optional<double> mimalloc_ns;     // absent when built without mimalloc
  double jemalloc_ns = 0;
  std::optional<double> instructions;    // per pair, absent without perf counters
  std::string instructions_note;         // why absent
  int64_t timed_segment_allocs = 0;
};

// `sizes` through `alloc` (sites from Sites() in rotation), mimalloc and jemalloc,
// alternating pass by pass (3 * kRepetitions passes each), each pass in the calling
// thread's CPU time (CpuTimePairs); each figure is the median of its passes.
ShippedPairFigures MeasureShippedPairs(CachingAllocator& alloc, const std::vector<size_t>& sizes);

// ns to create and destroy `empty({64})` on sim:0 through the tensor layer.
double MeasureTensorCreateNs();

// ns per InternSite of a known site, 256 sites in rotation.
double MeasureIntern256Ns();

}  // namespace devmem::devbench
