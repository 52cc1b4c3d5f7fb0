// tests/fake_cuda/fake_cuda_graphs.cc: stream capture and graphs in the fake CUDA
// runtime (fake_cuda.cc's opening comment describes the fake as a whole).
//
// What it models, after cudaStreamBeginCapture, cudaThreadExchangeStreamCaptureMode,
// cudaStreamEndCapture, cudaStreamIsCapturing and cudaStreamGetCaptureInfo in
// <cuda_runtime_api.h>:
//   * cudaStreamBeginCapture(stream, mode), mode global, thread-local or relaxed: not on
//     the legacy stream (cudaErrorStreamCaptureUnsupported), not on a stream already
//     capturing (cudaErrorIllegalState). Each capture has an id unique in the process.
//   * Work queued on a capturing stream (cudaLaunchHostFunc, cudaMemsetAsync) is not
//     run: it becomes a node of the capture's graph. cudaEventRecord on a capturing
//     stream is a node too, and the event is then "last recorded in a capture":
//     cudaEventQuery and cudaEventSynchronize of it fail with cudaErrorCapturedEvent
//     until it is recorded again outside a capture.
//   * The thread's interaction mode (cudaThreadExchangeStreamCaptureMode, global by
//     default) decides which "potentially unsafe" calls (cudaMalloc, cudaFree,
//     cudaHostAlloc, cudaFreeHost, cudaMemcpy, cudaMemset, and the driver's cuMemCreate,
//     cuMemRelease, cuMemMap, cuMemUnmap, cuMemSetAccess, cuMemAddressReserve,
//     cuMemAddressFree) it may make: global: none while this thread has a capture not
//     begun relaxed or another thread has one begun global; thread-local: none while
//     this thread has a capture not begun relaxed; relaxed: all. A prohibited call fails
//     with cudaErrorStreamCaptureUnsupported (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) and
//     INVALIDATES the captures that prohibit it, as a real driver does.
//   * cudaStreamSynchronize of a capturing stream fails with
//     cudaErrorStreamCaptureUnsupported and invalidates its capture; the legacy stream
//     (work, synchronize) while a blocking stream of its device captures fails with
//     cudaErrorStreamCaptureImplicit and invalidates that capture.
//   * cudaStreamIsCapturing / cudaStreamGetCaptureInfo say none, active or invalidated
//     (and the id); on the legacy stream while a blocking stream captures they fail
//     with cudaErrorStreamCaptureImplicit (that capture is not invalidated).
//   * cudaStreamEndCapture: cudaErrorStreamCaptureUnmatched on a stream not capturing;
//     cudaErrorStreamCaptureWrongThread from another thread than the one that began a
//     capture not begun relaxed (the capture goes on); an invalidated capture ends
//     with a NULL graph and cudaErrorStreamCaptureInvalidated; otherwise the graph.
//   * cudaGraphInstantiate / cudaGraphLaunch (the nodes queued in capture order on the
//     launch stream: a replay) / cudaGraphExecDestroy / cudaGraphDestroy. Graphs and
//     captures still live at exit are leaks.
// Not modeled: cross-stream capture (events waited on by other streams joining them to
// a capture), graph memory nodes (cudaMallocAsync), graph editing, cudaStreamQuery.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/fake_cuda/fake_cuda_capture.h"

namespace fake_cuda {
namespace {

struct Capture {
  int device = 0;
  bool blocking = false;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  unsigned long long id = 0;
  bool invalidated = false;
  std::vector<std::function<void()>> nodes;
};

struct Graph {
  std::vector<std::function<void()>> nodes;
};

struct Captures {
  std::mutex mu;  // a leaf (fake_cuda_capture.h)
  std::map<uintptr_t, Capture> by_stream;  // capturing streams
  std::set<uintptr_t> captured_events;     // last recorded in a capture
  std::set<Graph*> graphs;
  std::set<Graph*> execs;
  unsigned long long next_id = 1;
};

Captures& All() {
  static Captures* const c = new Captures;  // never destroyed (stream threads)
  return *c;
}

thread_local cudaStreamCaptureMode t_mode = cudaStreamCaptureModeGlobal;

// The captures that forbid the calling thread a potentially unsafe call. Holds mu.
std::vector<Capture*> Prohibitors(Captures& c) {
  std::vector<Capture*> out;
  if (t_mode == cudaStreamCaptureModeRelaxed) return out;
  const std::thread::id me = std::this_thread::get_id();
  for (auto& [stream, cap] : c.by_stream) {
    if (cap.invalidated) continue;
    const bool mine = cap.thread == me && cap.mode != cudaStreamCaptureModeRelaxed;
    const bool others = t_mode == cudaStreamCaptureModeGlobal && cap.thread != me &&
                        cap.mode == cudaStreamCaptureModeGlobal;
    if (mine || others) out.push_back(&cap);
  }
  return out;
}

// The captures of blocking streams of `device` (what the legacy stream would depend
// on). Holds mu.
std::vector<Capture*> BlockingCaptures(Captures& c, int device) {
  std::vector<Capture*> out;
  for (auto& [stream, cap] : c.by_stream) {
    if (cap.device == device && cap.blocking) out.push_back(&cap);
  }
  return out;
}

cudaError_t StatusOf(const StreamFacts& s, cudaStreamCaptureStatus* status,
                     unsigned long long* id) {
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  if (s.legacy) {
    if (!BlockingCaptures(c, s.device).empty()) return cudaErrorStreamCaptureImplicit;
    *status = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  auto it = c.by_stream.find(s.handle);
  if (it == c.by_stream.end()) {
    *status = cudaStreamCaptureStatusNone;
  } else {
    *status = it->second.invalidated ? cudaStreamCaptureStatusInvalidated
                                     : cudaStreamCaptureStatusActive;
    if (id != nullptr) *id = it->second.id;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t CheckUnsafeCall(const char* /*call*/) {
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  std::vector<Capture*> forbid = Prohibitors(c);
  if (forbid.empty()) return cudaSuccess;
  for (Capture* cap : forbid) cap->invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

cudaError_t OnStreamWork(const StreamFacts& s, std::function<void()>* work,
                         bool* captured) {
  *captured = false;
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  if (s.legacy) {
    std::vector<Capture*> caps = BlockingCaptures(c, s.device);
    if (caps.empty()) return cudaSuccess;
    for (Capture* cap : caps) cap->invalidated = true;
    return cudaErrorStreamCaptureImplicit;
  }
  auto it = c.by_stream.find(s.handle);
  if (it == c.by_stream.end()) return cudaSuccess;
  if (it->second.invalidated) return cudaErrorStreamCaptureInvalidated;
  it->second.nodes.push_back(std::move(*work));
  *captured = true;
  return cudaSuccess;
}

cudaError_t OnStreamSync(const StreamFacts& s) {
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  if (s.legacy) {
    std::vector<Capture*> caps = BlockingCaptures(c, s.device);
    if (caps.empty()) return cudaSuccess;
    for (Capture* cap : caps) cap->invalidated = true;
    return cudaErrorStreamCaptureImplicit;
  }
  auto it = c.by_stream.find(s.handle);
  if (it == c.by_stream.end()) return cudaSuccess;
  it->second.invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

bool OnEventRecord(uintptr_t event, const StreamFacts& s, cudaError_t* err) {
  std::function<void()> node = [] {};
  bool captured = false;
  *err = OnStreamWork(s, &node, &captured);
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  if (*err != cudaSuccess) return false;
  if (captured) {
    c.captured_events.insert(event);
  } else {
    c.captured_events.erase(event);
  }
  return captured;
}

bool EventCaptured(uintptr_t event) {
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.captured_events.count(event) != 0;
}

void OnEventDestroy(uintptr_t event) {
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  c.captured_events.erase(event);
}

void OnStreamDestroy(const StreamFacts& s) {
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.by_stream.count(s.handle) != 0) {
    Abort("cudaStreamDestroy of a stream that is capturing (end the capture first)");
  }
}

long LiveCaptureObjects(const char* what) {
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  const std::string w = what;
  if (w == "captures") return static_cast<long>(c.by_stream.size());
  if (w == "graphs") return static_cast<long>(c.graphs.size() + c.execs.size());
  return -1;
}

std::string CaptureLeaks() {
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  std::string out;
  for (const auto& [stream, cap] : c.by_stream) {
    out += "  a capture on stream " + std::to_string(stream) + " (id " +
           std::to_string(cap.id) + ") was never ended\n";
  }
  if (!c.graphs.empty()) {
    out += "  " + std::to_string(c.graphs.size()) + " graph(s) not destroyed\n";
  }
  if (!c.execs.empty()) {
    out += "  " + std::to_string(c.execs.size()) + " executable graph(s) not destroyed\n";
  }
  return out;
}

}  // namespace fake_cuda

using fake_cuda::All;
using fake_cuda::Captures;
using fake_cuda::Graph;

extern "C" {

cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t stream,
                                             enum cudaStreamCaptureMode mode) {
  fake_cuda::EnterCall("cudaStreamBeginCapture");
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return fake_cuda::RecordError(cudaErrorInvalidValue);
  }
  const fake_cuda::StreamFacts s = fake_cuda::ResolveStream(stream, "cudaStreamBeginCapture");
  // "Capture may not be initiated if stream is cudaStreamLegacy."
  if (s.legacy) return fake_cuda::RecordError(cudaErrorStreamCaptureUnsupported);
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.by_stream.count(s.handle) != 0) return fake_cuda::RecordError(cudaErrorIllegalState);
  fake_cuda::Capture& cap = c.by_stream[s.handle];
  cap.device = s.device;
  cap.blocking = s.blocking;
  cap.mode = mode;
  cap.thread = std::this_thread::get_id();
  cap.id = c.next_id++;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  fake_cuda::EnterCall("cudaThreadExchangeStreamCaptureMode");
  if (mode == nullptr || (*mode != cudaStreamCaptureModeGlobal &&
                          *mode != cudaStreamCaptureModeThreadLocal &&
                          *mode != cudaStreamCaptureModeRelaxed)) {
    return fake_cuda::RecordError(cudaErrorInvalidValue);
  }
  std::swap(*mode, fake_cuda::t_mode);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  fake_cuda::EnterCall("cudaStreamEndCapture");
  if (graph == nullptr) return fake_cuda::RecordError(cudaErrorInvalidValue);
  const fake_cuda::StreamFacts s = fake_cuda::ResolveStream(stream, "cudaStreamEndCapture");
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = s.legacy ? c.by_stream.end() : c.by_stream.find(s.handle);
  if (it == c.by_stream.end()) return fake_cuda::RecordError(cudaErrorStreamCaptureUnmatched);
  if (it->second.mode != cudaStreamCaptureModeRelaxed &&
      it->second.thread != std::this_thread::get_id()) {
    return fake_cuda::RecordError(cudaErrorStreamCaptureWrongThread);
  }
  const bool invalidated = it->second.invalidated;
  auto g = std::make_unique<Graph>();
  g->nodes = std::move(it->second.nodes);
  c.by_stream.erase(it);
  if (invalidated) {
    *graph = nullptr;
    return fake_cuda::RecordError(cudaErrorStreamCaptureInvalidated);
  }
  c.graphs.insert(g.get());
  *graph = reinterpret_cast<cudaGraph_t>(g.release());
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t stream,
                                            enum cudaStreamCaptureStatus* status) {
  fake_cuda::EnterCall("cudaStreamIsCapturing");
  if (status == nullptr) return fake_cuda::RecordError(cudaErrorInvalidValue);
  const fake_cuda::StreamFacts s = fake_cuda::ResolveStream(stream, "cudaStreamIsCapturing");
  const cudaError_t err = fake_cuda::StatusOf(s, status, nullptr);
  return err == cudaSuccess ? err : fake_cuda::RecordError(err);
}

cudaError_t CUDARTAPI cudaStreamGetCaptureInfo(cudaStream_t stream,
                                               enum cudaStreamCaptureStatus* status,
                                               unsigned long long* id, cudaGraph_t* graph,
                                               const cudaGraphNode_t** dependencies,
                                               const cudaGraphEdgeData** edge_data,
                                               size_t* num_dependencies) {
  fake_cuda::EnterCall("cudaStreamGetCaptureInfo");
  if (status == nullptr) return fake_cuda::RecordError(cudaErrorInvalidValue);
  if (graph != nullptr || dependencies != nullptr || edge_data != nullptr ||
      num_dependencies != nullptr) {
    fake_cuda::Abort(
        "cudaStreamGetCaptureInfo: only the status and the id are modeled (pass NULL "
        "for the graph and the dependencies)");
  }
  const fake_cuda::StreamFacts s =
      fake_cuda::ResolveStream(stream, "cudaStreamGetCaptureInfo");
  const cudaError_t err = fake_cuda::StatusOf(s, status, id);
  return err == cudaSuccess ? err : fake_cuda::RecordError(err);
}

cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                           unsigned long long flags) {
  fake_cuda::EnterCall("cudaGraphInstantiate");
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  auto* g = reinterpret_cast<Graph*>(graph);
  if (exec == nullptr || flags != 0 || c.graphs.count(g) == 0) {
    return fake_cuda::RecordError(cudaErrorInvalidValue);
  }
  auto* e = new Graph{g->nodes};
  c.execs.insert(e);
  *exec = reinterpret_cast<cudaGraphExec_t>(e);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  fake_cuda::EnterCall("cudaGraphLaunch");
  std::vector<std::function<void()>> nodes;
  {
    Captures& c = All();
    std::lock_guard<std::mutex> lock(c.mu);
    auto* e = reinterpret_cast<Graph*>(exec);
    if (c.execs.count(e) == 0) return fake_cuda::RecordError(cudaErrorInvalidValue);
    nodes = e->nodes;
  }
  for (std::function<void()>& node : nodes) fake_cuda::EnqueueWork(stream, std::move(node));
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t exec) {
  fake_cuda::EnterCall("cudaGraphExecDestroy");
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  auto* e = reinterpret_cast<Graph*>(exec);
  if (c.execs.erase(e) == 0) fake_cuda::Abort("cudaGraphExecDestroy: not a live executable graph");
  delete e;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph) {
  fake_cuda::EnterCall("cudaGraphDestroy");
  Captures& c = All();
  std::lock_guard<std::mutex> lock(c.mu);
  auto* g = reinterpret_cast<Graph*>(graph);
  if (c.graphs.erase(g) == 0) fake_cuda::Abort("cudaGraphDestroy: not a live graph");
  delete g;
  return cudaSuccess;
}

}  // extern "C"
