// runtime/runtime.cc: the process-wide device registry (see runtime.h).
//
// Structure: Runtime::State holds the configuration, the trace ring, the OOM dumper and
// callbacks (all fixed at construction; the allocation-size histogram is the process's
// SizeHistogram::Process()), the device -> allocator table and the
// observers installed on them (under `mu`), the HTTP server, and the poller thread.
//
// Creation: g_runtime is published once, under g_create_mu; Get() reads it with one
// acquire load after that. The HTTP server starts at the end of the constructor, when
// the state it serves is complete.
//
// Locks: `mu` (the registry) is taken before a device lock only while an allocator is
// created and its observer set, and while the poller calls process_events (which only
// polls events, never blocks); otherwise it is released before any allocator method
// runs (allocators() copies the table). `poll_mu` guards the poller's stop flag only.
//
// The poller's rounds take `mu` only when `pools_with_work` is not 0: every allocator
// in the table is attached to it (Install; detached when it leaves the table) and
// counts itself while it has work for process_events() (allocator/poll_work.h).
#include "runtime/runtime.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "allocator/backend_factory.h"
#include "allocator/errors.h"
#include "allocator/mutex.h"
#include "runtime/device_observer.h"
#include "runtime/flight_recorder.h"
#include "runtime/http_server.h"
#include "runtime/oom.h"
#include "runtime/size_histogram.h"
#include "runtime/trace.h"

namespace devmem {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(5);

int64_t UnixNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Sv(absl::string_view s) { return std::string(s.data(), s.size()); }

// The recorder of `config.flight_recorder`, or null when the key is empty. Throws
// InvalidArgumentError naming the key and the file when it cannot be had: the program
// asked for a record that survives it, and running without one would lose it silently.
std::unique_ptr<FlightRecorder> OpenFlightRecorder(const Config& config) {
  if (config.flight_recorder.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<FlightRecorder>> r = FlightRecorder::Create(config.flight_recorder);
  if (!r.ok()) {
    throw InvalidArgumentError(
        absl::StrCat("devmem runtime: flight_recorder: ", r.status().message()));
  }
  return *std::move(r);
}

DeviceId ComputeDefaultDevice(const Config& config) {
  switch (config.backend) {
    case BackendKind::kCuda: return DeviceId{DeviceType::kCuda, 0};
    case BackendKind::kSim: return DeviceId{DeviceType::kSim, 0};
    case BackendKind::kCpu: return DeviceId{DeviceType::kCpu, 0};
    case BackendKind::kAuto: break;
  }
  return ResolveAutoBackend() == BackendKind::kCuda ? DeviceId{DeviceType::kCuda, 0}
                                                    : DeviceId{DeviceType::kSim, 0};
}

// Makes the allocator of `device` with the policy keys of `config`. Throws
// InvalidArgumentError naming the device when it cannot be had.
std::shared_ptr<CachingAllocator> CreateAllocator(const Config& base, DeviceId device) {
  if (device.index < 0 || ((device.type == DeviceType::kCpu ||
                             device.type == DeviceType::kCpuPinned) &&
                            device.index != 0)) {
    throw InvalidArgumentError(absl::StrCat("devmem runtime: no device ", device.ToString(),
                                            " (cpu and cpu_pinned have index 0 only; "
                                            "indices are >= 0)"));
  }
  Config config = base;
  switch (device.type) {
    case DeviceType::kCpu: config.backend = BackendKind::kCpu; break;
    case DeviceType::kSim: config.backend = BackendKind::kSim; break;
    case DeviceType::kCuda: config.backend = BackendKind::kCuda; break;
    case DeviceType::kCpuPinned:  // page-locked host memory, the GPUs' staging pool
      return std::make_shared<CachingAllocator>(MakePinnedHostBackend(), config);
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(config, device.index);
  if (!backend.ok()) {
    throw InvalidArgumentError(absl::StrCat("device ", device.ToString(),
                                            " is not available: ", backend.status().message()));
  }
  return std::make_shared<CachingAllocator>(*std::move(backend), config);
}

}  // namespace

struct Runtime::State {
  explicit State(const Config& c)
      : config(c),
        default_device(ComputeDefaultDevice(c)),
        trace(c.trace_entries > 0 ? std::make_unique<TraceRing>(c.trace_entries) : nullptr),
        dumper(c.oom_dump_dir.empty() ? nullptr : std::make_unique<OomDumper>(c.oom_dump_dir)),
        flight(OpenFlightRecorder(c)) {}

  // Fixed at construction.
  const Config config;
  const DeviceId default_device;
  const std::unique_ptr<TraceRing> trace;
  const std::unique_ptr<OomDumper> dumper;
  // The flight record (flight_recorder), or null. Never destroyed with the state's
  // allocators alive: the runtime lives for the process (runtime.h).
  const std::unique_ptr<FlightRecorder> flight;
  OomCallbackList callbacks;

  mutable Mutex mu;
  std::map<DeviceId, std::shared_ptr<CachingAllocator>> allocators ABSL_GUARDED_BY(mu);
  // One per allocator ever installed, kept for the process's life: an allocator may
  // outlive its place in the table (in tensors) and keeps calling its observer.
  std::deque<std::unique_ptr<DeviceObserver>> observers ABSL_GUARDED_BY(mu);
  // Every allocator the runtime created (allocator()), kept until exit even once
  // replaced in `allocators`: what lets allocator_ref hand out plain pointers to them
  // (see the thread cache below). Few: one per device, plus one per exchange to none.
  std::vector<std::shared_ptr<CachingAllocator>> created ABSL_GUARDED_BY(mu);
  bool shut_down ABSL_GUARDED_BY(mu) = false;

  // Set at construction, reset by Shutdown; read without `mu` by http() (documented:
  // valid until Shutdown).
  std::atomic<HttpServer*> http_ptr{nullptr};
  // The layer that annotates live buffers (runtime/buffer_annotator.h), or null.
  std::atomic<const BufferAnnotator*> annotator{nullptr};
  std::unique_ptr<HttpServer> http ABSL_GUARDED_BY(mu);

  // The poller (see runtime.h). Started under `mu` by the first allocator that needs
  // it; joined by Shutdown.
  std::thread poller ABSL_GUARDED_BY(mu);
  std::mutex poll_mu;
  std::condition_variable poll_cv;
  bool poll_stop = false;  // guarded by poll_mu
  // How many allocators of the table have work queued for process_events(): written by
  // the allocators (under their device locks, read-modify-writes), read by the poller
  // without any lock. Relaxed (poll_work.h): a round that reads 0 while an allocator
  // queues its first event is the round that, taking the locks, would have come just
  // before it; the next round sees it. Lives as long as the state (the process).
  std::atomic<int64_t> pools_with_work{0};
  // The poller's figures (PollerStats), relaxed: counts only.
  std::atomic<uint64_t> poll_rounds{0};
  std::atomic<uint64_t> poll_registry_locks{0};

  // The allocator of `device`, created (and kept in `created`) if there is none.
  // Created under the registry lock so that each device gets exactly one; the device
  // lock is taken inside (lock order: registry -> device).
  std::shared_ptr<CachingAllocator> FindOrCreate(DeviceId device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = allocators.find(device);
    if (it != allocators.end()) return it->second;
    std::shared_ptr<CachingAllocator> made = CreateAllocator(config, device);
    Install(made);
    created.push_back(made);
    allocators.emplace(device, made);
    return made;
  }

  // Attaches the runtime's observer to `allocator` and starts the poller if needed.
  void Install(const std::shared_ptr<CachingAllocator>& allocator)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    observers.push_back(std::make_unique<DeviceObserver>(
        allocator.get(), trace.get(), dumper.get(), &callbacks, &SizeHistogram::Process(),
        flight != nullptr ? flight->AddAllocator(allocator->device()) : nullptr));
    allocator->set_observer(observers.back().get());
    // Counted while it has work, so that idle rounds of the poller take no lock
    // (detached again when it leaves the table: the poller polls the table only).
    allocator->set_poll_counter(&pools_with_work);
    const bool needs_poller =
        config.garbage_collection_threshold > 0 || allocator->backend().caps().streams;
    if (needs_poller && !shut_down && !poller.joinable()) {
      poller = std::thread([this] { Poll(); });
    }
  }

  void Poll() {
    std::unique_lock<std::mutex> lock(poll_mu);
    while (!poll_stop) {
      lock.unlock();
      poll_rounds.fetch_add(1, std::memory_order_relaxed);
      // No allocator of the table has work: nothing to do, and no lock taken to find
      // that out (the registry's nor any device's).
      if (pools_with_work.load(std::memory_order_relaxed) != 0) {
        poll_registry_locks.fetch_add(1, std::memory_order_relaxed);
        // Under the registry lock, through the table itself: a copy of the table would
        // hold references of its own, and an allocator its users have all dropped (one
        // that a ScopedAllocatorOverride installed, say) would then live on, and be
        // destroyed, on this thread. process_events never blocks (it only polls), and
        // registry -> device lock is the allowed order.
        MutexLock registry(&mu);
        // A poisoned allocator (a driver error, allocator/errors.h) is skipped: it
        // refuses every poll, and the error was reported when it poisoned it.
        // Its work stays queued for good: it no longer counts as work, or every round
        // would take the registry lock for it.
        for (const auto& [device, a] : allocators) {
          if (a->poisoned()) {
            a->set_poll_counter(nullptr);
            continue;
          }
          try {
            // Returns at once, without its device lock, when it has nothing queued.
            a->process_events();
          } catch (const DriverError&) {
            // Poisoned now (and said so on stderr): this thread must not end the process.
          }
        }
      }
      lock.lock();
      poll_cv.wait_for(lock, kPollInterval, [this] { return poll_stop; });
    }
  }
};

namespace {

std::atomic<Runtime*> g_runtime{nullptr};
Mutex g_create_mu;

// The registry's generation: advanced (under the registry lock) by every
// exchange_allocator, so that a thread's cached lookups made before are not trusted
// after. Starts at 1; a cache entry with generation 0 is empty. (One runtime exists per
// process; a counter shared by all would stay correct with more.)
std::atomic<uint64_t> g_generation{1};

// allocator_ref's per-thread cache: device -> an allocator the runtime created, valid
// while g_generation equals `generation`. Invariant: `allocator` was the table's
// allocator of `device` when the generation was `generation`, and is in
// State::created, so it lives until exit; the pointer is therefore never dangling,
// even when stale, and the generation check decides only whether it is still the
// current one. A thread uses few devices: a linear search of 4 entries, the oldest
// replaced.
struct CachedAllocator {
  DeviceId device;
  uint64_t generation = 0;
  CachingAllocator* allocator = nullptr;
};
constexpr size_t kCachedAllocators = 4;
thread_local CachedAllocator t_allocators[kCachedAllocators];
thread_local size_t t_next_allocator = 0;

void ShutdownAtExit() {
  if (Runtime* r = g_runtime.load(std::memory_order_acquire)) r->Shutdown();
}

}  // namespace

Runtime::Runtime(const Config& config) : state_(std::make_unique<State>(config)) {
  if (absl::Status s = ValidateHttpConfig(config); !s.ok()) {
    throw InvalidArgumentError(absl::StrCat("devmem runtime: ", s.message()));
  }
  if (!config.oom_dump_dir.empty()) {
    if (const std::string problem = DumpDirectoryProblem(config.oom_dump_dir); !problem.empty()) {
      std::fprintf(stderr, "devmem: warning: oom_dump_dir %s; no OOM dump will be written "
                           "there until that is fixed\n", problem.c_str());
    }
  }
  if (!config.http.empty()) {
    absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start(config, this);
    if (!server.ok()) {
      const std::string message =
          absl::StrCat("devmem runtime: cannot serve http on ", config.http, ": ",
                       server.status().message());
      if (absl::IsInvalidArgument(server.status())) throw InvalidArgumentError(message);
      throw std::runtime_error(message);
    }
    MutexLock lock(&state_->mu);
    state_->http = *std::move(server);
    state_->http_ptr.store(state_->http.get(), std::memory_order_release);
  }
}

// Never runs (the runtime is never destroyed, see runtime.h); defined for unique_ptr.
Runtime::~Runtime() { Shutdown(); }

Runtime& Runtime::Get() {
  if (Runtime* r = g_runtime.load(std::memory_order_acquire)) return *r;
  MutexLock lock(&g_create_mu);
  if (Runtime* r = g_runtime.load(std::memory_order_acquire)) return *r;
  absl::StatusOr<Config> config = ConfigFromEnv();
  if (!config.ok()) throw InvalidArgumentError(Sv(config.status().message()));
  Runtime* r = new Runtime(*config);
  g_runtime.store(r, std::memory_order_release);
  std::atexit(ShutdownAtExit);
  return *r;
}

absl::Status Runtime::Init(const Config& config) {
  MutexLock lock(&g_create_mu);
  if (Runtime* r = g_runtime.load(std::memory_order_acquire)) {
    if (r->config() == config) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "devmem runtime: already created with configuration \"", ToString(r->config()),
        "\"; Init(\"", ToString(config), "\") must come before its first use"));
  }
  try {
    Runtime* r = new Runtime(config);
    g_runtime.store(r, std::memory_order_release);
    std::atexit(ShutdownAtExit);
    return absl::OkStatus();
  } catch (const std::invalid_argument& e) {
    return absl::InvalidArgumentError(e.what());
  } catch (const std::exception& e) {
    return absl::UnavailableError(e.what());
  }
}

const Config& Runtime::config() const { return state_->config; }

DeviceId Runtime::default_device() const { return state_->default_device; }

std::shared_ptr<CachingAllocator> Runtime::allocator(DeviceId device) {
  State& s = *state_;
  MutexLock lock(&s.mu);
  return s.FindOrCreate(device);
}

AllocatorRef Runtime::allocator_ref(DeviceId device) {
  // Acquire: pairs with the release increment of exchange_allocator, so that a thread
  // that saw an exchange (through any synchronization) no longer trusts older entries.
  const uint64_t generation = g_generation.load(std::memory_order_acquire);
  for (const CachedAllocator& e : t_allocators) {
    if (e.generation == generation && e.device == device) return {e.allocator, nullptr};
  }
  State& s = *state_;
  MutexLock lock(&s.mu);
  std::shared_ptr<CachingAllocator> a = s.FindOrCreate(device);
  if (std::find(s.created.begin(), s.created.end(), a) == s.created.end()) {
    return {a.get(), std::move(a)};  // installed: the holder keeps it alive
  }
  // Exchanges advance the generation under the lock, so the table held `a` at `now`.
  const uint64_t now = g_generation.load(std::memory_order_relaxed);
  t_allocators[t_next_allocator] = CachedAllocator{device, now, a.get()};
  t_next_allocator = (t_next_allocator + 1) % kCachedAllocators;
  return {a.get(), nullptr};  // in `created`: lives until exit
}

std::vector<std::shared_ptr<CachingAllocator>> Runtime::allocators() const {
  MutexLock lock(&state_->mu);
  std::vector<std::shared_ptr<CachingAllocator>> out;
  out.reserve(state_->allocators.size());
  for (const auto& [device, a] : state_->allocators) out.push_back(a);
  return out;
}

void Runtime::set_allocator(std::shared_ptr<CachingAllocator> allocator) {
  if (allocator == nullptr) throw InvalidArgumentError("Runtime::set_allocator: null allocator");
  const DeviceId device = allocator->device();
  std::shared_ptr<CachingAllocator> previous = exchange_allocator(device, std::move(allocator));
  // `previous` is released here, outside the registry lock (it may be the last owner).
}

std::shared_ptr<CachingAllocator> Runtime::exchange_allocator(
    DeviceId device, std::shared_ptr<CachingAllocator> allocator) {
  if (allocator != nullptr && allocator->device() != device) {
    throw InvalidArgumentError(absl::StrCat("Runtime::exchange_allocator: allocator of ",
                                            allocator->device().ToString(),
                                            " given for device ", device.ToString()));
  }
  State& s = *state_;
  MutexLock lock(&s.mu);
  // Release: a thread that reads the new generation sees the table as changed here.
  g_generation.fetch_add(1, std::memory_order_release);
  std::shared_ptr<CachingAllocator> previous;
  auto it = s.allocators.find(device);
  if (it != s.allocators.end()) {
    previous = std::move(it->second);
    s.allocators.erase(it);
    // Out of the table, out of the poller's reach: its work no longer wakes it.
    if (previous != allocator) previous->set_poll_counter(nullptr);
  }
  if (allocator != nullptr) {
    if (allocator != previous) s.Install(allocator);
    s.allocators.emplace(device, std::move(allocator));
  }
  return previous;
}

int Runtime::add_oom_callback(OomCallback callback) {
  return state_->callbacks.add(std::move(callback));
}

bool Runtime::remove_oom_callback(int id) { return state_->callbacks.remove(id); }

TraceRing* Runtime::trace() const { return state_->trace.get(); }

HttpServer* Runtime::http() const { return state_->http_ptr.load(std::memory_order_acquire); }

RuntimeSnapshot Runtime::snapshot() const {
  RuntimeSnapshot snap;
  const std::vector<std::shared_ptr<CachingAllocator>> list = allocators();
  snap.time_ns = NowNs();
  snap.unix_time_ns = UnixNowNs();
  snap.devices.reserve(list.size());
  for (const auto& a : list) snap.devices.push_back(a->snapshot());
  // Outside every allocator lock: the annotator takes its own locks.
  if (const BufferAnnotator* annotator = state_->annotator.load(std::memory_order_acquire)) {
    snap.annotations.resize(snap.devices.size());
    for (size_t i = 0; i < snap.devices.size(); ++i) {
      std::vector<uintptr_t> addrs;
      for (const SegmentInfo& seg : snap.devices[i].segments) {
        for (const BlockInfo& b : seg.blocks) {
          if (b.state == BlockState::kAllocated) addrs.push_back(b.addr);
        }
      }
      annotator->annotate(snap.devices[i].device, addrs, &snap.annotations[i]);
    }
  }
  return snap;
}

Runtime::PollerStats Runtime::poller_stats() const {
  return {state_->poll_rounds.load(std::memory_order_relaxed),
          state_->poll_registry_locks.load(std::memory_order_relaxed)};
}

void Runtime::set_buffer_annotator(const BufferAnnotator* annotator) {
  state_->annotator.store(annotator, std::memory_order_release);
}

void Runtime::Shutdown() {
  State& s = *state_;
  std::unique_ptr<HttpServer> http;
  std::thread poller;
  {
    MutexLock lock(&s.mu);
    if (s.shut_down) return;
    s.shut_down = true;
    s.http_ptr.store(nullptr, std::memory_order_release);
    http = std::move(s.http);
    poller = std::move(s.poller);
  }
  // Outside the registry lock: HTTP handlers and the poller take it.
  http.reset();  // stops the listener and joins its threads
  if (poller.joinable()) {
    {
      std::lock_guard<std::mutex> lock(s.poll_mu);
      s.poll_stop = true;
    }
    s.poll_cv.notify_all();
    poller.join();
  }
}

}  // namespace devmem
