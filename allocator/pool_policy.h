// allocator/pool_policy.h: the caching policy's pure decisions (an internal header).
//
// Each function here decides one thing from numbers alone: no pool state, no backend,
// no lock. DevicePool and its parts call them where the decision is made, and
// tests/pool_policy_test.cc pins each one with a table. The numbers are those of
// docs/architecture.md ("Allocation policy").
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace devmem::internal {

// --- sizes ------------------------------------------------------------------------
inline constexpr size_t kMinBlockSize = 512;           // rounding granule, alignment
inline constexpr size_t kSmallSize = size_t{1} << 20;  // largest small-pool request
inline constexpr size_t kSmallBuffer = size_t{2} << 20;   // small-pool segment size
inline constexpr size_t kLargeBuffer = size_t{20} << 20;  // segment for 1 MiB < request < 10 MiB
inline constexpr size_t kMinLargeAlloc = size_t{10} << 20;
inline constexpr size_t kRoundLarge = size_t{2} << 20;

// Rounds up to a multiple of kMinBlockSize; false when that overflows.
inline bool RoundSize(size_t bytes, size_t* rounded) {
  if (bytes > SIZE_MAX - (kMinBlockSize - 1)) return false;
  *rounded = (bytes + kMinBlockSize - 1) & ~(kMinBlockSize - 1);
  return true;
}
// Pool choice: a rounded request of at most 1 MiB goes to the small pool.
inline bool IsSmall(size_t rounded) { return rounded <= kSmallSize; }
// The segment size for a rounded request; false when rounding that overflows.
inline bool SegmentSizeFor(size_t rounded, size_t* segment) {
  if (rounded <= kSmallSize) {
    *segment = kSmallBuffer;
  } else if (rounded < kMinLargeAlloc) {
    *segment = kLargeBuffer;
  } else {
    if (rounded > SIZE_MAX - (kRoundLarge - 1)) return false;
    *segment = (rounded + kRoundLarge - 1) & ~(kRoundLarge - 1);
  }
  return true;
}
// The last-resort segment of the staged retry: just the request rounded to 2 MiB.
// Worth trying only in the large pool and when it is smaller than the standard segment
// (0 otherwise). `rounded` fits in a segment (SegmentSizeFor succeeded for it).
inline size_t ExactSegmentSize(size_t rounded, size_t standard_segment) {
  if (IsSmall(rounded)) return 0;
  const size_t exact = (rounded + kRoundLarge - 1) & ~(kRoundLarge - 1);
  return exact < standard_segment ? exact : 0;
}

// --- oversize rule and split rule --------------------------------------------------
// A segment made for a request of max_split_size or more is "oversize".
inline bool IsOversizeRequest(size_t rounded, size_t max_split_size) {
  return rounded >= max_split_size;
}
// Whether a free block of `block_size` bytes of an oversize segment may serve a
// request of `size`: only requests of max_split_size or more, wasting less than one
// large segment.
inline bool OversizeBlockServes(size_t block_size, size_t size, size_t max_split_size) {
  return size >= max_split_size && block_size - size < kLargeBuffer;
}
// Whether a block of `block_size` (>= size) handed out for `size` is split, leaving
// the remainder free. Small pool and expandable runs: any remainder of one granule of
// rounding. Large pool: a remainder over 1 MiB, and only below max_split_size
// (oversize requests take the whole block).
inline bool ShouldSplit(size_t block_size, size_t size, bool small_pool, bool expandable,
                        size_t max_split_size) {
  const size_t remaining = block_size - size;
  if (small_pool || expandable) return remaining >= kMinBlockSize;
  return size < max_split_size && remaining > kSmallSize;
}

// --- expandable segments -----------------------------------------------------------
inline size_t RoundToGranule(size_t bytes, size_t granularity) {
  return (bytes + granularity - 1) / granularity * granularity;
}
// The address range reserved for one (stream, pool): a quarter of `total` for the small
// pool, twice it for the large pool (unmapped gaps fragment the address space), at
// least one granule.
inline size_t ReservationSize(size_t total, size_t granularity, bool small_pool) {
  size_t va = small_pool ? total / 4 : (total > SIZE_MAX / 4 ? total : 2 * total);
  va = RoundToGranule(va, granularity);
  return va > granularity ? va : granularity;
}
// The recycle trigger's figures for one stream (expandable_segments.h): its blocks in
// expandable reservations serve only that stream, so its footprint is judged against
// its own need, not the device's. With two streams whose peaks do not coincide, each
// holds what its own peak needs, and the sum is well above the peak of the total
// (about 1.8 x in devmem-bench's steady_maps_2streams): a device-wide reference
// called that fragmentation and unmapped granules that the stream mapped again at its
// next peak. With one stream the figures are the device's (less regular segments).
struct StreamFootprint {
  int64_t in_use = 0;       // bytes of its blocks out of the free sets: allocated,
                            // pending, or owned by a thread cache
  int64_t in_use_peak = 0;  // their high-water mark (policy-private: never reset)
  size_t mapped = 0;        // bytes mapped in its reservations
  size_t deferred = 0;      // of those, decided for a deferred recycle already
};

// Proactive recycling (the recycle trigger): bytes of the stream's idle granules to
// unmap before mapping `mapping` more bytes for a request of `size`, so that what the
// stream maps (less what deferred decisions give back) stays within (1 + threshold) x
// its need: the high-water mark of its bytes in use, or in use + `size` when larger.
// Never more than `mapping`. 0 when within the cap or when the threshold is infinite
// ("none").
inline size_t ProactiveRecycleBytes(double threshold, const StreamFootprint& s, size_t size,
                                    size_t mapping) {
  if (!std::isfinite(threshold)) return 0;
  const int64_t want = s.in_use + static_cast<int64_t>(size);
  const double need = static_cast<double>(s.in_use_peak > want ? s.in_use_peak : want);
  const double cap = (1.0 + threshold) * need;
  const size_t committed = s.mapped > s.deferred ? s.mapped - s.deferred : 0;
  const double after = static_cast<double>(committed + mapping);
  if (!(after > cap)) return 0;
  const auto over = static_cast<size_t>(after - cap);
  return over < mapping ? over : mapping;
}

// Deferred proactive recycling: of the `decided` bytes a recycle decision set aside
// until its event completed, those by which the stream's mapped bytes are still over
// its cap (1 + threshold) x its need (the high-water mark of its bytes in use, or in
// use when larger) now. `s.deferred` is not subtracted: the decision is being taken.
inline size_t DeferredRecycleBytes(double threshold, const StreamFootprint& s,
                                   size_t decided) {
  if (!std::isfinite(threshold)) return 0;
  const int64_t need_bytes = s.in_use_peak > s.in_use ? s.in_use_peak : s.in_use;
  const double cap = (1.0 + threshold) * static_cast<double>(need_bytes);
  const double have = static_cast<double>(s.mapped);
  if (!(have > cap)) return 0;
  const auto over = static_cast<size_t>(have - cap);
  return over < decided ? over : decided;
}

// --- giving memory back ------------------------------------------------------------
// garbage_collection_threshold as bytes of `allowed` (device total or memory limit).
inline size_t GcThresholdBytes(double threshold, size_t allowed) {
  return static_cast<size_t>(threshold * static_cast<double>(allowed));
}
// Garbage collection before growing by `incoming` bytes: what to give back so that
// reserved + incoming fits under the threshold (0: it fits already).
inline size_t GcReclaimBytes(size_t threshold_bytes, size_t reserved, size_t incoming) {
  const size_t after = reserved + incoming;
  return after > threshold_bytes ? after - threshold_bytes : 0;
}
// The memory limit that per_process_memory_fraction sets (SIZE_MAX: none).
inline size_t MemoryLimit(double fraction, size_t device_total) {
  if (fraction >= 1.0) return SIZE_MAX;
  return static_cast<size_t>(static_cast<double>(device_total) * fraction);
}

// The staged retry, in order, after a miss in the free sets (docs/architecture.md).
enum class RetryStage {
  kGrow,                // map or allocate a segment as asked
  kReleaseForSegment,   // release unused segments worth one new segment, then grow
  kWaitAndReleaseAll,   // wait for every pending event, retry the cache, release all
  kExactSegment,        // large pool: a segment of just the request
};
inline constexpr std::array<RetryStage, 4> kRetryOrder = {
    RetryStage::kGrow, RetryStage::kReleaseForSegment, RetryStage::kWaitAndReleaseAll,
    RetryStage::kExactSegment};

}  // namespace devmem::internal
