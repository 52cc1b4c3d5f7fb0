// allocator/oom_report.cc: choosing the cause and remedy of an out-of-memory failure
// from its numbers, and printing the report.
//
// The report is built by the caching allocator after its staged retry has already
// released every unused cached segment, so what is still cached sits in segments
// that also hold live blocks: a cached byte at this point is a fragmented byte.
//
// Thread-safety: pure functions of their arguments, except that ToString and the
// kRealUse remedy name sites through GetSite, which takes only the site table's leaf
// lock; so they may run with an allocator's device lock held. AttachTopStacks is the
// exception: it symbolizes (reads the binary's symbol table), so it runs after the
// device lock is released.
#include "allocator/oom_report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/config.h"

namespace devmem {

std::string_view OomCauseName(OomCause cause) {
  switch (cause) {
    case OomCause::kFragmentation: return "fragmentation";
    case OomCause::kPendingStreams: return "pending_streams";
    case OomCause::kMemoryFraction: return "memory_fraction";
    case OomCause::kRealUse: return "real_use";
    case OomCause::kTooLarge: return "too_large";
  }
  return "unknown";
}

namespace {

size_t SaturatingSub(size_t a, size_t b) { return a > b ? a - b : 0; }

// The cap on reserved bytes; 0 in the report means "no cap beyond the device".
size_t Limit(const OomReport& r) {
  if (r.memory_limit == 0) return r.device_total;
  return r.device_total == 0 ? r.memory_limit : std::min(r.memory_limit, r.device_total);
}

// Cached bytes that are really free (pending blocks are cached too, but not usable).
size_t TotalFree(const OomReport& r) { return SaturatingSub(r.reserved_unallocated, r.pending); }

std::string Percent(double share) { return absl::StrFormat("%.1f%%", 100.0 * share); }

double Share(size_t part, size_t whole) {
  return whole == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(whole);
}

// max_split_size_mb that keeps blocks of this request's size whole: the request in MiB
// rounded up to a power of two, at least the smallest value the key accepts (20).
size_t SuggestedMaxSplitMb(size_t rounded_bytes) {
  size_t mb = (rounded_bytes + kMiB - 1) / kMiB;
  size_t pow2 = 1;
  while (pow2 < mb && pow2 < (size_t{1} << 42)) pow2 <<= 1;
  return std::max<size_t>(pow2, 20);
}

// Decimal fraction rounded up to two places, capped at 1: what to set
// per_process_memory_fraction to.
std::string FractionAtLeast(size_t needed, size_t total) {
  if (total == 0) return "1";
  double f = std::ceil(Share(needed, total) * 100.0) / 100.0;
  if (f >= 1.0) return "1";
  return absl::StrFormat("%.2f", f);
}

std::string SiteName(SiteId site) { return GetSite(site).ToString(); }

OomCause ChooseCause(const OomReport& r) {
  const size_t limit = Limit(r);
  if (r.rounded_bytes > r.device_total || r.rounded_bytes > limit) {
    return OomCause::kTooLarge;
  }
  if (limit < r.device_total && r.reserved + r.segment_bytes > limit &&
      r.driver_free >= r.segment_bytes) {
    return OomCause::kMemoryFraction;
  }
  if (r.pending > 0 && r.pending >= r.rounded_bytes) return OomCause::kPendingStreams;
  const size_t total_free = TotalFree(r);
  if (total_free >= r.rounded_bytes && r.largest_free_block < r.rounded_bytes) {
    return OomCause::kFragmentation;
  }
  // Mostly scattered free memory that, with what the driver could still give, would
  // have held the request had it been contiguous.
  const size_t headroom = std::min(r.driver_free, SaturatingSub(limit, r.reserved));
  if (r.fragmentation > 0.5 && total_free > 0 && total_free + headroom >= r.rounded_bytes) {
    return OomCause::kFragmentation;
  }
  return OomCause::kRealUse;
}

std::string FragmentationRemedy(const OomReport& r, size_t max_split_size,
                                bool expandable_segments, bool virtual_memory) {
  const size_t mb = SuggestedMaxSplitMb(r.rounded_bytes);
  std::vector<std::string> settings;
  // Suggesting expandable segments where the backend has no virtual memory would only
  // earn a warning and change nothing.
  if (!expandable_segments && virtual_memory) settings.push_back("expandable_segments:true");
  if (max_split_size == std::numeric_limits<size_t>::max() || max_split_size > mb * kMiB) {
    settings.push_back(absl::StrCat("max_split_size_mb:", mb));
  }
  std::string what = absl::StrCat(
      FormatBytes(TotalFree(r)), " is free in cached blocks, but the largest is ",
      FormatBytes(r.largest_free_block), " (fragmentation ", Percent(r.fragmentation),
      "). ");
  if (settings.empty()) {
    return absl::StrCat(what,
                        expandable_segments
                            ? "expandable_segments are in use and max_split_size_mb is set"
                            : "max_split_size_mb is set, and this backend has no virtual "
                              "memory for expandable_segments",
                        "; free long-lived buffers earlier, or allocate them before large "
                        "short-lived ones, so that they do not pin partly used segments.");
  }
  return absl::StrCat(what, "Set ", absl::StrJoin(settings, " and "),
                      " in DEVMEM_CONF (e.g. DEVMEM_CONF=", absl::StrJoin(settings, ","),
                      ").");
}

std::string RealUseRemedy(const OomReport& r) {
  std::string out = absl::StrCat("Live buffers use ", FormatBytes(r.allocated), " of ",
                                 FormatBytes(Limit(r)), ".");
  if (!r.top_sites.empty()) {
    std::vector<std::string> holders;
    for (size_t i = 0; i < r.top_sites.size() && i < 2; ++i) {
      const SiteUsage& u = r.top_sites[i];
      holders.push_back(absl::StrCat(SiteName(u.site), " holds ", FormatBytes(u.live_bytes),
                                     " (", Percent(Share(u.live_bytes, r.allocated)),
                                     ") in ", u.live_count, u.live_count == 1 ? " buffer" : " buffers"));
    }
    absl::StrAppend(&out, " Largest holders: ", absl::StrJoin(holders, "; "), ".");
  }
  if (r.copy_bytes > 0) {
    absl::StrAppend(&out, " ", FormatBytes(r.copy_bytes), " (",
                    Percent(Share(r.copy_bytes, r.allocated)),
                    ") was created by clone/contiguous/to: use views where a copy is not "
                    "needed, and free copies as soon as they are used.");
  }
  absl::StrAppend(&out,
                  " Free buffers sooner, reduce the working set (e.g. the batch size), "
                  "or use a larger device.");
  return out;
}

std::string Remedy(const OomReport& r, size_t max_split_size, bool expandable_segments,
                   bool virtual_memory) {
  const size_t limit = Limit(r);
  switch (r.cause) {
    case OomCause::kTooLarge:
      if (r.rounded_bytes > r.device_total) {
        return absl::StrCat("The request (", FormatBytes(r.rounded_bytes),
                            ") exceeds the device's total memory (",
                            FormatBytes(r.device_total),
                            "); split the work into smaller buffers or use a larger device.");
      }
      return absl::StrCat("The request (", FormatBytes(r.rounded_bytes),
                          ") exceeds the memory limit (", FormatBytes(limit),
                          ") set by per_process_memory_fraction; raise it to at least ",
                          FractionAtLeast(r.rounded_bytes, r.device_total),
                          " or split the work into smaller buffers.");
    case OomCause::kMemoryFraction:
      return absl::StrCat(
          "per_process_memory_fraction caps reserved memory at ", FormatBytes(limit),
          " (", FractionAtLeast(limit, r.device_total), " of ",
          FormatBytes(r.device_total), ") while the driver still has ",
          FormatBytes(r.driver_free), " free; raise per_process_memory_fraction to at "
          "least ", FractionAtLeast(r.reserved + r.segment_bytes, r.device_total),
          " (e.g. DEVMEM_CONF=per_process_memory_fraction:",
          FractionAtLeast(r.reserved + r.segment_bytes, r.device_total), ").");
    case OomCause::kPendingStreams:
      return absl::StrCat(
          FormatBytes(r.pending),
          " is freed but waits for work on other streams (record_stream); synchronize "
          "those streams before allocating again, or allocate the buffers on the stream "
          "that uses them so that record_stream is not needed.");
    case OomCause::kFragmentation:
      return FragmentationRemedy(r, max_split_size, expandable_segments, virtual_memory);
    case OomCause::kRealUse:
      return RealUseRemedy(r);
  }
  return "";
}

}  // namespace

void ChooseRemedy(OomReport* report, size_t max_split_size, bool expandable_segments,
                  bool virtual_memory) {
  report->cause = ChooseCause(*report);
  report->remedy = Remedy(*report, max_split_size, expandable_segments, virtual_memory);
}

std::string OomReport::ToString() const {
  std::string out = absl::StrCat(
      "devmem: out of memory on ", device.ToString(), ": tried to allocate ",
      FormatBytes(requested_bytes), " (rounded ", FormatBytes(rounded_bytes),
      "); device total ", FormatBytes(device_total), ", driver free ",
      FormatBytes(driver_free), "; ", FormatBytes(allocated), " allocated by devmem, ",
      FormatBytes(reserved_unallocated), " reserved but unallocated.\n");
  absl::StrAppend(&out, "  requested by: ", SiteName(site), " on stream ", stream.handle,
                  "\n");
  const size_t limit = Limit(*this);
  if (limit < device_total) {
    absl::StrAppend(&out, "  memory limit: ", FormatBytes(limit), " (",
                    Percent(Share(limit, device_total)),
                    " of the device, per_process_memory_fraction)\n");
  }
  absl::StrAppend(&out, "  reserved: ", FormatBytes(reserved), " in ", segment_count,
                  " segments (could not get ", FormatBytes(segment_bytes),
                  " more); pending on other streams: ", FormatBytes(pending), "\n");
  absl::StrAppend(&out, "  largest free block: ", FormatBytes(largest_free_block), " of ",
                  FormatBytes(TotalFree(*this)), " free in ", free_blocks,
                  " cached blocks; fragmentation ", Percent(fragmentation), "\n");
  if (!top_sites.empty()) {
    absl::StrAppend(&out, "  top sites by live bytes:\n");
    for (size_t i = 0; i < top_sites.size(); ++i) {
      const SiteUsage& u = top_sites[i];
      absl::StrAppendFormat(&out, "    %2d. %s: %s in %d %s (%s)\n", i + 1,
                            SiteName(u.site), FormatBytes(u.live_bytes), u.live_count,
                            u.live_count == 1 ? "buffer" : "buffers", Percent(Share(u.live_bytes, allocated)));
    }
  }
  if (!top_stacks.empty()) {
    absl::StrAppend(&out, "  sampled stacks by estimated live bytes (one sample per ",
                    FormatBytes(stack_sample_bytes), " allocated on average):\n");
    for (size_t i = 0; i < top_stacks.size(); ++i) {
      const SampledStack& s = top_stacks[i];
      absl::StrAppendFormat(&out, "    %2d. ~%s estimated%s (%d %s of %s) at %s\n", i + 1,
                            FormatBytes(static_cast<size_t>(s.estimated_bytes)),
                            s.estimate_clamped ? ", clamped to its site's exact live bytes" : "",
                            s.samples, s.samples == 1 ? "sample" : "samples",
                            FormatBytes(s.sampled_bytes), SiteName(s.site));
      const size_t shown = std::min(s.frames.size(), kOomStackFrames);
      for (size_t f = 0; f < shown; ++f) absl::StrAppend(&out, "          ", s.frames[f], "\n");
      if (shown < s.frames.size()) {
        absl::StrAppend(&out, "          ... ", s.frames.size() - shown, " more frames\n");
      }
    }
  }
  absl::StrAppend(&out, "  created by clone/contiguous/to: ", FormatBytes(copy_bytes), " (",
                  Percent(Share(copy_bytes, allocated)), " of allocated)\n");
  if (arena_live_bytes + arena_retained_bytes > 0) {
    absl::StrAppend(&out, "  scoped arenas hold: ", FormatBytes(arena_live_bytes),
                    " live (", FormatBytes(arena_escaped_bytes),
                    " escaped their scope), ", FormatBytes(arena_retained_bytes),
                    " in empty retained chunks\n");
  }
  if (private_pool_bytes > 0) {
    absl::StrAppend(&out, "  private pools (CUDA graphs) hold: ", FormatBytes(private_pool_bytes),
                    " of the reserved bytes, usable only by their graphs until released\n");
  }
  absl::StrAppend(&out, "  cause: ", std::string(OomCauseName(cause)), "\n");
  absl::StrAppend(&out, "  remedy: ", remedy);
  return out;
}

// Why the bound: a group's estimate is the sum of its samples' weights s / p(s), and
// one sample of a buffer much smaller than stack_sample_bytes weighs far more than the
// buffer (a 60 MiB buffer sampled at 256 MiB stands for ~287 MiB), so on a small device
// a report could name more bytes for one stack than its site holds, or than the device
// has. The site's live bytes are exact, and bound every group sampled under it.
void AttachTopStacks(const void* owner, const std::vector<SiteStats>& site_stats,
                     OomReport* report) noexcept {
  if (owner == nullptr) return;
  try {
    report->stack_sample_bytes = stack_sampler::MeanBytes();
    std::vector<SampledStack> groups =
        stack_sampler::GroupSamples(stack_sampler::LiveSamples(owner));
    for (SampledStack& g : groups) {
      const double exact =
          g.site < site_stats.size() ? static_cast<double>(site_stats[g.site].live_bytes) : 0;
      // Never below the sampled buffers themselves: they are live.
      const double bound = std::max(exact, static_cast<double>(g.sampled_bytes));
      if (g.estimated_bytes > bound) {
        g.estimated_bytes = bound;
        g.estimate_clamped = true;
      }
    }
    // Ranked as GroupSamples ranks, after the bound.
    std::sort(groups.begin(), groups.end(), [](const SampledStack& a, const SampledStack& b) {
      if (a.estimated_bytes != b.estimated_bytes) return a.estimated_bytes > b.estimated_bytes;
      return std::pair(a.site, a.stack) < std::pair(b.site, b.stack);
    });
    if (groups.size() > kOomTopStacks) groups.resize(kOomTopStacks);
    for (SampledStack& g : groups) g.frames = stack_sampler::StackFrames(g.stack);
    report->top_stacks = std::move(groups);
  } catch (const std::bad_alloc&) {
    report->top_stacks.clear();  // the report without them rather than no report
  }
}

OutOfMemoryError::OutOfMemoryError(OomReport report)
    : report_(std::move(report)), message_(report_.ToString()) {}

}  // namespace devmem
