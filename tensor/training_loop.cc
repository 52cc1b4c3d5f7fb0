// tensor/training_loop.cc: the seed's training loop (see training_loop.h).
#include "tensor/training_loop.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "tensor/device_registry.h"
#include "tensor/errors.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace devmem {
namespace {

int64_t AllocatedBlocks(const CachingAllocator& a) {
  return a.stats().allocation[kAggregatePool].allocated;
}

double ScalarValue(const Tensor& t) {
  return t.dtype() == DType::kFloat64 ? t.item<double>() : t.item<float>();
}

// The synthetic data set: x in {0, 1}^features, y = x0 xor x1; seeded, so every run
// (and every device) sees the same numbers.
struct DataSet {
  Tensor x;  // [n, features]
  Tensor y;  // [n, 1]
};

DataSet MakeData(int64_t n, int features, uint64_t seed, DType dtype, DeviceId device) {
  std::vector<double> x(static_cast<size_t>(n * features));
  std::vector<double> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int f = 0; f < features; ++f) {
      const uint64_t bits =
          RandomBits(seed ^ 0xda7a, static_cast<uint64_t>(i * features + f));
      x[i * features + f] = static_cast<double>(bits & 1);
    }
    y[i] = static_cast<double>(x[i * features] != x[i * features + 1]);
  }
  if (dtype == DType::kFloat64) {
    return {from_vector(x, {n, features}, device), from_vector(y, {n, 1}, device)};
  }
  std::vector<float> xf(x.begin(), x.end()), yf(y.begin(), y.end());
  return {from_vector(xf, {n, features}, device), from_vector(yf, {n, 1}, device)};
}

}  // namespace

TrainingResult RunTrainingLoop(const TrainingOptions& o,
                               const std::function<void(const EpochReport&)>& on_epoch) {
  if (o.epochs < 0 || o.batches_per_epoch < 1 || o.batch_size < 1 || o.features < 2 ||
      o.hidden < 1 || (o.dtype != DType::kFloat32 && o.dtype != DType::kFloat64)) {
    ThrowInvalidArgument(Cat(
        "RunTrainingLoop: invalid options (epochs ", o.epochs, ", batches_per_epoch ",
        o.batches_per_epoch, ", batch_size ", o.batch_size, ", features ", o.features,
        ", hidden ", o.hidden, ", dtype ", DTypeName(o.dtype),
        "): need epochs >= 0, batches and batch size >= 1, features >= 2, hidden >= 1, "
        "a float dtype"));
  }
  TrainingResult result;
  result.device = o.device ? *o.device : DefaultDevice();
  const DeviceId device = result.device;
  const std::shared_ptr<CachingAllocator> allocator = AllocatorFor(device);
  const TensorOptions opts{o.dtype, device};

  const int64_t n = int64_t{o.batches_per_epoch} * o.batch_size;
  const int64_t f = o.features, h = o.hidden;
  const DataSet data = MakeData(n, o.features, o.seed, o.dtype, device);

  // One flat parameter buffer; the layers are views of it (reference semantics: the
  // in-place SGD update below writes through them, and one clone keeps them all).
  Generator gen(o.seed);
  Tensor params = randn({h * f + h + h + 1}, gen, opts);
  Tensor w1 = params.slice(0, 0, h * f).view({h, f});  // layer_3neurons [h, f]
  Tensor b1 = params.slice(0, h * f, h * f + h);       // [h]
  Tensor w2 = params.slice(0, h * f + h, h * f + 2 * h).view({1, h});  // classifier
  Tensor b2 = params.slice(0, h * f + 2 * h, h * f + 2 * h + 1);       // [1]
  w1.mul_(1.0 / std::sqrt(static_cast<double>(f)));
  w2.mul_(1.0 / std::sqrt(static_cast<double>(h)));
  b1.fill_(0);
  b2.fill_(0);

  const double lr = o.learning_rate;
  double best = std::numeric_limits<double>::infinity();
  Tensor best_params;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    EpochReport report;
    report.epoch = epoch;
    const int64_t blocks_at_start = AllocatedBlocks(*allocator);
    double loss_sum = 0;
    for (int batch_id = 0; batch_id < o.batches_per_epoch; ++batch_id) {
      // One step; declared first so that every temporary below dies before it closes.
      std::optional<ArenaScope> step;
      if (o.step_arena) step.emplace(*allocator, "step", *o.step_arena);
      const int64_t offset = int64_t{batch_id} * o.batch_size;
      const int64_t before = AllocatedBlocks(*allocator);
      const Tensor x = data.x.slice(0, offset, offset + o.batch_size);       // a view
      const Tensor target = data.y.slice(0, offset, offset + o.batch_size);  // a view
      report.slice_allocations += AllocatedBlocks(*allocator) - before;

      // Forward.
      const Tensor z1 = linear(x, w1, b1);  // [batch, h]
      const Tensor n1 = relu(z1);
      const Tensor n2 = linear(n1, w2, b2);  // [batch, 1]
      const Tensor loss = sigmoid_cross_entropy(n2, target);
      loss_sum += ScalarValue(loss);

      // Backward, by hand.
      const Tensor dn2 = sigmoid_cross_entropy_grad(n2, target);  // [batch, 1]
      const Tensor dw2 = matmul(dn2.t(), n1);                     // [1, h]
      const Tensor db2 = sum(dn2, 0);                             // [1]
      const Tensor dn1 = matmul(dn2, w2);                         // [batch, h]
      const Tensor dz1 = relu_backward(dn1, z1);
      const Tensor dw1 = matmul(dz1.t(), x);  // [h, f]
      const Tensor db1 = sum(dz1, 0);         // [h]

      // SGD, in place: writes through the views into `params`.
      w1.sub_(dw1, lr);
      b1.sub_(db1, lr);
      w2.sub_(dw2, lr);
      b2.sub_(db2, lr);
    }
    report.loss = loss_sum / o.batches_per_epoch;
    if (report.loss < best) {
      best = report.loss;
      best_params = params.clone();  // the deliberate copy: keep the best weights
      report.improved = true;
    }
    report.best_loss = best;
    report.allocations = AllocatedBlocks(*allocator) - blocks_at_start;
    report.stats = allocator->stats();
    if (on_epoch) on_epoch(report);
    result.epochs.push_back(std::move(report));
  }
  result.best_loss = best;
  result.params = params;
  result.best_params = best_params;
  result.stats = allocator->stats();
  result.copy_sites = CopySitesBySize(*allocator);
  return result;
}

std::vector<CopySite> CopySitesBySize(const CachingAllocator& allocator) {
  std::vector<CopySite> sites;
  const std::vector<SiteStats> stats = allocator.site_stats();
  for (size_t id = 0; id < stats.size(); ++id) {
    if (stats[id].total_count == 0) continue;
    SiteInfo info = GetSite(static_cast<SiteId>(id));
    if (!IsCopyKind(info.kind)) continue;
    sites.push_back(CopySite{static_cast<SiteId>(id), std::move(info), stats[id]});
  }
  std::stable_sort(sites.begin(), sites.end(), [](const CopySite& a, const CopySite& b) {
    return a.stats.total_bytes > b.stats.total_bytes;
  });
  return sites;
}

}  // namespace devmem
