// tensor/bench_kernels.h: the bodies of the tensor benchmarks, for devmem-bench to time.
//
// Example (what devmem-bench does):
//   double tensor_copy_ns = bench::TensorCopyNs();   // target <= 10
//   double slice_ns = bench::SliceNs();              // target <= 60
// or, timing the bodies yourself:
//   Tensor t = zeros({3200, 2}, {.device = DeviceId{}});
//   int64_t t0 = NowNs();
//   BenchTensorCopy(t, n);
//   double ns = double(NowNs() - t0) / n;
//
// Both bodies touch only the handle: no element is read, nothing is allocated. The
// return values depend on every iteration so the compiler cannot drop the loops.
//
// What bounds tensor_copy_ns: a copy is one relaxed atomic increment, a destroy one
// acq_rel decrement (the copied-from handle keeps the count above 1, so the unique-owner
// fast path does not apply), plus ~130 bytes of inline metadata (60 instructions an
// iteration in all). The two locked read-modify-writes dominate: on the 2-core AMD
// EPYC VM this was written on, a bare uncontended atomic increment+decrement pair cost
// ~9.5 ns of CPU time and the handle copy ~10-11 ns; since the VM changed (2026-12-01)
// the pair costs 11.0-11.7 ns (~5.6 ns, some 20 cycles, a locked instruction) and the
// copy ~1.15x that, whichever build runs. The figure is therefore at the target only on
// CPUs with cheap locked instructions, and it is sensitive to load (wall-clock time
// includes preemption).
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace devmem {

// `iterations` times: copy the Tensor handle `t` (shares the storage: one relaxed
// atomic increment, shape and strides copied inline) and destroy the copy (one acq_rel
// decrement, since `t` still holds a reference). Any defined tensor.
int64_t BenchTensorCopy(const Tensor& t, int64_t iterations);

// `iterations` times: make the seed's batch view t[offset ..< offset + 32, _] of the
// 2-D tensor `t` (offset cycling over the rows) and destroy it. `t` must be 2-D with at
// least 32 rows (throws InvalidArgumentError otherwise).
int64_t BenchSlice2D(const Tensor& t, int64_t iterations);

// The floor of BenchTensorCopy on this CPU: `iterations` times, one relaxed atomic
// increment and one acq_rel decrement of a counter, nothing else. `t` is unused but for
// the signature the timing harness shares.
int64_t BenchAtomicPair(const Tensor& t, int64_t iterations);

namespace bench {

// ns per BenchTensorCopy iteration: the median of 9 timed passes of 2^21 iterations
// (after one warm-up pass) on a [3200, 2] float32 tensor wrapping host memory (so no
// device, allocator or DEVMEM_CONF is involved), wall clock.
double TensorCopyNs();
// The same for BenchSlice2D.
double SliceNs();
// The same for BenchAtomicPair: what any thread-safe reference count pays per
// copy+destroy here. devmem-bench prints tensor_copy_ns beside it as a ratio.
double AtomicPairNs();

}  // namespace bench

}  // namespace devmem
