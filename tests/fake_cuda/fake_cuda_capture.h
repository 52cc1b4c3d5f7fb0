// tests/fake_cuda/fake_cuda_capture.h: the seam between the fake runtime
// (fake_cuda.cc) and its model of stream capture and graphs (fake_cuda_graphs.cc).
// Internal to the fake; tests use the CUDA API and fake_cuda.h.
//
// Lock order: fake_cuda.cc's State::mu, then the capture model's own mutex (a leaf:
// nothing here calls back into fake_cuda.cc while holding it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace fake_cuda {

// --- offered by fake_cuda.cc -----------------------------------------------------------

// What the capture model needs to know of a stream (a legacy default stream has
// handle 0).
struct StreamFacts {
  uintptr_t handle = 0;
  int device = 0;
  bool legacy = false;
  bool blocking = false;
};
// The live stream `stream` names for the calling thread (misuse aborts otherwise).
StreamFacts ResolveStream(cudaStream_t stream, const char* call);
// Every entry point's first step (no CUDA call from a host function, ...).
void EnterCall(const char* call);
// Records a failing runtime call's error as the thread's last error; returns it.
cudaError_t RecordError(cudaError_t err);
// Queues `work` on `stream` as ordinary stream work (graph launch).
void EnqueueWork(cudaStream_t stream, std::function<void()> work);
[[noreturn]] void Abort(const std::string& what);

// --- offered by fake_cuda_graphs.cc ----------------------------------------------------

// A "potentially unsafe" call (cudaMalloc, cudaFree, cuMemCreate, cuMemMap, ...):
// cudaSuccess when the calling thread may make it now; otherwise every capture that
// prohibits it is invalidated and the call fails with cudaErrorStreamCaptureUnsupported
// (cudaThreadExchangeStreamCaptureMode documents the rule).
cudaError_t CheckUnsafeCall(const char* call);
// Work about to be queued on `s`. cudaSuccess with *captured = false: run it as usual;
// with *captured = true: it became a node of the stream's capture (and must not run).
// Otherwise the error to return (an invalidated capture; the legacy stream while a
// blocking stream of its device captures, which invalidates that capture).
cudaError_t OnStreamWork(const StreamFacts& s, std::function<void()>* work, bool* captured);
// cudaStreamSynchronize / cudaStreamQuery of `s`: cudaSuccess, or the error (and the
// capture is invalidated).
cudaError_t OnStreamSync(const StreamFacts& s);
// cudaEventRecord of `event` on `s`: true when `s` is capturing (the event is then a
// capture node, and marked "last recorded in a capture"); false clears the mark.
// *err is set when the record must fail instead.
bool OnEventRecord(uintptr_t event, const StreamFacts& s, cudaError_t* err);
// True for an event last recorded in a capture (cudaEventQuery and
// cudaEventSynchronize fail with cudaErrorCapturedEvent).
bool EventCaptured(uintptr_t event);
void OnEventDestroy(uintptr_t event);
// A stream being destroyed while capturing is misuse.
void OnStreamDestroy(const StreamFacts& s);
// Live "captures" (begun, not ended) and "graphs" (cudaGraph_t and cudaGraphExec_t not
// destroyed); -1 for another name.
long LiveCaptureObjects(const char* what);
// What is still live at exit, one line each ("" when nothing).
std::string CaptureLeaks();

}  // namespace fake_cuda
