// allocator/stack_sampler.cc: see stack_sampler.h.
//
// Structure:
//   * the countdown: per thread, in units of the mean, refilled with -log(u) (an
//     exponential of mean 1) from a per-thread splitmix64 generator after each sample;
//   * the stack table (one per process, never destroyed): raw frames by id, and a map
//     from the frames to their id; at most kMaxStacks stacks (later ones are kNoStack);
//     symbolized frames are computed once per stack, when first asked for;
//   * the live table: (owner, address) -> the sample, and a bucket filter of counts by
//     address so that OnFree of an address with no live sample in its bucket takes no
//     lock. A bucket's count is raised before the sampled pointer reaches its user and
//     lowered after the sample is erased, so a free (which happens after the
//     allocation returned) never misses its sample.
#include "allocator/stack_sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/debugging/stacktrace.h"
#include "absl/debugging/symbolize.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_format.h"
#include "allocator/mutex.h"

namespace devmem {

double SampleWeight(size_t size, uint64_t mean) {
  if (mean == 0 || size == 0) return static_cast<double>(size);
  const double s = static_cast<double>(size);
  // -expm1(-x) = 1 - exp(-x) without cancellation for small x.
  return s / -std::expm1(-s / static_cast<double>(mean));
}

namespace stack_sampler {
namespace internal {

std::atomic<uint64_t> g_mean{kDefaultStackSampleBytes};
std::atomic<uint32_t> g_filter[kFilterBuckets];
// None drawn until the thread's first allocation draws its first countdown (Sample).
constinit thread_local Countdown tls_countdown;

}  // namespace internal

namespace {

// splitmix64: small, fast, and good enough to draw exponentials.
struct Generator {
  uint64_t state = 0;
  bool seeded = false;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // An exponential of mean 1: -log(u), u uniform in (0, 1].
  double exponential() {
    const double u = static_cast<double>((next() >> 11) + 1) * 0x1.0p-53;
    return -std::log(u);
  }
};
thread_local Generator tls_generator;

Generator& ThreadGenerator() {
  if (!tls_generator.seeded) {
    tls_generator.state = std::random_device{}() ^
                          (static_cast<uint64_t>(std::random_device{}()) << 32);
    tls_generator.seeded = true;
  }
  return tls_generator;
}

struct Frames {
  int depth = 0;
  void* pc[kMaxStackFrames] = {};
  friend bool operator==(const Frames& a, const Frames& b) {
    return a.depth == b.depth && std::equal(a.pc, a.pc + a.depth, b.pc);
  }
  template <typename H>
  friend H AbslHashValue(H h, const Frames& f) {
    for (int i = 0; i < f.depth; ++i) h = H::combine(std::move(h), f.pc[i]);
    return H::combine(std::move(h), f.depth);
  }
};

class StackTable {
 public:
  StackId Intern(const Frames& f) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    if (auto it = ids_.find(f); it != ids_.end()) return it->second;
    if (stacks_.size() >= kMaxStacks) return kNoStack;
    stacks_.push_back(Entry{f, std::nullopt});
    const auto id = static_cast<StackId>(stacks_.size());  // ids start at 1
    ids_.emplace(f, id);
    return id;
  }

  std::vector<std::string> Symbolized(StackId id) ABSL_LOCKS_EXCLUDED(mu_) {
    Frames f;
    {
      MutexLock lock(&mu_);
      if (id == kNoStack || id > stacks_.size()) return {};
      Entry& e = stacks_[id - 1];
      if (e.symbols) return *e.symbols;
      f = e.frames;
    }
    std::vector<std::string> symbols = Symbolize(f);  // outside the lock: slow
    MutexLock lock(&mu_);
    Entry& e = stacks_[id - 1];
    if (!e.symbols) e.symbols = std::move(symbols);
    return *e.symbols;
  }

  size_t Count() ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    return stacks_.size();
  }

 private:
  static std::vector<std::string> Symbolize(const Frames& f) {
    static std::once_flag once;
    // The ELF symbolizer reads the running binary; /proc/self/exe names it without
    // needing argv[0].
    std::call_once(once, [] { absl::InitializeSymbolizer("/proc/self/exe"); });
    // One symbolization at a time, on a lock of ours: absl's symbolizer guards its
    // caches with its own spin lock, which TSan cannot see in Debian's uninstrumented
    // libabsl_symbolize (two OOM reports at once read as a race), and symbolizing is
    // off the hot path, so running two at once gains nothing. A leaf lock: nothing
    // else is taken while it is held.
    static Mutex symbolize_mu;
    MutexLock lock(&symbolize_mu);
    std::vector<std::string> out;
    out.reserve(static_cast<size_t>(f.depth));
    char buf[1024];
    for (int i = 0; i < f.depth; ++i) {
      // A return address points after the call: look up the byte before it.
      void* pc = static_cast<char*>(f.pc[i]) - (i == 0 ? 0 : 1);
      if (absl::Symbolize(pc, buf, sizeof buf)) {
        out.emplace_back(buf);
      } else {
        out.push_back(absl::StrFormat("%p", f.pc[i]));
      }
    }
    return out;
  }

  struct Entry {
    Frames frames;
    std::optional<std::vector<std::string>> symbols;  // filled on first request
  };
  Mutex mu_;
  std::deque<Entry> stacks_ ABSL_GUARDED_BY(mu_);  // id - 1 == index
  absl::flat_hash_map<Frames, StackId> ids_ ABSL_GUARDED_BY(mu_);
};

StackTable& Stacks() {
  static StackTable* table = new StackTable();  // never destroyed: threads at exit
  return *table;
}

struct LiveEntry {
  SiteId site = kUnknownSite;
  StackId stack = kNoStack;
  size_t bytes = 0;
  double weight = 0;
};
using LiveKey = std::pair<const void*, const void*>;  // (owner, address)

class LiveTable {
 public:
  void Add(const LiveKey& key, const LiveEntry& s) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    auto [it, inserted] = live_.insert_or_assign(key, s);
    if (inserted) internal::g_filter[internal::Bucket(key.second)].fetch_add(1);
  }
  void Erase(const LiveKey& key) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    if (live_.erase(key) > 0) internal::g_filter[internal::Bucket(key.second)].fetch_sub(1);
  }
  void EraseOwner(const void* owner) ABSL_LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    for (auto it = live_.begin(); it != live_.end();) {
      if (it->first.first == owner) {
        internal::g_filter[internal::Bucket(it->first.second)].fetch_sub(1);
        live_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  std::vector<LiveSample> Of(const void* owner) ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<LiveSample> out;
    MutexLock lock(&mu_);
    for (const auto& [key, s] : live_) {
      if (key.first != owner) continue;
      out.push_back(LiveSample{reinterpret_cast<uintptr_t>(key.second), s.bytes, s.site,
                               s.stack, s.weight});
    }
    return out;
  }

 private:
  Mutex mu_;
  absl::flat_hash_map<LiveKey, LiveEntry> live_ ABSL_GUARDED_BY(mu_);
};

LiveTable& Live() {
  static LiveTable* table = new LiveTable();  // never destroyed, as the stack table
  return *table;
}

}  // namespace

namespace internal {

namespace {
// `units` of `mean` as the countdown keeps them: bytes, to the nearest (clamped, so a
// huge mean cannot overflow).
void SetCountdown(double units, uint64_t mean) {
  const double bytes = std::min(units * static_cast<double>(mean), 0x1.0p62);
  tls_countdown = {static_cast<int64_t>(std::llround(bytes)), mean};
}
}  // namespace

void Sample(const void* owner, void* p, size_t bytes, SiteId site) {
  const uint64_t mean = g_mean.load(std::memory_order_relaxed);
  if (mean == 0) return;
  Countdown& c = tls_countdown;
  // The countdown in units of the current mean, this allocation subtracted.
  double units_left;
  if (c.mean == mean) {
    units_left = static_cast<double>(c.bytes_left) / static_cast<double>(mean);
  } else {
    // Drawn at another mean (SetMeanBytes since), or never (0 units): rescaled.
    const double before =
        c.mean == 0 ? 0.0 : static_cast<double>(c.bytes_left) / static_cast<double>(c.mean);
    units_left = before - static_cast<double>(bytes) / static_cast<double>(mean);
  }
  if (!tls_generator.seeded) {
    // The thread's first crossing of its initial 0: only now is its first countdown
    // drawn, and this allocation is sampled only if it crosses that (so it is sampled
    // with probability p(s) like every other).
    units_left += ThreadGenerator().exponential();
  }
  if (units_left > 0) {  // not crossed (a rescaled or first countdown): not sampled
    SetCountdown(units_left, mean);
    return;
  }
  // Memoryless: the distance from the end of a sampled allocation to the next threshold
  // is a fresh exponential, whatever the overshoot.
  SetCountdown(ThreadGenerator().exponential(), mean);
  Frames f;
  // Skip this function; OnAllocate is inline, so the next frame is the allocation
  // entry (CachingAllocator::allocate).
  f.depth = absl::GetStackTrace(f.pc, kMaxStackFrames, /*skip_count=*/1);
  const StackId stack = f.depth > 0 ? Stacks().Intern(f) : kNoStack;
  Live().Add({owner, p}, LiveEntry{site, stack, bytes, SampleWeight(bytes, MeanBytes())});
}

void Forget(const void* owner, void* p) { Live().Erase({owner, p}); }

}  // namespace internal

void SetMeanBytes(uint64_t mean) {
  internal::g_mean.store(mean, std::memory_order_relaxed);
}

uint64_t MeanBytes() { return internal::g_mean.load(std::memory_order_relaxed); }

void ForgetOwner(const void* owner) { Live().EraseOwner(owner); }

std::vector<LiveSample> LiveSamples(const void* owner) { return Live().Of(owner); }

std::vector<SampledStack> GroupSamples(const std::vector<LiveSample>& samples) {
  absl::flat_hash_map<std::pair<SiteId, StackId>, SampledStack> groups;
  for (const LiveSample& s : samples) {
    SampledStack& g = groups[{s.site, s.stack}];
    g.site = s.site;
    g.stack = s.stack;
    g.samples += 1;
    g.sampled_bytes += s.bytes;
    g.estimated_bytes += s.weight;
  }
  std::vector<SampledStack> out;
  out.reserve(groups.size());
  for (auto& [_, g] : groups) out.push_back(std::move(g));
  std::sort(out.begin(), out.end(), [](const SampledStack& a, const SampledStack& b) {
    if (a.estimated_bytes != b.estimated_bytes) return a.estimated_bytes > b.estimated_bytes;
    return std::pair(a.site, a.stack) < std::pair(b.site, b.stack);
  });
  return out;
}

std::vector<SampledStack> TopStacks(const void* owner, size_t k) {
  std::vector<SampledStack> out = GroupSamples(LiveSamples(owner));
  if (out.size() > k) out.resize(k);
  for (SampledStack& s : out) s.frames = Stacks().Symbolized(s.stack);  // no lock held
  return out;
}

std::vector<SampledStack> LiveStacks(const void* owner) { return TopStacks(owner, SIZE_MAX); }

std::vector<std::string> StackFrames(StackId id) { return Stacks().Symbolized(id); }

size_t StackCount() { return Stacks().Count(); }

void SeedThreadForTesting(uint64_t seed) {
  tls_generator.state = seed;
  tls_generator.seeded = true;
  internal::SetCountdown(tls_generator.exponential(), MeanBytes());
}

}  // namespace stack_sampler
}  // namespace devmem
