// tensor/training_loop.h: the seed's training loop, as a function the demo and the
// tests share.
//
// Example:
//   TrainingOptions options;
//   options.epochs = 5;
//   TrainingResult r = RunTrainingLoop(options, [](const EpochReport& e) {
//     std::printf("epoch %d  loss %.4f  live %lld B\n", e.epoch, e.loss,
//                 (long long)e.stats.allocated_bytes[kAggregatePool].current);
//   });
//   for (const CopySite& s : r.copy_sites) ...   // bytes created per explicit copy site
//
// The loop is the one the seed (Arraymancer's XOR example) uses to argue for reference
// semantics: a two-layer network learns y = x0 xor x1 from synthetic, seeded data.
//
//   for epoch:
//     for batch_id in 0 ..< batches_per_epoch:     # optionally in an ArenaScope
//       x      = x_train.slice(0, offset, offset + batch_size)   # a view: no copy
//       target = y.slice(0, offset, offset + batch_size)         # a view: no copy
//       n1 = relu(linear(x, w1, b1)); n2 = linear(n1, w2, b2)
//       loss = sigmoid_cross_entropy(n2, target)
//       backward by hand; SGD update in place (w.sub_(dw, lr))
//     if the epoch's loss is the best so far: best = params.clone()   # the one copy
//
// The four weight tensors are views of one flat parameter buffer, so the in-place
// update writes through them and keeping the best weights is one clone() of one buffer
// at one line: the allocator's site table shows exactly that line, with kind clone, as
// the only source of copied bytes. Each epoch also measures what taking the batch views
// allocated (always 0).
//
// Thread-safety: runs on the calling thread. The allocation counts in the reports are
// exact only if nothing else allocates on the device meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "allocator/arena.h"
#include "allocator/caching_allocator.h"
#include "allocator/site.h"
#include "allocator/stats.h"
#include "tensor/tensor.h"

namespace devmem {

struct TrainingOptions {
  int epochs = 5;
  int batches_per_epoch = 100;
  int batch_size = 32;
  int features = 2;  // x0 and x1 decide y; any further features are noise (>= 2)
  int hidden = 3;    // the seed's layer_3neurons
  double learning_rate = 0.5;  // with seed 42: loss 0.48 -> 0.006 in 8 epochs
  uint64_t seed = 42;          // data and initial weights
  DType dtype = DType::kFloat32;
  std::optional<DeviceId> device;  // DefaultDevice() when unset
  // When set, each batch (one training step) runs inside an ArenaScope named "step"
  // with these options (allocator/arena.h): its temporaries are bump allocations and
  // the per-epoch clone, taken outside the steps, is not.
  std::optional<ArenaOptions> step_arena;
};

struct EpochReport {
  int epoch = 0;                  // 0-based
  double loss = 0;                // mean of the epoch's batch losses
  double best_loss = 0;           // best epoch loss so far (this one included)
  bool improved = false;          // this epoch cloned the weights as the new best
  int64_t slice_allocations = 0;  // blocks allocated while taking the batch views
  int64_t allocations = 0;        // blocks allocated during the epoch (ops, clone)
  DeviceStats stats;              // the device allocator's stats at the end of the epoch
};

// The bytes one explicit-copy site created (clone, contiguous, to).
struct CopySite {
  SiteId site = kUnknownSite;
  SiteInfo info;
  SiteStats stats;
};

struct TrainingResult {
  DeviceId device;
  std::vector<EpochReport> epochs;
  double best_loss = 0;
  Tensor params;       // the trained parameters: w1, b1, w2, b2 back to back
  Tensor best_params;  // the clone taken at the best epoch
  DeviceStats stats;   // at the end, with the data set, params and best_params alive
  std::vector<CopySite> copy_sites;  // of the device's allocator, largest total first
};

// Runs the loop; calls on_epoch (if set) after each epoch. Throws what the ops throw
// (InvalidArgumentError for bad options, OutOfMemoryError when the device is too small).
TrainingResult RunTrainingLoop(
    const TrainingOptions& options = {},
    const std::function<void(const EpochReport&)>& on_epoch = {});

// The sites of kind clone, contiguous or to_device that allocated on `allocator`,
// largest total bytes first.
std::vector<CopySite> CopySitesBySize(const CachingAllocator& allocator);

}  // namespace devmem
