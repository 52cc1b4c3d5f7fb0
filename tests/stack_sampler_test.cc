// tests/stack_sampler_test.cc: sampled stack traces (allocator/stack_sampler.h). The
// estimator's per-site sums are checked against the exact live bytes of a generated
// sequence and of a recorded trace's replay, within a tolerance derived from the
// estimator's own variance; frees forget
// their samples; 0 turns sampling off; a sampled stack names the function that
// allocated; OOM reports list the stacks holding the most, and snapshots carry each
// sampled block's stack, through their JSON and back.
#include "allocator/stack_sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/oom_report.h"
#include "runtime/json.h"
#include "tests/test_util.h"
#include "tests/text_assertions.h"

namespace devmem {
namespace {

using testutil::CatchOom;
using testutil::MakeSimAllocator;

// Restores the process-wide rate a test changes.
class StackSamplerTest : public ::testing::Test {
 protected:
  ~StackSamplerTest() override { stack_sampler::SetMeanBytes(kDefaultStackSampleBytes); }
};

TEST_F(StackSamplerTest, WeightIsSizeOverSamplingProbability) {
  constexpr uint64_t kMean = 1 << 16;
  for (size_t s : {size_t{1}, size_t{512}, size_t{1} << 16, size_t{1} << 24}) {
    const double p = 1 - std::exp(-static_cast<double>(s) / kMean);
    EXPECT_NEAR(SampleWeight(s, kMean), static_cast<double>(s) / p,
                1e-9 * static_cast<double>(s) / p)
        << s;
  }
  // Small allocations stand for about one mean; huge ones (always sampled) for themselves.
  EXPECT_NEAR(SampleWeight(1, kMean), kMean, 1.0);
  EXPECT_DOUBLE_EQ(SampleWeight(size_t{1} << 30, kMean), double(size_t{1} << 30));
}

// A generated trace on three sites of very different sizes: after it, the estimate of
// each site's live bytes is within 4 standard deviations (sigma^2 = sum over the live
// allocations of s^2 (1 - p(s)) / p(s)) of the exact live bytes, and the allocator's
// own per-site accounting holds at least those bytes.
TEST_F(StackSamplerTest, EstimatesMatchExactPerSiteLiveBytes) {
  constexpr uint64_t kMean = 64 * 1024;
  auto a = MakeSimAllocator("stack_sample_bytes:64KiB", 8 * kGiB);
  ASSERT_EQ(stack_sampler::MeanBytes(), kMean);
  stack_sampler::SeedThreadForTesting(12345);
  const SiteId sites[3] = {
      InternNamedSite("sampler_test.cc", 1, "small", SiteKind::kAlloc),
      InternNamedSite("sampler_test.cc", 2, "medium", SiteKind::kAlloc),
      InternNamedSite("sampler_test.cc", 3, "large", SiteKind::kAlloc)};
  const size_t lo[3] = {512, 64 * 1024, 1 << 20};
  const size_t span[3] = {8 * 1024, 448 * 1024, 3 << 20};
  const int count[3] = {3000, 1500, 200};
  struct Live { void* p; size_t bytes; int site; };
  std::vector<Live> live;
  uint64_t rng = 777;
  for (int k = 0; k < 3; ++k) {
    for (int i = 0; i < count[k]; ++i) {
      rng = testutil::SplitMix64(rng);
      const size_t bytes = (lo[k] + rng % span[k]) / 512 * 512;
      live.push_back({a->allocate(bytes, {}, sites[k]), bytes, k});
      // Free about half, chosen at random among the live ones.
      rng = testutil::SplitMix64(rng);
      if (rng % 2 == 0 && !live.empty()) {
        const size_t j = (rng >> 8) % live.size();
        a->free(live[j].p);
        live[j] = live.back();
        live.pop_back();
      }
    }
  }
  double exact[3] = {}, variance[3] = {};
  for (const Live& l : live) {
    const double s = static_cast<double>(l.bytes);
    const double p = -std::expm1(-s / kMean);
    exact[l.site] += s;
    variance[l.site] += s * s * (1 - p) / p;
  }
  double estimated[3] = {};
  uint64_t sampled_exact[3] = {};
  for (const SampledStack& g : stack_sampler::LiveStacks(a.get())) {
    for (int k = 0; k < 3; ++k) {
      if (g.site == sites[k]) {
        estimated[k] += g.estimated_bytes;
        sampled_exact[k] += g.sampled_bytes;
      }
    }
  }
  const std::vector<SiteStats> stats = a->site_stats();
  for (int k = 0; k < 3; ++k) {
    const double sigma = std::sqrt(variance[k]);
    EXPECT_NEAR(estimated[k], exact[k], 4 * sigma)
        << "site " << k << ": exact " << exact[k] << ", sigma " << sigma;
    EXPECT_LE(sampled_exact[k], exact[k]);
    EXPECT_GE(static_cast<double>(testutil::SiteStatsFor(stats, sites[k]).live_bytes),
              exact[k]);
  }
  // The large site's allocations are nearly all sampled, so its estimate is close.
  EXPECT_LT(std::sqrt(variance[2]), 0.05 * exact[2]);

  for (const Live& l : live) a->free(l.p);
  EXPECT_TRUE(stack_sampler::LiveStacks(a.get()).empty()) << "frees kept samples";
}

// A recorded trace (tests/data/traces/transformer.jsonl: 882 allocations of 8 sites,
// 8.4 GiB in all, 2 GiB live at its peak) replayed with its sites at one sample per
// 4 MiB: at every 50th event, the estimate of all live bytes, and that of each site
// expected to hold at least 5 live samples (the sum of p(s) over its live
// allocations: below that the estimate's distribution is too skewed for a normal
// bound, one sample of a 16 KiB buffer standing for 4 MiB), is within 4 standard
// deviations of the exact live bytes counted along the replay; a site with nothing
// live has no live sample.
TEST_F(StackSamplerTest, EstimatesMatchExactPerSiteLiveBytesOnATraceReplay) {
  constexpr uint64_t kMean = 4 << 20;
  std::ifstream in(std::string(DEVMEM_SOURCE_DIR) + "/tests/data/traces/transformer.jsonl");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  SiteMap names;
  absl::StatusOr<std::vector<TraceEvent>> events = TraceFromJsonl(text, &names);
  ASSERT_TRUE(events.ok()) << events.status();
  auto a = MakeSimAllocator("stack_sample_bytes:4MiB", uint64_t{64} << 30);
  stack_sampler::SeedThreadForTesting(2024);
  std::map<SiteId, SiteId> site_of;  // the trace's id -> this process's
  for (const auto& [id, info] : names) {
    site_of[id] = InternNamedSite(info.file, info.line, info.function, info.kind, info.tag);
  }
  struct Live { void* p; size_t bytes; SiteId site; };
  std::map<uintptr_t, Live> live;  // by the trace's address
  size_t checkpoints = 0, samples_seen = 0, site_checks = 0;
  for (size_t i = 0; i < events->size(); ++i) {
    const TraceEvent& e = (*events)[i];
    if (e.action == AllocAction::kAlloc) {
      const SiteId site = site_of.at(e.site);
      live[e.addr] = {a->allocate(e.requested, {}, site), e.requested, site};
    } else if (e.action == AllocAction::kFree) {
      auto it = live.find(e.addr);
      ASSERT_NE(it, live.end()) << "event " << e.seq;
      a->free(it->second.p);
      live.erase(it);
    }
    if (i % 50 != 49) continue;
    ++checkpoints;
    std::map<SiteId, double> exact, variance, expected_samples, estimated;
    double all_exact = 0, all_variance = 0, all_estimated = 0;
    for (const auto& [_, l] : live) {
      const double s = static_cast<double>(l.bytes);
      const double p = -std::expm1(-s / kMean);
      exact[l.site] += s;
      variance[l.site] += s * s * (1 - p) / p;
      expected_samples[l.site] += p;
      all_exact += s;
      all_variance += s * s * (1 - p) / p;
    }
    for (const SampledStack& g : stack_sampler::LiveStacks(a.get())) {
      estimated[g.site] += g.estimated_bytes;
      all_estimated += g.estimated_bytes;
      samples_seen += g.samples;
    }
    EXPECT_NEAR(all_estimated, all_exact, 4 * std::sqrt(all_variance)) << "event " << e.seq;
    for (const auto& [_, site] : site_of) {
      if (exact[site] == 0) {
        EXPECT_EQ(estimated[site], 0) << "event " << e.seq << ": site " << site;
        continue;
      }
      if (expected_samples[site] < 5) continue;
      ++site_checks;
      EXPECT_NEAR(estimated[site], exact[site], 4 * std::sqrt(variance[site]))
          << "event " << e.seq << ": site " << GetSite(site).ToString() << ", exact "
          << exact[site];
    }
  }
  EXPECT_GE(checkpoints, 30u);
  EXPECT_GE(site_checks, 60u) << "too few sites held enough samples to be checked";
  EXPECT_GE(samples_seen, 1000u) << "too few samples for the test to say anything";
  for (const auto& [_, l] : live) a->free(l.p);
  EXPECT_TRUE(stack_sampler::LiveStacks(a.get()).empty());
}

[[gnu::noinline]] void* AllocateFromANamedFunction(CachingAllocator& alloc) {
  void* p = alloc.allocate(4096);
  asm volatile("" ::: "memory");  // keep this frame (no tail call)
  return p;
}

TEST_F(StackSamplerTest, ASampledStackNamesTheAllocatingFunction) {
  auto a = MakeSimAllocator("stack_sample_bytes:1");  // every allocation: p = 1 - e^-4096
  void* p = AllocateFromANamedFunction(*a);
  const std::vector<SampledStack> stacks = stack_sampler::LiveStacks(a.get());
  ASSERT_EQ(stacks.size(), 1u);
  EXPECT_EQ(stacks[0].samples, 1u);
  EXPECT_EQ(stacks[0].sampled_bytes, 4096u);
  std::string all;
  for (const std::string& f : stacks[0].frames) all += f + "\n";
  EXPECT_NE(all.find("AllocateFromANamedFunction"), std::string::npos) << all;
  EXPECT_EQ(stack_sampler::StackFrames(stacks[0].stack), stacks[0].frames);
  a->free(p);
  EXPECT_TRUE(stack_sampler::LiveStacks(a.get()).empty());
}

TEST_F(StackSamplerTest, ZeroTurnsSamplingOffAndOwnersAreSeparate) {
  auto off = MakeSimAllocator("stack_sample_bytes:0");
  EXPECT_EQ(stack_sampler::MeanBytes(), 0u);
  void* p = off->allocate(1 << 20);
  EXPECT_TRUE(stack_sampler::LiveStacks(off.get()).empty());
  off->free(p);

  auto one = MakeSimAllocator("stack_sample_bytes:1");
  auto two = MakeSimAllocator("stack_sample_bytes:1");
  void* q = one->allocate(4096);
  EXPECT_EQ(stack_sampler::LiveStacks(one.get()).size(), 1u);
  EXPECT_TRUE(stack_sampler::LiveStacks(two.get()).empty());
  const void* owner = one.get();
  (void)q;
  one.alloc.reset();  // its destructor drops its samples (the leak is reported)
  EXPECT_TRUE(stack_sampler::LiveStacks(owner).empty());
}

// Allocates `bytes` under `depth` nested frames of this function, so that each depth
// is a stack of its own.
[[gnu::noinline]] void* AllocateAtDepth(CachingAllocator& alloc, int depth, size_t bytes) {
  void* p = depth <= 1 ? alloc.allocate(bytes) : AllocateAtDepth(alloc, depth - 1, bytes);
  asm volatile("" ::: "memory");  // keep this frame (no tail call)
  return p;
}
[[gnu::noinline]] void* HoldTheMost(CachingAllocator& alloc) {
  void* p = alloc.allocate(24 << 20);
  asm volatile("" ::: "memory");
  return p;
}

std::string Joined(const std::vector<std::string>& frames) {
  std::string all;
  for (const std::string& f : frames) all += f + "\n";
  return all;
}

// Seven stacks of growing sizes, then an OOM: the report lists the five that hold the
// most, largest first, symbolized (every allocation sampled: the estimates are the
// bytes); its message and its JSON (the OOM dump's "oom") show them too.
TEST_F(StackSamplerTest, AnOomReportListsTheSampledStacksHoldingTheMost) {
  auto a = MakeSimAllocator("stack_sample_bytes:1,sim_capacity:96MiB");
  std::vector<void*> held;
  for (int depth = 1; depth <= 7; ++depth) {
    held.push_back(AllocateAtDepth(*a, depth, size_t(depth) << 20));  // 1 .. 7 MiB
  }
  held.push_back(HoldTheMost(*a));  // 24 MiB: 52 MiB held in all
  std::optional<OomReport> report = CatchOom([&] { a->allocate(64 << 20); });
  ASSERT_TRUE(report.has_value()) << "no OutOfMemoryError";
  EXPECT_EQ(report->stack_sample_bytes, 1u);
  ASSERT_EQ(report->top_stacks.size(), kOomTopStacks);
  EXPECT_DOUBLE_EQ(report->top_stacks[0].estimated_bytes, double(24 << 20));
  EXPECT_CONTAINS(Joined(report->top_stacks[0].frames), "HoldTheMost");
  for (size_t i = 1; i < kOomTopStacks; ++i) {
    const SampledStack& s = report->top_stacks[i];
    EXPECT_DOUBLE_EQ(s.estimated_bytes, double((8 - i) << 20)) << i;  // 7, 6, 5, 4 MiB
    EXPECT_EQ(s.samples, 1u);
    EXPECT_CONTAINS(Joined(s.frames), "AllocateAtDepth");
    EXPECT_NOT_CONTAINS(Joined(s.frames), "HoldTheMost");
  }
  const std::string message = report->ToString();
  EXPECT_CONTAINS(message, "sampled stacks by estimated live bytes");
  EXPECT_CONTAINS(message, "~24.0 MiB estimated (1 sample of 24.0 MiB)");
  EXPECT_CONTAINS(message, "HoldTheMost");
  const std::string dump = OomDumpToJson(RuntimeSnapshot{}, *report);
  EXPECT_CONTAINS(dump, "\"top_stacks\"");
  EXPECT_CONTAINS(dump, "HoldTheMost");

  // Sampling off: no stacks, and no such section.
  stack_sampler::SetMeanBytes(0);
  for (void* p : held) a->free(p);
  held = {HoldTheMost(*a), HoldTheMost(*a)};
  report = CatchOom([&] { a->allocate(64 << 20); });
  ASSERT_TRUE(report.has_value());
  EXPECT_TRUE(report->top_stacks.empty());
  EXPECT_NOT_CONTAINS(report->ToString(), "sampled stacks");
  for (void* p : held) a->free(p);
}

// One 60 MiB buffer sampled at one sample per GiB on a 64 MiB device: alone, its sample
// stands for 60 MiB / (1 - e^(-60/1024)), about 1 GiB, more than the device holds. The
// OOM report bounds the estimate by its site's exact live bytes, and says so.
TEST_F(StackSamplerTest, AnOomReportBoundsEachEstimateByItsSitesExactBytes) {
  auto a = MakeSimAllocator("stack_sample_bytes:1GiB,sim_capacity:64MiB");
  const SiteId site = InternSite(std::source_location::current(), SiteKind::kAlloc);
  void* held = nullptr;
  // The first seed whose countdown the allocation crosses (each does with p ~ 5.7%).
  for (uint64_t seed = 1; seed <= 2000 && held == nullptr; ++seed) {
    stack_sampler::SeedThreadForTesting(seed);
    void* p = a->allocate(60 << 20, {}, site);
    if (!stack_sampler::LiveStacks(a.get()).empty()) {
      held = p;
    } else {
      a->free(p);
    }
  }
  ASSERT_NE(held, nullptr) << "no seed in 1 .. 2000 sampled the buffer";
  ASSERT_GT(stack_sampler::LiveStacks(a.get())[0].estimated_bytes, double(64 << 20));
  std::optional<OomReport> report = CatchOom([&] { a->allocate(8 << 20); });
  ASSERT_TRUE(report.has_value()) << "no OutOfMemoryError";
  ASSERT_EQ(report->top_stacks.size(), 1u);
  const SampledStack& s = report->top_stacks[0];
  EXPECT_EQ(s.site, site);
  EXPECT_TRUE(s.estimate_clamped);
  EXPECT_DOUBLE_EQ(s.estimated_bytes,
                   double(testutil::SiteStatsFor(a->site_stats(), site).live_bytes));
  EXPECT_DOUBLE_EQ(s.estimated_bytes, double(60 << 20));
  EXPECT_CONTAINS(report->ToString(),
                  "~60.0 MiB estimated, clamped to its site's exact live bytes (1 sample of "
                  "60.0 MiB)");
  a->free(held);
}

// A snapshot gives each sampled allocated block its stack, and the groups of those
// stacks; the JSON carries them symbolized, and reading it back gives them as written
// (frames from the file, not looked up again in the reading process).
TEST_F(StackSamplerTest, SnapshotsCarryTheSampledStacksOfTheirBlocks) {
  auto a = MakeSimAllocator("stack_sample_bytes:1");
  void* big = HoldTheMost(*a);
  void* small = AllocateAtDepth(*a, 2, 1 << 20);
  void* freed = AllocateAtDepth(*a, 3, 1 << 20);
  a->free(freed);
  const AllocatorSnapshot snap = a->snapshot();
  EXPECT_TRUE(snap.local_stacks);
  EXPECT_EQ(snap.stack_sample_bytes, 1u);
  ASSERT_EQ(snap.sampled_stacks.size(), 2u);
  EXPECT_EQ(snap.sampled_stacks[0].sampled_bytes, size_t{24} << 20);
  EXPECT_TRUE(snap.sampled_stacks[0].frames.empty()) << "symbolized under the snapshot";
  std::map<uintptr_t, StackId> stack_of;
  for (const SegmentInfo& seg : snap.segments) {
    for (const BlockInfo& b : seg.blocks) {
      if (b.stack != kNoStack) stack_of[b.addr] = b.stack;
    }
  }
  ASSERT_EQ(stack_of.size(), 2u);
  EXPECT_EQ(stack_of[reinterpret_cast<uintptr_t>(big)], snap.sampled_stacks[0].stack);
  EXPECT_EQ(stack_of[reinterpret_cast<uintptr_t>(small)], snap.sampled_stacks[1].stack);

  RuntimeSnapshot rs;
  rs.devices.push_back(snap);
  const std::string text = SnapshotToJson(rs);
  absl::StatusOr<RuntimeSnapshot> back = SnapshotFromJson(text);
  ASSERT_TRUE(back.ok()) << back.status();
  const AllocatorSnapshot& d = back->devices.at(0);
  EXPECT_FALSE(d.local_stacks);
  EXPECT_EQ(d.stack_sample_bytes, 1u);
  ASSERT_EQ(d.sampled_stacks.size(), 2u);
  EXPECT_CONTAINS(Joined(d.sampled_stacks[0].frames), "HoldTheMost");
  EXPECT_EQ(d.sampled_stacks[0].frames, stack_sampler::StackFrames(snap.sampled_stacks[0].stack));
  EXPECT_CONTAINS(Joined(d.sampled_stacks[1].frames), "AllocateAtDepth");
  EXPECT_EQ(d.sampled_stacks[1].estimated_bytes, snap.sampled_stacks[1].estimated_bytes);
  size_t blocks_with_stacks = 0;
  for (const SegmentInfo& seg : d.segments) {
    for (const BlockInfo& b : seg.blocks) {
      if (b.stack == kNoStack) continue;
      ++blocks_with_stacks;
      EXPECT_EQ(b.stack, stack_of[b.addr]);
    }
  }
  EXPECT_EQ(blocks_with_stacks, 2u);
  EXPECT_EQ(SnapshotToJson(*back), text) << "a read snapshot writes back as it was";

  // A malformed group is an error naming the field.
  std::string bad = text;
  const size_t at = bad.find("\"estimated_bytes\":");
  ASSERT_NE(at, std::string::npos);
  bad.insert(at + std::string("\"estimated_bytes\":").size(), "\"many\",\"x\":");
  absl::StatusOr<RuntimeSnapshot> refused = SnapshotFromJson(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_CONTAINS(refused.status().message(),
                  "devices[0].sampled_stacks[0].estimated_bytes: expected a non-negative number");
  a->free(big);
  a->free(small);
}

TEST_F(StackSamplerTest, TheConfigKeyIsBoundedAndNamed) {
  absl::StatusOr<Config> bad = ParseConfig("stack_sample_bytes:2TiB");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("stack_sample_bytes"), std::string::npos)
      << bad.status();
  absl::StatusOr<Config> ok = ParseConfig("stack_sample_bytes:512KiB");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->stack_sample_bytes, 512u * 1024);
  EXPECT_EQ(Config{}.stack_sample_bytes, kDefaultStackSampleBytes);
}

// The countdown is kept in bytes of the mean it was drawn at: when the process's mean
// changes, a thread's next allocation counts what is left in units of the new mean.
// Drawn at 1 TiB, the countdown (about a TiB) would let millions of 512-byte requests
// through unsampled if kept as bytes; rescaled to a 1-byte mean it is about 1 byte, so
// the next request of 512 bytes crosses it (p = 1 - e^-512).
TEST_F(StackSamplerTest, ACountdownDrawnAtAnotherMeanIsRescaledToTheNewOne) {
  auto a = MakeSimAllocator("stack_sample_bytes:1TiB");
  ASSERT_EQ(stack_sampler::MeanBytes(), uint64_t{1} << 40);
  stack_sampler::SeedThreadForTesting(7);
  void* first = a->allocate(512);
  EXPECT_TRUE(stack_sampler::LiveStacks(a.get()).empty());  // p = 512 / 2^40
  stack_sampler::SetMeanBytes(1);
  void* second = a->allocate(512);
  const std::vector<SampledStack> stacks = stack_sampler::LiveStacks(a.get());
  ASSERT_EQ(stacks.size(), 1u);
  EXPECT_EQ(stacks[0].samples, 1u);
  EXPECT_EQ(stacks[0].sampled_bytes, 512u);
  // And the countdown goes on at the new mean: the next request is sampled too (its
  // stack is another: grouped apart).
  void* third = a->allocate(512);
  uint64_t samples = 0;
  for (const SampledStack& s : stack_sampler::LiveStacks(a.get())) samples += s.samples;
  EXPECT_EQ(samples, 2u);
  for (void* p : {first, second, third}) a->free(p);
  EXPECT_TRUE(stack_sampler::LiveStacks(a.get()).empty());
}

}  // namespace
}  // namespace devmem
