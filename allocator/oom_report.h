// allocator/oom_report.h: one structured out-of-memory report, and the exception that
// carries it.
//
// The same OomReport feeds the exception's what(), the log, the dump file and the
// metrics (runtime layer). It says how much was asked, what the device and the driver
// hold, whether the failure is fragmentation or real use, who holds the memory (the
// top live sites, with the share created by explicit copies), and a remedy chosen from
// those numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "allocator/site.h"
#include "allocator/stack_sampler.h"
#include "allocator/stats.h"
#include "allocator/types.h"

namespace devmem {

// A live holder of memory, aggregated by site.
struct SiteUsage {
  SiteId site = kUnknownSite;
  size_t live_bytes = 0;
  size_t live_count = 0;
};

enum class OomCause : uint8_t {
  kFragmentation,   // enough bytes are free in total, but no block is large enough
  kPendingStreams,  // memory is held by frees waiting on other streams' events
  kMemoryFraction,  // per_process_memory_fraction caps reserved memory below need
  kRealUse,         // live allocations really use the memory
  kTooLarge,        // the request exceeds the device outright
};
std::string_view OomCauseName(OomCause cause);

struct OomReport {
  DeviceId device;
  Stream stream;
  SiteId site = kUnknownSite;  // who asked
  size_t requested_bytes = 0;  // what the caller asked for
  size_t rounded_bytes = 0;    // after rounding to the allocator's granule
  size_t segment_bytes = 0;    // bytes that could not be obtained: a segment, or the
                               // granules an expandable reservation tried to map
  size_t device_total = 0;     // MemInfo::total_bytes
  size_t driver_free = 0;      // MemInfo::free_bytes at the time of the failure
  size_t memory_limit = 0;     // device_total * per_process_memory_fraction
  size_t allocated = 0;        // bytes allocated to the user
  size_t reserved = 0;         // bytes held in segments
  size_t pending = 0;          // freed bytes waiting on other streams' events
  size_t reserved_unallocated = 0;  // reserved - allocated (cached + pending)
  size_t largest_free_block = 0;    // largest cached block (any stream)
  size_t free_blocks = 0;           // number of cached blocks
  double fragmentation = 0;  // 1 - largest_free_block / total free (0 when none free)
  size_t segment_count = 0;
  std::vector<SiteUsage> top_sites;  // largest live holders first (at most 10)
  size_t copy_bytes = 0;  // live bytes created by clone/contiguous/to
  // The sampled stacks (allocator/stack_sampler.h) holding the most estimated live
  // bytes, largest first (at most kOomTopStacks), symbolized: they name the code behind
  // the top sites even where no source_location was forwarded. Filled after the device
  // lock is released (AttachTopStacks); empty with sampling off or nothing sampled.
  std::vector<SampledStack> top_stacks;
  uint64_t stack_sample_bytes = 0;  // the sampling rate behind them (0: off)
  // What scoped arenas hold (allocator/arena.h), inside `allocated`: bytes of live
  // arena buffers, of which escaped (their scope closed), and empty chunks retained
  // for the next scope (the staged retry gave those back before failing, so this is
  // normally 0 in a report).
  size_t arena_live_bytes = 0;
  size_t arena_escaped_bytes = 0;
  size_t arena_retained_bytes = 0;
  // Bytes of private pools' segments (graph capture, allocator/pool_id.h), inside
  // `reserved`: memory only its graphs can use until their pools are released.
  size_t private_pool_bytes = 0;
  OomCause cause = OomCause::kRealUse;
  std::string remedy;  // one or two sentences chosen from the numbers above

  // A readable multi-line message: the first line is a one-sentence summary.
  std::string ToString() const;
};

// Chooses cause and remedy from the numbers (fills report->cause and ->remedy).
// `expandable_segments`: they are in use; `virtual_memory`: the backend could use them
// (when not, the remedy does not suggest them).
void ChooseRemedy(OomReport* report, size_t max_split_size, bool expandable_segments,
                  bool virtual_memory = true);

inline constexpr size_t kOomTopStacks = 5;  // sampled stacks an OOM report lists
inline constexpr size_t kOomStackFrames = 12;  // frames of each that ToString prints

// Fills report->top_stacks from `owner`'s live samples (nullptr: none), symbolizing
// them: not on the hot path, never under a device lock. Each group's estimate is bounded
// by what is known exactly: at most the live bytes of its site (`site_stats`, indexed
// by SiteId as PoolAccounting::site_stats gives them, taken with the report; marked
// estimate_clamped when cut), at least its own sampled bytes; the groups are ranked
// after the bound. Never throws: out of host memory, the report keeps no stacks.
void AttachTopStacks(const void* owner, const std::vector<SiteStats>& site_stats,
                     OomReport* report) noexcept;

// Thrown when device memory is really exhausted: after the staged retry (free cached
// blocks, synchronize and free every unused segment, retry) found nothing. Never
// thrown for bad arguments.
class OutOfMemoryError : public std::bad_alloc {
 public:
  explicit OutOfMemoryError(OomReport report);
  const char* what() const noexcept override { return message_.c_str(); }
  const OomReport& report() const noexcept { return report_; }

 private:
  OomReport report_;
  std::string message_;
};

}  // namespace devmem
