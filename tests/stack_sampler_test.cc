// tests/stack_sampler_test.cc: sampled stack traces (allocator/stack_sampler.h). The
// estimator's per-site sums are checked against the exact live bytes of a generated
// trace within a tolerance derived from the estimator's own variance; frees forget
// their samples; 0 turns sampling off; a sampled stack names the function that
// allocated.
#include "allocator/stack_sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

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

}  // namespace
}  // namespace devmem
