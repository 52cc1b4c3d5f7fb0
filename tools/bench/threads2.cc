// tools/bench/threads2.cc: see threads2.h.
#include "tools/bench/threads2.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_format.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/host_allocators.h"
#include "tools/bench/pass_overlap.h"
#include "tools/bench/shipped_path.h"

namespace devmem::devbench {
namespace {

using Clock = std::chrono::steady_clock;

// One spin of a busy wait: tells the core (and an SMT sibling) that this is one.
inline void Pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// mimalloc's pair, for the reference run.
struct MimallocOps {
  MimallocApi api;  // a copy: the loop does not reload the pointers
  void* allocate(size_t n, size_t) const { return api.malloc(n); }
  void free(void* p) const { api.free(p); }
};

// The two workers and the passes they run on request, each pair through `Ops`
// (ShippedOps, MimallocOps). Nothing but the allocator is shared between the workers'
// pair loops: the pass control below is touched only at a pass's start (the barrier)
// and end.
template <typename Ops>
class Workers {
 public:
  Workers(Ops ops, const std::vector<size_t>& a, const std::vector<size_t>& b)
      : ops_(ops), streams_{&a, &b} {
    for (size_t t = 0; t < 2; ++t) threads_[t] = std::thread([this, t] { run(t); });
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& w : threads_) w.join();
  }
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // Runs one pass on workers 0 .. n-1 (n is 1 or 2) and returns what each measured.
  std::vector<WorkerPass> pass(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    active_ = n;
    done_ = 0;
    arrived_.store(0, std::memory_order_relaxed);  // ordered before the workers by mu_
    ++generation_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_ == n; });
    return std::vector<WorkerPass>(result_, result_ + n);
  }

  size_t pairs(size_t t) const { return streams_[t]->size() * kThreadsRounds; }

 private:
  void run(size_t t) {
    uint64_t seen = 0;
    for (;;) {
      size_t n = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (generation_ != seen && t < active_); });
        if (stop_) return;
        seen = generation_;
        n = active_;
      }
      // The spin barrier: a worker woken late (its vCPU halted, or preempted) holds the
      // other back instead of letting it run its pass alone. Spinning keeps this
      // worker's CPU awake and ready; a yield now and then gives way to whatever else
      // the machine runs while the other worker is not scheduled.
      arrived_.fetch_add(1, std::memory_order_acq_rel);
      for (uint32_t spin = 1; arrived_.load(std::memory_order_acquire) < n; ++spin) {
        Pause();
        if (spin % 4096 == 0) std::this_thread::yield();
      }
      WorkerPass& r = result_[t];
      const int64_t cpu_start = ThreadCpuNs();
      r.begin = Clock::now();
      for (int round = 0; round < kThreadsRounds; ++round) {
        RunPairs(
            *streams_[t], [&](size_t bytes, size_t i) { return ops_.allocate(bytes, i); },
            [&](void* p, size_t) { ops_.free(p); });
      }
      r.end = Clock::now();
      r.cpu_ns = ThreadCpuNs() - cpu_start;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++done_;
      }
      cv_.notify_all();
    }
  }

  const Ops ops_;
  const std::vector<size_t>* const streams_[2];
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;  // a new pass (or the end, with stop_)
  size_t active_ = 0;        // workers 0 .. active_-1 run this pass
  size_t done_ = 0;
  bool stop_ = false;
  // The barrier's count, on a line of its own: the workers spin on it.
  alignas(64) std::atomic<size_t> arrived_{0};
  // Each worker's figures, on lines of their own (written by that worker only, read by
  // pass() after done_).
  struct alignas(64) Slot : WorkerPass {};
  Slot result_[2];
  std::thread threads_[2];
};

// One allocator's passes, as they are run (the loop below), and its figures.
class Series {
 public:
  template <typename Ops>
  void one_thread_pass(Workers<Ops>& workers) {
    const WorkerPass w = workers.pass(1)[0];
    ++f_.one_thread_passes;
    if (!RanUnpreempted(w)) return;  // said (the counts), not averaged in
    ++f_.one_thread_counted;
    const auto pairs = static_cast<double>(workers.pairs(0));
    one_.push_back(pairs / (w.wall_ns() * 1e-9));
    one_cpu_.push_back(static_cast<double>(w.cpu_ns) / pairs);
  }
  template <typename Ops>
  void two_thread_pass(Workers<Ops>& workers) {
    const std::vector<WorkerPass> w = workers.pass(2);
    ++f_.two_thread_passes;
    const double o = Overlap(w[0], w[1]);
    overlap_all_.push_back(o);
    if (!RanTogether(w[0], w[1])) return;  // not at the same time: said, not averaged in
    ++f_.two_thread_counted;
    overlap_.push_back(o);
    const double span_s = std::chrono::duration<double>(std::max(w[0].end, w[1].end) -
                                                        std::min(w[0].begin, w[1].begin))
                              .count();
    const auto pairs0 = static_cast<double>(workers.pairs(0));
    const auto pairs1 = static_cast<double>(workers.pairs(1));
    two_.push_back((pairs0 + pairs1) / span_s);
    two_cpu_.push_back((static_cast<double>(w[0].cpu_ns) / pairs0 +
                        static_cast<double>(w[1].cpu_ns) / pairs1) / 2);
    skew_.push_back(std::chrono::duration<double, std::nano>(
                        w[0].begin > w[1].begin ? w[0].begin - w[1].begin : w[1].begin - w[0].begin)
                        .count());
  }
  bool enough() const {
    return f_.one_thread_counted >= kRepetitions && f_.two_thread_counted >= kRepetitions;
  }
  int two_thread_passes() const { return f_.two_thread_passes; }

  Scaling figures() const {
    Scaling f = f_;
    if (!overlap_all_.empty()) f.overlap_all = Median(overlap_all_);
    if (!overlap_.empty()) {
      f.overlap = Median(overlap_);
      f.start_skew_ns = Median(skew_);
      f.two_threads_pairs_per_s = Median(two_);
      f.two_threads_cpu_ns_per_pair = Median(two_cpu_);
    }
    if (!one_.empty()) {
      f.one_thread_pairs_per_s = Median(one_);
      f.one_thread_cpu_ns_per_pair = Median(one_cpu_);
    }
    if (f.two_thread_counted >= kMinCountedPasses && f.one_thread_counted >= kMinCountedPasses) {
      f.speedup = f.two_threads_pairs_per_s / f.one_thread_pairs_per_s;
    } else {
      f.why = absl::StrFormat(
          "%d of %d two-thread passes had both threads on a CPU for %.0f%% of the pass "
          "(median overlap %.2f), %d of %d one-thread passes its thread; %d of each are "
          "needed: the machine did not run the two threads at once (busy? try chrt -f 1)",
          f.two_thread_counted, f.two_thread_passes, kMinOverlap * 100, f.overlap_all,
          f.one_thread_counted, f.one_thread_passes, kMinCountedPasses);
    }
    return f;
  }

 private:
  Scaling f_;  // the counts
  std::vector<double> one_, two_, one_cpu_, two_cpu_, overlap_, overlap_all_, skew_;
};

}  // namespace

ThreadsFigures MeasureThreads2(CachingAllocator& alloc, const std::vector<size_t>& a,
                               const std::vector<size_t>& b) {
  Workers<ShippedOps> dm(ShippedOps{alloc}, a, b);
  std::optional<Workers<MimallocOps>> mi;
  if (HaveMimalloc()) mi.emplace(MimallocOps{Mimalloc()}, a, b);
  // Warm-up: both caches filled at once, until a pass allocates no segment.
  WarmUp([&] { dm.pass(2); }, [&] { return alloc.stats().num_device_alloc; });
  if (mi) mi->pass(2);
  const int64_t before = alloc.stats().num_device_alloc;
  Series dm_series, mi_series;
  while (!dm_series.enough() && dm_series.two_thread_passes() < kMaxThreadsPasses) {
    dm_series.one_thread_pass(dm);
    dm_series.two_thread_pass(dm);
    if (mi) {
      mi_series.one_thread_pass(*mi);
      mi_series.two_thread_pass(*mi);
    }
  }
  ThreadsFigures f;
  f.timed_segment_allocs = alloc.stats().num_device_alloc - before;
  static_cast<Scaling&>(f) = dm_series.figures();
  if (mi) f.mimalloc = mi_series.figures();
  return f;
}

}  // namespace devmem::devbench
