// tensor/sim_stream_kernels.cc: the host kernels in the stream order of a sim device
// (kernels.h, SimStreamKernels).
//
// A sim device has real streams (in-order queues, each worked by a host thread of the
// sim backend), so a kernel launched on one of them must run after the work queued
// there before it, as on a GPU, or tests of stream semantics (record_stream, the
// allocator's cross-stream reuse) would test nothing. On the default stream the host
// kernels run at once on the calling thread, as before (the fast path, and what cpu
// always does); on any other stream each call is queued with the backend's
// launch_host_fn and the call returns: the kernel runs when the stream reaches it.
//
// What a queued kernel needs must outlive the call: the arguments' shapes and strides
// are copied (OwnedArg); the memory they point to is the caller's, kept valid the way
// device memory is (the allocator reuses a block only in its stream's order, and
// record_stream covers other streams). Calls that must wait: copy_to_host (its result
// is the host memory) and copy_from_host (the host source may die after the call), and
// integer division, whose division by zero throws InvalidArgumentError: those are
// queued too, and the caller waits for the stream to run them and gets their exception.
// Anything else a queued kernel throws (nothing should: ops check their arguments) is
// reported on stderr, since there is no caller left to throw to.
//
// Thread-safety: stateless; the queued functions touch only their own copies and the
// tensors' elements (which are the caller's to order, as kernels.h says).
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include "allocator/backend.h"
#include "tensor/device_registry.h"
#include "tensor/errors.h"
#include "tensor/kernels.h"

namespace devmem {
namespace {

// A TensorArg whose shape and strides it owns.
struct OwnedArg {
  explicit OwnedArg(const TensorArg& a)
      : data(a.data),
        dtype(a.dtype),
        shape(a.shape.begin(), a.shape.end()),
        strides(a.strides.begin(), a.strides.end()),
        device(a.device) {}
  TensorArg arg() const { return TensorArg{data, dtype, shape, strides, device}; }

  void* data;
  DType dtype;
  DimVector shape;
  DimVector strides;
  DeviceId device;
};

bool Queued(const KernelContext& ctx) {
  return ctx.device.type == DeviceType::kSim && ctx.stream != Stream{};
}

// Queues `fn` on ctx.stream; with `wait`, returns once it ran, rethrowing what it threw.
void Launch(const KernelContext& ctx, std::string_view op, std::function<void()> fn,
            bool wait) {
  Backend& backend = AllocatorFor(ctx.device)->backend();
  const std::string where =
      Cat(op, " on ", ctx.device.ToString(), " stream ", ctx.stream.handle);
  if (!wait) {
    const absl::Status s = backend.launch_host_fn(
        ctx.stream, [fn = std::move(fn), where] {
          try {
            fn();
          } catch (const std::exception& e) {
            std::fprintf(stderr, "devmem: the host kernel %s failed: %s\n",
                         where.c_str(), e.what());
          }
        });
    if (!s.ok()) throw UnsupportedDeviceError(Cat(where, ": ", s.ToString()));
    return;
  }
  struct Done {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  auto done = std::make_shared<Done>();
  const absl::Status s = backend.launch_host_fn(ctx.stream, [fn = std::move(fn), done] {
    std::exception_ptr error;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(done->mu);
    done->error = error;
    done->done = true;
    done->cv.notify_all();
  });
  if (!s.ok()) throw UnsupportedDeviceError(Cat(where, ": ", s.ToString()));
  std::unique_lock<std::mutex> lock(done->mu);
  done->cv.wait(lock, [&] { return done->done; });
  if (done->error) std::rethrow_exception(done->error);
}

bool CanThrow(BinaryOp op, DType dtype) {
  return op == BinaryOp::kDiv && !IsFloatingPoint(dtype);
}

class SimStreamKernelsImpl final : public Kernels {
 public:
  std::string_view name() const override { return "host (sim streams)"; }

  void fill(const KernelContext& ctx, const TensorArg& out, double value) override {
    if (!Queued(ctx)) return H().fill(ctx, out, value);
    Launch(ctx, "fill", [ctx, o = OwnedArg(out), value] { H().fill(ctx, o.arg(), value); },
           false);
  }
  void copy(const KernelContext& ctx, const TensorArg& dst, const TensorArg& src) override {
    if (!Queued(ctx)) return H().copy(ctx, dst, src);
    Launch(ctx, "copy",
           [ctx, d = OwnedArg(dst), s = OwnedArg(src)] { H().copy(ctx, d.arg(), s.arg()); },
           false);
  }
  void copy_from_host(const KernelContext& ctx, const TensorArg& dst,
                      const void* src) override {
    if (!Queued(ctx)) return H().copy_from_host(ctx, dst, src);
    Launch(ctx, "copy_from_host",
           [ctx, d = OwnedArg(dst), src] { H().copy_from_host(ctx, d.arg(), src); }, true);
  }
  void copy_to_host(const KernelContext& ctx, void* dst, const TensorArg& src) override {
    if (!Queued(ctx)) return H().copy_to_host(ctx, dst, src);
    Launch(ctx, "copy_to_host",
           [ctx, dst, s = OwnedArg(src)] { H().copy_to_host(ctx, dst, s.arg()); }, true);
  }
  void randn(const KernelContext& ctx, const TensorArg& out, uint64_t seed,
             uint64_t counter) override {
    if (!Queued(ctx)) return H().randn(ctx, out, seed, counter);
    Launch(ctx, "randn",
           [ctx, o = OwnedArg(out), seed, counter] { H().randn(ctx, o.arg(), seed, counter); },
           false);
  }
  void binary(const KernelContext& ctx, BinaryOp op, const TensorArg& out,
              const TensorArg& a, const TensorArg& b) override {
    if (!Queued(ctx)) return H().binary(ctx, op, out, a, b);
    Launch(ctx, BinaryOpName(op),
           [ctx, op, o = OwnedArg(out), x = OwnedArg(a), y = OwnedArg(b)] {
             H().binary(ctx, op, o.arg(), x.arg(), y.arg());
           },
           CanThrow(op, out.dtype));
  }
  void binary_scalar(const KernelContext& ctx, BinaryOp op, const TensorArg& out,
                     const TensorArg& a, double scalar) override {
    if (!Queued(ctx)) return H().binary_scalar(ctx, op, out, a, scalar);
    Launch(ctx, BinaryOpName(op),
           [ctx, op, o = OwnedArg(out), x = OwnedArg(a), scalar] {
             H().binary_scalar(ctx, op, o.arg(), x.arg(), scalar);
           },
           CanThrow(op, out.dtype));
  }
  void add_scaled(const KernelContext& ctx, const TensorArg& out, const TensorArg& a,
                  const TensorArg& b, double alpha) override {
    if (!Queued(ctx)) return H().add_scaled(ctx, out, a, b, alpha);
    Launch(ctx, "add_scaled",
           [ctx, o = OwnedArg(out), x = OwnedArg(a), y = OwnedArg(b), alpha] {
             H().add_scaled(ctx, o.arg(), x.arg(), y.arg(), alpha);
           },
           false);
  }
  void unary(const KernelContext& ctx, UnaryOp op, const TensorArg& out,
             const TensorArg& a) override {
    if (!Queued(ctx)) return H().unary(ctx, op, out, a);
    Launch(ctx, UnaryOpName(op),
           [ctx, op, o = OwnedArg(out), x = OwnedArg(a)] {
             H().unary(ctx, op, o.arg(), x.arg());
           },
           false);
  }
  void relu_backward(const KernelContext& ctx, const TensorArg& out, const TensorArg& grad,
                     const TensorArg& input) override {
    if (!Queued(ctx)) return H().relu_backward(ctx, out, grad, input);
    Launch(ctx, "relu_backward",
           [ctx, o = OwnedArg(out), g = OwnedArg(grad), i = OwnedArg(input)] {
             H().relu_backward(ctx, o.arg(), g.arg(), i.arg());
           },
           false);
  }
  void matmul(const KernelContext& ctx, const TensorArg& out, const TensorArg& a,
              const TensorArg& b) override {
    if (!Queued(ctx)) return H().matmul(ctx, out, a, b);
    Launch(ctx, "matmul",
           [ctx, o = OwnedArg(out), x = OwnedArg(a), y = OwnedArg(b)] {
             H().matmul(ctx, o.arg(), x.arg(), y.arg());
           },
           false);
  }
  void reduce(const KernelContext& ctx, ReduceOp op, const TensorArg& out,
              const TensorArg& a, int64_t dim) override {
    if (!Queued(ctx)) return H().reduce(ctx, op, out, a, dim);
    Launch(ctx, ReduceOpName(op),
           [ctx, op, o = OwnedArg(out), x = OwnedArg(a), dim] {
             H().reduce(ctx, op, o.arg(), x.arg(), dim);
           },
           false);
  }
  void sigmoid_cross_entropy(const KernelContext& ctx, const TensorArg& out,
                             const TensorArg& x, const TensorArg& t) override {
    if (!Queued(ctx)) return H().sigmoid_cross_entropy(ctx, out, x, t);
    Launch(ctx, "sigmoid_cross_entropy",
           [ctx, o = OwnedArg(out), xa = OwnedArg(x), ta = OwnedArg(t)] {
             H().sigmoid_cross_entropy(ctx, o.arg(), xa.arg(), ta.arg());
           },
           false);
  }
  void sigmoid_cross_entropy_grad(const KernelContext& ctx, const TensorArg& out,
                                  const TensorArg& x, const TensorArg& t,
                                  double scale) override {
    if (!Queued(ctx)) return H().sigmoid_cross_entropy_grad(ctx, out, x, t, scale);
    Launch(ctx, "sigmoid_cross_entropy_grad",
           [ctx, o = OwnedArg(out), xa = OwnedArg(x), ta = OwnedArg(t), scale] {
             H().sigmoid_cross_entropy_grad(ctx, o.arg(), xa.arg(), ta.arg(), scale);
           },
           false);
  }

 private:
  static Kernels& H() { return HostKernels(); }
};

}  // namespace

Kernels& SimStreamKernels() {
  static SimStreamKernelsImpl* kernels = new SimStreamKernelsImpl;  // never destroyed
  return *kernels;
}

}  // namespace devmem
