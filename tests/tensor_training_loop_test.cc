// tests/tensor_training_loop_test.cc: the seed's training loop (tensor/training_loop.h)
// on a small simulated device: the loss decreases, the batch views allocate nothing,
// and the only explicit copy is the best-weights clone(), attributed to its line in
// tensor/training_loop.cc.
#include <gtest/gtest.h>

#include <string>

#include "allocator/site.h"
#include "tensor/training_loop.h"
#include "tests/tensor_test_util.h"

namespace devmem {
namespace {

using tensor_test::kSimDevice;
using tensor_test::SimDeviceTest;

class TensorTrainingLoopTest : public SimDeviceTest {
 protected:
  static TrainingOptions Options() {
    TrainingOptions o;
    o.epochs = 8;
    o.device = kSimDevice;
    return o;
  }
};

TEST_F(TensorTrainingLoopTest, LossDecreases) {
  std::vector<double> printed;
  const TrainingResult r = RunTrainingLoop(
      Options(), [&](const EpochReport& e) { printed.push_back(e.loss); });
  ASSERT_EQ(r.epochs.size(), 8u);
  ASSERT_EQ(printed.size(), 8u);
  for (const EpochReport& e : r.epochs) {
    EXPECT_TRUE(std::isfinite(e.loss)) << "epoch " << e.epoch;
  }
  // Starts near log(2) (an untrained classifier) and learns XOR.
  EXPECT_GT(r.epochs.front().loss, 0.3);
  EXPECT_LT(r.epochs.back().loss, 0.5 * r.epochs.front().loss)
      << "first " << r.epochs.front().loss << ", last " << r.epochs.back().loss;
  EXPECT_LE(r.best_loss, r.epochs.back().loss);
  // Deterministic: the same options give the same losses.
  const TrainingResult again = RunTrainingLoop(Options());
  for (size_t i = 0; i < r.epochs.size(); ++i)
    EXPECT_EQ(again.epochs[i].loss, r.epochs[i].loss);
}

TEST_F(TensorTrainingLoopTest, SlicingAllocatesNothingAndCloneIsTheOnlyCopySite) {
  const TrainingOptions o = Options();
  const TrainingResult r = RunTrainingLoop(o);
  int improved = 0;
  for (const EpochReport& e : r.epochs) {
    EXPECT_EQ(e.slice_allocations, 0)
        << "epoch " << e.epoch << ": a batch view allocated";
    // Per batch: 11 op outputs (2 linear, relu, loss, loss grad, 3 matmul, 2 sum,
    // relu_backward); the views (slices, t(), the weight views) and the in-place
    // updates allocate nothing; plus the clone when the epoch improved.
    EXPECT_EQ(e.allocations, 11 * o.batches_per_epoch + (e.improved ? 1 : 0))
        << "epoch " << e.epoch;
    improved += e.improved;
  }
  ASSERT_GE(improved, 1);

  ASSERT_EQ(r.copy_sites.size(), 1u) << "expected exactly one explicit copy site";
  const CopySite& site = r.copy_sites.front();
  EXPECT_EQ(site.info.kind, SiteKind::kClone);
  EXPECT_TRUE(site.info.file.ends_with("tensor/training_loop.cc")) << site.info.file;
  EXPECT_GT(site.info.line, 0u);
  EXPECT_EQ(site.stats.total_count, improved);
  EXPECT_EQ(site.stats.live_count, 1);  // r.best_params
  std::optional<BlockInfo> block =
      alloc().find_allocation(r.best_params.storage()->data());
  ASSERT_TRUE(block.has_value());
  EXPECT_EQ(block->site, site.site);
}

TEST_F(TensorTrainingLoopTest, EverythingIsFreedWhenTheResultDies) {
  {
    const TrainingResult r = RunTrainingLoop(Options());
    // At the end of the loop: x_train, y, params and best_params. After it returns,
    // the data set is gone; params and best_params are held by the result.
    EXPECT_EQ(r.stats.allocation[kAggregatePool].current, 4);
    EXPECT_EQ(LiveBlocks(), 2);
  }
  EXPECT_EQ(LiveBlocks(), 0);
}

}  // namespace
}  // namespace devmem
