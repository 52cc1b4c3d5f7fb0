// tests/fake_cuda/fake_cuda.cc: a fake CUDA runtime and driver, so that the CUDA
// backend (cuda/cuda_backend.cc) and the allocator on top of it run without a GPU.
//
// README
//
// devmem_fake_cuda_tests (tests/fake_cuda/CMakeLists.txt) links cuda_backend.cc's
// object file against this file instead of the real runtime (CUDA::cudart_static);
// ctest runs its tests as fake_cuda.*. The fake implements the runtime calls that
// cuda_backend.cc and the tests make, and hands out the driver's cuMem* entry points
// through cudaGetDriverEntryPointByVersion, as a real runtime does. It follows the
// CUDA documentation (the comments in <cuda.h> and <cuda_runtime_api.h>); where the
// documentation allows a choice, it takes the one least convenient for its caller.
//
// What it models
//   * Devices: DEVMEM_FAKE_CUDA_DEVICES of them (default 2), each with
//     DEVMEM_FAKE_CUDA_CAPACITY bytes (default 1GiB; K/M/G[iB] suffixes). Segments and
//     cuMemCreate allocations share a device's capacity; cudaMemGetInfo reports it.
//   * Device memory is not host memory: device addresses come from a PROT_NONE host
//     range (64 GiB, or four times the devices' memory when that is more), so host
//     code that touches device memory crashes, as on a GPU. The bytes
//     live elsewhere and only device work reaches them (cudaMemset, cudaMemsetAsync,
//     cudaMemcpy). cudaMalloc returns addresses aligned to 512 bytes and to nothing
//     more (drivers give 512 in practice, the documented floor is 256), and does not
//     synchronize; cudaFree does not either (the documentation says it "may").
//   * Streams: each stream runs its work in order on a host thread of its own. The
//     legacy default stream (0, cudaStreamLegacy) of each device also waits for, and
//     is waited for by, that device's blocking streams. cudaStreamDestroy returns at
//     once and the stream finishes its queued work. A destroyed stream's handle is
//     given to the next cudaStreamCreateWithFlags (the newest destroyed first), while
//     the old stream may still be running: a real driver's handles are pointers to
//     its stream objects, whose memory it reuses, so a handle value names a stream
//     only while that stream lives. Host functions
//     (cudaLaunchHostFunc) run when their stream reaches them, one at a time on one
//     thread for the whole process (the documentation says they "may be serialized"):
//     a host function that waits for another stream's host function deadlocks.
//   * Events capture their stream's queued work (cudaEventRecord); cudaEventQuery is
//     cudaErrorNotReady until the stream passed that point; an event never recorded is
//     complete; destroying a pending event is allowed.
//   * The thread's current device (cudaGetDevice/cudaSetDevice, default 0) and
//     current context: cudaSetDevice and every runtime call make the current device's
//     primary context current. The driver's cuMem* calls need a current context
//     (CUDA_ERROR_INVALID_CONTEXT otherwise) but take their device from arguments.
//   * The thread's last error: failing runtime calls set it, cudaGetLastError
//     returns and clears it, cudaPeekAtLastError returns it (cudaErrorNotReady is not
//     an error and is not recorded).
//   * Sticky device errors: devmem_fake_cuda_launch_fault(stream, error) queues device
//     work that, when the stream reaches it, faults the device (a kernel's assert,
//     cudaErrorAssert, or an illegal address). From then on, as with a real corrupted
//     context, every runtime call acting on that device and every cuMem* call with
//     its context current returns the error (the driver's CUresult of the same
//     number), cudaGetLastError cannot clear it, queued work on the device's streams
//     is dropped, and cudaStreamSynchronize / cudaEventSynchronize return it. Only
//     the process's end clears it: the leak check ignores what a faulted device
//     holds (and every reservation once any device faulted: they carry no device).
//   * Virtual memory: cuMemAddressReserve / cuMemAddressFree, cuMemCreate /
//     cuMemRelease (pinned device memory; the allocation is freed when it is released
//     and no longer mapped), cuMemMap / cuMemUnmap, cuMemSetAccess, with a minimum and
//     recommended granularity of 2 MiB. Data survives unmapping until the allocation
//     is freed. CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 1.
//   * Pinned host memory: cudaHostAlloc (cudaHostAllocDefault or Portable; other flags
//     are misuse: not modeled) gives real host memory, which the host may touch, and
//     cudaFreeHost frees it (a pointer it did not give, or a second free, is misuse);
//     it is not charged against a device. cudaStreamGetDevice says a stream's device
//     (the current one for the legacy default stream).
//   * cudaGetDriverEntryPointByVersion: cudaErrorInvalidValue for a version newer than
//     the driver (DEVMEM_FAKE_CUDA_DRIVER_VERSION, default the toolkit's CUDA_VERSION);
//     otherwise cudaSuccess, with the pointer, or NULL and SymbolNotFound /
//     VersionNotSufficent (sic, the enum's spelling) in the status.
//
// What it checks: calls that devmem must never make end the process with
// "fake-cuda: misuse: <what and why>", even where a real driver returns an error
// code, so that no bug hides behind an error that the backend only logs:
//   * cuMemUnmap of part of a mapping or over an unmapped hole; cuMemSetAccess that
//     does not cover whole mappings exactly; cuMemMap outside one reservation, over a
//     mapping, or of a released handle; cuMemAddressFree of anything but a whole
//     reservation, or with mappings inside; cuMemRelease of an unknown or released
//     handle; cudaFree of a pointer cudaMalloc did not return (or twice);
//   * streams and events used after destroy (while a stream's handle is not reused:
//     see Streams above), an event recorded on another device's stream,
//     cudaStreamDestroy of a default stream;
//   * any CUDA call from inside a host function ("The host function must not make
//     any CUDA API calls");
//   * device work (a memset or copy) over memory that is not allocated, not mapped, or
//     mapped without cuMemSetAccess; checked when the work is queued and again when the
//     stream runs it, so memory released before its stream reached the work that uses
//     it (the allocator must synchronize the stream first) is caught;
//   * leaks: at exit (atexit, registered at the first CUDA call) every allocation,
//     handle, mapping, reservation, created stream and event must be gone; otherwise
//     the fake lists them and the process exits with status 1
//     (DEVMEM_FAKE_CUDA_LEAK_CHECK=0 turns this off). Objects destroyed by static
//     destructors after that handler runs would show as leaks.
//   * anything the fake does not model (a device attribute, cudaStreamPerThread, a
//     memcpy kind other than host<->device, timing events) is reported the same way
//     rather than answered wrongly.
//
// Failure injection: DEVMEM_FAKE_CUDA_FAIL="call:N[+][=code],..." makes the Nth call
// to `call` (counted from when the variable last changed; "+": and every later one)
// fail with `code` (default 999: cudaErrorUnknown / CUDA_ERROR_UNKNOWN) before it
// changes anything. It is read at every call, so a test may setenv/unsetenv it between
// calls. DEVMEM_FAKE_CUDA_NO_VMM=1 makes devices report no virtual memory management,
// DEVMEM_FAKE_CUDA_MISSING="cuMemCreate,..." makes the entry-point query not find
// those symbols (both read at every query). DEVMEM_FAKE_CUDA_DEVICES=0 makes
// cudaGetDeviceCount fail with cudaErrorNoDevice.
//
// What it cannot do: it is host memory and host threads. There are no kernels (but
// memsets and copies, which are device work of their stream's device), no mapped or
// write-combined host memory, no cudaIpc* (but shareable VMM handles, below),
// no stream priorities, no timing events; a stream's work is only host
// functions, memsets and copies. It cannot tell how long real work takes, whether a
// real driver would be slower or run out of memory earlier (fragmentation, context
// overhead), or what a real driver does on the calls it treats as misuse. Streams and
// host functions do run on threads of their own, so the backend's and the allocator's
// locking is exercised for real, but with a CPU's timing, not a GPU's.
//
// Shareable handles (cuMemExportToShareableHandle / cuMemImportFromShareableHandle with
// POSIX file descriptors, so two processes really share memory): "shareable handles
// (IPC)" below.
//
// Peer access (cudaDeviceCanAccessPeer, cudaDeviceEnablePeerAccess, cudaMemcpyPeer*,
// and which device may reach which memory): fake_cuda_peer.h.
//
// Stream capture and graphs: fake_cuda_graphs.cc (its opening comment says what is
// modeled: capture modes, prohibited calls that invalidate a capture, captured events).
//
// tests/fake_cuda/fake_cuda.h declares devmem_fake_cuda_live(), which tests use to
// count what is live.
#include "tests/fake_cuda/fake_cuda.h"

#include "tests/fake_cuda/fake_cuda_capture.h"
#include "tests/fake_cuda/fake_cuda_peer.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

constexpr size_t kGranularity = size_t{2} << 20;  // minimum and recommended
constexpr size_t kMallocAlign = 512;

[[noreturn]] __attribute__((format(printf, 1, 2))) void Misuse(const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::fputs("fake-cuda: misuse: ", stderr);
  std::vfprintf(stderr, format, args);
  std::fputc('\n', stderr);
  va_end(args);
  std::fflush(stderr);
  std::abort();
}

// "1GiB", "512MiB", "64M", "4096".
size_t ParseBytes(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(text, &end, 10);
  if (end == text || errno != 0) Misuse("%s=%s is not a byte count", name, text);
  const std::string unit(end);
  size_t scale = 1;
  if (unit == "K" || unit == "KiB")
    scale = size_t{1} << 10;
  else if (unit == "M" || unit == "MiB")
    scale = size_t{1} << 20;
  else if (unit == "G" || unit == "GiB")
    scale = size_t{1} << 30;
  else if (!unit.empty())
    Misuse("%s=%s: unknown unit (K, M, G, KiB, MiB, GiB)", name, text);
  return static_cast<size_t>(n) * scale;
}

struct Settings {
  int devices = 2;
  size_t capacity = size_t{1} << 30;
  bool leak_check = true;
};

// Read once, at the first CUDA call.
const Settings& Config() {
  static const Settings settings = [] {
    Settings s;
    if (const char* e = std::getenv("DEVMEM_FAKE_CUDA_DEVICES")) {
      s.devices = std::atoi(e);
      if (s.devices < 0 || s.devices > 16)
        Misuse("DEVMEM_FAKE_CUDA_DEVICES=%s: 0 to 16", e);
    }
    if (const char* e = std::getenv("DEVMEM_FAKE_CUDA_CAPACITY")) {
      s.capacity = ParseBytes("DEVMEM_FAKE_CUDA_CAPACITY", e);
    }
    if (const char* e = std::getenv("DEVMEM_FAKE_CUDA_LEAK_CHECK")) {
      s.leak_check = std::string(e) != "0";
    }
    return s;
  }();
  return settings;
}

int DriverVersion() {
  const char* e = std::getenv("DEVMEM_FAKE_CUDA_DRIVER_VERSION");
  return e != nullptr ? std::atoi(e) : CUDA_VERSION;
}

bool ValidDevice(int d) { return d >= 0 && d < Config().devices; }

// --- failure injection ---------------------------------------------------------------

struct Injection {
  std::string call;
  long nth = 0;
  bool and_later = false;
  int code = 999;
  long calls = 0;
};

std::vector<Injection> ParseInjections(const std::string& text) {
  std::vector<Injection> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t comma = text.find(',', at);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(at, comma - at);
    at = comma + 1;
    if (item.empty()) continue;
    Injection in;
    const size_t colon = item.find(':');
    if (colon == std::string::npos || colon == 0) {
      Misuse("DEVMEM_FAKE_CUDA_FAIL item '%s': expected call:N[+][=code]", item.c_str());
    }
    in.call = item.substr(0, colon);
    const char* p = item.c_str() + colon + 1;
    char* end = nullptr;
    in.nth = std::strtol(p, &end, 10);
    if (end == p || in.nth < 1) {
      Misuse("DEVMEM_FAKE_CUDA_FAIL item '%s': N must be 1 or more", item.c_str());
    }
    if (*end == '+') {
      in.and_later = true;
      ++end;
    }
    if (*end == '=') {
      p = end + 1;
      in.code = static_cast<int>(std::strtol(p, &end, 10));
      if (end == p || in.code == 0) {
        Misuse("DEVMEM_FAKE_CUDA_FAIL item '%s': the code must be a non-zero number",
               item.c_str());
      }
    }
    if (*end != '\0') {
      Misuse("DEVMEM_FAKE_CUDA_FAIL item '%s': expected call:N[+][=code]", item.c_str());
    }
    out.push_back(in);
  }
  return out;
}

// The error `call` must fail with now, or 0.
int Injected(const char* call) {
  static std::mutex* mu = new std::mutex;
  static std::string* text = new std::string;
  static std::vector<Injection>* injections = new std::vector<Injection>;
  const char* env = std::getenv("DEVMEM_FAKE_CUDA_FAIL");
  std::lock_guard<std::mutex> lock(*mu);
  const std::string now = env != nullptr ? env : "";
  if (now != *text) {
    *text = now;
    *injections = ParseInjections(now);
  }
  for (Injection& in : *injections) {
    if (in.call != call) continue;
    ++in.calls;
    if (in.calls == in.nth || (in.and_later && in.calls > in.nth)) return in.code;
  }
  return 0;
}

// --- state ---------------------------------------------------------------------------

struct Stream {
  uintptr_t handle = 0;  // 0 for a legacy default stream
  int device = 0;
  bool legacy = false;
  bool blocking = false;  // created with cudaStreamDefault: synchronizes with legacy
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  uint64_t enqueued = 0;   // items ever queued
  uint64_t completed = 0;  // items run, in order
  bool destroyed = false;
};

struct Event {
  int device = 0;
  Stream* stream = nullptr;  // null until recorded
  uint64_t seq = 0;          // complete once stream->completed >= seq
};

struct Allocation {  // cudaMalloc
  int device = 0;
  size_t bytes = 0;    // as asked
  size_t charged = 0;  // rounded up to 512
  uintptr_t va = 0;    // the address range taken for it
  size_t va_bytes = 0;
  char* data = nullptr;
};

struct Handle {  // cuMemCreate, or cuMemImportFromShareableHandle
  int device = 0;
  size_t bytes = 0;
  char* data = nullptr;
  // Shareable (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested): the memfd behind
  // `data`, which cuMemExportToShareableHandle dups; -1 otherwise.
  int fd = -1;
  bool imported = false;  // from another process's export
  bool released = false;
  int maps = 0;
};

struct Mapping {  // cuMemMap
  size_t bytes = 0;
  CUmemGenericAllocationHandle handle = 0;
  unsigned access = 0;  // bit d: device d has read/write access
};

struct State {
  std::mutex mu;  // guards everything below; taken before any Stream::mu
  uintptr_t va_base = 0;
  std::map<uintptr_t, size_t> va_free;          // free device addresses: start -> bytes
  std::vector<size_t> used;                     // per device
  std::map<uintptr_t, Allocation> allocations;  // by the address cudaMalloc returned
  std::map<uintptr_t, size_t> reservations;     // base -> bytes
  std::map<uintptr_t, Mapping> mappings;        // address -> mapping
  std::map<CUmemGenericAllocationHandle, Handle> handles;  // created or still mapped
  std::map<uintptr_t, Stream*> streams;                    // created, not destroyed
  std::vector<Stream*> retired;  // destroyed (kept: events refer to them)
  std::vector<Stream*> legacy;   // per device, made on first use
  std::map<uintptr_t, Event> events;
  std::map<uintptr_t, size_t> pinned;  // cudaHostAlloc: address -> bytes
  uintptr_t next_stream = 0x5f0000;  // new handles count up
  std::vector<uintptr_t> free_streams;  // destroyed handles, reused newest first
  uintptr_t next_event = 0xe70000;
  CUmemGenericAllocationHandle next_handle = 0x4a0000;
};

void LeakCheck();

// The process's state; never destroyed (stream threads outlive static destructors).
State& Global() {
  static State* const state = [] {
    auto* s = new State;
    // Device address space: four times the memory of all devices, at least 64 GiB
    // (ThreadSanitizer leaves too little room for much more).
    const size_t va_bytes = std::max(
        size_t{64} << 30, 4 * static_cast<size_t>(Config().devices) * Config().capacity);
    void* base = mmap(nullptr, va_bytes + kGranularity, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) Misuse("cannot reserve %zu bytes of address space", va_bytes);
    s->va_base =
        (reinterpret_cast<uintptr_t>(base) + kGranularity - 1) & ~(kGranularity - 1);
    s->va_free.emplace(s->va_base, va_bytes);
    s->used.assign(static_cast<size_t>(Config().devices), 0);
    s->legacy.assign(static_cast<size_t>(Config().devices), nullptr);
    std::atexit(LeakCheck);
    return s;
  }();
  return *state;
}

// First fit of `bytes` at a multiple of `align` (a power of two); 0 when none is left.
uintptr_t VaAlloc(State& st, size_t bytes, size_t align) {
  for (auto it = st.va_free.begin(); it != st.va_free.end(); ++it) {
    const uintptr_t start = (it->first + align - 1) & ~(align - 1);
    const uintptr_t end = it->first + it->second;
    if (start >= end || end - start < bytes) continue;
    const uintptr_t free_start = it->first;
    st.va_free.erase(it);
    if (start > free_start) st.va_free.emplace(free_start, start - free_start);
    if (start + bytes < end) st.va_free.emplace(start + bytes, end - start - bytes);
    return start;
  }
  return 0;
}

void VaFree(State& st, uintptr_t start, size_t bytes) {
  auto next = st.va_free.lower_bound(start);
  if (next != st.va_free.end() && next->first == start + bytes) {
    bytes += next->second;
    next = st.va_free.erase(next);
  }
  if (next != st.va_free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += bytes;
      return;
    }
  }
  st.va_free.emplace(start, bytes);
}

// Memory another process can map too: a memfd named after its device (the importer
// reads the device from the name), mapped shared. *fd receives the memfd.
char* SharedBytes(size_t bytes, int device, int* fd) {
  char name[48];
  std::snprintf(name, sizeof name, "fake-cuda-device-%d", device);
  const int f = memfd_create(name, MFD_CLOEXEC);
  if (f < 0) return nullptr;
  if (ftruncate(f, static_cast<off_t>(bytes)) != 0) {
    close(f);
    return nullptr;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, f, 0);
  if (p == MAP_FAILED) {
    close(f);
    return nullptr;
  }
  *fd = f;
  return static_cast<char*>(p);
}

char* HostBytes(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char*>(p);
}

// --- the calling thread --------------------------------------------------------------

thread_local int t_device = 0;
thread_local int t_context = -1;  // the device whose primary context is current
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local bool t_in_host_fn = false;

// Every entry point starts here.
void Enter(const char* call) {
  if (t_in_host_fn) {
    Misuse(
        "%s called from inside a host function (cudaLaunchHostFunc: \"The host "
        "function must not make any CUDA API calls\")",
        call);
  }
  (void)Global();
}

cudaError_t Fail(cudaError_t err) {
  if (err != cudaSuccess && err != cudaErrorNotReady) t_last_error = err;
  return err;
}

// Runtime calls act on the current device and make its primary context current.
int RuntimeDevice() {
  t_context = t_device;
  return t_device;
}

// --- sticky device errors ----------------------------------------------------------

// Per device: cudaSuccess, or the fault that corrupted its context (never cleared).
std::atomic<int> g_sticky[16];

cudaError_t Sticky(int device) {
  return device >= 0 && device < 16 ? static_cast<cudaError_t>(g_sticky[device].load())
                                    : cudaSuccess;
}
bool AnyFaulted() {
  for (const auto& e : g_sticky) {
    if (e.load() != cudaSuccess) return true;
  }
  return false;
}
// The driver's view: cuMem* calls act on the current context's device. CUresult and
// cudaError_t share the numbers of these errors (700, 710, 719).
CUresult StickyCu() {
  return static_cast<CUresult>(Sticky(t_context));
}

// --- streams -------------------------------------------------------------------------

void RunStream(Stream* s) {
  std::unique_lock<std::mutex> lock(s->mu);
  for (;;) {
    s->cv.wait(lock, [s] { return !s->queue.empty() || s->destroyed; });
    if (s->queue.empty()) return;  // destroyed, and everything queued has run
    std::function<void()> work = std::move(s->queue.front());
    s->queue.pop_front();
    lock.unlock();
    if (Sticky(s->device) == cudaSuccess) work();  // a faulted device runs nothing more
    lock.lock();
    ++s->completed;
    s->cv.notify_all();
  }
}

Stream* NewStream(int device, bool legacy, bool blocking, uintptr_t handle) {
  auto* s = new Stream;  // never freed: events and the thread may still refer to it
  s->handle = handle;
  s->device = device;
  s->legacy = legacy;
  s->blocking = blocking;
  std::thread(RunStream, s).detach();
  return s;
}

void WaitFor(Stream* s, uint64_t seq) {
  std::unique_lock<std::mutex> lock(s->mu);
  s->cv.wait(lock, [&] { return s->completed >= seq; });
}

// The stream `handle` names for the calling thread. Holds st.mu.
Stream* FindStream(State& st, cudaStream_t handle, const char* call) {
  if (handle == nullptr || handle == cudaStreamLegacy) {
    const int d = RuntimeDevice();
    Stream*& s = st.legacy[static_cast<size_t>(d)];
    if (s == nullptr) s = NewStream(d, /*legacy=*/true, /*blocking=*/true, 0);
    return s;
  }
  if (handle == cudaStreamPerThread) {
    Misuse("%s: cudaStreamPerThread is not modeled", call);
  }
  auto it = st.streams.find(reinterpret_cast<uintptr_t>(handle));
  if (it == st.streams.end()) {
    Misuse("%s: stream %p is not a live stream (destroyed, or never created)", call,
           static_cast<void*>(handle));
  }
  RuntimeDevice();
  return it->second;
}

fake_cuda::StreamFacts FactsOf(const Stream* s) {
  return fake_cuda::StreamFacts{
      .handle = s->handle, .device = s->device, .legacy = s->legacy, .blocking = s->blocking};
}

// Host functions run one at a time, on one thread for the whole process, in the
// order their streams reach them: "Host functions without a mandated order (such as in
// independent streams) execute in undefined order and may be serialized". The stream
// waits until its host function has returned.
void RunHostFunction(cudaHostFn_t fn, void* user_data) {
  struct HostThread {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;
  };
  static HostThread* const host = [] {
    auto* h = new HostThread;  // never freed: the thread outlives static destructors
    std::thread([h] {
      std::unique_lock<std::mutex> lock(h->mu);
      for (;;) {
        h->cv.wait(lock, [h] { return !h->queue.empty(); });
        std::function<void()> call = std::move(h->queue.front());
        h->queue.pop_front();
        lock.unlock();
        t_in_host_fn = true;
        call();
        t_in_host_fn = false;
        lock.lock();
      }
    }).detach();
    return h;
  }();
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(host->mu);
    host->queue.push_back([&] {
      fn(user_data);
      std::lock_guard<std::mutex> done_lock(done_mu);
      done = true;
      done_cv.notify_all();
    });
    host->cv.notify_all();
  }
  std::unique_lock<std::mutex> lock(done_mu);
  done_cv.wait(lock, [&] { return done; });
}

// Queues `work` on `s`, behind what the legacy default stream semantics make it wait
// for; returns the item's sequence number. Holds st.mu.
uint64_t Enqueue(State& st, Stream* s, std::function<void()> work) {
  std::vector<std::pair<Stream*, uint64_t>> waits;
  auto pending = [](Stream* other) {
    std::lock_guard<std::mutex> lock(other->mu);
    return other->completed < other->enqueued ? other->enqueued : uint64_t{0};
  };
  if (s->legacy) {
    for (const auto& [handle, other] : st.streams) {
      if (other->device != s->device || !other->blocking) continue;
      if (uint64_t seq = pending(other); seq > 0) waits.emplace_back(other, seq);
    }
  } else if (s->blocking) {
    if (Stream* legacy = st.legacy[static_cast<size_t>(s->device)]; legacy != nullptr) {
      if (uint64_t seq = pending(legacy); seq > 0) waits.emplace_back(legacy, seq);
    }
  }
  std::lock_guard<std::mutex> lock(s->mu);
  for (const auto& [other, seq] : waits) {
    s->queue.push_back([other = other, seq = seq] { WaitFor(other, seq); });
    ++s->enqueued;
  }
  s->queue.push_back(std::move(work));
  ++s->enqueued;
  s->cv.notify_all();
  return s->enqueued;
}

// The point an event recorded (or a synchronize called) on `s` now waits for.
uint64_t Mark(State& st, Stream* s) {
  if (s->legacy || s->blocking) return Enqueue(st, s, [] {});  // implicit waits count
  std::lock_guard<std::mutex> lock(s->mu);
  return s->enqueued;
}

// --- device memory as device work sees it --------------------------------------------

using Pieces = std::vector<std::pair<char*, size_t>>;

// How device work reaches memory (fake_cuda_peer.h, "Peer access"): a kernel (a
// memset) needs cudaDeviceEnablePeerAccess for another device's cudaMalloc'd memory;
// a copy does not (the driver stages it). Both need a mapping's access granted to
// the device that runs them (cuMemSetAccess).
enum class Reach { kKernel, kCopy };

// The host bytes behind device range [addr, addr + bytes), or why there are none.
// With `device` >= 0 (the device running the work) and `denied` set, also whether
// that device may touch all of it: *denied says why not (empty: it may). Holds st.mu.
bool Resolve(State& st, uintptr_t addr, size_t bytes, Pieces* out, std::string* why,
             int device = -1, Reach reach = Reach::kKernel, std::string* denied = nullptr) {
  if (denied != nullptr) denied->clear();
  out->clear();
  if (addr + bytes < addr) {
    *why = "the range wraps around";
    return false;
  }
  auto a = st.allocations.upper_bound(addr);
  if (a != st.allocations.begin()) {
    --a;
    const Allocation& m = a->second;
    if (addr >= a->first && addr - a->first < m.bytes) {
      if (bytes > m.bytes - (addr - a->first)) {
        *why = "it runs past the end of its cudaMalloc allocation";
        return false;
      }
      if (denied != nullptr && device >= 0 && reach == Reach::kKernel &&
          m.device != device && !fake_cuda::PeerAccessEnabled(device, m.device)) {
        *denied = "it is cudaMalloc'd memory of device " + std::to_string(m.device) +
                  ", to which device " + std::to_string(device) +
                  " has not enabled peer access (cudaDeviceEnablePeerAccess)";
      }
      out->emplace_back(m.data + (addr - a->first), bytes);
      return true;
    }
  }
  auto it = st.mappings.upper_bound(addr);
  if (it == st.mappings.begin() ||
      std::prev(it)->first + std::prev(it)->second.bytes <= addr) {
    *why = "it is neither cudaMalloc'd nor mapped";
    return false;
  }
  --it;
  uintptr_t at = addr;
  const uintptr_t end = addr + bytes;
  while (at < end) {
    if (it == st.mappings.end() || it->first > at) {
      *why = "part of it is not mapped";
      return false;
    }
    if (it->second.access == 0) {
      *why = "it is mapped but cuMemSetAccess did not make it accessible (a GPU faults)";
      return false;
    }
    if (denied != nullptr && device >= 0 && denied->empty() &&
        (it->second.access & (1u << device)) == 0) {
      char line[160];
      std::snprintf(line, sizeof line,
                    "the mapping at %p was not made accessible to device %d "
                    "(cuMemSetAccess)",
                    reinterpret_cast<void*>(it->first), device);
      *denied = line;
    }
    const Handle& h = st.handles.at(it->second.handle);
    const uintptr_t stop = std::min<uintptr_t>(end, it->first + it->second.bytes);
    out->emplace_back(h.data + (at - it->first), stop - at);
    at = stop;
    ++it;
  }
  return true;
}

// Device work over [addr, addr + bytes) run by `device`: checked now and again when
// the stream runs it. Memory that does not exist is misuse; memory the device may not
// touch (fake_cuda_peer.h) faults the device when the work runs, as a GPU does: the
// device's context is broken with cudaErrorIllegalAddress (sticky) and the work is
// not done.
std::function<void()> DeviceWork(State& st, const char* call, uintptr_t addr,
                                 size_t bytes, std::function<void(const Pieces&)> body,
                                 int device = -1, Reach reach = Reach::kKernel) {
  Pieces pieces;
  std::string why;
  if (!Resolve(st, addr, bytes, &pieces, &why)) {
    Misuse("%s over [%p, +%zu bytes): %s", call, reinterpret_cast<void*>(addr), bytes,
           why.c_str());
  }
  return [call, addr, bytes, device, reach, body = std::move(body)] {
    State& g = Global();
    std::lock_guard<std::mutex> lock(g.mu);
    Pieces now;
    std::string reason;
    std::string denied;
    const bool found = Resolve(g, addr, bytes, &now, &reason, device, reach, &denied);
    if (found && !denied.empty()) {
      std::fprintf(stderr,
                   "fake-cuda: device %d faulted (cudaErrorIllegalAddress): %s over "
                   "[%p, +%zu bytes): %s\n",
                   device, call, reinterpret_cast<void*>(addr), bytes, denied.c_str());
      int healthy = cudaSuccess;
      g_sticky[device].compare_exchange_strong(healthy, cudaErrorIllegalAddress);
      return;
    }
    if (!found) {
      Misuse(
          "a stream reached %s over [%p, +%zu bytes), but the memory was released "
          "while that work was still queued (%s): release memory only after its "
          "stream has passed the work that uses it",
          call, reinterpret_cast<void*>(addr), bytes, reason.c_str());
    }
    body(now);
  };
}

// The bodies of copy work: the pieces of device memory, in address order, gathered
// into the host bytes at `to`, or the host bytes at `from` scattered over them. The
// caller keeps the host bytes alive until the work has run.
std::function<void(const Pieces&)> GatherInto(char* to) {
  return [to](const Pieces& pieces) {
    size_t at = 0;
    for (const auto& [p, n] : pieces) {
      std::memcpy(to + at, p, n);
      at += n;
    }
  };
}
std::function<void(const Pieces&)> ScatterFrom(const char* from) {
  return [from](const Pieces& pieces) {
    size_t at = 0;
    for (const auto& [p, n] : pieces) {
      std::memcpy(p, from + at, n);
      at += n;
    }
  };
}

// --- the driver (reached through cudaGetDriverEntryPointByVersion) -------------------

const char* CuErrorNameOf(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_DEINITIALIZED: return "CUDA_ERROR_DEINITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NOT_PERMITTED: return "CUDA_ERROR_NOT_PERMITTED";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
    case CUDA_ERROR_ASSERT: return "CUDA_ERROR_ASSERT";
    case CUDA_ERROR_LAUNCH_FAILED: return "CUDA_ERROR_LAUNCH_FAILED";
    case CUDA_ERROR_UNKNOWN: return "CUDA_ERROR_UNKNOWN";
    default: return nullptr;
  }
}

const char* CuErrorTextOf(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return "no error";
    case CUDA_ERROR_INVALID_VALUE: return "invalid argument";
    case CUDA_ERROR_OUT_OF_MEMORY: return "out of memory";
    case CUDA_ERROR_NOT_INITIALIZED: return "initialization error";
    case CUDA_ERROR_DEINITIALIZED: return "driver shutting down";
    case CUDA_ERROR_NO_DEVICE: return "no CUDA-capable device is detected";
    case CUDA_ERROR_INVALID_DEVICE: return "invalid device ordinal";
    case CUDA_ERROR_INVALID_CONTEXT: return "invalid device context";
    case CUDA_ERROR_NOT_PERMITTED: return "operation not permitted";
    case CUDA_ERROR_NOT_SUPPORTED: return "operation not supported";
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
      return "operation not permitted when stream is capturing";
    case CUDA_ERROR_ILLEGAL_ADDRESS: return "an illegal memory access was encountered";
    case CUDA_ERROR_ASSERT: return "device-side assert triggered";
    case CUDA_ERROR_LAUNCH_FAILED: return "unspecified launch failure";
    case CUDA_ERROR_UNKNOWN: return "unknown error";
    default: return nullptr;
  }
}

CUresult CUDAAPI FakeGetErrorString(CUresult error, const char** text) {
  Enter("cuGetErrorString");
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *text = CuErrorTextOf(error);
  return *text != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI FakeGetErrorName(CUresult error, const char** name) {
  Enter("cuGetErrorName");
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = CuErrorNameOf(error);
  return *name != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI FakeDeviceGet(CUdevice* device, int ordinal) {
  Enter("cuDeviceGet");
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  if (int e = Injected("cuDeviceGet")) return static_cast<CUresult>(e);
  *device = ordinal;
  return CUDA_SUCCESS;
}

// Whether devices can export memory to POSIX file descriptors (read at every call).
bool PosixFdHandles() {
  const char* e = std::getenv("DEVMEM_FAKE_CUDA_NO_POSIX_FD");
  return e == nullptr || std::string(e) == "0";
}

CUresult CUDAAPI FakeDeviceGetAttribute(int* value, CUdevice_attribute attribute,
                                        CUdevice device) {
  Enter("cuDeviceGetAttribute");
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
  if (int e = Injected("cuDeviceGetAttribute")) return static_cast<CUresult>(e);
  if (attribute == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) {
    *value = PosixFdHandles() ? 1 : 0;
    return CUDA_SUCCESS;
  }
  if (attribute != CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) {
    Misuse("cuDeviceGetAttribute: attribute %d is not modeled",
           static_cast<int>(attribute));
  }
  const char* no_vmm = std::getenv("DEVMEM_FAKE_CUDA_NO_VMM");
  *value = no_vmm != nullptr && std::string(no_vmm) != "0" ? 0 : 1;
  return CUDA_SUCCESS;
}

// CUDA_SUCCESS when `prop` describes pinned memory on a device of ours.
CUresult CheckProp(const CUmemAllocationProp* prop) {
  if (prop == nullptr || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return ValidDevice(prop->location.id) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult CUDAAPI
FakeMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                CUmemAllocationGranularity_flags option) {
  Enter("cuMemGetAllocationGranularity");
  if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = CheckProp(prop); r != CUDA_SUCCESS) return r;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
      option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (int e = Injected("cuMemGetAllocationGranularity")) return static_cast<CUresult>(e);
  *granularity = kGranularity;
  return CUDA_SUCCESS;
}

// The cuMem* calls below need a current context.
CUresult NeedContext() {
  return t_context >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

// What every cuMem* entry point checks first, in this order: it is not called from a
// host function (misuse), the thread has a current context, the context has no sticky
// error, and, for the calls a stream capture forbids (`capture_unsafe`), no capture
// that forbids them is under way. CUDA_SUCCESS to go on, else the driver's error.
CUresult EnterMemCall(const char* call, bool capture_unsafe = true) {
  Enter(call);
  if (CUresult r = NeedContext(); r != CUDA_SUCCESS) return r;
  if (CUresult r = StickyCu(); r != CUDA_SUCCESS) return r;
  if (capture_unsafe && fake_cuda::CheckUnsafeCall(call) != cudaSuccess) {
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI FakeMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                       CUdeviceptr addr, unsigned long long flags) {
  if (CUresult r = EnterMemCall("cuMemAddressReserve"); r != CUDA_SUCCESS) return r;
  // "The size and address parameters must be a multiple of the host page size and
  // the alignment must be a power of two or zero"; flags "must be zero".
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (ptr == nullptr || size == 0 || size % page != 0 || addr % page != 0 || flags != 0 ||
      (alignment & (alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (int e = Injected("cuMemAddressReserve")) return static_cast<CUresult>(e);
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  // The hint is a hint: this driver places reservations where it likes.
  const uintptr_t base = VaAlloc(st, size, std::max(alignment, kGranularity));
  if (base == 0) return CUDA_ERROR_OUT_OF_MEMORY;
  st.reservations.emplace(base, size);
  *ptr = base;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI FakeMemAddressFree(CUdeviceptr ptr, size_t size) {
  if (CUresult r = EnterMemCall("cuMemAddressFree"); r != CUDA_SUCCESS) return r;
  if (int e = Injected("cuMemAddressFree")) return static_cast<CUresult>(e);
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.reservations.find(ptr);
  if (it == st.reservations.end() || it->second != size) {
    Misuse(
        "cuMemAddressFree(%p, %zu bytes): not a reservation (\"The size must match "
        "what was given to memAddressReserve and the ptr given must match what was "
        "returned\")",
        reinterpret_cast<void*>(ptr), size);
  }
  if (auto m = st.mappings.lower_bound(ptr);
      m != st.mappings.end() && m->first < ptr + size) {
    Misuse("cuMemAddressFree(%p, %zu bytes): %p inside is still mapped",
           reinterpret_cast<void*>(ptr), size, reinterpret_cast<void*>(m->first));
  }
  st.reservations.erase(it);
  VaFree(st, ptr, size);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI FakeMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                               const CUmemAllocationProp* prop,
                               unsigned long long flags) {
  if (CUresult r = EnterMemCall("cuMemCreate"); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || flags != 0 || size == 0 || size % kGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (CUresult r = CheckProp(prop); r != CUDA_SUCCESS) return r;
  if (prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE &&
      prop->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    Misuse("cuMemCreate: requested handle types %#x are not modeled (only none and "
           "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)",
           static_cast<unsigned>(prop->requestedHandleTypes));
  }
  const bool shareable = prop->requestedHandleTypes == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (shareable && !PosixFdHandles()) return CUDA_ERROR_NOT_SUPPORTED;
  if (int e = Injected("cuMemCreate")) return static_cast<CUresult>(e);
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  const int d = prop->location.id;
  size_t& used = st.used[static_cast<size_t>(d)];
  if (size > Config().capacity - used) return CUDA_ERROR_OUT_OF_MEMORY;
  int fd = -1;
  char* data = shareable ? SharedBytes(size, d, &fd) : HostBytes(size);
  if (data == nullptr && shareable) {
    // One memfd per live shareable handle: a host limit, not the device's memory.
    Misuse("cuMemCreate(%zu bytes, POSIX file descriptor): cannot make its memfd: %s "
           "(each live shareable handle holds one open file; raise ulimit -n)",
           size, std::strerror(errno));
  }
  if (data == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  used += size;
  const CUmemGenericAllocationHandle h = st.next_handle++;
  st.handles.emplace(h, Handle{.device = d, .bytes = size, .data = data, .fd = fd});
  *handle = h;
  return CUDA_SUCCESS;
}

// Frees a handle's memory once it is released and unmapped. Holds st.mu.
void MaybeFreeHandle(State& st, CUmemGenericAllocationHandle h) {
  auto it = st.handles.find(h);
  if (!it->second.released || it->second.maps > 0) return;
  munmap(it->second.data, it->second.bytes);
  if (it->second.fd >= 0) close(it->second.fd);
  // An imported handle's memory is the exporter's: charged there, not here.
  if (!it->second.imported) st.used[static_cast<size_t>(it->second.device)] -= it->second.bytes;
  st.handles.erase(it);
}

CUresult CUDAAPI FakeMemRelease(CUmemGenericAllocationHandle handle) {
  if (CUresult r = EnterMemCall("cuMemRelease"); r != CUDA_SUCCESS) return r;
  if (int e = Injected("cuMemRelease")) return static_cast<CUresult>(e);
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.handles.find(handle);
  if (it == st.handles.end() || it->second.released) {
    Misuse(
        "cuMemRelease(%#llx): not a live handle (\"If handle is not a valid handle the "
        "behavior is undefined\"): released twice?",
        handle);
  }
  it->second.released = true;
  MaybeFreeHandle(st, handle);
  return CUDA_SUCCESS;
}

CUresult CUDAAPI FakeMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle,
                            unsigned long long flags) {
  if (CUresult r = EnterMemCall("cuMemMap"); r != CUDA_SUCCESS) return r;
  // "offset ... currently must be zero", flags "must be zero now"; ptr and size
  // multiples of the minimum granularity.
  if (offset != 0 || flags != 0 || size == 0 || ptr % kGranularity != 0 ||
      size % kGranularity != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  auto h = st.handles.find(handle);
  if (h == st.handles.end() || h->second.released) {
    Misuse("cuMemMap(%p, %zu bytes) of handle %#llx, which is not live (released?)",
           reinterpret_cast<void*>(ptr), size, handle);
  }
  if (size > h->second.bytes) {
    Misuse("cuMemMap(%p, %zu bytes): more than handle %#llx holds (%zu bytes)",
           reinterpret_cast<void*>(ptr), size, handle, h->second.bytes);
  }
  auto r = st.reservations.upper_bound(ptr);
  if (r == st.reservations.begin() ||
      std::prev(r)->first + std::prev(r)->second < ptr + size) {
    Misuse("cuMemMap(%p, %zu bytes): not inside one cuMemAddressReserve range",
           reinterpret_cast<void*>(ptr), size);
  }
  auto next = st.mappings.lower_bound(ptr);
  const bool over_next = next != st.mappings.end() && next->first < ptr + size;
  const bool over_prev = next != st.mappings.begin() &&
                         std::prev(next)->first + std::prev(next)->second.bytes > ptr;
  if (over_next || over_prev) {
    Misuse(
        "cuMemMap(%p, %zu bytes): overlaps a mapping (\"cuMemMap can only create "
        "mappings on VA range reservations that are not currently mapped\")",
        reinterpret_cast<void*>(ptr), size);
  }
  if (int e = Injected("cuMemMap")) return static_cast<CUresult>(e);
  st.mappings.emplace(ptr, Mapping{.bytes = size, .handle = handle});
  ++h->second.maps;
  return CUDA_SUCCESS;
}

// Checks that [ptr, ptr + size) is exactly a run of whole, adjacent mappings, and
// returns the first. Holds st.mu.
std::map<uintptr_t, Mapping>::iterator WholeMappings(State& st, const char* call,
                                                     CUdeviceptr ptr, size_t size) {
  auto first = st.mappings.find(ptr);
  if (first == st.mappings.end()) {
    Misuse("%s(%p, %zu bytes): %p is not the start of a mapping", call,
           reinterpret_cast<void*>(ptr), size, reinterpret_cast<void*>(ptr));
  }
  uintptr_t at = ptr;
  for (auto it = first; at < ptr + size; ++it) {
    if (it == st.mappings.end() || it->first != at) {
      Misuse("%s(%p, %zu bytes): [%p, ...) inside it is not mapped", call,
             reinterpret_cast<void*>(ptr), size, reinterpret_cast<void*>(at));
    }
    at += it->second.bytes;
  }
  if (at != ptr + size) {
    Misuse(
        "%s(%p, %zu bytes): ends inside the mapping that ends at %p (a mapping is "
        "unmapped, and given access, whole)",
        call, reinterpret_cast<void*>(ptr), size, reinterpret_cast<void*>(at));
  }
  return first;
}

CUresult CUDAAPI FakeMemSetAccess(CUdeviceptr ptr, size_t size,
                                  const CUmemAccessDesc* desc, size_t count) {
  if (CUresult r = EnterMemCall("cuMemSetAccess"); r != CUDA_SUCCESS) return r;
  if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
      Misuse("cuMemSetAccess: location type %d is not modeled",
             static_cast<int>(desc[i].location.type));
    }
    if (!ValidDevice(desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE &&
        desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) {
      Misuse("cuMemSetAccess: flags %d are not modeled", static_cast<int>(desc[i].flags));
    }
  }
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  auto first = WholeMappings(st, "cuMemSetAccess", ptr, size);
  if (int e = Injected("cuMemSetAccess")) return static_cast<CUresult>(e);
  for (auto it = first; it != st.mappings.end() && it->first < ptr + size; ++it) {
    for (size_t i = 0; i < count; ++i) {
      const unsigned bit = 1u << desc[i].location.id;
      if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        it->second.access |= bit;
      } else {
        it->second.access &= ~bit;
      }
    }
  }
  return CUDA_SUCCESS;
}

CUresult CUDAAPI FakeMemUnmap(CUdeviceptr ptr, size_t size) {
  if (CUresult r = EnterMemCall("cuMemUnmap"); r != CUDA_SUCCESS) return r;
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  // "The range must be the entire contiguous address range that was mapped to":
  // whole mappings (this fake accepts several adjacent ones in one call).
  auto it = WholeMappings(st, "cuMemUnmap", ptr, size);
  if (int e = Injected("cuMemUnmap")) return static_cast<CUresult>(e);
  while (it != st.mappings.end() && it->first < ptr + size) {
    const CUmemGenericAllocationHandle h = it->second.handle;
    --st.handles.at(h).maps;
    it = st.mappings.erase(it);
    MaybeFreeHandle(st, h);
  }
  return CUDA_SUCCESS;
}

// --- shareable handles (IPC) --------------------------------------------------------
// A handle created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested is backed
// by a memfd (held open while the handle lives: one file descriptor per granule, so a
// full 1 GiB device holds 512; running out of descriptors is reported as misuse, not
// as out of memory); cuMemExportToShareableHandle gives a new file descriptor of it (the
// caller closes it), which may cross to another process (SCM_RIGHTS, pidfd_getfd),
// where cuMemImportFromShareableHandle makes a handle of the same memory (not charged
// to that process's device again) that cuMemMap maps like any. Exporting a handle
// created without that type is CUDA_ERROR_INVALID_VALUE (the type must be among
// CUmemAllocationProp::requestedHandleTypes); other handle types are
// CUDA_ERROR_NOT_SUPPORTED; a file descriptor that is not a fake device's memory is
// CUDA_ERROR_INVALID_VALUE. DEVMEM_FAKE_CUDA_NO_POSIX_FD=1 makes devices report
// CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 0 and cuMemCreate
// refuse the type (CUDA_ERROR_NOT_SUPPORTED).

CUresult CUDAAPI FakeMemExportToShareableHandle(void* shareable,
                                                CUmemGenericAllocationHandle handle,
                                                CUmemAllocationHandleType type,
                                                unsigned long long flags) {
  if (CUresult r = EnterMemCall("cuMemExportToShareableHandle", /*capture_unsafe=*/false);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  if (int e = Injected("cuMemExportToShareableHandle")) return static_cast<CUresult>(e);
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.handles.find(handle);
  if (it == st.handles.end() || it->second.released) {
    Misuse("cuMemExportToShareableHandle(%#llx): not a live handle", handle);
  }
  if (it->second.fd < 0) return CUDA_ERROR_INVALID_VALUE;  // type not requested
  const int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI FakeMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                  void* os_handle,
                                                  CUmemAllocationHandleType type) {
  if (CUresult r = EnterMemCall("cuMemImportFromShareableHandle", /*capture_unsafe=*/false);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
  if (int e = Injected("cuMemImportFromShareableHandle")) return static_cast<CUresult>(e);
  // For this type the OS handle is the file descriptor itself, cast to a pointer.
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(os_handle));
  char link[64];
  char target[128] = {};
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof target - 1);
  int device = -1;
  struct stat info {};
  if (n <= 0 || std::sscanf(target, "/memfd:fake-cuda-device-%d", &device) != 1 ||
      !ValidDevice(device) || fstat(fd, &info) != 0 || info.st_size <= 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const auto bytes = static_cast<size_t>(info.st_size);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  const CUmemGenericAllocationHandle h = st.next_handle++;
  st.handles.emplace(h, Handle{.device = device,
                               .bytes = bytes,
                               .data = static_cast<char*>(p),
                               .imported = true});
  *handle = h;
  return CUDA_SUCCESS;
}

struct Symbol {
  const char* name;
  int introduced;  // the CUDA version that introduced it
  void* fn;
};

// Each pointer is converted from <cuda.h>'s own declaration's type, so a signature
// that does not match the header does not compile.
#define FAKE_CUDA_SYMBOL(name, introduced, fake)                                         \
  Symbol {                                                                               \
#name, introduced, reinterpret_cast < void*>(static_cast <decltype(&::name)>(&fake)) \
  }

const Symbol kSymbols[] = {
    FAKE_CUDA_SYMBOL(cuGetErrorString, 6000, FakeGetErrorString),
    FAKE_CUDA_SYMBOL(cuGetErrorName, 6000, FakeGetErrorName),
    FAKE_CUDA_SYMBOL(cuDeviceGet, 2000, FakeDeviceGet),
    FAKE_CUDA_SYMBOL(cuDeviceGetAttribute, 2000, FakeDeviceGetAttribute),
    FAKE_CUDA_SYMBOL(cuMemGetAllocationGranularity, 10020,
                     FakeMemGetAllocationGranularity),
    FAKE_CUDA_SYMBOL(cuMemAddressReserve, 10020, FakeMemAddressReserve),
    FAKE_CUDA_SYMBOL(cuMemAddressFree, 10020, FakeMemAddressFree),
    FAKE_CUDA_SYMBOL(cuMemCreate, 10020, FakeMemCreate),
    FAKE_CUDA_SYMBOL(cuMemRelease, 10020, FakeMemRelease),
    FAKE_CUDA_SYMBOL(cuMemMap, 10020, FakeMemMap),
    FAKE_CUDA_SYMBOL(cuMemSetAccess, 10020, FakeMemSetAccess),
    FAKE_CUDA_SYMBOL(cuMemUnmap, 10020, FakeMemUnmap),
    FAKE_CUDA_SYMBOL(cuMemExportToShareableHandle, 10020, FakeMemExportToShareableHandle),
    FAKE_CUDA_SYMBOL(cuMemImportFromShareableHandle, 10020,
                     FakeMemImportFromShareableHandle),
};
#undef FAKE_CUDA_SYMBOL

bool Missing(const char* symbol) {
  const char* env = std::getenv("DEVMEM_FAKE_CUDA_MISSING");
  if (env == nullptr) return false;
  const std::string list = std::string(",") + env + ",";
  return list.find(std::string(",") + symbol + ",") != std::string::npos;
}

cudaError_t EntryPoint(const char* call, const char* symbol, void** fn,
                       unsigned int cuda_version, unsigned long long flags,
                       cudaDriverEntryPointQueryResult* status) {
  Enter(call);
  if (symbol == nullptr || fn == nullptr || flags > cudaEnablePerThreadDefaultStream) {
    return Fail(cudaErrorInvalidValue);
  }
  // "If the specified CUDA version is greater than the driver version, the API will
  // return cudaErrorInvalidValue."
  if (static_cast<int>(cuda_version) > DriverVersion())
    return Fail(cudaErrorInvalidValue);
  if (int e = Injected(call)) return Fail(static_cast<cudaError_t>(e));
  *fn = nullptr;
  cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
  for (const Symbol& s : kSymbols) {
    if (std::strcmp(s.name, symbol) != 0 || Missing(symbol)) continue;
    if (static_cast<int>(cuda_version) < s.introduced) {
      result = cudaDriverEntryPointVersionNotSufficent;
    } else {
      *fn = s.fn;
      result = cudaDriverEntryPointSuccess;
    }
  }
  if (status != nullptr) *status = result;
  return cudaSuccess;
}

// The live event `event` names. Holds st.mu.
Event& FindEvent(State& st, cudaEvent_t event, const char* call) {
  auto it = st.events.find(reinterpret_cast<uintptr_t>(event));
  if (it == st.events.end()) {
    Misuse("%s: event %p is not a live event (destroyed, or never created)", call,
           static_cast<void*>(event));
  }
  return it->second;
}

// cudaMemset and cudaMemsetAsync.
cudaError_t Memset(const char* call, void* dev_ptr, int value, size_t count,
                   cudaStream_t stream) {
  Enter(call);
  if (count == 0) return cudaSuccess;
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  Stream* s = FindStream(st, stream, call);
  if (cudaError_t e = Sticky(s->device)) return Fail(e);
  if (int e = Injected(call)) return Fail(static_cast<cudaError_t>(e));
  std::function<void()> work =
      DeviceWork(st, call, reinterpret_cast<uintptr_t>(dev_ptr), count,
                 [value](const Pieces& pieces) {
                   for (const auto& [p, n] : pieces) std::memset(p, value, n);
                 }, s->device);
  bool captured = false;
  if (cudaError_t e = fake_cuda::OnStreamWork(FactsOf(s), &work, &captured); e != cudaSuccess) {
    return Fail(e);
  }
  if (!captured) Enqueue(st, s, std::move(work));
  return cudaSuccess;
}

}  // namespace

// --- the seam to the capture model (fake_cuda_capture.h) -----------------------------

namespace fake_cuda {

StreamFacts ResolveStream(cudaStream_t stream, const char* call) {
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  return FactsOf(FindStream(st, stream, call));
}
void EnterCall(const char* call) { Enter(call); }
cudaError_t RecordError(cudaError_t err) { return Fail(err); }
void EnqueueWork(cudaStream_t stream, std::function<void()> work) {
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  Enqueue(st, FindStream(st, stream, "cudaGraphLaunch"), std::move(work));
}
void Abort(const std::string& what) { Misuse("%s", what.c_str()); }

// --- the seam to the peer-access model (fake_cuda_peer.h) ----------------------------

int CurrentDevice() { return RuntimeDevice(); }
bool IsDevice(int device) { return ValidDevice(device); }
cudaError_t DeviceFault(int device) { return Sticky(device); }
int InjectedFailure(const char* call) { return Injected(call); }

cudaError_t MemcpyPeer(const char* call, void* dst, int dst_device, const void* src,
                       int src_device, size_t count, cudaStream_t stream, bool wait) {
  Enter(call);
  if (!ValidDevice(dst_device) || !ValidDevice(src_device)) {
    return Fail(cudaErrorInvalidDevice);
  }
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Fail(cudaErrorInvalidValue);
  Stream* s = nullptr;
  uint64_t seq = 0;
  {
    State& st = Global();
    std::lock_guard<std::mutex> lock(st.mu);
    s = FindStream(st, stream, call);
    if (cudaError_t e = Sticky(s->device)) return Fail(e);
    if (int e = Injected(call)) return Fail(static_cast<cudaError_t>(e));
    // Each pointer must be memory of the device the call names.
    auto owner = [&st](uintptr_t addr) {
      auto a = st.allocations.upper_bound(addr);
      if (a != st.allocations.begin() && addr - std::prev(a)->first < std::prev(a)->second.bytes) {
        return std::prev(a)->second.device;
      }
      auto m = st.mappings.upper_bound(addr);
      if (m != st.mappings.begin() && addr - std::prev(m)->first < std::prev(m)->second.bytes) {
        return st.handles.at(std::prev(m)->second.handle).device;
      }
      return -1;
    };
    const auto d = reinterpret_cast<uintptr_t>(dst);
    const auto from = reinterpret_cast<uintptr_t>(src);
    if (owner(d) != dst_device || owner(from) != src_device) {
      Misuse("%s(%p on device %d <- %p on device %d, %zu bytes): a pointer is not memory "
             "of the device named with it (it is on device %d and %d)",
             call, dst, dst_device, src, src_device, count, owner(d), owner(from));
    }
    const int device = s->device;
    auto buffer = std::make_shared<std::vector<char>>(count);
    std::function<void()> read =
        DeviceWork(st, call, from, count, GatherInto(buffer->data()), device, Reach::kCopy);
    std::function<void()> write =
        DeviceWork(st, call, d, count, ScatterFrom(buffer->data()), device, Reach::kCopy);
    std::function<void()> work = [read, write, device, buffer] {  // buffer: kept alive
      read();
      if (Sticky(device) == cudaSuccess) write();  // a faulted read writes nothing
    };
    bool captured = false;
    if (cudaError_t e = OnStreamWork(FactsOf(s), &work, &captured); e != cudaSuccess) {
      return Fail(e);
    }
    if (captured) return cudaSuccess;
    seq = Enqueue(st, s, std::move(work));
  }
  if (!wait) return cudaSuccess;
  WaitFor(s, seq);
  if (cudaError_t e = Sticky(s->device)) return Fail(e);
  return cudaSuccess;
}

}  // namespace fake_cuda

namespace {

// --- the leak check ------------------------------------------------------------------

void LeakCheck() {
  if (!Config().leak_check) return;
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  std::string report;
  auto add = [&report](const char* format, auto... args) {
    char line[256];
    std::snprintf(line, sizeof line, format, args...);
    report += line;
  };
  // What a faulted device holds cannot be given back; it goes with the process.
  const bool faulted = AnyFaulted();
  for (const auto& [p, a] : st.allocations) {
    if (Sticky(a.device) != cudaSuccess) continue;
    add("  cudaMalloc %p (%zu bytes) on device %d not freed\n",
        reinterpret_cast<void*>(p), a.bytes, a.device);
  }
  for (const auto& [p, m] : st.mappings) {
    if (Sticky(st.handles.at(m.handle).device) != cudaSuccess) continue;
    add("  mapping [%p, +%zu bytes) of handle %#llx not unmapped\n",
        reinterpret_cast<void*>(p), m.bytes, m.handle);
  }
  for (const auto& [h, x] : st.handles) {
    if (!x.released && Sticky(x.device) == cudaSuccess) add("  handle %#llx (%zu bytes) not released\n", h, x.bytes);
  }
  for (const auto& [p, bytes] : st.reservations) {
    if (faulted) break;
    add("  reservation [%p, +%zu bytes) not freed\n", reinterpret_cast<void*>(p), bytes);
  }
  for (const auto& [h, s] : st.streams) {
    if (Sticky(s->device) != cudaSuccess) continue;
    add("  stream %p not destroyed\n", reinterpret_cast<void*>(h));
  }
  for (const auto& [h, e] : st.events) {
    if (Sticky(e.device) != cudaSuccess) continue;
    add("  event %p not destroyed\n", reinterpret_cast<void*>(h));
  }
  for (const auto& [p, bytes] : st.pinned) {
    add("  cudaHostAlloc %p (%zu bytes) not freed\n", reinterpret_cast<void*>(p), bytes);
  }
  report += fake_cuda::CaptureLeaks();
  if (report.empty()) return;
  std::fflush(stdout);
  std::fprintf(stderr, "fake-cuda: leaked at exit:\n%s", report.c_str());
  std::fflush(stderr);
  _exit(1);
}

}  // namespace

// --- the runtime ---------------------------------------------------------------------

extern "C" {

size_t devmem_fake_cuda_live(const char* what) {
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  const std::string w = what;
  if (w == "allocations") return st.allocations.size();
  if (w == "mappings") return st.mappings.size();
  if (w == "reservations") return st.reservations.size();
  if (w == "streams") return st.streams.size();
  if (w == "events") return st.events.size();
  if (w == "pinned") return st.pinned.size();
  if (w == "handles") {
    size_t n = 0;
    for (const auto& [h, x] : st.handles) n += x.released ? 0 : 1;
    return n;
  }
  if (w == "used_bytes") {
    size_t n = 0;
    for (size_t u : st.used) n += u;
    return n;
  }
  if (long n = fake_cuda::LiveCaptureObjects(what); n >= 0) return static_cast<size_t>(n);
  Misuse("devmem_fake_cuda_live(\"%s\"): unknown", what);
}

int devmem_fake_cuda_launch_fault(void* stream, int error) {
  Enter("devmem_fake_cuda_launch_fault");
  if (error == cudaSuccess) Misuse("devmem_fake_cuda_launch_fault: error 0 is no fault");
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  Stream* s = FindStream(st, static_cast<cudaStream_t>(stream), "devmem_fake_cuda_launch_fault");
  if (cudaError_t e = Sticky(s->device)) return Fail(e);
  const int device = s->device;
  Enqueue(st, s, [device, error] {
    int healthy = cudaSuccess;
    g_sticky[device].compare_exchange_strong(healthy, error);  // the first fault stays
  });
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  Enter("cudaGetDeviceCount");
  if (count == nullptr) return Fail(cudaErrorInvalidValue);
  if (int e = Injected("cudaGetDeviceCount")) return Fail(static_cast<cudaError_t>(e));
  *count = Config().devices;
  return Config().devices == 0 ? Fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  Enter("cudaGetDeviceProperties");
  if (prop == nullptr) return Fail(cudaErrorInvalidValue);
  if (!ValidDevice(device)) return Fail(cudaErrorInvalidDevice);
  if (int e = Injected("cudaGetDeviceProperties"))
    return Fail(static_cast<cudaError_t>(e));
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "devmem fake CUDA device %d", device);
  for (int i = 0; i < 16; ++i) {
    prop->uuid.bytes[i] = static_cast<char>(i == 0   ? 0xfa
                                            : i == 1 ? 0xce
                                                     : device * 16 + i);
  }
  prop->totalGlobalMem = Config().capacity;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->warpSize = 32;
  prop->unifiedAddressing = 1;
  prop->pciDeviceID = device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  Enter("cudaGetDevice");
  if (device == nullptr) return Fail(cudaErrorInvalidValue);
  if (Config().devices == 0) return Fail(cudaErrorNoDevice);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  Enter("cudaSetDevice");
  if (!ValidDevice(device)) return Fail(cudaErrorInvalidDevice);
  if (int e = Injected("cudaSetDevice")) return Fail(static_cast<cudaError_t>(e));
  t_device = device;
  t_context = device;  // CUDA 12 and later: initializes the primary context, current
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetLastError(void) {
  Enter("cudaGetLastError");
  const cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  if (cudaError_t sticky = Sticky(t_device)) return sticky;  // cannot be cleared
  return e;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) {
  Enter("cudaPeekAtLastError");
  if (cudaError_t sticky = Sticky(t_device)) return sticky;
  return t_last_error;
}

const char* CUDARTAPI cudaGetErrorName(cudaError_t error) {
  Enter("cudaGetErrorName");
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorCudartUnloading: return "cudaErrorCudartUnloading";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorAssert: return "cudaErrorAssert";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotPermitted: return "cudaErrorNotPermitted";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorUnknown: return "cudaErrorUnknown";
    default: return "unrecognized error code";
  }
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t error) {
  Enter("cudaGetErrorString");
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorCudartUnloading: return "driver shutting down";
    case cudaErrorInsufficientDriver:
      return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotPermitted: return "operation not permitted";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorIllegalState: return "the resource is not in a valid state";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorUnknown: return "unknown error";
    default: return "unrecognized error code";
  }
}

cudaError_t CUDARTAPI cudaMalloc(void** dev_ptr, size_t size) {
  Enter("cudaMalloc");
  if (dev_ptr == nullptr) return Fail(cudaErrorInvalidValue);
  const int d = RuntimeDevice();
  if (cudaError_t e = Sticky(d)) return Fail(e);
  if (int e = Injected("cudaMalloc")) return Fail(static_cast<cudaError_t>(e));
  if (cudaError_t e = fake_cuda::CheckUnsafeCall("cudaMalloc"); e != cudaSuccess) return Fail(e);
  if (size == 0) {  // allowed, and gives no memory
    *dev_ptr = nullptr;
    return cudaSuccess;
  }
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  size_t& used = st.used[static_cast<size_t>(d)];
  if (size > Config().capacity - used) return Fail(cudaErrorMemoryAllocation);
  const size_t charged = (size + kMallocAlign - 1) / kMallocAlign * kMallocAlign;
  if (charged > Config().capacity - used) return Fail(cudaErrorMemoryAllocation);
  // An odd multiple of 512: aligned to 512 bytes and to nothing more.
  const size_t va_bytes = charged + kMallocAlign;
  const uintptr_t va = VaAlloc(st, va_bytes, 2 * kMallocAlign);
  char* data = va != 0 ? HostBytes(charged) : nullptr;
  if (data == nullptr) {
    if (va != 0) VaFree(st, va, va_bytes);
    return Fail(cudaErrorMemoryAllocation);
  }
  used += charged;
  const uintptr_t p = va + kMallocAlign;
  st.allocations.emplace(p, Allocation{.device = d,
                                       .bytes = size,
                                       .charged = charged,
                                       .va = va,
                                       .va_bytes = va_bytes,
                                       .data = data});
  *dev_ptr = reinterpret_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFree(void* dev_ptr) {
  Enter("cudaFree");
  if (cudaError_t e = Sticky(RuntimeDevice())) return Fail(e);
  if (dev_ptr == nullptr) return cudaSuccess;  // "no operation is performed"
  if (int e = Injected("cudaFree")) return Fail(static_cast<cudaError_t>(e));
  if (cudaError_t e = fake_cuda::CheckUnsafeCall("cudaFree"); e != cudaSuccess) return Fail(e);
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.allocations.find(reinterpret_cast<uintptr_t>(dev_ptr));
  if (it == st.allocations.end()) {
    Misuse("cudaFree(%p): not a pointer cudaMalloc returned, or freed already", dev_ptr);
  }
  const Allocation& a = it->second;
  munmap(a.data, a.charged);
  st.used[static_cast<size_t>(a.device)] -= a.charged;
  VaFree(st, a.va, a.va_bytes);
  st.allocations.erase(it);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaHostAlloc(void** host_ptr, size_t size, unsigned int flags) {
  Enter("cudaHostAlloc");
  if (host_ptr == nullptr || size == 0) return Fail(cudaErrorInvalidValue);
  if ((flags & ~cudaHostAllocPortable) != 0) {
    Misuse("cudaHostAlloc(%zu bytes, flags %#x): only cudaHostAllocDefault and "
           "cudaHostAllocPortable are modeled", size, flags);
  }
  RuntimeDevice();
  if (int e = Injected("cudaHostAlloc")) return Fail(static_cast<cudaError_t>(e));
  if (cudaError_t e = fake_cuda::CheckUnsafeCall("cudaHostAlloc"); e != cudaSuccess) return Fail(e);
  char* data = HostBytes(size);  // host memory: the host may touch it
  if (data == nullptr) return Fail(cudaErrorMemoryAllocation);
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  st.pinned.emplace(reinterpret_cast<uintptr_t>(data), size);
  *host_ptr = data;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFreeHost(void* ptr) {
  Enter("cudaFreeHost");
  if (ptr == nullptr) return cudaSuccess;
  if (int e = Injected("cudaFreeHost")) return Fail(static_cast<cudaError_t>(e));
  if (cudaError_t e = fake_cuda::CheckUnsafeCall("cudaFreeHost"); e != cudaSuccess) return Fail(e);
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  auto it = st.pinned.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == st.pinned.end()) {
    Misuse("cudaFreeHost(%p): not a pointer cudaHostAlloc returned, or freed already", ptr);
  }
  munmap(ptr, it->second);
  st.pinned.erase(it);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamGetDevice(cudaStream_t stream, int* device) {
  Enter("cudaStreamGetDevice");
  if (device == nullptr) return Fail(cudaErrorInvalidValue);
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  *device = FindStream(st, stream, "cudaStreamGetDevice")->device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  Enter("cudaMemGetInfo");
  if (free_bytes == nullptr || total_bytes == nullptr) return Fail(cudaErrorInvalidValue);
  const int d = RuntimeDevice();
  if (cudaError_t e = Sticky(d)) return Fail(e);
  if (int e = Injected("cudaMemGetInfo")) return Fail(static_cast<cudaError_t>(e));
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  *total_bytes = Config().capacity;
  *free_bytes = Config().capacity - st.used[static_cast<size_t>(d)];
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* stream,
                                                unsigned int flags) {
  Enter("cudaStreamCreateWithFlags");
  if (stream == nullptr ||
      (flags != cudaStreamDefault && flags != cudaStreamNonBlocking)) {
    return Fail(cudaErrorInvalidValue);
  }
  const int d = RuntimeDevice();
  if (cudaError_t e = Sticky(d)) return Fail(e);
  if (int e = Injected("cudaStreamCreateWithFlags"))
    return Fail(static_cast<cudaError_t>(e));
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  uintptr_t handle = st.next_stream;
  if (!st.free_streams.empty()) {  // a destroyed stream's handle, as a driver reuses it
    handle = st.free_streams.back();
    st.free_streams.pop_back();
  } else {
    st.next_stream += 0x10;
  }
  st.streams.emplace(handle, NewStream(d, /*legacy=*/false,
                                       /*blocking=*/flags == cudaStreamDefault, handle));
  *stream = reinterpret_cast<cudaStream_t>(handle);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  Enter("cudaStreamDestroy");
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    Misuse("cudaStreamDestroy(%p): a default stream cannot be destroyed",
           static_cast<void*>(stream));
  }
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  Stream* s = FindStream(st, stream, "cudaStreamDestroy");
  if (cudaError_t e = Sticky(s->device)) return Fail(e);
  fake_cuda::OnStreamDestroy(FactsOf(s));
  if (int e = Injected("cudaStreamDestroy")) return Fail(static_cast<cudaError_t>(e));
  st.streams.erase(s->handle);
  st.free_streams.push_back(s->handle);
  st.retired.push_back(s);
  std::lock_guard<std::mutex> stream_lock(s->mu);
  s->destroyed = true;  // its thread runs what is queued, then ends
  s->cv.notify_all();
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  Enter("cudaStreamSynchronize");
  Stream* s = nullptr;
  uint64_t seq = 0;
  {
    State& st = Global();
    std::lock_guard<std::mutex> lock(st.mu);
    s = FindStream(st, stream, "cudaStreamSynchronize");
    if (cudaError_t e = Sticky(s->device)) return Fail(e);
    if (int e = Injected("cudaStreamSynchronize"))
      return Fail(static_cast<cudaError_t>(e));
    if (cudaError_t e = fake_cuda::OnStreamSync(FactsOf(s)); e != cudaSuccess) return Fail(e);
    seq = Mark(st, s);
  }
  WaitFor(s, seq);
  if (cudaError_t e = Sticky(s->device)) return Fail(e);  // the stream faulted on the way
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn,
                                         void* user_data) {
  Enter("cudaLaunchHostFunc");
  if (fn == nullptr) return Fail(cudaErrorInvalidValue);
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  Stream* s = FindStream(st, stream, "cudaLaunchHostFunc");
  if (cudaError_t e = Sticky(s->device)) return Fail(e);
  if (int e = Injected("cudaLaunchHostFunc")) return Fail(static_cast<cudaError_t>(e));
  std::function<void()> work = [fn, user_data] { RunHostFunction(fn, user_data); };
  bool captured = false;
  if (cudaError_t e = fake_cuda::OnStreamWork(FactsOf(s), &work, &captured); e != cudaSuccess) {
    return Fail(e);
  }
  if (!captured) Enqueue(st, s, std::move(work));
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  Enter("cudaEventCreateWithFlags");
  constexpr unsigned kKnown =
      cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (event == nullptr || (flags & ~kKnown) != 0 ||
      ((flags & cudaEventInterprocess) != 0 && (flags & cudaEventDisableTiming) == 0)) {
    return Fail(cudaErrorInvalidValue);
  }
  if ((flags & cudaEventDisableTiming) == 0) {
    Misuse("cudaEventCreateWithFlags(%#x): timing events are not modeled", flags);
  }
  const int d = RuntimeDevice();
  if (cudaError_t e = Sticky(d)) return Fail(e);
  if (int e = Injected("cudaEventCreateWithFlags"))
    return Fail(static_cast<cudaError_t>(e));
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  const uintptr_t handle = st.next_event;
  st.next_event += 0x10;
  st.events.emplace(handle, Event{.device = d});
  *event = reinterpret_cast<cudaEvent_t>(handle);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Enter("cudaEventRecord");
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  Event& e = FindEvent(st, event, "cudaEventRecord");
  Stream* s = FindStream(st, stream, "cudaEventRecord");
  if (s->device != e.device) {
    Misuse(
        "cudaEventRecord: an event of device %d on a stream of device %d (\"event and "
        "stream must be on the same CUDA context\")",
        e.device, s->device);
  }
  if (cudaError_t err = Sticky(s->device)) return Fail(err);
  if (int err = Injected("cudaEventRecord")) return Fail(static_cast<cudaError_t>(err));
  cudaError_t capture_err = cudaSuccess;
  if (fake_cuda::OnEventRecord(reinterpret_cast<uintptr_t>(event), FactsOf(s), &capture_err)) {
    return cudaSuccess;  // a node of the capture: it completes when a replay reaches it
  }
  if (capture_err != cudaSuccess) return Fail(capture_err);
  e.stream = s;
  e.seq = Mark(st, s);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  Enter("cudaEventQuery");
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  const Event& e = FindEvent(st, event, "cudaEventQuery");
  if (cudaError_t err = Sticky(e.device)) return Fail(err);
  if (int err = Injected("cudaEventQuery")) return Fail(static_cast<cudaError_t>(err));
  if (fake_cuda::EventCaptured(reinterpret_cast<uintptr_t>(event))) {
    return Fail(cudaErrorCapturedEvent);
  }
  if (e.stream == nullptr) return cudaSuccess;  // never recorded: "an empty set of work"
  std::lock_guard<std::mutex> stream_lock(e.stream->mu);
  return e.stream->completed >= e.seq ? cudaSuccess : Fail(cudaErrorNotReady);
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  Enter("cudaEventSynchronize");
  int device = 0;
  Stream* s = nullptr;
  uint64_t seq = 0;
  {
    State& st = Global();
    std::lock_guard<std::mutex> lock(st.mu);
    const Event& e = FindEvent(st, event, "cudaEventSynchronize");
    device = e.device;
    if (cudaError_t err = Sticky(device)) return Fail(err);
    if (int err = Injected("cudaEventSynchronize"))
      return Fail(static_cast<cudaError_t>(err));
    if (fake_cuda::EventCaptured(reinterpret_cast<uintptr_t>(event))) {
      return Fail(cudaErrorCapturedEvent);
    }
    s = e.stream;
    seq = e.seq;
  }
  if (s != nullptr) WaitFor(s, seq);
  if (cudaError_t err = Sticky(device)) return Fail(err);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  Enter("cudaEventDestroy");
  State& st = Global();
  std::lock_guard<std::mutex> lock(st.mu);
  if (cudaError_t err = Sticky(FindEvent(st, event, "cudaEventDestroy").device)) {
    return Fail(err);
  }
  if (int err = Injected("cudaEventDestroy")) return Fail(static_cast<cudaError_t>(err));
  // A pending event may be destroyed; what it captured still runs.
  st.events.erase(reinterpret_cast<uintptr_t>(event));
  fake_cuda::OnEventDestroy(reinterpret_cast<uintptr_t>(event));
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* dev_ptr, int value, size_t count,
                                      cudaStream_t stream) {
  return Memset("cudaMemsetAsync", dev_ptr, value, count, stream);
}

cudaError_t CUDARTAPI cudaMemset(void* dev_ptr, int value, size_t count) {
  // On the legacy default stream; asynchronous with respect to the host.
  return Memset("cudaMemset", dev_ptr, value, count, nullptr);
}

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t count,
                                 cudaMemcpyKind kind) {
  Enter("cudaMemcpy");
  if (kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyHostToDevice) {
    Misuse("cudaMemcpy: kind %d is not modeled", static_cast<int>(kind));
  }
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return Fail(cudaErrorInvalidValue);
  Stream* s = nullptr;
  uint64_t seq = 0;
  {
    State& st = Global();
    std::lock_guard<std::mutex> lock(st.mu);
    s = FindStream(st, nullptr, "cudaMemcpy");
    if (cudaError_t e = Sticky(s->device)) return Fail(e);
    if (int e = Injected("cudaMemcpy")) return Fail(static_cast<cudaError_t>(e));
    if (cudaError_t e = fake_cuda::CheckUnsafeCall("cudaMemcpy"); e != cudaSuccess) {
      return Fail(e);
    }
    if (kind == cudaMemcpyDeviceToHost) {
      auto* to = static_cast<char*>(dst);
      seq = Enqueue(st, s,
                    DeviceWork(st, "cudaMemcpy (device to host)",
                               reinterpret_cast<uintptr_t>(src), count, GatherInto(to),
                               s->device, Reach::kCopy));
    } else {
      const auto* from = static_cast<const char*>(src);
      seq = Enqueue(st, s,
                    DeviceWork(st, "cudaMemcpy (host to device)",
                               reinterpret_cast<uintptr_t>(dst), count, ScatterFrom(from),
                               s->device, Reach::kCopy));
    }
  }
  WaitFor(s, seq);  // synchronous for pageable host memory
  return cudaSuccess;
}

// cudaMemcpyPeerAsync and cudaMemcpyPeer: run by the device of the stream they are
// queued on (cudaMemcpyPeer: the current device's legacy default stream, and it waits),
// which must be able to reach both ranges (fake_cuda_peer.h, "Peer access").
cudaError_t CUDARTAPI cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src,
                                          int src_device, size_t count,
                                          cudaStream_t stream) {
  return fake_cuda::MemcpyPeer("cudaMemcpyPeerAsync", dst, dst_device, src, src_device,
                               count, stream, /*wait=*/false);
}

cudaError_t CUDARTAPI cudaMemcpyPeer(void* dst, int dst_device, const void* src,
                                     int src_device, size_t count) {
  return fake_cuda::MemcpyPeer("cudaMemcpyPeer", dst, dst_device, src, src_device, count,
                               nullptr, /*wait=*/true);
}

#if CUDART_VERSION >= 12050
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(
    const char* symbol, void** fn, unsigned int cuda_version, unsigned long long flags,
    cudaDriverEntryPointQueryResult* status) {
  return EntryPoint("cudaGetDriverEntryPointByVersion", symbol, fn, cuda_version, flags,
                    status);
}
#elif CUDART_VERSION >= 12000
cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char* symbol, void** fn,
                                              unsigned long long flags,
                                              cudaDriverEntryPointQueryResult* status) {
  return EntryPoint("cudaGetDriverEntryPoint", symbol, fn, CUDART_VERSION, flags, status);
}
#else
cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char* symbol, void** fn,
                                              unsigned long long flags) {
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err =
      EntryPoint("cudaGetDriverEntryPoint", symbol, fn, CUDART_VERSION, flags, &status);
  // Before 12.0 a symbol that was not found is an error.
  return err == cudaSuccess && status != cudaDriverEntryPointSuccess
             ? Fail(cudaErrorSymbolNotFound)
             : err;
}
#endif

}  // extern "C"
