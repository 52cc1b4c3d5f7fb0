// tensor/kernels.h: the interface between tensor ops and the code that touches
// elements, one implementation per device type.
//
// Example (what cuda/ will do to add GPU kernels, without touching tensor/ops.cc):
//   class CudaKernels final : public Kernels { ... };
//   static const bool registered = [] {
//     static CudaKernels kernels;
//     RegisterKernels(DeviceType::kCuda, &kernels);
//     return true;
//   }();
//
// Division of labour: ops (tensor/ops.cc) check dtypes, devices and shapes, compute the
// output shape, allocate the output and broadcast the inputs (stride-0 views), then call
// exactly one kernel. Kernels trust their arguments: every TensorArg of one call has
// the same shape unless the method says otherwise, and (unless stated) the same dtype,
// one of float32, float64, int32, int64, uint8 (bfloat16 reaches only fill and the
// copies). Inputs may have any non-negative strides, 0 included; outputs are never
// broadcast (no stride 0 on a dim larger than 1). An output may be exactly the same
// view as an input (in-place ops); it never partially overlaps one.
//
// Numerics promised by every implementation (the tests hold the host kernels to them):
// elementwise float ops are computed in the element type; sums, means, matmul and the
// loss accumulate in double (int64 for integers) and round once.
//
// Streams: `ctx.stream` is the stream to enqueue on (the calling thread's current
// stream of ctx.device, tensor/stream.h), and a kernel may return before its work has
// run, as CUDA kernels do; copy_to_host returns once the host memory holds the result.
// The host kernels run synchronously on the calling thread on the default stream of
// cpu and sim (the memory of both is host accessible), which is equivalent to an
// always-synchronized default stream. On any other stream of a sim device they run in
// that stream's order (SimStreamKernels below): queued behind the stream's earlier
// work, on the stream's worker thread, and the call returns at once, except
// copy_to_host, copy_from_host and integer division (which can throw), which wait.
//
// Thread-safety: kernel objects are stateless and shared by all threads. Registration
// is meant for static initialization, but is safe at any time.
#pragma once

#include <cstdint>
#include <string_view>

#include "allocator/types.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"

namespace devmem {

// A view of a tensor as a kernel sees it. Valid for the duration of one call.
struct TensorArg {
  void* data = nullptr;  // address of element (0, ..., 0): storage data + offset
  DType dtype = DType::kFloat32;
  IntList shape;
  IntList strides;  // in elements, all >= 0
  DeviceId device;  // where `data` lives (copies between devices need to know)
  int64_t numel() const { return Numel(shape); }
};

struct KernelContext {
  DeviceId device;
  Stream stream;
};

enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv };
enum class UnaryOp : uint8_t { kNeg, kRelu, kSigmoid };
enum class ReduceOp : uint8_t { kSum, kMean };
std::string_view BinaryOpName(BinaryOp op);
std::string_view UnaryOpName(UnaryOp op);
std::string_view ReduceOpName(ReduceOp op);

class Kernels {
 public:
  virtual ~Kernels() = default;

  // "host": for messages.
  virtual std::string_view name() const = 0;

  // out[i] = value, converted to out's dtype (a static_cast; round to nearest for
  // bfloat16). Any dtype.
  virtual void fill(const KernelContext& ctx, const TensorArg& out, double value) = 0;
  // dst[i] = src[i]; same dtype (any) and shape. dst and src may be on different
  // devices (ctx.device is then the one whose kernels run: the one that is not host
  // accessible, else the sim one); an implementation serves the pairs where it can
  // reach both (host kernels: two host-accessible devices).
  virtual void copy(const KernelContext& ctx, const TensorArg& dst,
                    const TensorArg& src) = 0;
  // dst = the row-major elements at host address `src` (of dst's dtype and shape).
  virtual void copy_from_host(const KernelContext& ctx, const TensorArg& dst,
                              const void* src) = 0;
  // The elements of src, row-major, to host address `dst` (numel * item size bytes).
  virtual void copy_to_host(const KernelContext& ctx, void* dst,
                            const TensorArg& src) = 0;
  // out's element number i in row-major order = NormalAt(seed, counter + i)
  // (tensor/random.h), rounded to out's dtype (float32 or float64).
  virtual void randn(const KernelContext& ctx, const TensorArg& out, uint64_t seed,
                     uint64_t counter) = 0;

  // out = a op b. Integer ops wrap on overflow; integer division truncates toward
  // zero and throws InvalidArgumentError on division by zero.
  virtual void binary(const KernelContext& ctx, BinaryOp op, const TensorArg& out,
                      const TensorArg& a, const TensorArg& b) = 0;
  // out = a op scalar (scalar converted to the dtype first, as fill does).
  virtual void binary_scalar(const KernelContext& ctx, BinaryOp op, const TensorArg& out,
                             const TensorArg& a, double scalar) = 0;
  // out = a + alpha * b (alpha converted to the dtype first): the SGD update.
  virtual void add_scaled(const KernelContext& ctx, const TensorArg& out,
                          const TensorArg& a, const TensorArg& b, double alpha) = 0;
  // out = op(a). relu keeps NaN; sigmoid is for float dtypes only.
  virtual void unary(const KernelContext& ctx, UnaryOp op, const TensorArg& out,
                     const TensorArg& a) = 0;
  // out = input > 0 ? grad : 0.
  virtual void relu_backward(const KernelContext& ctx, const TensorArg& out,
                             const TensorArg& grad, const TensorArg& input) = 0;
  // out[M, N] = a[M, K] @ b[K, N] (shapes differ, as written; same dtype).
  virtual void matmul(const KernelContext& ctx, const TensorArg& out, const TensorArg& a,
                      const TensorArg& b) = 0;
  // Reduces `a` over `dim` (or over everything when dim == -1) into `out`, whose shape
  // is a's without `dim` (0-dim when dim == -1). For integer a, out is int64 (sum
  // only); otherwise out has a's dtype.
  virtual void reduce(const KernelContext& ctx, ReduceOp op, const TensorArg& out,
                      const TensorArg& a, int64_t dim) = 0;
  // out (0-dim) = mean over i of max(x, 0) - x * t + log1p(exp(-|x|)): the binary
  // cross-entropy of sigmoid(x) against t, in the form that never overflows.
  virtual void sigmoid_cross_entropy(const KernelContext& ctx, const TensorArg& out,
                                     const TensorArg& x, const TensorArg& t) = 0;
  // out = scale * (sigmoid(x) - t): the gradient of the loss above times
  // scale * numel (scale = 1 / numel gives the gradient of the mean).
  virtual void sigmoid_cross_entropy_grad(const KernelContext& ctx, const TensorArg& out,
                                          const TensorArg& x, const TensorArg& t,
                                          double scale) = 0;
};

// Installs the kernels for every device of `type` (replacing any before; nullptr
// removes them, for tests). `kernels` must live until the process exits.
void RegisterKernels(DeviceType type, Kernels* kernels);

// The kernels that serve `device`: the registered ones, else the host kernels for cpu,
// cpu_pinned and sim (whose memory is host accessible). Throws UnsupportedDeviceError naming `op`
// and the device when there are none.
Kernels& KernelsFor(DeviceId device, std::string_view op);

// The host implementation (tensor/host_kernels.cc).
Kernels& HostKernels();

// The host kernels in the stream order of sim devices (tensor/sim_stream_kernels.cc):
// HostKernels() itself on the default stream; on any other stream, each call queued on
// the stream through the sim backend's launch_host_fn. What KernelsFor gives sim.
Kernels& SimStreamKernels();

}  // namespace devmem
