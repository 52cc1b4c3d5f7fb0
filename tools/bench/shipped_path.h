// tools/bench/shipped_path.h: what a program using devmem pays: the runtime's allocator
// for sim:0 with the runtime's observer attached (trace ring when configured, the
// /metrics size histogram), a site interned per allocation from 256 call sites in
// rotation, and the tensor layer on top.
//
// Every function takes the runtime's allocator (Runtime::Get().allocator(sim:0), after
// Runtime::Init with SimConfig) so that what is timed is what ships, thread caches and
// all once they exist. Figures are medians of kRepetitions passes after a warm-up.
//
// Thread-safety: call from one thread at a time (MeasureThreads2 starts its own).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"

namespace devmem::devbench {

struct ShippedPairFigures {
  double devmem_ns = 0;                  // tcache_pair_ns
  std::optional<double> mimalloc_ns;     // absent when built without mimalloc
  double jemalloc_ns = 0;
  std::optional<double> instructions;    // per pair, absent without perf counters
  std::string instructions_note;         // why absent
  int64_t timed_segment_allocs = 0;
};

// `sizes` through `alloc` (sites from Sites() in rotation), mimalloc and jemalloc,
// interleaved per pass.
ShippedPairFigures MeasureShippedPairs(CachingAllocator& alloc, const std::vector<size_t>& sizes);

struct ThreadsFigures {
  double one_thread_pairs_per_s = 0;
  double two_threads_pairs_per_s = 0;  // aggregate
  double speedup = 0;                  // two over one
  // Each worker's thread CPU time per pair, alone and beside the other (the mean of
  // the two): their ratio is what sharing costs a thread while both run at once, a
  // figure that machine load dilutes (time the threads do not overlap) but does not
  // inflate the way it does wall-clock throughput.
  double one_thread_cpu_ns_per_pair = 0;
  double two_threads_cpu_ns_per_pair = 0;
  int64_t timed_segment_allocs = 0;
};

// Aggregate throughput of two threads, each with its own size stream (`a`, `b`) on
// `alloc`'s default stream, over that of one thread running `a`. The two threads are
// started once and keep their caches across passes (warm, as a program's threads).
ThreadsFigures MeasureThreads2(CachingAllocator& alloc, const std::vector<size_t>& a,
                               const std::vector<size_t>& b);

// ns to create and destroy `empty({64})` on sim:0 through the tensor layer.
double MeasureTensorCreateNs();

// ns per InternSite of a known site, 256 sites in rotation.
double MeasureIntern256Ns();

}  // namespace devmem::devbench
