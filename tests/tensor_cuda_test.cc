// tests/tensor_cuda_test.cc: every tensor op on cuda:0 (cuda/cuda_kernels.cc) against
// the host kernels on the same inputs, within the bounds cuda_kernels.cc states:
//   exact       fill, copies (clone, contiguous, to, copy_ over any strides), randn,
//               neg, relu, relu_backward, every integer op, integer sums and matmul;
//   kFloatOps   float elementwise ops (sigmoid uses the device's expf: 2 ulp);
//   kReduce     float sums, means, the loss and its gradient (double accumulation in
//               another order, rounded once);
//   GemmBound   float matmul through cuBLAS: K * eps * sum |a||b| per element.
// And the seed's training loop on cuda:0 against the same loop on sim: every epoch's
// loss within kLoopRelative.
//
// Runs where a GPU and the CUDA kernels exist (scripts/gpu-check.sh runs it on the GPU
// machine); skips, saying why, anywhere else (a build without nvcc, no driver, no GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/device_registry.h"
#include "tensor/factories.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tensor/tensor.h"
#include "tensor/training_loop.h"
#if DEVMEM_HAVE_CUDA_KERNELS
#include "cuda/cuda_backend.h"
#endif

namespace devmem {
namespace {

constexpr DeviceId kGpu{DeviceType::kCuda, 0};
constexpr DeviceId kCpu{};

// Relative bounds, in units of the element type's epsilon.
constexpr double kFloatOps = 4;  // elementwise float ops
constexpr double kReduce = 4;    // sums, means, loss (rounded once from double)
constexpr double kLoopRelative = 1e-4;

class TensorCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if !DEVMEM_HAVE_CUDA_KERNELS
    GTEST_SKIP() << "this build has no CUDA kernels (no CUDA toolkit or nvcc, or "
                    "-DDEVMEM_CUDA_KERNELS=OFF)";
#else
    absl::StatusOr<int> n = CudaDeviceCount();
    if (!n.ok()) GTEST_SKIP() << "no usable GPU: " << n.status().message();
    if (*n == 0) GTEST_SKIP() << "the CUDA driver reports no device";
#endif
  }
};

double Epsilon(DType dtype) {
  return dtype == DType::kFloat32 ? 0x1.0p-23 : dtype == DType::kFloat64 ? 0x1.0p-52 : 0;
}

std::vector<double> Doubles(const Tensor& t) {
  const Tensor c = t.to(kCpu).contiguous();
  std::vector<double> out;
  VisitDType(c.dtype(), [&]<typename T>() {
    if constexpr (std::is_same_v<T, BFloat16>) {
      for (BFloat16 v : c.to_vector<BFloat16>()) out.push_back(v.bits);
    } else {
      for (T v : c.to_vector<T>()) out.push_back(static_cast<double>(v));
    }
  });
  return out;
}

// gpu (any device) equals host elementwise within ulps * eps * max(1, |host|).
void ExpectClose(const Tensor& gpu, const Tensor& host, double ulps, const std::string& what) {
  ASSERT_EQ(gpu.device(), kGpu) << what;
  ASSERT_EQ(gpu.dtype(), host.dtype()) << what;
  ASSERT_EQ(ShapeString(gpu.shape()), ShapeString(host.shape())) << what;
  const std::vector<double> g = Doubles(gpu);
  const std::vector<double> h = Doubles(host);
  const double eps = Epsilon(host.dtype()) * ulps;
  for (size_t i = 0; i < h.size(); ++i) {
    if (std::isnan(h[i])) {
      EXPECT_TRUE(std::isnan(g[i])) << what << " element " << i;
      continue;
    }
    const double bound = eps * std::max(1.0, std::abs(h[i]));
    ASSERT_LE(std::abs(g[i] - h[i]), bound)
        << what << ": element " << i << " is " << g[i] << " on cuda, " << h[i]
        << " on the host (bound " << bound << ")";
  }
}

void ExpectSame(const Tensor& gpu, const Tensor& host, const std::string& what) {
  ExpectClose(gpu, host, 0, what);
}

// Host inputs: normal floats, or integers in [-50, 50] (nonzero where asked).
Tensor HostInput(IntList shape, DType dtype, uint64_t seed, bool nonzero = false) {
  Generator gen(seed);
  if (IsFloatingPoint(dtype)) return randn(shape, gen, {dtype, kCpu});
  const Tensor r = randn(shape, gen, {DType::kFloat64, kCpu});
  std::vector<double> v = r.to_vector<double>();
  Tensor out = empty(shape, {dtype, kCpu});
  VisitDType(dtype, [&]<typename T>() {
    if constexpr (std::is_integral_v<T>) {
      T* p = out.data<T>();
      for (size_t i = 0; i < v.size(); ++i) {
        int64_t x = static_cast<int64_t>(std::llround(v[i] * 20));
        if (std::is_unsigned_v<T>) x = std::abs(x);
        if (nonzero && x == 0) x = 3;
        p[i] = static_cast<T>(std::clamp<int64_t>(x, -50, 50));
      }
    }
  });
  return out;
}

const DType kArith[] = {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64,
                        DType::kUInt8};

TEST_F(TensorCudaTest, FillAndFactoriesMatchTheHost) {
  for (DType d : kArith) {
    const std::string name(DTypeName(d));
    ExpectSame(full({3, 5}, 7, {d, kGpu}), full({3, 5}, 7, {d, kCpu}), "full " + name);
    ExpectSame(zeros({0, 4}, {d, kGpu}), zeros({0, 4}, {d, kCpu}), "zeros of no elements");
    Tensor g = zeros({4, 6}, {d, kGpu});
    Tensor h = zeros({4, 6}, {d, kCpu});
    g.slice(1, 1, 6, 2).fill_(3);  // a strided view
    h.slice(1, 1, 6, 2).fill_(3);
    ExpectSame(g, h, "fill_ of a strided view, " + name);
  }
  ExpectSame(full({9}, 1.7, {DType::kBFloat16, kGpu}), full({9}, 1.7, {DType::kBFloat16, kCpu}),
             "bfloat16 fill (bits)");
  for (DType d : {DType::kFloat32, DType::kFloat64}) {
    Generator a(5), b(5);
    ExpectSame(randn({17, 3}, a, {d, kGpu}), randn({17, 3}, b, {d, kCpu}), "randn");
  }
}

TEST_F(TensorCudaTest, CopiesOverAnyStridesMatchTheHost) {
  for (DType d : kArith) {
    const std::string name(DTypeName(d));
    const Tensor h = HostInput({4, 5, 6}, d, 1);
    const Tensor g = h.to(kGpu);
    ExpectSame(g, h, "to(cuda) " + name);
    const Tensor hv = h.permute({2, 0, 1}).slice(0, 1, 6, 2);
    const Tensor gv = g.permute({2, 0, 1}).slice(0, 1, 6, 2);
    ExpectSame(gv.clone(), hv.clone(), "clone of a permuted, stepped view " + name);
    ExpectSame(gv.contiguous(), hv.contiguous(), "contiguous " + name);
    ExpectSame(hv.to(kGpu), hv.clone(), "to(cuda) of a strided host view " + name);
    EXPECT_EQ(Doubles(gv.to(kCpu)), Doubles(hv)) << "to(cpu) of a strided cuda view " << name;
    const Tensor hb = h.select(1, 2).unsqueeze(1).broadcast_to({4, 3, 6});
    const Tensor gb = g.select(1, 2).unsqueeze(1).broadcast_to({4, 3, 6});
    ExpectSame(gb.clone(), hb.clone(), "clone of a broadcast view " + name);
    Tensor gd = zeros({6, 4, 5}, {d, kGpu});
    Tensor hd = zeros({6, 4, 5}, {d, kCpu});
    gd.permute({1, 2, 0}).copy_(g);
    hd.permute({1, 2, 0}).copy_(h);
    ExpectSame(gd, hd, "copy_ into a permuted view " + name);
  }
  // Seven dims with nothing to merge, still within the kernels' eight.
  const Tensor h7 = HostInput({2, 3, 2, 3, 2, 3, 2}, DType::kFloat32, 2);
  const std::vector<int64_t> perm = {6, 0, 5, 1, 4, 2, 3};
  ExpectSame(h7.to(kGpu).permute(perm).clone(), h7.permute(perm).clone(), "7-D permute");
}

// to() between pageable host memory and the GPU stages through the cpu_pinned pool
// (cudaHostAlloc memory, reused once the copies that read it completed); a cpu_pinned
// tensor is copied directly.
TEST_F(TensorCudaTest, CopiesBetweenHostAndGpuStageThroughThePinnedPool) {
  const std::shared_ptr<CachingAllocator> pinned =
      AllocatorFor(DeviceId{DeviceType::kCpuPinned, 0});
  EXPECT_NE(pinned->backend().info().name.find("cudaHostAlloc"), std::string::npos)
      << pinned->backend().info().name;
  const int64_t before = pinned->stats().allocation[kAggregatePool].allocated;
  const Tensor h = HostInput({256, 256}, DType::kFloat32, 13);
  std::vector<Tensor> copies;
  for (int i = 0; i < 4; ++i) copies.push_back(h.to(kGpu));  // queued back to back
  for (const Tensor& g : copies) ExpectSame(g, h, "a staged copy to the GPU");
  EXPECT_GE(pinned->stats().allocation[kAggregatePool].allocated, before + 4)
      << "the copies did not stage through cpu_pinned";
  const Tensor hp = h.to(DeviceId{DeviceType::kCpuPinned, 0});
  ExpectSame(hp.to(kGpu), h, "a copy from a cpu_pinned tensor");
  const Tensor back = copies[0].to(DeviceId{DeviceType::kCpuPinned, 0});
  EXPECT_EQ(Doubles(back), Doubles(h)) << "a copy into a cpu_pinned tensor";
}

TEST_F(TensorCudaTest, BroadcastingElementwiseOpsMatchTheHost) {
  for (DType d : kArith) {
    const std::string name(DTypeName(d));
    const double ulps = IsFloatingPoint(d) ? kFloatOps : 0;
    const Tensor ha = HostInput({4, 1, 5}, d, 3);
    const Tensor hb = HostInput({3, 5}, d, 4, /*nonzero=*/true);
    const Tensor ga = ha.to(kGpu), gb = hb.to(kGpu);
    ExpectClose(add(ga, gb), add(ha, hb), ulps, "add " + name);
    ExpectClose(sub(ga, gb), sub(ha, hb), ulps, "sub " + name);
    ExpectClose(mul(ga, gb), mul(ha, hb), ulps, "mul " + name);
    ExpectClose(div(ga, gb), div(ha, hb), ulps, "div " + name);
    ExpectClose(add(ga, 3.0), add(ha, 3.0), ulps, "add scalar " + name);
    ExpectClose(mul(ga.t().contiguous(), 2.0), mul(ha.t().contiguous(), 2.0), ulps,
                "mul scalar " + name);
    ExpectClose(div(ga, 7.0), div(ha, 7.0), ulps, "div scalar " + name);
    ExpectSame(neg(ga), neg(ha), "neg " + name);
    ExpectSame(relu(ga), relu(ha), "relu " + name);
    ExpectSame(relu_backward(gb, gb), relu_backward(hb, hb), "relu_backward " + name);
    if (IsFloatingPoint(d)) {
      ExpectClose(sigmoid(ga), sigmoid(ha), kFloatOps, "sigmoid " + name);
    } else {
      const Tensor gz = zeros({3, 5}, {d, kGpu});
      EXPECT_THROW(div(ga, gz), InvalidArgumentError) << "integer division by zero, " << name;
      EXPECT_THROW(div(ga, 0.0), InvalidArgumentError) << name;
    }
  }
}

TEST_F(TensorCudaTest, InPlaceOpsMatchTheHost) {
  for (DType d : kArith) {
    const std::string name(DTypeName(d));
    const double ulps = IsFloatingPoint(d) ? kFloatOps : 0;
    Tensor h = HostInput({6, 7}, d, 5);
    Tensor g = h.to(kGpu);
    const Tensor ho = HostInput({7}, d, 6);
    const Tensor go = ho.to(kGpu);
    h.add_(ho);
    g.add_(go);
    h.sub_(ho, 2);
    g.sub_(go, 2);
    h.slice(0, 0, 6, 2).mul_(ho);
    g.slice(0, 0, 6, 2).mul_(go);
    h.add_(5);
    g.add_(5);
    h.mul_(3);
    g.mul_(3);
    h.t().sub_(1);
    g.t().sub_(1);
    ExpectClose(g, h, ulps, "in-place chain " + name);
  }
}

TEST_F(TensorCudaTest, ReductionsMatchTheHost) {
  for (DType d : kArith) {
    const std::string name(DTypeName(d));
    const double ulps = IsFloatingPoint(d) ? kReduce : 0;
    const Tensor h = HostInput({5, 300, 7}, d, 7);
    const Tensor g = h.to(kGpu);
    ExpectClose(sum(g), sum(h), ulps, "sum " + name);
    for (int64_t dim : {0, 1, 2}) {
      ExpectClose(sum(g, dim), sum(h, dim), ulps, "sum over a dim, " + name);
      ExpectClose(sum(g.transpose(0, 2), dim, true), sum(h.transpose(0, 2), dim, true), ulps,
                  "sum of a transposed view, keepdim, " + name);
    }
    if (IsFloatingPoint(d)) {
      ExpectClose(mean(g), mean(h), ulps, "mean " + name);
      ExpectClose(mean(g, 1), mean(h, 1), ulps, "mean over a dim " + name);
      ExpectClose(mean(g.slice(1, 0, 0)), mean(h.slice(1, 0, 0)), ulps, "mean of nothing");
    }
  }
}

TEST_F(TensorCudaTest, LossAndItsGradientMatchTheHost) {
  for (DType d : {DType::kFloat32, DType::kFloat64}) {
    const Tensor x = mul(HostInput({64, 3}, d, 8), 4.0);  // large logits too
    const Tensor t = relu(sigmoid(HostInput({64, 3}, d, 9)));
    ExpectClose(sigmoid_cross_entropy(x.to(kGpu), t.to(kGpu)), sigmoid_cross_entropy(x, t),
                kReduce, "sigmoid_cross_entropy");
    ExpectClose(sigmoid_cross_entropy_grad(x.to(kGpu), t.to(kGpu)),
                sigmoid_cross_entropy_grad(x, t), kReduce, "sigmoid_cross_entropy_grad");
  }
}

// |gpu - host| <= k * eps * sum_l |a_il| |b_lj| (cuBLAS accumulates in the element type).
void ExpectGemm(const Tensor& a, const Tensor& b, const std::string& what) {
  const Tensor host = matmul(a, b);
  const Tensor gpu = matmul(a.to(kGpu), b.to(kGpu));
  const std::vector<double> g = Doubles(gpu), h = Doubles(host);
  const std::vector<double> av = Doubles(a.to(kGpu)), bv = Doubles(b.to(kGpu));
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  const double eps = Epsilon(a.dtype());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double mag = 0;
      for (int64_t l = 0; l < k; ++l) mag += std::abs(av[i * k + l] * bv[l * n + j]);
      const double bound = (k + 1) * eps * mag;
      ASSERT_LE(std::abs(g[i * n + j] - h[i * n + j]), bound)
          << what << ": element (" << i << ", " << j << ")";
    }
  }
}

TEST_F(TensorCudaTest, MatmulMatchesTheHost) {
  for (DType d : kArith) {
    const std::string name(DTypeName(d));
    const Tensor a = HostInput({33, 64}, d, 10);
    const Tensor b = HostInput({64, 17}, d, 11);
    const Tensor w = HostInput({17, 64}, d, 12);
    if (IsFloatingPoint(d)) {
      ExpectGemm(a, b, "matmul " + name);
      ExpectGemm(a, w.t(), "matmul by a transposed operand (linear) " + name);
      ExpectGemm(a.slice(1, 0, 64, 2), b.slice(0, 0, 64, 2), "matmul of stepped views " + name);
      ExpectGemm(a.slice(0, 0, 1), b, "a one-row matmul " + name);
    } else {
      ExpectSame(matmul(a.to(kGpu), b.to(kGpu)), matmul(a, b), "integer matmul " + name);
      ExpectSame(matmul(a.to(kGpu), w.to(kGpu).t()), matmul(a, w.t()), "integer, transposed");
    }
    ExpectSame(matmul(a.slice(1, 0, 0).to(kGpu), b.slice(0, 0, 0).to(kGpu)),
               matmul(a.slice(1, 0, 0), b.slice(0, 0, 0)), "matmul with K = 0 " + name);
  }
}

TEST_F(TensorCudaTest, TheTrainingLoopMatchesTheSim) {
  TrainingOptions options;
  options.epochs = 3;
  options.device = kGpu;
  const TrainingResult gpu = RunTrainingLoop(options);
  options.device = DeviceId{DeviceType::kSim, 0};
  const TrainingResult sim = RunTrainingLoop(options);
  ASSERT_EQ(gpu.epochs.size(), sim.epochs.size());
  for (size_t e = 0; e < sim.epochs.size(); ++e) {
    const double s = sim.epochs[e].loss;
    EXPECT_LE(std::abs(gpu.epochs[e].loss - s), kLoopRelative * std::max(1.0, s))
        << "epoch " << e << ": cuda " << gpu.epochs[e].loss << ", sim " << s;
  }
}

}  // namespace
}  // namespace devmem
