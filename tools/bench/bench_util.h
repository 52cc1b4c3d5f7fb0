// tools/bench/bench_util.h: what every devmem-bench measurement shares: the size
// streams, the pair loop, medians, the sim configuration, the 256 call sites, and the
// alternating fastest-pass comparison of two observers.
//
// Thread-safety: every function may be called from any thread; TimePairs runs its
// callbacks on the calling thread only.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <source_location>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/observer.h"

namespace devmem::devbench {

inline constexpr int kRepetitions = 9;     // timed passes per figure; the median is kept
inline constexpr size_t kSizes = 1 << 14;  // alloc+free pairs per pass
inline constexpr size_t kLive = 8;         // allocations live at once in a pair loop
inline constexpr size_t kNumSites = 256;   // call sites the shipped path rotates over

// `n` sizes drawn log-uniformly from [lo, hi), seeded (the same seed, the same stream).
std::vector<size_t> LogUniformSizes(size_t lo, size_t hi, uint64_t seed, size_t n = kSizes);

double Median(std::vector<double> v);

// `base`'s policy keys with the bench's own backend: sim, with 1 TiB of address space
// (nothing is touched, nothing runs out).
Config SimConfig(const Config& base);

// kNumSites distinct source locations (one per instantiation of a template, so each has
// its own function name), built once.
const std::array<std::source_location, kNumSites>& Sites();

// The pair loop of TimePairs and CpuTimePairs, untimed.
template <typename Alloc, typename Free>
void RunPairs(const std::vector<size_t>& sizes, Alloc alloc, Free free_fn) {
  void* live[kLive] = {};
  size_t live_size[kLive] = {};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t slot = i % kLive;
    if (live[slot] != nullptr) free_fn(live[slot], live_size[slot]);
    live[slot] = alloc(sizes[i], i);
    live_size[slot] = sizes[i];
  }
  for (size_t slot = 0; slot < kLive; ++slot) {
    if (live[slot] != nullptr) free_fn(live[slot], live_size[slot]);
  }
}

// The calling thread's CPU time in ns (CLOCK_THREAD_CPUTIME_ID): a pass preempted on a
// shared machine does not count the time it waited.
int64_t ThreadCpuNs();

// Runs the size stream through alloc/free with a window of kLive live pointers (allocate
// the next, free the oldest, so the free lists hold real neighbours) and returns ns per
// alloc+free pair. alloc(bytes, i) gets the index of the request in the stream;
// free_fn(ptr, bytes) gets the size it was allocated with.
template <typename Alloc, typename Free>
double TimePairs(const std::vector<size_t>& sizes, Alloc alloc, Free free_fn) {
  const auto start = std::chrono::steady_clock::now();
  RunPairs(sizes, alloc, free_fn);
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(end - start).count() /
         static_cast<double>(sizes.size());
}

// Warm-up: runs `pass` until one allocates no segment (`segments()` counts them: the
// cache then holds what the size stream needs), at most kMaxWarmUpPasses times. One
// pass is not always enough: the free lists' layout after a pass depends on what the
// pass before it left, so a stream with large sizes may map a granule or two more in
// each of its first passes (expandable segments) before it settles.
inline constexpr int kMaxWarmUpPasses = 8;
template <typename Pass, typename Segments>
void WarmUp(Pass pass, Segments segments) {
  for (int i = 0; i < kMaxWarmUpPasses; ++i) {
    const int64_t before = segments();
    pass();
    if (segments() == before) return;
  }
}

// TimePairs timed in the calling thread's CPU time (ThreadCpuNs): on a loaded machine
// wall-clock passes of a few milliseconds measure preemption. For a ratio of two
// variants, alternate their passes within the run, then compare: the median of each
// pass over the one before it (flight_recorder.cc), or the fastest of each
// (FastestAlternating, below).
template <typename Alloc, typename Free>
double CpuTimePairs(const std::vector<size_t>& sizes, Alloc alloc, Free free_fn) {
  const int64_t start = ThreadCpuNs();
  RunPairs(sizes, alloc, free_fn);
  return static_cast<double>(ThreadCpuNs() - start) / static_cast<double>(sizes.size());
}

// Two variants of one pair loop that differ by the allocator's observer (`a`, `b`; either
// may be null): `repetitions` CpuTimePairs passes of each, alternating (a, b, a, b,
// ...) so that drift in machine load hits both alike, and the fastest pass of each
// (see CpuTimePairs). Leaves `b` set on the allocator.
struct AlternatingFigures {
  double a_ns = 0;
  double b_ns = 0;
};
template <typename Alloc, typename Free>
AlternatingFigures FastestAlternating(CachingAllocator& allocator, AllocatorObserver* a,
                                      AllocatorObserver* b, const std::vector<size_t>& sizes,
                                      Alloc alloc, Free free_fn, int repetitions) {
  std::vector<double> with_a, with_b;
  for (int r = 0; r < repetitions; ++r) {
    allocator.set_observer(a);
    with_a.push_back(CpuTimePairs(sizes, alloc, free_fn));
    allocator.set_observer(b);
    with_b.push_back(CpuTimePairs(sizes, alloc, free_fn));
  }
  return {*std::min_element(with_a.begin(), with_a.end()),
          *std::min_element(with_b.begin(), with_b.end())};
}

}  // namespace devmem::devbench
