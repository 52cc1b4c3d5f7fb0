// tests/tensor_sites_test.cc: every allocation of the tensor layer is recorded at the
// caller's file and line with its kind: clone, contiguous, to_device for the three
// copies, alloc for creation and op outputs. And, in the seed's loop, slicing
// allocates nothing while clone() allocates exactly one buffer, attributed to the line
// that called it.
#include <gtest/gtest.h>

#include <source_location>
#include <string>

#include "absl/strings/str_cat.h"

#include "allocator/site.h"
#include "allocator/stack_sampler.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/tensor.h"
#include "tests/tensor_test_util.h"

namespace devmem {
namespace {

using tensor_test::SimDeviceTest;

// Library helpers as programs write them (noinline so the sampled stack of a helper
// that does neither keeps its frame).
Tensor HelperForwardingItsLocation(const Tensor& t,
                                   std::source_location loc = std::source_location::current()) {
  return t.clone(loc);
}
int g_plain_helper_line = 0;
[[gnu::noinline]] Tensor LibraryHelperClone(const Tensor& t) {
  g_plain_helper_line = __LINE__ + 1;
  return t.clone();
}
int g_pushing_helper_line = 0;
Tensor LibraryHelperPushingAFrame(const Tensor& t,
                                  std::source_location loc = std::source_location::current()) {
  ScopedSite frame(loc);
  g_pushing_helper_line = __LINE__ + 1;
  return t.clone();
}

class TensorSitesTest : public SimDeviceTest {
 protected:
  // The site recorded on the block behind `t` (which must own its storage).
  SiteInfo SiteOf(const Tensor& t) {
    std::optional<BlockInfo> block = alloc().find_allocation(t.storage()->data());
    EXPECT_TRUE(block.has_value()) << "no allocated block at " << t.storage()->data();
    return block ? GetSite(block->site) : SiteInfo{};
  }
  SiteId SiteIdOf(const Tensor& t) {
    std::optional<BlockInfo> block = alloc().find_allocation(t.storage()->data());
    return block ? block->site : kUnknownSite;
  }
};

TEST_F(TensorSitesTest, CloneIsAttributedToTheCallersLine) {
  Tensor base = zeros({16, 8}, On());
  const int line = __LINE__ + 1;
  Tensor copy = base.clone();
  const SiteInfo site = SiteOf(copy);
  EXPECT_EQ(site.file, __FILE__);
  EXPECT_EQ(site.line, static_cast<uint32_t>(line));
  EXPECT_EQ(site.kind, SiteKind::kClone);

  const std::vector<SiteStats> stats = alloc().site_stats();
  const SiteId id = SiteIdOf(copy);
  ASSERT_LT(id, stats.size());
  EXPECT_EQ(stats[id].live_count, 1);
  EXPECT_EQ(stats[id].total_count, 1);
  EXPECT_GE(stats[id].live_bytes, static_cast<int64_t>(16 * 8 * sizeof(float)));
}

TEST_F(TensorSitesTest, ContiguousAndToRecordTheirKinds) {
  Tensor base = ones({4, 6}, On());
  const int contiguous_line = __LINE__ + 1;
  Tensor c = base.t().contiguous();
  EXPECT_EQ(SiteOf(c).file, __FILE__);
  EXPECT_EQ(SiteOf(c).line, static_cast<uint32_t>(contiguous_line));
  EXPECT_EQ(SiteOf(c).kind, SiteKind::kContiguous);

  auto other = tensor_test::MakeSmallSim(tensor_test::kOtherSimDevice.index);
  ScopedAllocatorOverride use(other);
  const int to_line = __LINE__ + 1;
  Tensor moved = base.to(tensor_test::kOtherSimDevice);
  std::optional<BlockInfo> block = other->find_allocation(moved.storage()->data());
  ASSERT_TRUE(block.has_value());
  const SiteInfo site = GetSite(block->site);
  EXPECT_EQ(site.file, __FILE__);
  EXPECT_EQ(site.line, static_cast<uint32_t>(to_line));
  EXPECT_EQ(site.kind, SiteKind::kToDevice);
}

TEST_F(TensorSitesTest, CreationAndOpOutputsRecordKindAllocAtTheCallersLine) {
  const int zeros_line = __LINE__ + 1;
  Tensor a = zeros({3, 3}, On());
  const int relu_line = __LINE__ + 1;
  Tensor b = relu(a);
  const int matmul_line = __LINE__ + 1;
  Tensor c = matmul(a, b.t());
  Generator gen(1);
  const int randn_line = __LINE__ + 1;
  Tensor d = randn({5}, gen, On());
  for (auto [t, line] : {std::pair{a, zeros_line}, std::pair{b, relu_line},
                         std::pair{c, matmul_line}, std::pair{d, randn_line}}) {
    const SiteInfo site = SiteOf(t);
    EXPECT_EQ(site.file, __FILE__);
    EXPECT_EQ(site.line, static_cast<uint32_t>(line));
    EXPECT_EQ(site.kind, SiteKind::kAlloc);
  }
}

// The seed's loop body, written in this test: the batch views allocate nothing, and the
// one clone per batch allocates exactly one block, recorded at this file and line.
TEST_F(TensorSitesTest, InTheTrainingLoopSlicingAllocatesNothingAndCloneOneBuffer) {
  Generator gen(3);
  Tensor x_train = randn({32 * 10, 2}, gen, On());
  Tensor y = zeros({32 * 10, 1}, On());
  Tensor w = randn({3, 2}, gen, On());
  int clone_line = 0;
  SiteId clone_site = kUnknownSite;
  for (int batch_id = 0; batch_id < 10; ++batch_id) {
    const int64_t offset = batch_id * 32;
    const int64_t before = BlocksEverAllocated();
    Tensor x = x_train.slice(0, offset, offset + 32);
    Tensor target = y.slice(0, offset, offset + 32);
    EXPECT_EQ(BlocksEverAllocated(), before) << "slicing allocated";
    EXPECT_TRUE(x.shares_storage_with(x_train));

    Tensor h = relu(matmul(x, w.t()));
    Tensor loss = sigmoid_cross_entropy(sum(h, 1, /*keepdim=*/true), target);

    const int64_t before_clone = BlocksEverAllocated();
    const int64_t live_before_clone = LiveBlocks();
    clone_line = __LINE__ + 1;
    Tensor best = w.clone();
    EXPECT_EQ(BlocksEverAllocated(), before_clone + 1)
        << "clone allocated more than once";
    EXPECT_EQ(LiveBlocks(), live_before_clone + 1);
    const SiteInfo site = SiteOf(best);
    EXPECT_EQ(site.file, __FILE__);
    EXPECT_EQ(site.line, static_cast<uint32_t>(clone_line));
    EXPECT_EQ(site.kind, SiteKind::kClone);
    clone_site = SiteIdOf(best);
    w.sub_(mul(w, 0.01));
  }
  const std::vector<SiteStats> stats = alloc().site_stats();
  ASSERT_LT(clone_site, stats.size());
  EXPECT_EQ(stats[clone_site].total_count, 10);
  EXPECT_EQ(stats[clone_site].total_bytes, 10 * stats[clone_site].peak_live_bytes);
  EXPECT_EQ(stats[clone_site].live_count, 0);  // each batch's `best` died with the batch
}

TEST_F(TensorSitesTest, AHelperThatForwardsItsLocationIsAttributedToTheUsersLine) {
  Tensor base = zeros({4, 4}, On());
  const int line = __LINE__ + 1;
  Tensor copy = HelperForwardingItsLocation(base);
  const SiteInfo site = SiteOf(copy);
  EXPECT_EQ(site.file, __FILE__);
  EXPECT_EQ(site.line, static_cast<uint32_t>(line));
  EXPECT_EQ(site.kind, SiteKind::kClone);
  EXPECT_FALSE(site.has_outer()) << site.ToString();
}

TEST_F(TensorSitesTest, AHelperUnderAScopedSiteRecordsTheUsersLineAsTheOuterFrame) {
  Tensor base = zeros({4, 4}, On());
  int user_line = 0;
  Tensor copy;
  {
    user_line = __LINE__ + 1;
    ScopedSite frame;
    copy = LibraryHelperClone(base);
  }
  const SiteInfo site = SiteOf(copy);
  EXPECT_EQ(site.line, static_cast<uint32_t>(g_plain_helper_line));  // innermost
  EXPECT_EQ(site.outer_file, __FILE__);
  EXPECT_EQ(site.outer_line, static_cast<uint32_t>(user_line));
  EXPECT_EQ(site.kind, SiteKind::kClone);
  EXPECT_NE(site.ToString().find(absl::StrCat(":", user_line, " > ")), std::string::npos)
      << site.ToString();
  EXPECT_EQ(ScopedSiteDepth(), 0u);

  // A library that pushes its caller's location: the same chain, with no user code.
  const int call_line = __LINE__ + 1;
  Tensor pushed = LibraryHelperPushingAFrame(base);
  const SiteInfo chain = SiteOf(pushed);
  EXPECT_EQ(chain.line, static_cast<uint32_t>(g_pushing_helper_line));
  EXPECT_EQ(chain.outer_line, static_cast<uint32_t>(call_line));
  EXPECT_EQ(chain.outer_file, __FILE__);

  // The same helper line without a frame is another site (no outer frame).
  Tensor bare = LibraryHelperClone(base);
  EXPECT_FALSE(SiteOf(bare).has_outer());
  EXPECT_NE(SiteIdOf(bare), SiteIdOf(copy));
}

// Without a forwarded location or a frame the site is the helper's line; the sampled
// stack (every allocation sampled here) still names the user's function.
[[gnu::noinline]] Tensor UsersFunctionCallingTheHelper(const Tensor& base) {
  Tensor t = LibraryHelperClone(base);
  asm volatile("" ::: "memory");  // keep this frame (no tail call)
  return t;
}

TEST_F(TensorSitesTest, AHelperThatDoesNeitherIsNamedByItsSampledStack) {
  Tensor base = zeros({4, 4}, On());
  stack_sampler::SetMeanBytes(1);  // p = 1 - e^-64: every allocation
  Tensor copy = UsersFunctionCallingTheHelper(base);
  stack_sampler::SetMeanBytes(kDefaultStackSampleBytes);
  const SiteInfo site = SiteOf(copy);
  EXPECT_EQ(site.line, static_cast<uint32_t>(g_plain_helper_line));
  EXPECT_FALSE(site.has_outer());
  std::string frames;
  for (const SampledStack& g : stack_sampler::LiveStacks(&alloc())) {
    if (g.site != SiteIdOf(copy)) continue;
    for (const std::string& f : g.frames) frames += f + "\n";
  }
  EXPECT_NE(frames.find("UsersFunctionCallingTheHelper"), std::string::npos) << frames;
}

}  // namespace
}  // namespace devmem
