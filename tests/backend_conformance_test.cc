// tests/backend_conformance_test.cc: one conformance suite over every backend, then
// what only the sim backend and the factory promise.
//
//   BackendConformanceTest/{cpu,sim,cuda}  the allocator/backend.h contract, the same
//                                          test for each backend; cuda is skipped,
//                                          with the reason, where there is no device.
//                                          The VirtualMemory* and ExpandableSegments*
//                                          cases run where caps().virtual_memory (sim;
//                                          cuda on a GPU with VMM) and are skipped,
//                                          with the backend's reason, elsewhere.
//   SimBackendTest, SimBackendDeathTest    capacity, failure injection, latency,
//                                          first-fit determinism, decommit on free,
//                                          streams, virtual-memory emulation.
//   BackendFactoryTest                     backend:sim/cpu/auto/cuda through MakeBackend.
//
// No test depends on an upper bound of time: latencies are checked from below only,
// and "not yet done" is checked while the stream is provably blocked.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/backend.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/sim_backend.h"
#include "allocator/types.h"
#include "gtest/gtest.h"
#ifdef DEVMEM_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace devmem {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kSimCapacity = 256 * kMiB;

Config SimConfig(size_t capacity = kSimCapacity) {
  Config config;
  config.backend = BackendKind::kSim;
  config.sim_capacity = capacity;
  return config;
}

std::unique_ptr<SimBackend> NewSim(size_t capacity = kSimCapacity, int index = 0) {
  SimOptions options;
  options.index = index;
  options.capacity = capacity;
  return NewSimBackend(options);
}

// The backend a conformance test runs on. Only cuda may be missing.
absl::StatusOr<std::unique_ptr<Backend>> MakeForKind(const std::string& kind) {
  if (kind == "cpu") return MakeCpuBackend();
  if (kind == "sim") return MakeSimBackend(SimConfig());
  Config config;
  config.backend = BackendKind::kCuda;
  return MakeBackend(config, 0);
}

// How long a call that must wait for a blocked stream is given to return early (and so
// show that it does not wait) before the stream is let go. A correct call never returns
// within it, so this bounds only how hard a broken one is looked for; nothing is
// ordered by it (see WaitsForQueuedWork).
constexpr auto kGrace = milliseconds(50);

// Checks that `wait` (synchronize_stream, destroy_stream, a destructor) returns only
// after the work queued on `stream` before it has run. The work is held behind a gate;
// `wait` runs on another thread; the gate opens once `wait` has returned (a broken one)
// or kGrace has passed without it returning. Then the work runs, `wait` returns, and
// what `wait`'s thread saw is compared: the order comes from the gate and the futures,
// not from a sleep inside the work. Returns true when the work had run before `wait`
// returned.
bool WaitsForQueuedWork(Backend& backend, Stream stream, const std::function<void()>& wait) {
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  std::atomic<bool> ran{false};
  EXPECT_TRUE(backend
                  .launch_host_fn(stream,
                                  [opened, &ran] {
                                    opened.wait();
                                    ran.store(true);
                                  })
                  .ok());
  std::promise<bool> returned;
  std::future<bool> ran_at_return = returned.get_future();
  std::thread waiter([&] {
    wait();
    returned.set_value(ran.load());
  });
  const bool early = ran_at_return.wait_for(kGrace) == std::future_status::ready;
  gate.set_value();
  const bool ok = ran_at_return.get();
  waiter.join();
  EXPECT_FALSE(early) << "returned while the stream was still held";
  return ok && !early;
}

// Holds a stream's worker inside a host function until Release() (or the end of the
// scope, so a failed expectation cannot leave a worker blocked forever).
class StreamBlocker {
 public:
  StreamBlocker() : future_(promise_.get_future().share()) {}
  ~StreamBlocker() { Release(); }
  absl::Status BlockOn(Backend& backend, Stream stream) {
    return backend.launch_host_fn(stream, [future = future_] { future.wait(); });
  }
  void Release() {
    if (!released_) promise_.set_value();
    released_ = true;
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_;
  bool released_ = false;
};

bool Overlap(const std::pair<uintptr_t, size_t>& a,
             const std::pair<uintptr_t, size_t>& b) {
  return a.first < b.first + b.second && b.first < a.first + a.second;
}

// Fills device memory with `value`, whatever the backend: plain stores where the host
// can reach it, the CUDA runtime for cuda.
absl::Status FillDevice(Backend& backend, void* p, unsigned char value, size_t bytes) {
  if (backend.caps().host_accessible) {
    std::memset(p, value, bytes);
    return absl::OkStatus();
  }
#ifdef DEVMEM_HAVE_CUDA
  if (backend.device().type == DeviceType::kCuda) {
    return CudaMemsetSync(backend.device().index, p, value, bytes);
  }
#endif
  return absl::UnimplementedError("no way to write this backend's memory");
}

// Copies device memory to the host, as FillDevice writes it.
absl::StatusOr<std::vector<unsigned char>> ReadDevice(Backend& backend, const void* p,
                                                      size_t bytes) {
  std::vector<unsigned char> out(bytes);
  if (backend.caps().host_accessible) {
    std::memcpy(out.data(), p, bytes);
    return out;
  }
#ifdef DEVMEM_HAVE_CUDA
  if (backend.device().type == DeviceType::kCuda) {
    absl::Status st = CudaCopyToHost(backend.device().index, out.data(), p, bytes);
    if (!st.ok()) return st;
    return out;
  }
#endif
  return absl::UnimplementedError("no way to read this backend's memory");
}

// Empty when every byte of [p, p + bytes) holds `value`; else where the first one that
// does not is, and what it holds.
std::string CheckDevice(Backend& backend, const void* p, size_t bytes,
                        unsigned char value) {
  absl::StatusOr<std::vector<unsigned char>> data = ReadDevice(backend, p, bytes);
  if (!data.ok()) return std::string(data.status().message());
  for (size_t i = 0; i < bytes; ++i) {
    if ((*data)[i] != value) {
      return absl::StrFormat("byte %u of %p is %d, not %d", i, p, (*data)[i], value);
    }
  }
  return "";
}

// ---------------------------------------------------------------------------------
// The conformance suite.

class BackendConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeForKind(GetParam());
    if (!backend.ok()) {
      ASSERT_EQ(GetParam(), "cuda")
          << "the " << GetParam() << " backend must always exist: " << backend.status();
      GTEST_SKIP() << "no cuda backend on this machine: " << backend.status().message();
    }
    backend_ = std::move(*backend);
  }
  // A stream of its own when the backend has streams, else the default stream.
  Stream SomeStream() {
    if (!backend_->caps().streams) return Stream{};
    absl::StatusOr<Stream> stream = backend_->create_stream();
    EXPECT_TRUE(stream.ok()) << stream.status();
    return stream.ok() ? *stream : Stream{};
  }
  void DoneWith(Stream stream) {
    if (stream.handle != 0) backend_->destroy_stream(stream);
  }
  // Why the backend has no virtual memory, in its own words (reserve_address's
  // Unimplemented message: cuda names the driver's reason).
  std::string NoVirtualMemoryReason() {
    absl::StatusOr<void*> r = backend_->reserve_address(2 * kMiB);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
    if (r.ok()) backend_->release_address(*r, 2 * kMiB);
    return std::string(r.status().message());
  }

  std::unique_ptr<Backend> backend_;
};

// Fails the test, printing the status, unless `expr` is OK.
#define ASSERT_STATUS_OK(expr)            \
  do {                                    \
    const absl::Status status_ = (expr);  \
    ASSERT_TRUE(status_.ok()) << status_; \
  } while (false)

// Skips the test, with the backend's reason, unless it has virtual memory.
#define SKIP_WITHOUT_VIRTUAL_MEMORY()                        \
  do {                                                       \
    if (!backend_->caps().virtual_memory) {                  \
      GTEST_SKIP() << NoVirtualMemoryReason();               \
    }                                                        \
  } while (false)

TEST_P(BackendConformanceTest, ReportsItsKind) {
  const std::string kind = GetParam();
  EXPECT_EQ(DeviceTypeName(backend_->device().type), kind);
  EXPECT_EQ(backend_->info().backend, kind);
  EXPECT_FALSE(backend_->info().name.empty());
  if (kind == "cuda") {
    EXPECT_TRUE(absl::StartsWith(backend_->info().uuid, "GPU-"));
  }
  if (kind == "sim") {
    EXPECT_TRUE(absl::StartsWith(backend_->info().uuid, "SIM-"));
  }
  if (kind == "cpu") {
    EXPECT_EQ(backend_->info().uuid, "");
  }
}

TEST_P(BackendConformanceTest, SegmentsRoundTripWithoutOverlap) {
  const std::vector<size_t> sizes = {512, kMiB, 2 * kMiB + 1, 20 * kMiB};
  for (int round = 0; round < 2; ++round) {
    std::vector<std::pair<uintptr_t, size_t>> live;
    for (size_t bytes : sizes) {
      absl::StatusOr<void*> p = backend_->allocate_segment(bytes);
      ASSERT_TRUE(p.ok()) << bytes << ": " << p.status();
      ASSERT_NE(*p, nullptr);
      const std::pair<uintptr_t, size_t> range{reinterpret_cast<uintptr_t>(*p), bytes};
      for (const auto& other : live) EXPECT_FALSE(Overlap(range, other));
      live.push_back(range);
    }
    // Free in reverse order in round 0 and in order in round 1.
    if (round == 0) std::reverse(live.begin(), live.end());
    for (const auto& [p, bytes] : live) {
      backend_->free_segment(reinterpret_cast<void*>(p), bytes);
    }
  }
}

TEST_P(BackendConformanceTest, SegmentsAreAligned) {
  // The contract's 512 bytes; sim promises 2 MiB and cpu a page.
  const size_t want = GetParam() == "sim" ? 2 * kMiB : GetParam() == "cpu" ? 4096 : 512;
  for (size_t bytes : {size_t{1}, size_t{4097}, 3 * kMiB}) {
    absl::StatusOr<void*> p = backend_->allocate_segment(bytes);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % want, 0u) << *p << " for " << bytes;
    backend_->free_segment(*p, bytes);
  }
}

TEST_P(BackendConformanceTest, HostAccessibleMemoryHoldsData) {
  if (!backend_->caps().host_accessible)
    GTEST_SKIP() << "device memory is not host accessible";
  const size_t bytes = 8 * kMiB + 123;
  absl::StatusOr<void*> p = backend_->allocate_segment(bytes);
  ASSERT_TRUE(p.ok()) << p.status();
  auto* data = static_cast<unsigned char*>(*p);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(i * 31 % 251);
  size_t mismatches = 0;
  for (size_t i = 0; i < bytes; ++i) {
    mismatches += data[i] != static_cast<unsigned char>(i * 31 % 251);
  }
  EXPECT_EQ(mismatches, 0u);
  backend_->free_segment(*p, bytes);
}

TEST_P(BackendConformanceTest, MemInfoIsConsistent) {
  const MemInfo before = backend_->mem_info();
  EXPECT_GT(before.total_bytes, 0u);
  EXPECT_LE(before.free_bytes, before.total_bytes);
  const size_t bytes = 8 * kMiB;
  absl::StatusOr<void*> p = backend_->allocate_segment(bytes);
  ASSERT_TRUE(p.ok()) << p.status();
  const MemInfo during = backend_->mem_info();
  EXPECT_EQ(during.total_bytes, before.total_bytes);
  EXPECT_LE(during.free_bytes, during.total_bytes);
  if (GetParam() == "sim") {
    EXPECT_EQ(during.free_bytes, before.free_bytes - bytes);
  }
  backend_->free_segment(*p, bytes);
  if (GetParam() == "sim") {
    EXPECT_EQ(backend_->mem_info().free_bytes, before.free_bytes);
  }
}

TEST_P(BackendConformanceTest, ImpossibleSegmentIsResourceExhaustedAndHarmless) {
  const MemInfo before = backend_->mem_info();
  absl::StatusOr<void*> huge = backend_->allocate_segment(size_t{1} << 50);  // 1 PiB
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  if (GetParam() == "sim") {
    EXPECT_EQ(backend_->mem_info().free_bytes, before.free_bytes);
  }
  // The failure leaves nothing behind (cuda: the sticky error was cleared).
  absl::StatusOr<void*> p = backend_->allocate_segment(kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  backend_->free_segment(*p, kMiB);
}

TEST_P(BackendConformanceTest, CreateStreamFollowsCaps) {
  absl::StatusOr<Stream> a = backend_->create_stream();
  if (!backend_->caps().streams) {
    EXPECT_EQ(a.status().code(), absl::StatusCode::kUnimplemented) << a.status();
    return;
  }
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<Stream> b = backend_->create_stream();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE(a->handle, 0u);
  EXPECT_NE(*a, *b);
  backend_->destroy_stream(*a);
  backend_->destroy_stream(*b);
}

TEST_P(BackendConformanceTest, HostFunctionsRunInOrder) {
  for (Stream stream : {Stream{}, SomeStream()}) {
    // std::mutex, not absl::Mutex: Debian's abseil is not built with ThreadSanitizer,
    // so TSan cannot see absl::Mutex's ordering and would report false races here.
    std::mutex mu;
    std::vector<int> order;
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE(backend_
                      ->launch_host_fn(stream,
                                       [&, i] {
                                         std::lock_guard<std::mutex> lock(mu);
                                         order.push_back(i);
                                       })
                      .ok());
    }
    backend_->synchronize_stream(stream);
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(order.size(), 200u);
    for (int i = 0; i < 200; ++i) EXPECT_EQ(order[i], i);
    DoneWith(stream);
  }
}

TEST_P(BackendConformanceTest, SynchronizeStreamWaitsForQueuedWork) {
  if (!backend_->caps().streams) {
    // Host functions run at once (inside launch_host_fn): nothing to wait for.
    std::atomic<bool> ran{false};
    ASSERT_TRUE(backend_->launch_host_fn(Stream{}, [&ran] { ran.store(true); }).ok());
    backend_->synchronize_stream(Stream{});
    EXPECT_TRUE(ran.load());
    return;
  }
  for (Stream stream : {Stream{}, SomeStream()}) {
    EXPECT_TRUE(WaitsForQueuedWork(*backend_, stream,
                                   [&] { backend_->synchronize_stream(stream); }));
    DoneWith(stream);
  }
}

TEST_P(BackendConformanceTest, RecordedEventCompletes) {
  const Event event = backend_->record_event(Stream{});
  EXPECT_NE(event.handle, 0u);
  backend_->synchronize_event(event);
  EXPECT_TRUE(backend_->event_done(event));
  backend_->release_event(event);
}

TEST_P(BackendConformanceTest, EventCompletesOnlyWhenItsStreamReachesIt) {
  if (!backend_->caps().streams) GTEST_SKIP() << "no streams: events complete at once";
  for (Stream stream : {Stream{}, SomeStream()}) {
    StreamBlocker blocker;
    ASSERT_TRUE(blocker.BlockOn(*backend_, stream).ok());
    std::atomic<bool> after_ran{false};
    ASSERT_TRUE(backend_->launch_host_fn(stream, [&] { after_ran.store(true); }).ok());
    const Event event = backend_->record_event(stream);
    // The stream is held inside the blocker's function, so it cannot have reached the
    // event, however long we look.
    EXPECT_FALSE(backend_->event_done(event));
    std::this_thread::sleep_for(milliseconds(20));
    EXPECT_FALSE(backend_->event_done(event));
    EXPECT_FALSE(after_ran.load());
    blocker.Release();
    backend_->synchronize_event(event);
    EXPECT_TRUE(backend_->event_done(event));
    EXPECT_TRUE(after_ran.load());  // work before the event ran before it completed
    backend_->release_event(event);
    DoneWith(stream);
  }
}

// An event pool (allocator/event_pool.h) records a completed event again instead of
// making a new one: it must then behave as a fresh record on the new stream.
TEST_P(BackendConformanceTest, RerecordedEventCompletesOnlyWhenItsNewStreamReachesIt) {
  const Event event = backend_->record_event(Stream{});
  backend_->synchronize_event(event);
  ASSERT_TRUE(backend_->event_done(event));
  const Stream stream = backend_->caps().streams ? SomeStream() : Stream{};
  std::optional<StreamBlocker> blocker;
  if (backend_->caps().streams) {
    blocker.emplace();
    ASSERT_TRUE(blocker->BlockOn(*backend_, stream).ok());
  }
  if (!backend_->rerecord_event(event, stream)) {
    // Not reusable: nothing changed, the event is still the caller's and completed.
    EXPECT_TRUE(backend_->event_done(event));
    if (blocker) blocker->Release();
    backend_->release_event(event);
    DoneWith(stream);
    return;
  }
  if (blocker) {
    EXPECT_FALSE(backend_->event_done(event));  // the stream is held before it
    blocker->Release();
  }
  backend_->synchronize_event(event);
  EXPECT_TRUE(backend_->event_done(event));
  // And once more, on the same stream, after it completed there.
  ASSERT_TRUE(backend_->rerecord_event(event, stream));
  backend_->synchronize_stream(stream);
  EXPECT_TRUE(backend_->event_done(event));
  backend_->release_event(event);
  DoneWith(stream);
}

TEST_P(BackendConformanceTest, EventMayBeReleasedBeforeItCompletes) {
  if (!backend_->caps().streams) GTEST_SKIP() << "no streams: events complete at once";
  Stream stream = SomeStream();
  StreamBlocker blocker;
  ASSERT_TRUE(blocker.BlockOn(*backend_, stream).ok());
  std::vector<Event> events;
  for (int i = 0; i < 16; ++i) events.push_back(backend_->record_event(stream));
  for (Event event : events) backend_->release_event(event);  // all still pending
  std::atomic<bool> ran{false};
  ASSERT_TRUE(backend_->launch_host_fn(stream, [&] { ran.store(true); }).ok());
  blocker.Release();
  backend_->synchronize_stream(stream);  // the stream passes the released events
  EXPECT_TRUE(ran.load());
  DoneWith(stream);
}

TEST_P(BackendConformanceTest, DestroyStreamRunsQueuedWork) {
  if (!backend_->caps().streams) GTEST_SKIP() << "no streams to destroy";
  absl::StatusOr<Stream> stream = backend_->create_stream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_TRUE(WaitsForQueuedWork(*backend_, *stream,
                                 [&] { backend_->destroy_stream(*stream); }));
}

// Many threads using one backend at once; meant for ThreadSanitizer as much as for
// the checks it makes.
TEST_P(BackendConformanceTest, ConcurrentUseIsSafe) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 40;
  std::atomic<int> host_fns{0};
  std::atomic<int> bad_data{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Stream stream{};
      if (backend_->caps().streams) {
        absl::StatusOr<Stream> s = backend_->create_stream();
        if (s.ok()) stream = *s;
      }
      for (int round = 0; round < kRounds; ++round) {
        const size_t bytes = (1 + (t + round) % 3) * kMiB;
        absl::StatusOr<void*> p = backend_->allocate_segment(bytes);
        if (!p.ok()) {
          ADD_FAILURE() << p.status();
          continue;
        }
        if (backend_->caps().host_accessible) {
          auto* bytes_p = static_cast<unsigned char*>(*p);
          std::memset(bytes_p, t + 1, bytes);
          if (bytes_p[0] != t + 1 || bytes_p[bytes - 1] != t + 1) ++bad_data;
        }
        EXPECT_TRUE(backend_->launch_host_fn(stream, [&] { ++host_fns; }).ok());
        const Event event = backend_->record_event(stream);
        (void)backend_->event_done(event);
        backend_->synchronize_event(event);
        EXPECT_TRUE(backend_->event_done(event));
        if (backend_->rerecord_event(event, stream)) {  // reused, as an event pool does
          (void)backend_->event_done(event);
          backend_->synchronize_event(event);
          EXPECT_TRUE(backend_->event_done(event));
        }
        backend_->release_event(event);
        (void)backend_->mem_info();
        backend_->free_segment(*p, bytes);
      }
      if (stream.handle != 0) backend_->destroy_stream(stream);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(host_fns.load(), kThreads * kRounds);
  EXPECT_EQ(bad_data.load(), 0);
  if (GetParam() == "sim") {
    EXPECT_EQ(static_cast<SimBackend&>(*backend_).used_bytes(), 0u);
  }
}

// ---------------------------------------------------------------------------------
// Virtual memory (caps().virtual_memory): what expandable segments rest on.

TEST_P(BackendConformanceTest, VirtualMemoryFollowsCaps) {
  if (!backend_->caps().virtual_memory) {
    EXPECT_EQ(backend_->granularity(), 0u);
    EXPECT_EQ(backend_->reserve_address(2 * kMiB).status().code(),
              absl::StatusCode::kUnimplemented);
    int x = 0;
    EXPECT_EQ(backend_->map(&x, 2 * kMiB).code(), absl::StatusCode::kUnimplemented);
    return;
  }
  const size_t g = backend_->granularity();
  EXPECT_GE(g, 2 * kMiB);  // sim: exactly 2 MiB; cuda: the driver's, at least 2 MiB
  EXPECT_EQ(g % 4096, 0u);
  if (GetParam() == "sim") {
    EXPECT_EQ(g, 2 * kMiB);
  }
}

// Maps two adjacent ranges, unmaps a range that takes part of each, maps the hole
// again, grows past the end, and unmaps everything in one call that spans four
// earlier maps: the allocator grows and shrinks expandable segments in these shapes.
TEST_P(BackendConformanceTest, VirtualMemoryMapsAdjacentRangesAndUnmapsAcrossThem) {
  SKIP_WITHOUT_VIRTUAL_MEMORY();
  const size_t g = backend_->granularity();
  const MemInfo before = backend_->mem_info();
  absl::StatusOr<void*> r = backend_->reserve_address(8 * g);
  ASSERT_TRUE(r.ok()) << r.status();
  auto* base = static_cast<char*>(*r);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % g, 0u);

  ASSERT_STATUS_OK(backend_->map(base, 2 * g));
  absl::Status second = backend_->map(base + 2 * g, 2 * g);  // adjacent to the first
  ASSERT_TRUE(second.ok()) << second;
  if (GetParam() == "sim") {
    EXPECT_EQ(backend_->mem_info().free_bytes, before.free_bytes - 4 * g);
  }
  // Each granule gets its own value, so a granule mapped at the wrong place shows.
  for (size_t i = 0; i < 4; ++i) {
    const auto value = static_cast<unsigned char>(0x10 + i);
    ASSERT_STATUS_OK(FillDevice(*backend_, base + i * g, value, g));
  }
  for (size_t i = 0; i < 4; ++i) {
    const auto value = static_cast<unsigned char>(0x10 + i);
    EXPECT_EQ(CheckDevice(*backend_, base + i * g, g, value), "") << "granule " << i;
  }

  // Half of each mapping goes; the other halves keep their data. Unmapped memory stays
  // charged in the handle reserve until it is released.
  backend_->unmap(base + g, 2 * g);
  backend_->release_handle_reserve();
  if (GetParam() == "sim") {
    EXPECT_EQ(backend_->mem_info().free_bytes, before.free_bytes - 2 * g);
  }
  EXPECT_EQ(CheckDevice(*backend_, base, g, 0x10), "");
  EXPECT_EQ(CheckDevice(*backend_, base + 3 * g, g, 0x13), "");
  // The hole is unmapped (it can be mapped again), the rest is not (it cannot).
  absl::Status refill = backend_->map(base + g, 2 * g);
  ASSERT_TRUE(refill.ok()) << refill;
  EXPECT_EQ(backend_->map(base, g).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->map(base + 3 * g, g).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_STATUS_OK(FillDevice(*backend_, base + g, 0x7e, 2 * g));
  EXPECT_EQ(CheckDevice(*backend_, base + g, 2 * g, 0x7e), "");
  EXPECT_EQ(CheckDevice(*backend_, base, g, 0x10), "");
  EXPECT_EQ(CheckDevice(*backend_, base + 3 * g, g, 0x13), "");

  // Growing past the end of what is mapped, as an expandable segment does.
  ASSERT_STATUS_OK(backend_->map(base + 4 * g, 4 * g));
  ASSERT_STATUS_OK(FillDevice(*backend_, base + 4 * g, 0x44, 4 * g));
  EXPECT_EQ(CheckDevice(*backend_, base + 4 * g, 4 * g, 0x44), "");

  backend_->unmap(base, 8 * g);  // spans all four earlier maps
  backend_->release_handle_reserve();
  if (GetParam() == "sim") {
    EXPECT_EQ(backend_->mem_info().free_bytes, before.free_bytes);
  }
  // All of it is unmapped: mapped again whole, in one call.
  ASSERT_STATUS_OK(backend_->map(base, 8 * g));
  backend_->unmap(base, 8 * g);
  backend_->release_address(base, 8 * g);
}

TEST_P(BackendConformanceTest, VirtualMemoryRejectsBadArgumentsAndLeavesNothingBehind) {
  SKIP_WITHOUT_VIRTUAL_MEMORY();
  const size_t g = backend_->granularity();
  EXPECT_EQ(backend_->reserve_address(0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->reserve_address(g + 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<void*> r = backend_->reserve_address(4 * g);
  ASSERT_TRUE(r.ok()) << r.status();
  auto* base = static_cast<char*>(*r);
  absl::StatusOr<void*> segment = backend_->allocate_segment(g);
  ASSERT_TRUE(segment.ok()) << segment.status();
  const MemInfo before = backend_->mem_info();

  auto expect_invalid = [&](void* p, size_t bytes) {
    absl::Status status = backend_->map(p, bytes);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << p << " " << bytes;
    EXPECT_TRUE(absl::StrContains(status.message(), absl::StrFormat("%p", p))) << status;
  };
  expect_invalid(base + 4096, g);       // misaligned address
  expect_invalid(base, 4096);           // size not a multiple of the granularity
  expect_invalid(base, 0);              // empty
  expect_invalid(base + 3 * g, 2 * g);  // runs past the end of the reservation
  expect_invalid(*segment, g);          // a segment, not reserved address space
  ASSERT_STATUS_OK(backend_->map(base + g, g));
  expect_invalid(base, 2 * g);          // overlaps that mapping from below
  expect_invalid(base + g, 2 * g);      // and from its start
  if (GetParam() == "sim") {
    EXPECT_EQ(backend_->mem_info().free_bytes, before.free_bytes - g);
  }
  // Nothing of the refused calls stayed mapped: the whole range maps around it.
  ASSERT_STATUS_OK(backend_->map(base, g));
  ASSERT_STATUS_OK(backend_->map(base + 2 * g, 2 * g));
  backend_->unmap(base, 4 * g);
  backend_->release_address(base, 4 * g);
  backend_->free_segment(*segment, g);
}

// A map larger than the memory left is ResourceExhausted and takes back the granules
// it did get. The device is first filled with a segment, so the map fails fast.
TEST_P(BackendConformanceTest, VirtualMemoryExhaustionIsResourceExhaustedAndUndone) {
  SKIP_WITHOUT_VIRTUAL_MEMORY();
  const size_t g = backend_->granularity();
  // Leave about `margin` free; cudaMalloc may refuse the last bytes, so back off.
  void* filler = nullptr;
  size_t filler_bytes = 0;
  for (size_t margin = 16 * g; margin <= 512 * g && filler == nullptr; margin *= 2) {
    const size_t free_bytes = backend_->mem_info().free_bytes;
    if (free_bytes <= margin) break;
    filler_bytes = free_bytes - margin;
    absl::StatusOr<void*> p = backend_->allocate_segment(filler_bytes);
    if (p.ok()) filler = *p;
  }
  ASSERT_NE(filler, nullptr) << "could not fill the device with one segment";
  const MemInfo before = backend_->mem_info();
  const size_t va = (before.free_bytes / g + 8) * g;  // more than is left
  absl::StatusOr<void*> r = backend_->reserve_address(va);
  ASSERT_TRUE(r.ok()) << r.status();

  absl::Status over = backend_->map(*r, va);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  backend_->release_handle_reserve();  // what the failed map made is kept for reuse
  const MemInfo after = backend_->mem_info();
  if (GetParam() == "sim") {
    EXPECT_EQ(after.free_bytes, before.free_bytes);
  } else {
    // The driver's own figures move a little; what the failed map took came back.
    EXPECT_GE(after.free_bytes + 4 * g, before.free_bytes)
        << before.free_bytes << " free before the map, " << after.free_bytes << " after";
  }
  // Nothing stayed mapped: the first granule maps again.
  absl::Status small = backend_->map(*r, g);
  EXPECT_TRUE(small.ok()) << small;
  if (small.ok()) backend_->unmap(*r, g);
  backend_->release_address(*r, va);
  backend_->free_segment(filler, filler_bytes);
}

// Threads reserving, mapping and unmapping at once; meant for ThreadSanitizer too.
TEST_P(BackendConformanceTest, ConcurrentVirtualMemoryIsSafe) {
  SKIP_WITHOUT_VIRTUAL_MEMORY();
  const size_t g = backend_->granularity();
  constexpr int kThreads = 4;
  constexpr int kRounds = 12;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      absl::StatusOr<void*> r = backend_->reserve_address(4 * g);
      if (!r.ok()) {
        ++failures;
        return;
      }
      auto* base = static_cast<char*>(*r);
      const auto value = static_cast<unsigned char>(t + 1);
      for (int round = 0; round < kRounds; ++round) {
        if (!backend_->map(base, 2 * g).ok() || !backend_->map(base + 2 * g, g).ok()) {
          ++failures;
          break;
        }
        if (!FillDevice(*backend_, base, value, 3 * g).ok() ||
            !CheckDevice(*backend_, base, 3 * g, value).empty()) {
          ++failures;
        }
        backend_->unmap(base + g, 2 * g);
        backend_->unmap(base, g);
      }
      backend_->release_address(base, 4 * g);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  backend_->release_handle_reserve();
  if (GetParam() == "sim") {
    EXPECT_EQ(static_cast<SimBackend&>(*backend_).used_bytes(), 0u);
  }
}

// The physical-handle reserve (allocator/driver_calls.h): unmapped granules keep their
// memory, the next map anywhere takes them instead of creating new ones, and
// release_handle_reserve gives them back. Counted as the driver calls they are.
TEST_P(BackendConformanceTest, UnmappedGranulesAreMappedAgainWithoutCreating) {
  SKIP_WITHOUT_VIRTUAL_MEMORY();
  const size_t g = backend_->granularity();
  absl::StatusOr<void*> r = backend_->reserve_address(8 * g);
  ASSERT_TRUE(r.ok()) << r.status();
  auto* base = static_cast<char*>(*r);
  const DriverCallStats before = backend_->driver_calls();
  auto delta = [&](DriverCall c) { return backend_->driver_calls().count(c) - before.count(c); };
  ASSERT_STATUS_OK(backend_->map(base, 4 * g));
  EXPECT_EQ(delta(DriverCall::kCreate), 4);
  EXPECT_EQ(delta(DriverCall::kMap), 4);
  EXPECT_EQ(delta(DriverCall::kSetAccess), 1);
  backend_->unmap(base, 4 * g);
  EXPECT_EQ(delta(DriverCall::kUnmap), 1);
  EXPECT_EQ(backend_->handle_reserve_bytes(), 4 * g);
  EXPECT_EQ(backend_->driver_calls().handle_reserve_bytes, static_cast<int64_t>(4 * g));
  // Elsewhere in the range, from the reserve: no cuMemCreate.
  ASSERT_STATUS_OK(backend_->map(base + 4 * g, 4 * g));
  EXPECT_EQ(delta(DriverCall::kCreate), 4);
  EXPECT_EQ(backend_->handle_reserve_bytes(), 0u);
  ASSERT_STATUS_OK(FillDevice(*backend_, base + 4 * g, 0x3c, 4 * g));
  EXPECT_EQ(CheckDevice(*backend_, base + 4 * g, 4 * g, 0x3c), "");
  backend_->unmap(base + 4 * g, 4 * g);
  EXPECT_EQ(backend_->release_handle_reserve(), 4 * g);
  EXPECT_EQ(delta(DriverCall::kRelease), 4);
  EXPECT_EQ(backend_->handle_reserve_bytes(), 0u);
  backend_->release_address(base, 8 * g);
}

// The allocator's expandable segments on this backend, end to end: reserve, map as
// the segment grows, the memory holds data, unmap on empty_cache.
TEST_P(BackendConformanceTest, ExpandableSegmentsWorkThroughTheAllocator) {
  SKIP_WITHOUT_VIRTUAL_MEMORY();
  const size_t g = backend_->granularity();
  Config base;
  if (GetParam() == "sim") {
    base = SimConfig();
  } else {
    base.backend = BackendKind::kCuda;
  }
  absl::StatusOr<Config> config = ParseConfig("expandable_segments:true", base);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeForKind(GetParam());
  ASSERT_TRUE(backend.ok()) << backend.status();
  CachingAllocator alloc(std::move(*backend), *config);

  std::vector<std::pair<void*, size_t>> live;
  unsigned char value = 1;
  // Small and large pools; a size past a granule boundary; one that must map more.
  const size_t sizes[] = {4096, 3 * kMiB, 5 * g + 12345, 24 * kMiB, 700 * 1024};
  for (size_t bytes : sizes) {
    void* p = alloc.allocate(bytes);
    ASSERT_NE(p, nullptr);
    ASSERT_STATUS_OK(FillDevice(alloc.backend(), p, value, bytes));
    live.emplace_back(p, bytes);
    ++value;
  }
  value = 1;
  for (const auto& [p, bytes] : live) {
    EXPECT_EQ(CheckDevice(alloc.backend(), p, bytes, value), "");
    ++value;
  }
  const DeviceStats during = alloc.stats();
  EXPECT_GT(during.reserved_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(during.reserved_bytes[kAggregatePool].current % static_cast<int64_t>(g), 0);
  EXPECT_TRUE(alloc.validate().ok()) << alloc.validate();
  // Free every other one and allocate into the holes.
  for (size_t i = 0; i < live.size(); i += 2) alloc.free(live[i].first);
  void* again = alloc.allocate(2 * kMiB);
  ASSERT_NE(again, nullptr);
  ASSERT_STATUS_OK(FillDevice(alloc.backend(), again, 0x5c, 2 * kMiB));
  EXPECT_EQ(CheckDevice(alloc.backend(), again, 2 * kMiB, 0x5c), "");
  for (size_t i = 1; i < live.size(); i += 2) {
    EXPECT_EQ(CheckDevice(alloc.backend(), live[i].first, live[i].second,
                          static_cast<unsigned char>(i + 1)),
              "");
    alloc.free(live[i].first);
  }
  alloc.free(again);
  EXPECT_TRUE(alloc.validate().ok()) << alloc.validate();
  alloc.empty_cache();
  EXPECT_EQ(alloc.stats().reserved_bytes[kAggregatePool].current, 0);
  EXPECT_TRUE(alloc.validate().ok()) << alloc.validate();
}

INSTANTIATE_TEST_SUITE_P(AllBackends, BackendConformanceTest,
                         ::testing::Values("cpu", "sim", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// ---------------------------------------------------------------------------------
// The sim backend's own promises.

TEST(SimBackendTest, CapacityIsEnforcedWithoutCharging) {
  auto sim = NewSim(64 * kMiB);
  absl::StatusOr<void*> a = sim->allocate_segment(48 * kMiB);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<void*> b = sim->allocate_segment(32 * kMiB);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  const std::string message(b.status().message());
  EXPECT_TRUE(absl::StrContains(message, "33554432")) << message;  // the request
  EXPECT_TRUE(absl::StrContains(message, "50331648")) << message;  // used
  EXPECT_TRUE(absl::StrContains(message, "67108864")) << message;  // capacity
  EXPECT_EQ(sim->used_bytes(), 48 * kMiB);
  EXPECT_EQ(sim->mem_info().free_bytes, 16 * kMiB);
  // Exactly the rest still fits; one byte more does not.
  absl::StatusOr<void*> c = sim->allocate_segment(16 * kMiB);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(sim->mem_info().free_bytes, 0u);
  EXPECT_EQ(sim->allocate_segment(1).status().code(),
            absl::StatusCode::kResourceExhausted);
  sim->free_segment(*a, 48 * kMiB);
  sim->free_segment(*c, 16 * kMiB);
  EXPECT_EQ(sim->used_bytes(), 0u);
}

TEST(SimBackendTest, CapacityCountsRequestedBytesNotRoundedOnes) {
  auto sim = NewSim(64 * kMiB);
  absl::StatusOr<void*> p = sim->allocate_segment(kMiB + 1);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(sim->used_bytes(), kMiB + 1);
  EXPECT_EQ(sim->mem_info().free_bytes, 64 * kMiB - kMiB - 1);
  sim->free_segment(*p, kMiB + 1);
}

TEST(SimBackendTest, ZeroBytesIsInvalid) {
  auto sim = NewSim();
  EXPECT_EQ(sim->allocate_segment(0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SimBackendTest, FailNthFailsExactlyTheNthAttempt) {
  SimOptions options;
  options.capacity = 64 * kMiB;
  options.fail_nth = 3;
  auto sim = NewSimBackend(options);
  std::vector<void*> live;
  for (int attempt = 1; attempt <= 6; ++attempt) {
    absl::StatusOr<void*> p = sim->allocate_segment(kMiB);
    if (attempt == 3) {
      ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
      EXPECT_TRUE(absl::StrContains(p.status().message(), "injected")) << p.status();
    } else {
      ASSERT_TRUE(p.ok()) << "attempt " << attempt << ": " << p.status();
      live.push_back(*p);
    }
  }
  EXPECT_EQ(sim->segment_alloc_attempts(), 6u);
  EXPECT_EQ(sim->injected_failures(), 1u);
  EXPECT_EQ(sim->used_bytes(), 5 * kMiB);  // the injected failure charged nothing

  // Counting restarts at set_failure_injection.
  sim->set_failure_injection(2, 0, 0);
  absl::StatusOr<void*> first = sim->allocate_segment(kMiB);
  ASSERT_TRUE(first.ok()) << first.status();
  live.push_back(*first);
  EXPECT_EQ(sim->allocate_segment(kMiB).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(sim->injected_failures(), 2u);
  EXPECT_EQ(sim->segment_alloc_attempts(), 8u);
  for (void* p : live) sim->free_segment(p, kMiB);
}

// Which of `n` attempts fail with probability p under `seed` (true = failed).
std::vector<bool> FailurePattern(uint64_t seed, double p, int n) {
  SimOptions options;
  options.capacity = 64 * kMiB;
  options.fail_probability = p;
  options.seed = seed;
  auto sim = NewSimBackend(options);
  std::vector<bool> failed;
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<void*> segment = sim->allocate_segment(kMiB);
    failed.push_back(!segment.ok());
    if (segment.ok()) {
      sim->free_segment(*segment, kMiB);
    } else {
      EXPECT_TRUE(absl::StrContains(segment.status().message(), "injected"));
    }
  }
  EXPECT_EQ(sim->injected_failures(),
            static_cast<uint64_t>(std::count(failed.begin(), failed.end(), true)));
  return failed;
}

TEST(SimBackendTest, FailProbabilityIsDeterministicForASeed) {
  const std::vector<bool> a = FailurePattern(42, 0.5, 200);
  const std::vector<bool> b = FailurePattern(42, 0.5, 200);
  EXPECT_EQ(a, b);
  const auto failures = std::count(a.begin(), a.end(), true);
  EXPECT_GT(failures, 0);
  EXPECT_LT(failures, 200);
  EXPECT_NE(FailurePattern(43, 0.5, 200), a);  // another seed, another pattern
  const std::vector<bool> always = FailurePattern(1, 1.0, 20);
  EXPECT_EQ(std::count(always.begin(), always.end(), true), 20);
  const std::vector<bool> never = FailurePattern(1, 0.0, 20);
  EXPECT_EQ(std::count(never.begin(), never.end(), true), 0);
}

TEST(SimBackendTest, SetFailureInjectionReseeds) {
  SimOptions options;
  options.capacity = 64 * kMiB;
  auto sim = NewSimBackend(options);
  auto pattern = [&] {
    std::vector<bool> failed;
    for (int i = 0; i < 64; ++i) {
      absl::StatusOr<void*> p = sim->allocate_segment(kMiB);
      failed.push_back(!p.ok());
      if (p.ok()) sim->free_segment(*p, kMiB);
    }
    return failed;
  };
  sim->set_failure_injection(0, 0.5, 7);
  const std::vector<bool> first = pattern();
  sim->set_failure_injection(0, 0.5, 7);
  EXPECT_EQ(pattern(), first);
}

TEST(SimBackendTest, LatencyIsApplied) {
  SimOptions options;
  options.capacity = 64 * kMiB;
  options.alloc_latency_ns = 20'000'000;  // 20 ms
  options.free_latency_ns = 30'000'000;   // 30 ms
  auto sim = NewSimBackend(options);
  Clock::time_point start = Clock::now();
  absl::StatusOr<void*> p = sim->allocate_segment(kMiB);
  EXPECT_GE(Clock::now() - start, milliseconds(20));
  ASSERT_TRUE(p.ok());
  start = Clock::now();
  sim->free_segment(*p, kMiB);
  EXPECT_GE(Clock::now() - start, milliseconds(30));
}

TEST(SimBackendTest, FirstFitFromTheLowestAddressAndCoalescing) {
  auto sim = NewSim();
  auto alloc = [&](size_t bytes) {
    absl::StatusOr<void*> p = sim->allocate_segment(bytes);
    EXPECT_TRUE(p.ok()) << p.status();
    return reinterpret_cast<uintptr_t>(p.value_or(nullptr));
  };
  const uintptr_t a = alloc(2 * kMiB);
  const uintptr_t b = alloc(2 * kMiB);
  const uintptr_t c = alloc(2 * kMiB + 1);  // takes 4 MiB of addresses
  const uintptr_t d = alloc(kMiB);
  EXPECT_EQ(b, a + 2 * kMiB);
  EXPECT_EQ(c, b + 2 * kMiB);
  EXPECT_EQ(d, c + 4 * kMiB);
  sim->free_segment(reinterpret_cast<void*>(a), 2 * kMiB);
  sim->free_segment(reinterpret_cast<void*>(b), 2 * kMiB);
  // a and b coalesced: 4 MiB fits at a, below everything else.
  EXPECT_EQ(alloc(4 * kMiB), a);
  // Freed space is reused before fresh space: c's range comes back to c.
  sim->free_segment(reinterpret_cast<void*>(c), 2 * kMiB + 1);
  EXPECT_EQ(alloc(3 * kMiB), c);
}

// A scripted mix of allocations and frees; returns every address handed out, as an
// offset from the first one.
std::vector<uintptr_t> ScriptedOffsets(SimBackend& sim) {
  std::mt19937_64 rng(1234);  // the script, not the backend, is random
  std::vector<std::pair<void*, size_t>> live;
  std::vector<uintptr_t> addresses;
  for (int step = 0; step < 300; ++step) {
    if (!live.empty() && rng() % 3 == 0) {
      const size_t victim = rng() % live.size();
      sim.free_segment(live[victim].first, live[victim].second);
      live.erase(live.begin() + victim);
      continue;
    }
    const size_t bytes = (1 + rng() % 12) * kMiB + rng() % 4096;
    absl::StatusOr<void*> p = sim.allocate_segment(bytes);
    if (!p.ok()) {
      addresses.push_back(0);  // failures must repeat too
      continue;
    }
    addresses.push_back(reinterpret_cast<uintptr_t>(*p));
    live.emplace_back(*p, bytes);
  }
  for (auto& [p, bytes] : live) sim.free_segment(p, bytes);
  std::vector<uintptr_t> offsets;
  for (uintptr_t a : addresses)
    offsets.push_back(a == 0 ? UINTPTR_MAX : a - addresses[0]);
  return offsets;
}

TEST(SimBackendTest, SameCallsGiveSameOffsets) {
  auto first = NewSim(512 * kMiB);
  auto second = NewSim(512 * kMiB);
  const std::vector<uintptr_t> a = ScriptedOffsets(*first);
  const std::vector<uintptr_t> b = ScriptedOffsets(*second);
  EXPECT_EQ(a, b);
  // And the script did reuse freed ranges (some offset repeats), so the test covers
  // the free-range map, not only a bump pointer.
  std::vector<uintptr_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_NE(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
}

TEST(SimBackendTest, FreedMemoryReturnsToTheOs) {
  auto sim = NewSim();
  absl::StatusOr<void*> p = sim->allocate_segment(2 * kMiB);
  ASSERT_TRUE(p.ok());
  std::memset(*p, 0xab, 2 * kMiB);
  sim->free_segment(*p, 2 * kMiB);
  absl::StatusOr<void*> again = sim->allocate_segment(2 * kMiB);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(*again, *p);  // first fit gives the same range back
  const auto* bytes = static_cast<const unsigned char*>(*again);
  // MADV_DONTNEED dropped the pages: they read back as zeros.
  EXPECT_EQ(std::count(bytes, bytes + 2 * kMiB, 0), static_cast<long>(2 * kMiB));
  sim->free_segment(*again, 2 * kMiB);
}

TEST(SimBackendTest, InfoIsStablePerIndex) {
  auto a = NewSim(kSimCapacity, 3);
  auto b = NewSim(kSimCapacity, 3);
  auto c = NewSim(kSimCapacity, 4);
  EXPECT_EQ(a->device(), (DeviceId{DeviceType::kSim, 3}));
  EXPECT_EQ(a->info().name, "devmem simulated device");
  EXPECT_EQ(a->info().backend, "sim");
  EXPECT_EQ(a->info().uuid, b->info().uuid);
  EXPECT_NE(a->info().uuid, c->info().uuid);
  EXPECT_EQ(a->info().uuid.size(),
            std::string("SIM-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx").size());
  const Capabilities caps = a->caps();
  EXPECT_TRUE(caps.streams);
  EXPECT_TRUE(caps.virtual_memory);
  EXPECT_TRUE(caps.host_accessible);
}

TEST(SimBackendTest, StreamHandlesCountUpAndDieWithDestroy) {
  auto sim = NewSim();
  for (uintptr_t want = 1; want <= 3; ++want) {
    absl::StatusOr<Stream> s = sim->create_stream();
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->handle, want);
  }
  absl::Status unknown = sim->launch_host_fn(Stream{99}, [] {});
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(unknown.message(), "99")) << unknown;
  sim->destroy_stream(Stream{2});
  EXPECT_EQ(sim->launch_host_fn(Stream{2}, [] {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(sim->launch_host_fn(Stream{3}, [] {}).ok());
  absl::StatusOr<Stream> next = sim->create_stream();
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->handle, 4u);  // handles are never reused
}

TEST(SimBackendTest, EachStreamHasItsOwnWorker) {
  auto sim = NewSim();
  absl::StatusOr<Stream> a = sim->create_stream();
  absl::StatusOr<Stream> b = sim->create_stream();
  ASSERT_TRUE(a.ok() && b.ok());
  // Stream a is held; b and the default stream still run their work.
  StreamBlocker blocker;
  ASSERT_TRUE(blocker.BlockOn(*sim, *a).ok());
  std::atomic<bool> a_ran{false};
  ASSERT_TRUE(sim->launch_host_fn(*a, [&] { a_ran.store(true); }).ok());
  std::thread::id b_thread, default_thread;
  ASSERT_TRUE(
      sim->launch_host_fn(*b, [&] { b_thread = std::this_thread::get_id(); }).ok());
  ASSERT_TRUE(
      sim->launch_host_fn(Stream{}, [&] { default_thread = std::this_thread::get_id(); })
          .ok());
  sim->synchronize_stream(*b);
  sim->synchronize_stream(Stream{});
  EXPECT_FALSE(a_ran.load());
  EXPECT_NE(b_thread, std::thread::id());
  EXPECT_NE(b_thread, std::this_thread::get_id());
  EXPECT_NE(default_thread, std::this_thread::get_id());
  EXPECT_NE(default_thread, b_thread);
  blocker.Release();
  sim->synchronize_stream(*a);
  EXPECT_TRUE(a_ran.load());
}

TEST(SimBackendTest, DestructorRunsQueuedWork) {
  for (bool default_stream : {true, false}) {
    auto sim = NewSim();
    absl::StatusOr<Stream> s = sim->create_stream();
    ASSERT_TRUE(s.ok());
    Backend& backend = *sim;
    EXPECT_TRUE(WaitsForQueuedWork(backend, default_stream ? Stream{} : *s,
                                   [&] { sim.reset(); }));
  }
}

TEST(SimBackendTest, VirtualMemoryMapChargesAndUnmapReleases) {
  auto sim = NewSim(64 * kMiB);
  const size_t g = sim->granularity();
  ASSERT_EQ(g, 2 * kMiB);
  absl::StatusOr<void*> r = sim->reserve_address(8 * g);
  ASSERT_TRUE(r.ok()) << r.status();
  auto* base = static_cast<char*>(*r);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % g, 0u);
  EXPECT_EQ(sim->used_bytes(), 0u);  // reserving charges nothing

  ASSERT_TRUE(sim->map(base, 2 * g).ok());
  EXPECT_EQ(sim->used_bytes(), 2 * g);
  EXPECT_EQ(sim->mem_info().free_bytes, 64 * kMiB - 2 * g);
  std::memset(base, 0x5a, 2 * g);
  ASSERT_TRUE(sim->map(base + 2 * g, g).ok());  // growing next to a mapping
  std::memset(base + 2 * g, 0x5a, g);
  EXPECT_EQ(sim->used_bytes(), 3 * g);

  // Unmap part of it: the charge drops once the handle reserve is released, and the
  // pages come back as zeros.
  sim->unmap(base + g, 2 * g);
  EXPECT_EQ(sim->used_bytes(), 3 * g);
  EXPECT_EQ(sim->release_handle_reserve(), 2 * g);
  EXPECT_EQ(sim->used_bytes(), g);
  EXPECT_EQ(static_cast<unsigned char>(base[0]), 0x5a);
  ASSERT_TRUE(sim->map(base + g, g).ok());
  EXPECT_EQ(base[g], 0);
  sim->unmap(base, 2 * g);
  sim->release_handle_reserve();
  EXPECT_EQ(sim->used_bytes(), 0u);

  sim->release_address(base, 8 * g);
  // The range went back: first fit hands the same addresses out again.
  absl::StatusOr<void*> again = sim->reserve_address(8 * g);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *r);
  sim->release_address(*again, 8 * g);
}

// The conformance case VirtualMemoryRejectsBadArgumentsAndLeavesNothingBehind covers
// bad map arguments for every backend; what only the sim can show is here.
TEST(SimBackendTest, VirtualMemoryRefusalsChargeNothing) {
  auto sim = NewSim(64 * kMiB);
  const size_t g = sim->granularity();
  // More address space than the reservation holds: exhausted, not a crash.
  EXPECT_EQ(sim->reserve_address(size_t{1} << 60).status().code(),
            absl::StatusCode::kResourceExhausted);
  absl::StatusOr<void*> r = sim->reserve_address(4 * g);
  ASSERT_TRUE(r.ok());
  auto* base = static_cast<char*>(*r);
  ASSERT_TRUE(sim->map(base, 2 * g).ok());
  EXPECT_EQ(sim->map(base + g, 2 * g).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sim->map(base + 4096, g).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sim->used_bytes(), 2 * g);  // errors charged nothing
  sim->unmap(base, 2 * g);
  sim->release_handle_reserve();
  EXPECT_EQ(sim->used_bytes(), 0u);
  sim->release_address(base, 4 * g);
}

TEST(SimBackendTest, VirtualMemoryMapIsBoundedByCapacity) {
  auto sim = NewSim(8 * kMiB);
  const size_t g = sim->granularity();
  absl::StatusOr<void*> r = sim->reserve_address(32 * kMiB);  // more than capacity: fine
  ASSERT_TRUE(r.ok()) << r.status();
  auto* base = static_cast<char*>(*r);
  ASSERT_TRUE(sim->map(base, 8 * kMiB).ok());
  absl::Status over = sim->map(base + 8 * kMiB, g);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_EQ(sim->used_bytes(), 8 * kMiB);
  // Segments and mappings share the one capacity.
  EXPECT_EQ(sim->allocate_segment(kMiB).status().code(),
            absl::StatusCode::kResourceExhausted);
  sim->unmap(base, 8 * kMiB);
  sim->release_address(base, 32 * kMiB);
}

TEST(SimBackendTest, ConcurrentSegmentsNeverOverlap) {
  auto sim = NewSim(512 * kMiB);
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<std::pair<unsigned char*, size_t>> live;
      for (int i = 0; i < 150; ++i) {
        if (live.size() > 4 || (!live.empty() && rng() % 2 == 0)) {
          auto [p, bytes] = live.back();
          live.pop_back();
          // Every page still holds this thread's mark: no one else got this memory.
          // (One byte a page: overlapping segments share whole pages, and touching
          // every byte is slow under ThreadSanitizer.)
          for (size_t i = 0; i < bytes; i += 4096) {
            if (p[i] != static_cast<unsigned char>(t + 1)) ++corrupted;
          }
          sim->free_segment(p, bytes);
          continue;
        }
        const size_t bytes = (1 + rng() % 4) * kMiB;
        absl::StatusOr<void*> p = sim->allocate_segment(bytes);
        ASSERT_TRUE(p.ok()) << p.status();
        auto* data = static_cast<unsigned char*>(*p);
        for (size_t i = 0; i < bytes; i += 4096)
          data[i] = static_cast<unsigned char>(t + 1);
        live.emplace_back(static_cast<unsigned char*>(*p), bytes);
      }
      for (auto [p, bytes] : live) sim->free_segment(p, bytes);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(corrupted.load(), 0);
  EXPECT_EQ(sim->used_bytes(), 0u);
}

// Device indices: MakeBackend makes sim:0 .. sim:(sim_devices - 1) and refuses the
// rest with an error naming the key (the C ABI would otherwise make a device for any
// int, each reserving 16x sim_capacity of address space).
TEST(SimBackendFactoryTest, IndicesBeyondSimDevicesAreInvalid) {
  absl::StatusOr<Config> config = ParseConfig("backend:sim,sim_capacity:64MiB,sim_devices:3");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::unique_ptr<Backend>> last = MakeBackend(*config, 2);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ((*last)->device(), (DeviceId{DeviceType::kSim, 2}));
  for (int index : {3, 64, 1 << 20, INT32_MAX}) {
    absl::StatusOr<std::unique_ptr<Backend>> b = MakeBackend(*config, index);
    ASSERT_FALSE(b.ok()) << index;
    EXPECT_TRUE(absl::IsInvalidArgument(b.status())) << b.status();
    EXPECT_TRUE(absl::StrContains(b.status().message(), absl::StrCat("sim:", index)))
        << b.status();
    EXPECT_TRUE(absl::StrContains(b.status().message(), "sim_devices is 3")) << b.status();
  }
}

// Contract violations end the process with a message (they are devmem bugs).
class SimBackendDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// Not a contract violation: a simulated device whose address space cannot be reserved
// is an error the caller gets back (and MakeBackend passes on), never an abort. Run in
// a child process under an address-space limit just above what it already uses; the
// child exits 0 only when the error came back, naming the device and the cause.
// The child's side of FailedReservationIsAnErrorNotAnAbort: its exit status.
int CreateSimUnderAddressSpaceLimit() {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  unsigned long pages = 0;
  if (statm == nullptr || std::fscanf(statm, "%lu", &pages) != 1) return 3;
  std::fclose(statm);
  // 32 MiB of headroom: less than the smallest reservation (64 MiB) the sim tries.
  const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) +
                       (rlim_t{32} << 20);
  struct rlimit rl;
  rl.rlim_cur = limit;
  rl.rlim_max = limit;
  if (setrlimit(RLIMIT_AS, &rl) != 0) return 4;
  SimOptions options;
  options.index = 5;
  options.capacity = 64 * kMiB;
  absl::StatusOr<std::unique_ptr<SimBackend>> sim = CreateSimBackend(options);
  if (sim.ok()) return 5;
  std::fprintf(stderr, "error: %s\n", std::string(sim.status().message()).c_str());
  if (!absl::IsResourceExhausted(sim.status())) return 6;
  Config config;
  config.backend = BackendKind::kSim;
  config.sim_capacity = 64 * kMiB;
  absl::StatusOr<std::unique_ptr<Backend>> b = MakeBackend(config, 5);
  if (b.ok() || !absl::IsResourceExhausted(b.status())) return 7;
  return 0;
}

// Not a contract violation: a simulated device whose address space cannot be reserved
// is an error the caller gets back (and MakeBackend passes on), never an abort. Run in
// a child process under an address-space limit just above what it already uses; the
// child exits 0 only when the error came back, naming the device and the cause.
TEST_F(SimBackendDeathTest, FailedReservationIsAnErrorNotAnAbort) {
  EXPECT_EXIT(std::_Exit(CreateSimUnderAddressSpaceLimit()), ::testing::ExitedWithCode(0),
              "sim:5: mmap could not reserve even .* address space");
}

TEST_F(SimBackendDeathTest, UseAfterFreeCrashes) {
  auto sim = NewSim();
  absl::StatusOr<void*> p = sim->allocate_segment(2 * kMiB);
  ASSERT_TRUE(p.ok());
  auto* bytes = static_cast<volatile unsigned char*>(*p);
  bytes[0] = 1;  // fine while allocated
  sim->free_segment(*p, 2 * kMiB);
  EXPECT_DEATH(bytes[0] = 2, "");
}

TEST_F(SimBackendDeathTest, BadFreesAreFatal) {
  auto sim = NewSim();
  absl::StatusOr<void*> p = sim->allocate_segment(2 * kMiB);
  ASSERT_TRUE(p.ok());
  EXPECT_DEATH(sim->free_segment(static_cast<char*>(*p) + 4096, 2 * kMiB),
               "not a live segment");
  EXPECT_DEATH(sim->free_segment(*p, kMiB), "allocated with");
  sim->free_segment(*p, 2 * kMiB);
  EXPECT_DEATH(sim->free_segment(*p, 2 * kMiB), "not a live segment");  // double free
}

TEST_F(SimBackendDeathTest, BadUnmapAndReleaseAreFatal) {
  auto sim = NewSim();
  const size_t g = sim->granularity();
  absl::StatusOr<void*> r = sim->reserve_address(4 * g);
  ASSERT_TRUE(r.ok());
  auto* base = static_cast<char*>(*r);
  EXPECT_DEATH(sim->unmap(base, g), "not entirely mapped");
  ASSERT_TRUE(sim->map(base, g).ok());
  EXPECT_DEATH(sim->unmap(base, 2 * g), "not entirely mapped");
  EXPECT_DEATH(sim->release_address(base, 4 * g), "still mapped");
  sim->unmap(base, g);
  EXPECT_DEATH(sim->release_address(base, 2 * g), "not a range reserve_address returned");
  sim->release_address(base, 4 * g);
}

// ---------------------------------------------------------------------------------
// The factory.

TEST(BackendFactoryTest, MakesSimFromConfig) {
  Config config = SimConfig(128 * kMiB);
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(config, 2);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->device(), (DeviceId{DeviceType::kSim, 2}));
  EXPECT_EQ((*backend)->info().backend, "sim");
  EXPECT_EQ((*backend)->mem_info().total_bytes, 128 * kMiB);
}

TEST(BackendFactoryTest, PassesSimKnobsThrough) {
  Config config = SimConfig(64 * kMiB);
  config.sim_fail_nth = 2;
  config.sim_alloc_latency_ns = 15'000'000;  // 15 ms
  std::unique_ptr<Backend> sim = MakeSimBackend(config);
  absl::StatusOr<void*> first = sim->allocate_segment(kMiB);
  ASSERT_TRUE(first.ok());
  const Clock::time_point start = Clock::now();
  absl::StatusOr<void*> second = sim->allocate_segment(kMiB);
  EXPECT_GE(Clock::now() - start, milliseconds(15));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "injected"));
  sim->free_segment(*first, kMiB);

  // Probability and seed reach the backend too: the same pattern as a direct one.
  config = SimConfig(64 * kMiB);
  config.sim_fail_probability = 0.5;
  config.sim_seed = 42;
  std::unique_ptr<Backend> from_config = MakeSimBackend(config);
  std::vector<bool> failed;
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<void*> p = from_config->allocate_segment(kMiB);
    failed.push_back(!p.ok());
    if (p.ok()) from_config->free_segment(*p, kMiB);
  }
  EXPECT_EQ(failed, FailurePattern(42, 0.5, 200));
}

TEST(BackendFactoryTest, MakesCpu) {
  Config config;
  config.backend = BackendKind::kCpu;
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->device(), (DeviceId{DeviceType::kCpu, 0}));
  EXPECT_EQ((*backend)->info().name, "host (jemalloc)");
  EXPECT_FALSE(MakeBackend(config, 1).ok());  // cpu has only index 0
}

TEST(BackendFactoryTest, RejectsNegativeIndex) {
  EXPECT_EQ(MakeBackend(SimConfig(), -1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BackendFactoryTest, AutoMakesWhatResolveAutoBackendSays) {
  std::string why;
  const BackendKind kind = ResolveAutoBackend(&why);
  ASSERT_TRUE(kind == BackendKind::kCuda || kind == BackendKind::kSim);
  EXPECT_EQ(ResolveAutoBackend(), kind);  // computed once
  if (kind == BackendKind::kSim) {
    EXPECT_FALSE(why.empty());
  }
  Config config;
  config.backend = BackendKind::kAuto;
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(config);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->device().type,
            kind == BackendKind::kCuda ? DeviceType::kCuda : DeviceType::kSim);
}

TEST(BackendFactoryTest, CudaWithoutADeviceIsAnErrorWithTheReason) {
  std::string why;
  if (ResolveAutoBackend(&why) == BackendKind::kCuda)
    GTEST_SKIP() << "a CUDA device exists";
#ifdef DEVMEM_HAVE_CUDA
  // cuda/ registered itself (whole-archive link), so the reason is the driver's.
  EXPECT_TRUE(absl::StrContains(why, "cudaGetDeviceCount")) << why;
#else
  EXPECT_TRUE(absl::StrContains(why, "without CUDA support")) << why;
#endif
  Config config;
  config.backend = BackendKind::kCuda;
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(config);
  ASSERT_FALSE(backend.ok());
  EXPECT_TRUE(absl::StrContains(backend.status().message(), why)) << backend.status();
}

}  // namespace
}  // namespace devmem
