// allocator/stack_sampler.h: sampled stack traces of allocations, as tcmalloc's sampled
// heap profile does it.
//
// Every thread counts down a random number of bytes drawn from an exponential
// distribution; the allocation that takes the countdown below zero is sampled: its raw
// stack is captured (absl::GetStackTrace), interned in a bounded stack table, and the
// allocation is recorded as live until it is freed. Symbols are looked up (absl::
// Symbolize) only when a report asks for a stack's frames.
//
// Rate: on average one sample per `mean` bytes allocated (config key
// stack_sample_bytes; 0 = off). The countdown is kept in units of the mean (the thread
// subtracts bytes / mean), so the process is a Poisson process of rate 1/mean per byte
// whatever the rate of other allocators on the thread: an allocation of s bytes is
// sampled with probability p(s) = 1 - exp(-s / mean), independently of every other.
//
// Estimator: a sample of an allocation of s bytes stands for w(s) = s / p(s) =
// s / (1 - exp(-s / mean)) bytes. Summed over the live samples of a stack (or a site) it
// is an unbiased estimate of that stack's live bytes: E[sum w(s_i) X_i] = sum s_i with
// X_i ~ Bernoulli(p(s_i)); its variance is sum s_i^2 (1 - p(s_i)) / p(s_i)
// (tests/stack_sampler_test.cc checks both against exact per-site accounting).
//
// Thread-safety: the hot path touches only thread-locals and one relaxed atomic; the
// live table and the stack table are guarded by leaf mutexes (nothing else is acquired
// while they are held). Samples are keyed by (owner, address), so allocators on
// different devices may hand out equal addresses.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/optimization.h"
#include "allocator/site.h"

namespace devmem {

using StackId = uint32_t;
inline constexpr StackId kNoStack = 0;  // none captured (or the stack table was full)
inline constexpr int kMaxStackFrames = 32;
inline constexpr size_t kMaxStacks = 4096;  // distinct stacks one process keeps
// The default of stack_sample_bytes (docs/configuration.md says how it was chosen).
inline constexpr uint64_t kDefaultStackSampleBytes = uint64_t{256} << 20;

// w(s) above: the bytes one sample of an s-byte allocation stands for at `mean`.
double SampleWeight(size_t size, uint64_t mean);

// The live samples of one owner, grouped by (site, stack).
struct SampledStack {
  SiteId site = kUnknownSite;
  StackId stack = kNoStack;
  uint64_t samples = 0;          // live sampled allocations
  uint64_t sampled_bytes = 0;    // their exact sizes, summed
  double estimated_bytes = 0;    // sum of w(size): the estimate of the live bytes
  std::vector<std::string> frames;  // symbolized, innermost first (sampler frames cut)
  // OOM reports only (AttachTopStacks): estimated_bytes exceeded the exact live bytes of
  // `site` and was cut to them.
  bool estimate_clamped = false;
};

namespace stack_sampler {

// Sets the process-wide mean (0 = off). Every CachingAllocator sets it from its config
// when constructed, so a process gives all its allocators one value.
void SetMeanBytes(uint64_t mean);
uint64_t MeanBytes();

namespace internal {
extern std::atomic<uint64_t> g_mean;  // the mean in bytes, 0 when off
// The thread's countdown: bytes to go before the next sample, drawn (in units of the
// mean, see above) when the mean was `mean`. Kept in bytes so that the hit path is an
// integer subtraction (a double's was a multiply, a conversion and, since a TLS access
// is a call in -fPIC code, spills of the double around it: about 20 instructions an
// allocation). When the process's mean changes, the next allocation on the thread
// rescales what is left (Sample), so the countdown still counts units of the mean.
// constinit: read without a TLS init check.
struct Countdown {
  int64_t bytes_left = 0;
  uint64_t mean = 0;  // 0: none drawn yet on this thread
};
extern constinit thread_local Countdown tls_countdown;
// OnAllocate's slow path: the countdown ran out, or was drawn at another mean (or
// never): `bytes` are subtracted here when the hit path did not (mean differs).
void Sample(const void* owner, void* p, size_t bytes, SiteId site);
extern std::atomic<uint32_t> g_filter[];  // live samples per address bucket
constexpr size_t kFilterBuckets = 4096;
inline size_t Bucket(const void* p) {
  return static_cast<size_t>((reinterpret_cast<uintptr_t>(p) >> 8) * 0x9E3779B97F4A7C15ULL >>
                             52);  // the top 12 bits: 0 .. 4095
}
void Forget(const void* owner, void* p);
}  // namespace internal

// The allocation entry's hook: `p` (of `bytes`, from `site`) was just handed out by
// `owner`. Costs a relaxed load, a compare and a thread-local subtraction when not
// sampled.
inline void OnAllocate(const void* owner, void* p, size_t bytes, SiteId site) {
  const uint64_t mean = internal::g_mean.load(std::memory_order_relaxed);
  if (mean == 0 || p == nullptr) return;
  internal::Countdown& c = internal::tls_countdown;
  if (ABSL_PREDICT_TRUE(c.mean == mean)) {
    const int64_t left = c.bytes_left - static_cast<int64_t>(bytes);
    c.bytes_left = left;
    if (ABSL_PREDICT_TRUE(left > 0)) return;
  }
  internal::Sample(owner, p, bytes, site);
}
// The free entry's hook, after `owner` freed `p`. A relaxed load when `p` is not in a
// bucket with a live sample.
inline void OnFree(const void* owner, void* p) {
  if (p == nullptr ||
      internal::g_filter[internal::Bucket(p)].load(std::memory_order_relaxed) == 0) {
    return;
  }
  internal::Forget(owner, p);
}
// Drops every live sample of `owner` (its destructor: its addresses may be reused).
void ForgetOwner(const void* owner);

// One live sample, as the live table holds it (no symbols).
struct LiveSample {
  uintptr_t addr = 0;
  size_t bytes = 0;
  SiteId site = kUnknownSite;
  StackId stack = kNoStack;
  double weight = 0;  // SampleWeight(bytes) at the rate it was sampled at
};
// The live samples of `owner`, in no order. Takes the live table's leaf lock only: may
// be called with a device lock held (it is not: CachingAllocator::snapshot calls it
// after the pool's snapshot).
std::vector<LiveSample> LiveSamples(const void* owner);
// `samples` grouped by (site, stack), largest estimate first (ties: by site, stack);
// frames are left empty.
std::vector<SampledStack> GroupSamples(const std::vector<LiveSample>& samples);
// The `k` groups of `owner`'s live samples with the largest estimates, with symbolized
// frames. Symbolizing a stack the first time reads the binary's symbol table
// (milliseconds): never call it on the hot path or under a device lock.
std::vector<SampledStack> TopStacks(const void* owner, size_t k);
// Every group (TopStacks with no bound).
std::vector<SampledStack> LiveStacks(const void* owner);
// The symbolized frames of a stack (empty for kNoStack or an unknown id).
std::vector<std::string> StackFrames(StackId id);
// Number of distinct stacks interned so far.
size_t StackCount();

// Restarts this thread's countdown from a generator seeded with `seed` (tests: a fixed
// seed makes the samples reproducible). Call it with sampling on: the countdown is
// drawn at the current mean.
void SeedThreadForTesting(uint64_t seed);

}  // namespace stack_sampler
}  // namespace devmem
