// runtime/size_histogram.h: how large the allocations are, per device, counted as they
// happen (devmem_allocation_size_bytes in docs/metrics.md).
//
// Example:
//   SizeHistogram sizes;
//   allocator->set_observer(&sizes);            // or forward from a composed observer
//   allocator->allocate(3000);
//   for (const SizeHistogram::Counts& c : sizes.counts()) ...   // c.buckets[3] == 1
//
// The allocator keeps no size distribution of its own, and metrics are read at scrape
// time (never pushed through prometheus-cpp on the hot path), so this observer is the
// smallest addition that can produce the histogram. Every event but kAlloc is ignored.
//
// Cost on the allocation path: no lock and no atomic read-modify-write. Each thread
// counts into its own shard (one writer per counter: a relaxed load and a relaxed
// store) on cache lines of its own (the per-device counts are line-aligned), so threads
// allocating at once never write a shared cache line; counts() adds
// the shards up. A shard outlives its thread: when the thread exits its shard is marked
// free and the next thread that records takes it over, counts and all, so the memory is
// bounded by the most threads that ever recorded at once (about 300 bytes per device a
// thread recorded on, plus 600 per shard).
//
// Buckets are fixed powers of two: upper bounds 2^9 (512 B, the rounding unit) up to
// 2^40 (1 TiB), then +Inf. A request lands in the first bucket whose bound is >= its
// requested size (what the user asked for, before rounding; the rounding to 512 B never
// moves a request across a power of two above 512, so the bucket is the same either
// way).
//
// Wiring: the runtime gives every allocator one observer; that composed observer must
// forward each event to the process's SizeHistogram (SizeHistogram::Process()), which
// is what the runtime's /metrics reads. Tests may attach their own instance instead.
//
// Thread-safety: on_event/record may run concurrently on any threads (they run under
// the allocating device's lock, or in a thread's own cache; they take no lock but the
// first time a thread records into this histogram, when it is given a shard). counts()
// may run at any time (it takes the shard list's lock, which the hot path does not); a
// read concurrent with updates sees each counter at some recent value (the sum and the
// buckets are not read atomically together, which a histogram scrape tolerates), and
// once the recording threads are quiescent it is exact. A histogram may be destroyed
// while threads that recorded into it still run (their shards die with them).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "allocator/mutex.h"
#include "allocator/observer.h"
#include "allocator/types.h"

namespace devmem {

class SizeHistogram : public AllocatorObserver {
 public:
  static constexpr int kMinLog2 = 9;    // first bound: 512 B
  static constexpr int kMaxLog2 = 40;   // last finite bound: 1 TiB
  static constexpr int kNumFiniteBuckets = kMaxLog2 - kMinLog2 + 1;
  static constexpr int kNumBuckets = kNumFiniteBuckets + 1;  // plus +Inf
  // Devices one histogram tracks; events of further devices are dropped (and counted
  // in dropped_events()). devmem has one allocator per device, so a process with more
  // than this many devices is not a case worth a lock on the hot path.
  static constexpr int kMaxDevices = 64;

  // The upper bound of finite bucket i (0 <= i < kNumFiniteBuckets): 2^(kMinLog2 + i).
  static constexpr uint64_t UpperBound(int i) { return uint64_t{1} << (kMinLog2 + i); }
  // The bucket a request of `bytes` falls in (kNumFiniteBuckets for +Inf). Inline: it
  // runs on every allocation.
  static int BucketOf(size_t bytes) {
    if (bytes <= UpperBound(0)) return 0;
    // The smallest n with 2^n >= bytes.
    const int log2_ceil = static_cast<int>(std::bit_width(static_cast<uint64_t>(bytes) - 1));
    return std::min(log2_ceil - kMinLog2, kNumFiniteBuckets);
  }

  // Per device: per-bucket (not cumulative) counts, their total and the byte sum.
  struct Counts {
    DeviceId device;
    std::array<uint64_t, kNumBuckets> buckets{};
    uint64_t count = 0;
    uint64_t sum_bytes = 0;
  };

  SizeHistogram();
  ~SizeHistogram() override;
  SizeHistogram(const SizeHistogram&) = delete;
  SizeHistogram& operator=(const SizeHistogram&) = delete;

  // The instance the runtime's observer forwards to and its /metrics reads. Never
  // destroyed (allocators may report from threads still running at exit).
  static SizeHistogram& Process();

  // Counts AllocAction::kAlloc events (event.requested bytes); ignores the rest. Inline
  // (below), as record's fast path: the runtime's observer calls it non-virtually on
  // every event.
  void on_event(const AllocEvent& event) override;
  // Counts one allocation of `requested` bytes on `device`.
  void record(DeviceId device, size_t requested);

  // The devices seen so far, in device order.
  std::vector<Counts> counts() const;
  uint64_t dropped_events() const { return dropped_.load(std::memory_order_relaxed); }
  // The shards made so far (one per thread that recorded while no freed shard was
  // there to take over): bounded by the most threads recording at once.
  size_t shard_count() const;

  // One shard's counters of one device. Cache-line aligned: one thread writes a
  // DeviceCounts on every allocation, and two threads' counts must not share a line
  // whatever the heap put next to them (a shard made by one thread is taken over by a
  // later one, so neighbours in the heap are not the same thread's).
  struct alignas(64) DeviceCounts {
    std::array<std::atomic<uint64_t>, kNumBuckets> buckets{};
    std::atomic<uint64_t> sum_bytes{0};
  };
  static_assert(sizeof(DeviceCounts) % 64 == 0, "a DeviceCounts fills whole lines");
  // One thread's counters (or an exited thread's, until another takes them over);
  // defined in size_histogram.cc.
  struct Shard;

 private:
  // Type in the top byte, index + 1 below it, so that no device encodes to 0.
  static uint32_t EncodeDevice(DeviceId device) {
    return (static_cast<uint32_t>(device.type) << 24) |
           ((static_cast<uint32_t>(device.index) + 1) & 0xFFFFFF);
  }
  static DeviceId DecodeDevice(uint32_t key);
  // The index of `device`'s key in keys_ (claimed on first use), or -1 when all
  // kMaxDevices keys belong to other devices.
  int device_index(DeviceId device);
  // record() when the calling thread last counted elsewhere (another histogram or
  // device), or never.
  [[gnu::noinline]] void record_slow(DeviceId device, size_t requested);
  // on_event's: record_slow(event.device, event.requested).
  [[gnu::noinline]] void record_event_slow(const AllocEvent& event);
  // The fast paths' two counts (one writer: the calling thread owns `counts`).
  static void count_into(DeviceCounts* counts, size_t requested);
  // The calling thread's shard, given it (a freed shard, or a new one) on first use.
  Shard& thread_shard();
  Shard& claim_shard() ABSL_LOCKS_EXCLUDED(mu_);

  const uint64_t id_;  // unique per histogram for the life of the process
  // 0 = free; otherwise EncodeDevice(device). Written once (CAS from 0); a device's
  // index is the same in every shard.
  std::array<std::atomic<uint32_t>, kMaxDevices> keys_{};
  mutable Mutex mu_;  // guards the shard list only; never taken by a thread that has one
  std::vector<std::shared_ptr<Shard>> shards_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> dropped_{0};
};

namespace size_histogram_internal {
// Where this thread counted last (histogram, device): record()'s fast path, one
// thread_local read and two compares. Constant-initialized and trivially destructible
// (no guard; readable until the thread is gone). `counts` lies in a shard this thread
// owns; it is only used while the histogram `histogram_id` lives (ids are never reused,
// and start at 1), which keeps that shard.
struct LastCounts {
  uint64_t histogram_id = 0;
  DeviceId device;
  SizeHistogram::DeviceCounts* counts = nullptr;
};
inline constinit thread_local LastCounts tls_last;

// One writer per counter (the shard's owner): a relaxed load and store, no
// read-modify-write.
inline void Bump(std::atomic<uint64_t>& a, uint64_t n) {
  a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}
}  // namespace size_histogram_internal

inline void SizeHistogram::count_into(DeviceCounts* counts, size_t requested) {
  size_histogram_internal::Bump(counts->buckets[static_cast<size_t>(BucketOf(requested))], 1);
  size_histogram_internal::Bump(counts->sum_bytes, requested);
}

inline void SizeHistogram::on_event(const AllocEvent& event) {
  if (event.action != AllocAction::kAlloc) return;
  // record(event.device, event.requested), with the slow path given the event itself:
  // nothing read for the fast path is then kept across that call (calling record here
  // cost the inlining observer two spills and a reload on every allocation, 16
  // instructions a pair; so did a helper returning the counts or nullptr, 9).
  const size_histogram_internal::LastCounts& last = size_histogram_internal::tls_last;
  DeviceCounts* const counts = last.counts;
  if (last.histogram_id == id_ && last.device == event.device) [[likely]] {
    count_into(counts, event.requested);
    return;
  }
  record_event_slow(event);
}

inline void SizeHistogram::record(DeviceId device, size_t requested) {
  const size_histogram_internal::LastCounts& last = size_histogram_internal::tls_last;
  // Read once: the counters are atomics, after whose stores the compiler would read
  // the thread_local again (its address too, in -fPIC code).
  DeviceCounts* const counts = last.counts;
  if (last.histogram_id == id_ && last.device == device) [[likely]] {
    count_into(counts, requested);
    return;
  }
  record_slow(device, requested);
}

}  // namespace devmem
