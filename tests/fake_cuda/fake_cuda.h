// tests/fake_cuda/fake_cuda.h: what the fake CUDA runtime and driver
// (tests/fake_cuda/fake_cuda.cc, whose opening comment describes it) offer tests
// beyond the CUDA API itself.
#pragma once

#include <cstddef>

extern "C" {

// How many of `what` are live right now, over every device: "allocations" (cudaMalloc),
// "handles" (cuMemCreate, not yet released), "mappings" (cuMemMap), "reservations"
// (cuMemAddressReserve), "streams" (created, not destroyed; default streams are not
// counted), "events" (created, not destroyed), "pinned" (cudaHostAlloc, not yet freed),
// "used_bytes" (memory charged against the devices' capacity). Any other name aborts.
size_t devmem_fake_cuda_live(const char* what);

// A kernel that faults: queues work on `stream` (a cudaStream_t; NULL for the legacy
// default stream of the current device) that, when the stream reaches it, corrupts the
// stream's device with `error` (cudaErrorAssert, cudaErrorIllegalAddress, ...), which
// every later call on that device returns (fake_cuda.cc, "Sticky device errors").
// Returns cudaSuccess, or the device's error if it has faulted already.
int devmem_fake_cuda_launch_fault(void* stream, int error);

}  // extern "C"
