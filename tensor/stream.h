// tensor/stream.h: the current stream of each device, per thread, as PyTorch has it.
//
// Example:
//   Backend& b = AllocatorFor(dev)->backend();
//   Stream side = *b.create_stream();
//   {
//     StreamGuard guard(dev, side);     // this thread's ops on `dev` now use `side`
//     Tensor y = relu(x);               // y is allocated on `side`, relu runs on it
//     x.record_stream(side);            // x came from the default stream: announce it
//   }                                   // back to the previous stream (the default)
//
// Every op, factory and copy of the tensor layer allocates its output on, and runs its
// kernel on, CurrentStream(device) of the calling thread (kernels.h, KernelContext).
// Memory handed out on stream S is reused by the allocator only in S's order, so a
// tensor may be used on S at once, and on S only:
//
// THE USER ERROR (the one PyTorch users know): using a tensor on a stream other than
// the one it was allocated on, without calling record_stream(that stream), and then
// dropping it. The allocator sees the free, gives the block to the next allocation on
// the allocating stream, and that allocation's work may overwrite the memory while the
// other stream's kernel still reads or writes it: silently wrong results, no error.
// t.record_stream(S) makes the free wait (with an event) until S has passed the work
// queued so far. tests/tensor_streams_test.cc shows both.
//
// The streams are the device backend's (Backend::create_stream; Stream{0} is the
// default stream, and every device starts there). A guard does not create, check or
// synchronize anything: the stream must belong to the device's backend. Destroy a stream
// with DestroyStream, which retires it in the device's allocator first
// (CachingAllocator::release_stream: memory cached on it never serves the next stream
// given its handle before its work is done, and nothing synchronizes it once
// destroyed). cpu has only the default stream.
//
// Thread-safety: the current streams are thread-local; nothing here is shared.
#pragma once

#include "allocator/types.h"

namespace devmem {

// The calling thread's current stream for `device`: Stream{0} unless a StreamGuard
// (or SetCurrentStream) says otherwise.
Stream CurrentStream(DeviceId device);

// Makes `stream` the calling thread's current stream for `device` until changed again.
// Prefer StreamGuard, which restores the previous one.
void SetCurrentStream(DeviceId device, Stream stream);

// Blocks until every piece of work queued on `stream` of `device` has run (the device's
// Backend::synchronize_stream). Throws what AllocatorFor throws for a device that
// cannot be had.
void SynchronizeStream(DeviceId device, Stream stream);

// Destroys `stream` of `device` (made by the device's Backend::create_stream): retires
// it in the device's allocator (CachingAllocator::release_stream), then destroys it
// (Backend::destroy_stream), and makes the default stream current again on this thread
// if it was `stream`. Throws InvalidArgumentError for the default stream (or one
// released already whose work has not run), destroying nothing; what AllocatorFor
// throws for a device that cannot be had.
void DestroyStream(DeviceId device, Stream stream);

// Sets the current stream of `device` for its lifetime, then restores the previous
// one. Scoped: guards on one thread and device end in reverse order of creation. Not
// copyable or movable (it restores thread state on destruction).
class StreamGuard {
 public:
  StreamGuard(DeviceId device, Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

  DeviceId device() const { return device_; }
  Stream stream() const { return stream_; }
  Stream previous() const { return previous_; }

 private:
  DeviceId device_;
  Stream stream_;
  Stream previous_;
};

}  // namespace devmem
