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
// smallest addition that can produce the histogram: one relaxed atomic increment per
// bucket and one for the byte sum, per alloc event. Every other event is ignored.
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
// Thread-safety: on_event may run concurrently on any threads (it runs under the
// allocating device's lock, and takes no lock of its own: lock-free slot lookup and
// relaxed atomics). counts() may run at any time; a read concurrent with updates sees
// each bucket at some recent value (the sum and the buckets are not read atomically
// together, which a histogram scrape tolerates).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

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
  // The bucket a request of `bytes` falls in (kNumFiniteBuckets for +Inf).
  static int BucketOf(size_t bytes);

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

  // Counts AllocAction::kAlloc events (event.requested bytes); ignores the rest.
  void on_event(const AllocEvent& event) override;
  // Counts one allocation of `requested` bytes on `device`.
  void record(DeviceId device, size_t requested);

  // The devices seen so far, in device order.
  std::vector<Counts> counts() const;
  uint64_t dropped_events() const { return dropped_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    // 0 = free; otherwise EncodeDevice(device). Written once (CAS from 0), published
    // with release after which the counters are live; read with acquire.
    std::atomic<uint32_t> key{0};
    std::array<std::atomic<uint64_t>, kNumBuckets> buckets{};
    std::atomic<uint64_t> sum_bytes{0};
  };
  static uint32_t EncodeDevice(DeviceId device);
  static DeviceId DecodeDevice(uint32_t key);
  Slot* slot_for(DeviceId device);

  std::array<Slot, kMaxDevices> slots_;
  std::atomic<uint64_t> dropped_{0};
};

}  // namespace devmem
