// tensor/bench_kernels.cc: benchmark bodies (see bench_kernels.h).
#include "tensor/bench_kernels.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <vector>

#include "tensor/errors.h"
#include "tensor/factories.h"

namespace devmem {
namespace {

// Makes the compiler assume `p` escapes and memory may be read, so the object behind it
// must really exist (the same trick as benchmark::DoNotOptimize).
inline void Escape(const void* p) { asm volatile("" : : "g"(p) : "memory"); }

}  // namespace

int64_t BenchTensorCopy(const Tensor& t, int64_t iterations) {
  int64_t checksum = 0;
  for (int64_t i = 0; i < iterations; ++i) {
    Tensor copy = t;
    Escape(&copy);
    checksum += copy.offset();
  }
  return checksum;
}

int64_t BenchSlice2D(const Tensor& t, int64_t iterations) {
  constexpr int64_t kBatch = 32;
  if (t.dim() != 2 || t.shape()[0] < kBatch) {
    ThrowInvalidArgument(Cat("BenchSlice2D: expected a 2-D tensor with at least ", kBatch,
                             " rows, got shape ", ShapeString(t.shape())));
  }
  const int64_t batches = t.shape()[0] / kBatch;
  int64_t checksum = 0;
  int64_t batch = 0;
  for (int64_t i = 0; i < iterations; ++i) {
    const int64_t offset = batch * kBatch;
    Tensor x = t.slice(0, offset, offset + kBatch);
    Escape(&x);
    checksum += x.offset();
    if (++batch == batches) batch = 0;
  }
  return checksum;
}

int64_t BenchAtomicPair(const Tensor& t, int64_t iterations) {
  // The same two read-modify-writes a handle copy and destroy do, with nothing else.
  std::atomic<uint64_t> count{1};
  int64_t checksum = 0;
  for (int64_t i = 0; i < iterations; ++i) {
    count.fetch_add(1, std::memory_order_relaxed);
    Escape(&count);
    checksum += static_cast<int64_t>(count.fetch_sub(1, std::memory_order_acq_rel));
  }
  return checksum + t.offset();
}

namespace bench {
namespace {

constexpr int kPasses = 9;
constexpr int64_t kIterations = int64_t{1} << 21;

template <typename Body>
double MedianNs(Body body) {
  std::vector<float> host(3200 * 2, 0.0f);
  const Tensor t = from_blob(host.data(), {3200, 2}, DType::kFloat32, DeviceId{});
  body(t, kIterations);  // warm-up
  std::vector<double> ns(kPasses);
  for (double& v : ns) {
    const auto start = std::chrono::steady_clock::now();
    body(t, kIterations);
    const auto stop = std::chrono::steady_clock::now();
    v = std::chrono::duration<double, std::nano>(stop - start).count() /
        static_cast<double>(kIterations);
  }
  std::sort(ns.begin(), ns.end());
  return ns[kPasses / 2];
}

}  // namespace

double TensorCopyNs() { return MedianNs(BenchTensorCopy); }
double SliceNs() { return MedianNs(BenchSlice2D); }
double AtomicPairNs() { return MedianNs(BenchAtomicPair); }

}  // namespace bench
}  // namespace devmem
