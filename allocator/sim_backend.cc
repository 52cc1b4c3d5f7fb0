// allocator/sim_backend.cc: the simulated device (sim_backend.h says what it emulates
// and why).
//
// The pieces, in file order:
//   RangeSet        disjoint, coalesced [start, end) address ranges: the free part of
//                   the reservation, and the mapped parts of virtual reservations.
//   SimEvent        one recorded event, shared by its handle and its queued marker.
//   StreamWorker    one in-order queue and the host thread that works it.
//   SimBackendImpl  the Backend itself.
//
// Locks (leaf locks: no method calls out of this file while holding one, and none is
// held while another is taken):
//   SimBackendImpl::mu_          memory state: ranges, segments, charge, injection.
//   SimBackendImpl::streams_mu_  the stream table.
//   StreamWorker::mu_            one stream's queue.
//   SimEvent::mu_                only to wake synchronize_event waiters.
// They are allocator/mutex.h's (std::mutex underneath), which ThreadSanitizer sees.
//
// Contract violations that a void method cannot report (freeing an unknown segment,
// unmapping a range that is not mapped, using a destroyed stream or event 0) end the
// process with a message: the simulator exists to find bugs, and a wrong free found
// late is much harder to explain than one found at once.
#include "allocator/sim_backend.h"

#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "allocator/config.h"
#include "allocator/mutex.h"

namespace devmem {
namespace {

// Every segment and every virtual reservation starts on this boundary, like the
// 2 MiB pages cudaMalloc hands large segments out from.
constexpr size_t kSegmentAlign = size_t{2} << 20;
// The reservation: 16x capacity, within these bounds (each stream's expandable
// segments reserve 2.25x capacity of address space). Smaller ones are tried (halving)
// when the kernel refuses, down to kMinReservation.
constexpr size_t kMinPreferredReservation = size_t{1} << 30;
constexpr size_t kMaxReservation = size_t{64} << 40;
constexpr size_t kMinReservation = size_t{64} << 20;

[[noreturn]] void Fatal(absl::string_view message) {
  std::fprintf(stderr, "devmem: fatal: %.*s\n", static_cast<int>(message.size()),
               message.data());
  std::fflush(stderr);
  std::abort();
}

size_t RoundUp(size_t x, size_t align) { return (x + align - 1) / align * align; }
bool IsPowerOfTwo(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

// Sleeps for a configured latency; 0 costs nothing.
void SleepNs(uint64_t ns) {
  if (ns != 0) std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
}

// A set of disjoint half-open address ranges, kept coalesced: no two ranges touch.
// Not thread-safe; the owner's lock guards it.
class RangeSet {
 public:
  bool empty() const { return ranges_.empty(); }

  // Adds [start, start + len). It must not overlap the set; it merges with neighbours.
  void Insert(uintptr_t start, size_t len) {
    uintptr_t end = start + len;
    auto next = ranges_.lower_bound(start);
    if (next != ranges_.begin()) {
      auto prev = std::prev(next);
      if (prev->second == start) {  // touches the range before: extend it
        start = prev->first;
        ranges_.erase(prev);
      }
    }
    next = ranges_.lower_bound(start);
    if (next != ranges_.end() && next->first == end) {  // touches the range after
      end = next->second;
      ranges_.erase(next);
    }
    ranges_[start] = end;
  }

  // True when every byte of [start, start + len) is in the set. Because ranges are
  // coalesced, that means one range holds all of it.
  bool Contains(uintptr_t start, size_t len) const {
    auto it = Containing(start);
    return it != ranges_.end() && it->second >= start + len;
  }

  // True when some byte of [start, start + len) is in the set.
  bool Overlaps(uintptr_t start, size_t len) const {
    auto it = ranges_.lower_bound(start + len);  // first range starting at or after end
    if (it == ranges_.begin()) return false;
    return std::prev(it)->second > start;
  }

  // Removes [start, start + len), which must be Contained.
  void Erase(uintptr_t start, size_t len) {
    auto it = Containing(start);
    const uintptr_t range_start = it->first;
    const uintptr_t range_end = it->second;
    ranges_.erase(it);
    if (range_start < start) ranges_[range_start] = start;
    if (start + len < range_end) ranges_[start + len] = range_end;
  }

  // First fit: the lowest `align`-aligned address a with [a, a + len) in the set.
  std::optional<uintptr_t> FindFirstFit(size_t len, size_t align) const {
    for (const auto& [start, end] : ranges_) {
      const uintptr_t a = RoundUp(start, align);
      if (a >= start && a < end && end - a >= len) return a;
    }
    return std::nullopt;
  }

 private:
  // The range whose start is the greatest one <= addr, if it contains addr.
  absl::btree_map<uintptr_t, uintptr_t>::const_iterator Containing(uintptr_t addr) const {
    auto it = ranges_.upper_bound(addr);
    if (it == ranges_.begin()) return ranges_.end();
    --it;
    return it->second > addr ? it : ranges_.end();
  }

  absl::btree_map<uintptr_t, uintptr_t> ranges_;  // start -> end
};

// One recorded event. Two owners share it: the Event handle the caller holds (until
// release_event) and the marker queued on the stream (until the worker has completed
// it). Either may go first, so the last one deletes it; the worker therefore never
// touches an event the caller has released, and vice versa.
//
// Memory orders: done_ is stored with release after everything queued before the
// marker has run, and loaded with acquire, so a caller that sees the event done also
// sees (and, under ThreadSanitizer, is ordered after) that work. The reference count
// is decremented acq_rel so the deleting owner sees the other owner's last writes.
class SimEvent {
 public:
  static SimEvent* FromHandle(Event event) {
    if (event.handle == 0) Fatal("sim backend: use of Event{0}, which is never valid");
    return reinterpret_cast<SimEvent*>(event.handle);
  }
  Event handle() { return Event{reinterpret_cast<uintptr_t>(this)}; }

  bool done() const { return done_.load(std::memory_order_acquire); }

  // Called once, by the stream's worker, when the stream reaches the event. The
  // worker still holds its reference, so the event outlives this call.
  void Complete() {
    // Stored under mu_ so that a waiter between checking done_ and sleeping cannot
    // miss the notification.
    MutexLock lock(&mu_);
    done_.store(true, std::memory_order_release);
    cv_.notify_all();
  }

  // Blocks until Complete() has run.
  void Wait() {
    if (done()) return;
    MutexLock lock(&mu_);
    cv_.wait(lock, [this] { return done(); });
  }

  // Makes a completed event pending again for a new marker (rerecord_event): the
  // marker takes a new reference. The previous marker has run Complete() (the caller
  // saw the event done), though maybe not yet its Unref(), which then drops only its
  // own reference.
  void Rearm() {
    if (!done()) Fatal("sim backend: rerecord_event of an event that has not completed");
    refs_.fetch_add(1, std::memory_order_relaxed);
    MutexLock lock(&mu_);
    done_.store(false, std::memory_order_relaxed);
  }

  // Drops one owner's reference; the last one deletes the event.
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

 private:
  std::atomic<int> refs_{2};  // the handle and the queued marker
  std::atomic<bool> done_{false};
  Mutex mu_;
  CondVar cv_;  // notified once, when done_ becomes true
};

// One stream: an in-order queue of host functions and the one thread that runs them.
// The thread starts with the first enqueued function, so streams nobody uses cost no
// thread. Thread-safe. Functions run without any lock held.
class StreamWorker {
 public:
  explicit StreamWorker(std::string thread_name) : thread_name_(std::move(thread_name)) {}
  ~StreamWorker() { Shutdown(); }
  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  // Queues `fn` to run after everything queued before it. Fatal after Shutdown().
  void Enqueue(std::function<void()> fn) {
    MutexLock lock(&mu_);
    if (stopping_) {
      Fatal(absl::StrCat("sim backend: work queued on destroyed stream ", thread_name_));
    }
    queue_.push_back(std::move(fn));
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    work_cv_.notify_one();
  }

  // Queues `fn` as Enqueue does, unless the stream is idle (nothing queued or
  // running): then returns false without queuing, and the caller runs `fn` itself
  // (nothing queued so far can be ordered after it). Fatal after Shutdown().
  bool EnqueueUnlessIdle(std::function<void()> fn) {
    MutexLock lock(&mu_);
    if (stopping_) {
      Fatal(absl::StrCat("sim backend: work queued on destroyed stream ", thread_name_));
    }
    if (IdleLocked()) return false;
    queue_.push_back(std::move(fn));
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    work_cv_.notify_one();
    return true;
  }

  // Blocks until every function queued so far has run. Must not be called from this
  // stream's own functions (that would wait for itself).
  void Drain() {
    MutexLock lock(&mu_);
    // The predicate runs with mu_ held (CondVar::wait's contract); the analysis
    // cannot see into lambdas.
    idle_cv_.wait(lock, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return IdleLocked(); });
  }

  // Runs what is queued, then stops and joins the thread. Idempotent.
  void Shutdown() {
    std::thread thread;
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      thread = std::move(thread_);
      work_cv_.notify_one();
    }
    if (thread.joinable()) thread.join();
  }

 private:
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && !busy_;
  }

  void Loop() {
    // Names show in debuggers and TSan reports; Linux limits them to 15 characters.
    pthread_setname_np(pthread_self(), thread_name_.substr(0, 15).c_str());
    for (;;) {
      std::function<void()> fn;
      {
        MutexLock lock(&mu_);
        work_cv_.wait(lock, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return !queue_.empty() || stopping_;
        });
        if (queue_.empty()) return;  // stopping, and everything queued has run
        fn = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      fn();
      fn = nullptr;  // destroy captures before Drain() can return
      MutexLock lock(&mu_);
      busy_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }

  const std::string thread_name_;
  Mutex mu_;
  CondVar work_cv_;  // the worker waits here for work or Shutdown()
  CondVar idle_cv_;  // Drain() waits here for an empty queue and an idle worker
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;      // a function is running
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;  // Shutdown() was called
  std::thread thread_ ABSL_GUARDED_BY(mu_);     // empty until the first Enqueue
};

// A stable made-up UUID for sim:N, in the shape of a GPU UUID, from splitmix64.
std::string SimUuid(int index) {
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  const uint64_t hi = mix(0x64657667000000ULL + static_cast<uint64_t>(index));
  const uint64_t lo = mix(hi);
  return absl::StrFormat("SIM-%08x-%04x-%04x-%04x-%012x", hi >> 32, (hi >> 16) & 0xffff,
                         hi & 0xffff, lo >> 48, lo & 0xffffffffffffULL);
}

std::string ErrnoText(int err) {
  return absl::StrCat(std::strerror(err), " (errno ", err, ")");
}

// The address-space reservation of one simulated device (see SimBackendImpl::mapping_).
struct AddressReservation {
  void* mapping = nullptr;
  size_t mapping_size = 0;
  uintptr_t base = 0;
  size_t size = 0;
};

class SimBackendImpl final : public SimBackend {
 public:
  SimBackendImpl(const SimOptions& options, const AddressReservation& reservation);
  ~SimBackendImpl() override;

  DeviceId device() const override { return device_; }
  Capabilities caps() const override {
    return Capabilities{.streams = true, .virtual_memory = true, .host_accessible = true};
  }
  DeviceInfo info() const override {
    return DeviceInfo{.name = "devmem simulated device",
                      .uuid = SimUuid(options_.index),
                      .backend = "sim"};
  }

  absl::StatusOr<void*> allocate_segment(size_t bytes) override;
  void free_segment(void* p, size_t bytes) override;
  MemInfo mem_info() override;

  absl::StatusOr<Stream> create_stream() override;
  void destroy_stream(Stream stream) override;
  absl::Status launch_host_fn(Stream stream, std::function<void()> fn) override;
  Event record_event(Stream stream) override;
  bool event_done(Event event) override { return SimEvent::FromHandle(event)->done(); }
  void synchronize_event(Event event) override { SimEvent::FromHandle(event)->Wait(); }
  void release_event(Event event) override { SimEvent::FromHandle(event)->Unref(); }
  bool rerecord_event(Event event, Stream stream) override;
  void synchronize_stream(Stream stream) override;

  size_t granularity() const override { return options_.granularity; }
  absl::StatusOr<void*> reserve_address(size_t bytes) override;
  void release_address(void* p, size_t bytes) override;
  absl::Status map(void* p, size_t bytes) override;
  void unmap(void* p, size_t bytes) override;
  size_t release_handle_reserve() override;
  size_t handle_reserve_bytes() const override {
    MutexLock lock(&mu_);
    return reserve_;
  }
  DriverCallStats driver_calls() const override {
    DriverCallStats s = calls_.read();
    MutexLock lock(&mu_);
    s.handle_reserve_bytes = static_cast<int64_t>(reserve_);
    return s;
  }

  void set_failure_injection(uint64_t fail_nth, double probability,
                             uint64_t seed) override;
  void set_event_failure_injection(uint64_t fail_nth) override;
  size_t used_bytes() const override {
    MutexLock lock(&mu_);
    return used_;
  }
  uint64_t segment_alloc_attempts() const override {
    MutexLock lock(&mu_);
    return attempts_;
  }
  uint64_t injected_failures() const override {
    MutexLock lock(&mu_);
    return injected_;
  }

 private:
  // The worker of `stream`, or nullptr when no such stream exists.
  std::shared_ptr<StreamWorker> FindStream(Stream stream) const;
  // What record_event and rerecord_event (`call`) do first: finds the stream's worker
  // (fatal when there is none) and throws when event injection says this record fails.
  std::shared_ptr<StreamWorker> StartRecord(Stream stream, const char* call);
  // Queues the marker that completes `event` (and drops the marker's reference).
  static void EnqueueMarker(StreamWorker& worker, SimEvent* event);
  // Decides whether this request for memory (`what`: "segment allocation" or "map")
  // fails by injection; counts the attempt.
  std::optional<absl::Status> InjectLocked(absl::string_view what, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ResourceExhausted error for charging `bytes` more than the capacity allows.
  absl::Status OverCapacityLocked(absl::string_view what, size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes [a, a + RoundUp(bytes, kSegmentAlign)) from the free ranges, first fit.
  absl::StatusOr<uintptr_t> CarveLocked(size_t bytes, size_t align)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives pages back to the OS and makes them inaccessible (use after free crashes).
  void Decommit(uintptr_t start, size_t len);
  // The reservation made by reserve_address that holds [p, p + bytes), if one does.
  std::optional<std::pair<uintptr_t, size_t>> FindReservationLocked(uintptr_t p,
                                                                    size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string Name() const { return device_.ToString(); }
  // Counts `n` calls of `call` at the model's cost.
  void Count(DriverCall call, int64_t n) {
    calls_.add(call, n,
               n * static_cast<int64_t>(options_.driver_costs.ns[static_cast<int>(call)]));
  }

  const SimOptions options_;
  const DeviceId device_;

  // The address-space reservation, fixed for the backend's lifetime: mapping_ is what
  // mmap returned (and munmap takes); [base_, base_ + size_) is its 2 MiB-aligned
  // part that segments are carved from.
  void* const mapping_;
  const size_t mapping_size_;
  const uintptr_t base_;
  const size_t size_;

  // Memory state. Leaf lock; syscalls that must be atomic with the bookkeeping
  // (virtual-memory map/unmap) run under it, the rest run outside.
  mutable Mutex mu_;
  RangeSet free_ranges_ ABSL_GUARDED_BY(mu_);
  // Live segments: start -> the bytes allocate_segment was asked for.
  absl::btree_map<uintptr_t, size_t> segments_ ABSL_GUARDED_BY(mu_);
  // Virtual reservations: start -> the bytes reserve_address was asked for.
  absl::btree_map<uintptr_t, size_t> reservations_ ABSL_GUARDED_BY(mu_);
  // Mapped parts of virtual reservations.
  RangeSet mapped_ ABSL_GUARDED_BY(mu_);
  size_t used_ ABSL_GUARDED_BY(mu_) = 0;  // segment + mapped + handle-reserve bytes
  size_t reserve_ ABSL_GUARDED_BY(mu_) = 0;  // the physical-handle reserve's bytes
  DriverCallCounter calls_;  // thread-safe on its own
  uint64_t attempts_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t injected_ ABSL_GUARDED_BY(mu_) = 0;
  // Failure injection; attempts_since_set_ counts from creation or the last
  // set_failure_injection.
  uint64_t fail_nth_ ABSL_GUARDED_BY(mu_) = 0;
  double fail_probability_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t seed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t attempts_since_set_ ABSL_GUARDED_BY(mu_) = 0;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  // Event injection: the event_fail_nth_-th record (record_event or rerecord_event)
  // since it was set throws.
  uint64_t event_fail_nth_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t events_since_set_ ABSL_GUARDED_BY(mu_) = 0;

  // Streams: handle -> worker. Stream 0 is there from the start; its thread, like
  // every stream's, starts on first use. Handles are never reused, so a destroyed
  // stream's handle stays invalid.
  mutable Mutex streams_mu_;
  absl::flat_hash_map<uintptr_t, std::shared_ptr<StreamWorker>> streams_
      ABSL_GUARDED_BY(streams_mu_);
  uintptr_t next_stream_ ABSL_GUARDED_BY(streams_mu_) = 1;
};

// Checks `options` and reserves the device's address space. An error (never an abort)
// when the granularity is bad or the kernel refuses even kMinReservation bytes: a
// process asking for its 600th simulated device, or one under an address-space limit,
// gets a message it can report.
absl::StatusOr<AddressReservation> ReserveForSim(const SimOptions& options) {
  const std::string name = DeviceId{DeviceType::kSim, options.index}.ToString();
  if (!IsPowerOfTwo(options.granularity) ||
      options.granularity % static_cast<size_t>(sysconf(_SC_PAGESIZE)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": SimOptions::granularity ", options.granularity,
                     " is not a power of two multiple of the page size"));
  }
  // 16x capacity leaves room for the 2 MiB rounding of segments, for fragmentation of
  // the address space, and for the address ranges of several streams' expandable
  // segments, so capacity (not addresses) is what runs out first.
  size_t want =
      options.capacity > kMaxReservation / 16 ? kMaxReservation : options.capacity * 16;
  want =
      RoundUp(std::clamp(want, kMinPreferredReservation, kMaxReservation), kSegmentAlign);
  int err = 0;
  for (size_t size = want; size >= kMinReservation; size /= 2) {
    // The extra kSegmentAlign lets the base be aligned up to 2 MiB.
    void* p = mmap(nullptr, size + kSegmentAlign, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      err = errno;
      continue;
    }
    return AddressReservation{p, size + kSegmentAlign,
                       RoundUp(reinterpret_cast<uintptr_t>(p), kSegmentAlign), size};
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      name, ": mmap could not reserve even ", kMinReservation,
      " bytes of address space for the simulated device: ", ErrnoText(err),
      " (each simulated device reserves up to 16x sim_capacity; use fewer devices or a "
      "smaller sim_capacity)"));
}

SimBackendImpl::SimBackendImpl(const SimOptions& options,
                               const AddressReservation& reservation)
    : options_(options),
      device_{DeviceType::kSim, options.index},
      mapping_(reservation.mapping),
      mapping_size_(reservation.mapping_size),
      base_(reservation.base),
      size_(reservation.size) {
  {
    MutexLock lock(&mu_);
    free_ranges_.Insert(base_, size_);
    fail_nth_ = options_.fail_nth;
    fail_probability_ = options_.fail_probability;
    seed_ = options_.seed;
    rng_.seed(options_.seed);
  }
  MutexLock lock(&streams_mu_);
  streams_[0] =
      std::make_shared<StreamWorker>(absl::StrCat("sim", options_.index, ".s0"));
}

SimBackendImpl::~SimBackendImpl() {
  // Drain and join every stream first: their functions may still touch memory.
  absl::flat_hash_map<uintptr_t, std::shared_ptr<StreamWorker>> streams;
  {
    MutexLock lock(&streams_mu_);
    streams.swap(streams_);
  }
  for (auto& [handle, worker] : streams) worker->Shutdown();
  streams.clear();
  // Segments still live are the caller's leak; the whole reservation goes at once.
  munmap(mapping_, mapping_size_);
}

std::optional<absl::Status> SimBackendImpl::InjectLocked(absl::string_view what,
                                                         size_t bytes) {
  ++attempts_;
  ++attempts_since_set_;
  bool fail = false;
  std::string why;
  if (fail_nth_ != 0 && attempts_since_set_ == fail_nth_) {
    fail = true;
    why = absl::StrCat("sim_fail_nth=", fail_nth_);
  }
  if (fail_probability_ > 0) {
    // Always draw when a probability is set, so that the sequence of draws (and so
    // which attempts fail) depends only on the seed and the attempt number. The top
    // 53 bits give a uniform double in [0, 1), the same on every platform.
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    if (!fail && u < fail_probability_) {
      fail = true;
      why =
          absl::StrCat("sim_fail_probability=", fail_probability_, ", sim_seed=", seed_);
    }
  }
  if (!fail) return std::nullopt;
  ++injected_;
  return absl::ResourceExhaustedError(
      absl::StrCat(Name(), ": injected failure of ", what, " (memory request #",
                   attempts_since_set_, ", ", bytes, " bytes; ", why, ")"));
}

absl::Status SimBackendImpl::OverCapacityLocked(absl::string_view what,
                                                size_t bytes) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      Name(), ": out of memory: ", what, " of ", FormatBytes(bytes), " (", bytes,
      " bytes) with ", FormatBytes(used_), " (", used_, " bytes) used of ",
      FormatBytes(options_.capacity), " (", options_.capacity, " bytes) capacity"));
}

absl::StatusOr<uintptr_t> SimBackendImpl::CarveLocked(size_t bytes, size_t align) {
  // The size check first: it keeps RoundUp from overflowing on absurd sizes.
  const size_t len = bytes > size_ ? 0 : RoundUp(bytes, kSegmentAlign);
  std::optional<uintptr_t> start =
      len == 0 ? std::nullopt : free_ranges_.FindFirstFit(len, align);
  if (!start) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Name(), ": no free range for ", bytes,
                     " bytes left in the simulated address space (", size_,
                     " bytes reserved; it is fragmented or too small for the capacity)"));
  }
  free_ranges_.Erase(*start, len);
  return *start;
}

void SimBackendImpl::Decommit(uintptr_t start, size_t len) {
  void* p = reinterpret_cast<void*>(start);
  // MADV_DONTNEED drops the pages (a private anonymous mapping reads back zeros), so
  // freed memory returns to the OS; PROT_NONE makes any later touch fault.
  if (madvise(p, len, MADV_DONTNEED) != 0 || mprotect(p, len, PROT_NONE) != 0) {
    Fatal(absl::StrFormat("%s: madvise/mprotect(%p, %u) failed: %s", Name(), p, len,
                          ErrnoText(errno)));
  }
}

absl::StatusOr<void*> SimBackendImpl::allocate_segment(size_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), ": allocate_segment of 0 bytes"));
  }
  // Like cudaMalloc, an attempt costs its latency whether or not it succeeds.
  SleepNs(options_.alloc_latency_ns);
  Count(DriverCall::kMalloc, 1);
  uintptr_t start;
  {
    MutexLock lock(&mu_);
    if (std::optional<absl::Status> injected = InjectLocked("segment allocation", bytes)) {
      return *injected;
    }
    if (bytes > options_.capacity - used_) {
      return OverCapacityLocked("cannot allocate a segment", bytes);
    }
    absl::StatusOr<uintptr_t> carved = CarveLocked(bytes, kSegmentAlign);
    if (!carved.ok()) return carved.status();
    start = *carved;
    segments_[start] = bytes;
    used_ += bytes;
  }
  // Outside the lock: nobody else knows this range yet.
  void* p = reinterpret_cast<void*>(start);
  if (mprotect(p, RoundUp(bytes, kSegmentAlign), PROT_READ | PROT_WRITE) != 0) {
    const int err = errno;
    MutexLock lock(&mu_);
    segments_.erase(start);
    used_ -= bytes;
    free_ranges_.Insert(start, RoundUp(bytes, kSegmentAlign));
    return absl::InternalError(
        absl::StrFormat("%s: mprotect(%p, %u, PROT_READ|PROT_WRITE) failed: %s", Name(),
                        p, RoundUp(bytes, kSegmentAlign), ErrnoText(err)));
  }
  return p;
}

void SimBackendImpl::free_segment(void* p, size_t bytes) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  {
    MutexLock lock(&mu_);
    auto it = segments_.find(start);
    if (it == segments_.end()) {
      Fatal(
          absl::StrFormat("%s: free_segment(%p, %u): not a live segment (double free, "
                          "or a pointer this backend did not return)",
                          Name(), p, bytes));
    }
    if (it->second != bytes) {
      Fatal(
          absl::StrFormat("%s: free_segment(%p, %u): the segment was allocated with "
                          "%u bytes",
                          Name(), p, bytes, it->second));
    }
    // Gone from segments_ now, so a second free of p is caught even while this one
    // is still decommitting; the range is not free until the end.
    segments_.erase(it);
  }
  const size_t len = RoundUp(bytes, kSegmentAlign);
  Decommit(start, len);
  SleepNs(options_.free_latency_ns);
  Count(DriverCall::kFree, 1);
  MutexLock lock(&mu_);
  used_ -= bytes;
  free_ranges_.Insert(start, len);
}

MemInfo SimBackendImpl::mem_info() {
  MutexLock lock(&mu_);
  return MemInfo{.free_bytes = options_.capacity - used_,
                 .total_bytes = options_.capacity};
}

// --- streams and events -------------------------------------------------------------

std::shared_ptr<StreamWorker> SimBackendImpl::FindStream(Stream stream) const {
  MutexLock lock(&streams_mu_);
  auto it = streams_.find(stream.handle);
  return it == streams_.end() ? nullptr : it->second;
}

absl::StatusOr<Stream> SimBackendImpl::create_stream() {
  MutexLock lock(&streams_mu_);
  const uintptr_t handle = next_stream_++;
  streams_[handle] =
      std::make_shared<StreamWorker>(absl::StrCat("sim", options_.index, ".s", handle));
  return Stream{handle};
}

void SimBackendImpl::destroy_stream(Stream stream) {
  if (stream.handle == 0) return;  // the default stream lives as long as the backend
  std::shared_ptr<StreamWorker> worker;
  {
    MutexLock lock(&streams_mu_);
    auto it = streams_.find(stream.handle);
    if (it == streams_.end()) {
      Fatal(absl::StrCat(Name(), ": destroy_stream of unknown stream ", stream.handle));
    }
    worker = std::move(it->second);
    streams_.erase(it);
  }
  worker->Shutdown();  // runs what is queued, then joins
}

absl::Status SimBackendImpl::launch_host_fn(Stream stream, std::function<void()> fn) {
  if (!fn) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), ": launch_host_fn of an empty function"));
  }
  std::shared_ptr<StreamWorker> worker = FindStream(stream);
  if (worker == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), ": launch_host_fn on unknown stream ", stream.handle));
  }
  // The scope marks the worker thread for the function's duration only (backend.h:
  // callbacks must not call the allocator; event markers are not callbacks).
  worker->Enqueue([fn = std::move(fn)] {
    StreamCallbackScope scope;
    fn();
  });
  return absl::OkStatus();
}

std::shared_ptr<StreamWorker> SimBackendImpl::StartRecord(Stream stream, const char* call) {
  std::shared_ptr<StreamWorker> worker = FindStream(stream);
  if (worker == nullptr) {
    Fatal(absl::StrCat(Name(), ": ", call, " on unknown stream ", stream.handle));
  }
  MutexLock lock(&mu_);
  if (event_fail_nth_ != 0 && ++events_since_set_ == event_fail_nth_) {
    ++injected_;
    // What a real record can throw (the event and its queue entry are allocated).
    throw std::runtime_error(absl::StrCat(Name(), ": injected failure of ", call, " #",
                                          event_fail_nth_, " (sim event injection)"));
  }
  return worker;
}

void SimBackendImpl::EnqueueMarker(StreamWorker& worker, SimEvent* event) {
  // On an idle stream the event is complete at once, as a GPU's would be within
  // microseconds: that keeps replays, whose streams run no work, deterministic.
  auto marker = [event] {
    event->Complete();
    event->Unref();  // the marker's reference; the handle may already be released
  };
  if (!worker.EnqueueUnlessIdle(marker)) marker();
}

Event SimBackendImpl::record_event(Stream stream) {
  std::shared_ptr<StreamWorker> worker = StartRecord(stream, "record_event");
  SimEvent* event = new SimEvent;
  EnqueueMarker(*worker, event);
  return event->handle();
}

bool SimBackendImpl::rerecord_event(Event handle, Stream stream) {
  std::shared_ptr<StreamWorker> worker = StartRecord(stream, "rerecord_event");
  SimEvent* event = SimEvent::FromHandle(handle);
  event->Rearm();
  EnqueueMarker(*worker, event);
  return true;
}

void SimBackendImpl::synchronize_stream(Stream stream) {
  std::shared_ptr<StreamWorker> worker = FindStream(stream);
  if (worker == nullptr) {
    Fatal(absl::StrCat(Name(), ": synchronize_stream on unknown stream ", stream.handle));
  }
  worker->Drain();
}

// --- virtual memory -----------------------------------------------------------------

std::optional<std::pair<uintptr_t, size_t>> SimBackendImpl::FindReservationLocked(
    uintptr_t p, size_t bytes) const {
  auto it = reservations_.upper_bound(p);
  if (it == reservations_.begin()) return std::nullopt;
  --it;
  const auto [start, len] = *it;
  if (p >= start + len || bytes > start + len - p) return std::nullopt;
  return std::make_pair(start, len);
}

absl::StatusOr<void*> SimBackendImpl::reserve_address(size_t bytes) {
  if (bytes == 0 || bytes % options_.granularity != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Name(), ": reserve_address(", bytes,
                     "): size must be a positive multiple of the ", options_.granularity,
                     "-byte granularity"));
  }
  Count(DriverCall::kAddressReserve, 1);
  MutexLock lock(&mu_);
  absl::StatusOr<uintptr_t> start =
      CarveLocked(bytes, std::max(options_.granularity, kSegmentAlign));
  if (!start.ok()) return start.status();
  reservations_[*start] = bytes;
  return reinterpret_cast<void*>(*start);
}

void SimBackendImpl::release_address(void* p, size_t bytes) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  MutexLock lock(&mu_);
  auto it = reservations_.find(start);
  if (it == reservations_.end() || it->second != bytes) {
    Fatal(
        absl::StrFormat("%s: release_address(%p, %u): not a range reserve_address "
                        "returned",
                        Name(), p, bytes));
  }
  if (mapped_.Overlaps(start, bytes)) {
    Fatal(
        absl::StrFormat("%s: release_address(%p, %u): part of the range is still "
                        "mapped; unmap it first",
                        Name(), p, bytes));
  }
  reservations_.erase(it);
  free_ranges_.Insert(start, RoundUp(bytes, kSegmentAlign));
  Count(DriverCall::kAddressFree, 1);
}

absl::Status SimBackendImpl::map(void* p, size_t bytes) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  const size_t g = options_.granularity;
  if (start % g != 0 || bytes == 0 || bytes % g != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: map(%p, %u): address and size must be positive multiples of the %u-byte "
        "granularity",
        Name(), p, bytes, g));
  }
  MutexLock lock(&mu_);
  if (!FindReservationLocked(start, bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: map(%p, %u): the range is not inside one range from reserve_address", Name(),
        p, bytes));
  }
  if (mapped_.Overlaps(start, bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: map(%p, %u): part of the range is already mapped", Name(), p, bytes));
  }
  // Maps are memory requests like segment allocations: injection applies to both, so
  // it fires with expandable segments (the default) too.
  if (std::optional<absl::Status> injected = InjectLocked("map", bytes)) return *injected;
  // Granules from the reserve are charged already; only the rest is new memory.
  const size_t reused = std::min(bytes, reserve_);
  const size_t fresh = bytes - reused;
  if (fresh > options_.capacity - used_) {
    Count(DriverCall::kCreate, 1);  // the cuMemCreate that failed
    return OverCapacityLocked("cannot map", fresh);
  }
  // Under the lock, so a concurrent unmap/map of the same range cannot interleave
  // its mprotect with this one.
  if (mprotect(p, bytes, PROT_READ | PROT_WRITE) != 0) {
    return absl::InternalError(
        absl::StrFormat("%s: mprotect(%p, %u, PROT_READ|PROT_WRITE) failed: %s", Name(),
                        p, bytes, ErrnoText(errno)));
  }
  mapped_.Insert(start, bytes);
  reserve_ -= reused;
  used_ += fresh;
  Count(DriverCall::kCreate, static_cast<int64_t>(fresh / g));
  Count(DriverCall::kMap, static_cast<int64_t>(bytes / g));
  Count(DriverCall::kSetAccess, 1);
  return absl::OkStatus();
}

void SimBackendImpl::unmap(void* p, size_t bytes) {
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  MutexLock lock(&mu_);
  if (bytes == 0 || !FindReservationLocked(start, bytes) ||
      !mapped_.Contains(start, bytes)) {
    Fatal(
        absl::StrFormat("%s: unmap(%p, %u): the range is not entirely mapped inside "
                        "one reserved range",
                        Name(), p, bytes));
  }
  Decommit(start, bytes);
  mapped_.Erase(start, bytes);
  reserve_ += bytes;  // still charged: the handles are kept for the next map
  Count(DriverCall::kUnmap, 1);
}

size_t SimBackendImpl::release_handle_reserve() {
  MutexLock lock(&mu_);
  const size_t bytes = reserve_;
  Count(DriverCall::kRelease, static_cast<int64_t>(bytes / options_.granularity));
  used_ -= bytes;
  reserve_ = 0;
  return bytes;
}

void SimBackendImpl::set_event_failure_injection(uint64_t fail_nth) {
  MutexLock lock(&mu_);
  event_fail_nth_ = fail_nth;
  events_since_set_ = 0;
}

void SimBackendImpl::set_failure_injection(uint64_t fail_nth, double probability,
                                           uint64_t seed) {
  MutexLock lock(&mu_);
  fail_nth_ = fail_nth;
  fail_probability_ = probability;
  seed_ = seed;
  rng_.seed(seed);
  attempts_since_set_ = 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SimBackend>> CreateSimBackend(const SimOptions& options) {
  absl::StatusOr<AddressReservation> reservation = ReserveForSim(options);
  if (!reservation.ok()) return reservation.status();
  return std::make_unique<SimBackendImpl>(options, *reservation);
}

std::unique_ptr<SimBackend> NewSimBackend(const SimOptions& options) {
  absl::StatusOr<std::unique_ptr<SimBackend>> sim = CreateSimBackend(options);
  if (!sim.ok()) throw std::runtime_error(std::string(sim.status().message()));
  return *std::move(sim);
}

}  // namespace devmem
