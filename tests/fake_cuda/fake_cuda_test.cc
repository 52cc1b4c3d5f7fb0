// tests/fake_cuda/fake_cuda_test.cc: the CUDA backend and the allocator on the fake
// CUDA runtime and driver (fake_cuda.cc), beyond the conformance suite that
// devmem_fake_cuda_tests also runs (tests/backend_conformance_test.cc, cuda cases).
//
//   FakeCudaTest           the fake is what the backend runs on (guards against the
//                          cuda cases skipping), and the backend's paths a GPU rarely
//                          takes: driver failures at each step of map, no virtual
//                          memory, the caller's current device, the last error.
//   FakeCudaEntryPointTest a driver without a cuMem* symbol, or older than the
//                          toolkit: no virtual memory, with the reason (each in a fresh
//                          process: the entry points are resolved once per process).
//   FakeCudaAllocatorTest  CachingAllocator with backend:cuda, regular and expandable
//                          segments: cross-stream reuse, out of memory, driver errors,
//                          and that memory goes back only after its stream passed the
//                          work that uses it (the fake aborts otherwise).
//   FakeCudaPinnedHostTest the cpu_pinned backend (cudaHostAlloc) under the caching
//                          allocator: host-touchable memory, and reuse gated on the
//                          events of the GPU streams that used a block (record_stream);
//                          PinnedHostWithoutADevice (a child process with no device): plain
//                          host memory with a one-line message.
//   FakeCudaSelfTest       the fake's own checks fire (misuse aborts, leaks fail the
//                          process, device memory is not host memory).
//   FakeCudaThreadCacheTest  thread caches with expandable segments: a block given back
//                          by a cache is not unmapped by a recycle decided before the
//                          user's free (the fake aborts on the memset that uses it).
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/fake_cuda/fake_cuda_test_util.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <future>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/backend.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/errors.h"
#include "allocator/oom_report.h"
#include "allocator/types.h"
#include "cuda/cuda_backend.h"
#include "gtest/gtest.h"
#include "tests/hooked_backend.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using std::chrono::milliseconds;

constexpr size_t kG = 2 * kMiB;  // the fake's granularity

using fake_cuda_test::CudaBackend;
using fake_cuda_test::Live;
using fake_cuda_test::ScopedEnv;

// Nothing of the fake's is live (default streams aside).
void ExpectNothingLive() {
  for (const char* what : {"allocations", "handles", "mappings", "reservations",
                           "streams", "events", "pinned", "used_bytes"}) {
    EXPECT_EQ(Live(what), 0u) << what;
  }
}

// Under the fake, a cuda case that skips is a failure: a skip would mean that the
// backend did not find the fake device or its virtual memory, and these cases are here
// to run. (ctest would report a skip as "not run" and pass.) Only cuda memory not being
// host memory is a reason to skip.
class SkippedCudaCasesFail : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const std::string name = absl::StrCat(info.test_suite_name(), ".", info.name());
    if (!info.result()->Skipped() ||
        !(absl::EndsWith(name, "/cuda") || absl::StrContains(name, "FakeCuda")) ||
        name == "AllBackends/BackendConformanceTest.HostAccessibleMemoryHoldsData/cuda") {
      return;
    }
    ADD_FAILURE() << name << " skipped on the fake CUDA device; it must run here";
  }
};

[[maybe_unused]] const bool kSkipsFail = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SkippedCudaCasesFail);
  return true;
}();

// ---------------------------------------------------------------------------------
// FakeCudaTest

// The guard: were the fake not linked, or the backend not to find virtual memory on
// it, the cuda conformance cases would skip; this fails instead.
TEST(FakeCudaTest, BackendFactoryPicksCudaWithVirtualMemory) {
  std::string why;
  EXPECT_EQ(ResolveAutoBackend(&why), BackendKind::kCuda) << why;
  absl::StatusOr<int> count = CudaDeviceCount();
  ASSERT_TRUE(count.ok()) << count.status();
  EXPECT_EQ(*count, 2);
  Config config;
  config.backend = BackendKind::kCuda;
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(config, 0);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->info().backend, "cuda");
  EXPECT_TRUE(absl::StartsWith((*backend)->info().name, "devmem fake CUDA device"))
      << (*backend)->info().name;
  EXPECT_TRUE((*backend)->caps().virtual_memory)
      << "reserve_address says: " << (*backend)->reserve_address(kG).status();
  EXPECT_TRUE((*backend)->caps().streams);
  EXPECT_FALSE((*backend)->caps().host_accessible);
  EXPECT_EQ((*backend)->granularity(), kG);
  EXPECT_EQ((*backend)->mem_info().total_bytes, size_t{1} << 30);
}

TEST(FakeCudaTest, EachDeviceIsItsOwn) {
  auto a = CudaBackend(0);
  auto b = CudaBackend(1);
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->info().uuid, b->info().uuid);
  EXPECT_EQ(NewCudaBackend(2).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<void*> p = a->allocate_segment(64 * kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(a->mem_info().free_bytes, (size_t{1} << 30) - 64 * kMiB);
  EXPECT_EQ(b->mem_info().free_bytes, size_t{1} << 30);
  a->free_segment(*p, 64 * kMiB);
}

// The backend makes its device current for its calls and gives the caller's back;
// driver calls work from a thread that never made a CUDA call (the backend binds the
// device's context first).
TEST(FakeCudaTest, BackendKeepsTheCallersCurrentDevice) {
  struct Restore {
    ~Restore() { cudaSetDevice(0); }  // for the tests after this one, even on failure
  } restore;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  auto backend = CudaBackend(0);
  ASSERT_TRUE(backend);
  auto current = [] {
    int d = -1;
    EXPECT_EQ(cudaGetDevice(&d), cudaSuccess);
    return d;
  };
  absl::StatusOr<void*> p = backend->allocate_segment(kMiB);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(current(), 1);
  absl::StatusOr<Stream> s = backend->create_stream();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(current(), 1);
  // The default stream is device 0's: an event of device 0 may be recorded on it.
  for (Stream stream : {Stream{}, *s}) {
    std::atomic<bool> ran{false};
    ASSERT_TRUE(backend->launch_host_fn(stream, [&ran] { ran.store(true); }).ok());
    const Event e = backend->record_event(stream);
    backend->synchronize_event(e);
    EXPECT_TRUE(backend->event_done(e));
    EXPECT_TRUE(ran.load());
    backend->release_event(e);
    backend->synchronize_stream(stream);
    EXPECT_EQ(current(), 1);
  }
  ASSERT_EQ(CudaMemsetSync(0, *p, 0x3c, kMiB), absl::OkStatus());
  EXPECT_EQ(current(), 1);
  std::thread fresh([&] {  // no CUDA call was ever made on this thread
    absl::StatusOr<void*> r = backend->reserve_address(4 * kG);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(backend->map(*r, 2 * kG).ok());
    backend->unmap(*r, 2 * kG);
    backend->release_handle_reserve();
    backend->release_address(*r, 4 * kG);
  });
  fresh.join();
  EXPECT_EQ(current(), 1);
  backend->destroy_stream(*s);
  backend->free_segment(*p, kMiB);
  EXPECT_EQ(current(), 1);
  ExpectNothingLive();
}

TEST(FakeCudaTest, FailedSegmentsLeaveNoLastError) {
  auto backend = CudaBackend();
  ASSERT_TRUE(backend);
  absl::StatusOr<void*> huge = backend->allocate_segment(size_t{2} << 30);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_TRUE(absl::StrContains(huge.status().message(), "cudaMalloc")) << huge.status();
  EXPECT_TRUE(absl::StrContains(huge.status().message(), "cudaErrorMemoryAllocation"))
      << huge.status();
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  {
    // Not out of memory: another error, named (one that is not sticky: those throw,
    // fake_cuda_errors_test.cc).
    ScopedEnv fail("DEVMEM_FAKE_CUDA_FAIL", "cudaMalloc:1=999");
    absl::StatusOr<void*> broken = backend->allocate_segment(kMiB);
    EXPECT_EQ(broken.status().code(), absl::StatusCode::kInternal) << broken.status();
    EXPECT_TRUE(absl::StrContains(broken.status().message(), "cudaErrorUnknown"))
        << broken.status();
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  }
  ExpectNothingLive();
}

TEST(FakeCudaTest, StreamAndHostFunctionFailuresAreErrors) {
  auto backend = CudaBackend();
  ASSERT_TRUE(backend);
  {
    ScopedEnv fail("DEVMEM_FAKE_CUDA_FAIL", "cudaStreamCreateWithFlags:1");
    absl::StatusOr<Stream> s = backend->create_stream();
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInternal) << s.status();
    EXPECT_TRUE(absl::StrContains(s.status().message(), "cudaStreamCreateWithFlags"));
    // A handled failure is not left for the program's next cudaGetLastError().
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  }
  {
    ScopedEnv fail("DEVMEM_FAKE_CUDA_FAIL", "cudaLaunchHostFunc:1");
    auto token = std::make_shared<int>(0);
    absl::Status st = backend->launch_host_fn(Stream{}, [token] { ++*token; });
    EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
    EXPECT_EQ(token.use_count(), 1);  // the function was not leaked
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  }
  EXPECT_TRUE(backend->launch_host_fn(Stream{}, [] {}).ok());
  backend->synchronize_stream(Stream{});
  ExpectNothingLive();
}

// Was the end of the process (abort from inside the library); now an error that names
// the call, and the event whose record failed is not leaked.
TEST(FakeCudaTest, EventRecordFailureIsADriverError) {
  auto backend = CudaBackend();
  ASSERT_TRUE(backend);
  {
    ScopedEnv fail("DEVMEM_FAKE_CUDA_FAIL", "cudaEventRecord:1");
    try {
      backend->record_event(Stream{});
      ADD_FAILURE() << "record_event succeeded";
    } catch (const DriverError& e) {
      EXPECT_TRUE(absl::StrContains(e.what(), "cuda:0: cudaEventRecord: unknown error"))
          << e.what();
    }
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  }
  ExpectNothingLive();
}

// A driver failure at any step of map takes back what the call made.
TEST(FakeCudaTest, MapFailuresUndoEverything) {
  auto backend = CudaBackend();
  ASSERT_TRUE(backend);
  absl::StatusOr<void*> r = backend->reserve_address(8 * kG);
  ASSERT_TRUE(r.ok()) << r.status();
  auto* base = static_cast<char*>(*r);
  ASSERT_TRUE(backend->map(base + 6 * kG, kG).ok());  // an earlier mapping stays
  const size_t used = Live("used_bytes");
  for (const char* spec : {"cuMemCreate:1", "cuMemCreate:3", "cuMemMap:1", "cuMemMap:4",
                           "cuMemSetAccess:1", "cuMemCreate:2=2"}) {
    SCOPED_TRACE(spec);
    ScopedEnv fail("DEVMEM_FAKE_CUDA_FAIL", spec);
    absl::Status st = backend->map(base, 4 * kG);
    const std::string call(spec, std::string(spec).find(':'));
    if (absl::StrContains(spec, "=2")) {  // CUDA_ERROR_OUT_OF_MEMORY
      EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
    } else {
      EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
      EXPECT_TRUE(absl::StrContains(st.message(), "unknown error")) << st;
    }
    EXPECT_TRUE(absl::StrContains(st.message(), call)) << st;
    EXPECT_EQ(Live("handles"), 1u);
    EXPECT_EQ(Live("mappings"), 1u);
    EXPECT_EQ(Live("used_bytes"), used);
    EXPECT_EQ(backend->handle_reserve_bytes(), 0u);
  }
  // With two handles in the reserve, a failed map puts those back and releases the
  // ones it created.
  ASSERT_TRUE(backend->map(base, 2 * kG).ok());
  backend->unmap(base, 2 * kG);
  for (const char* spec : {"cuMemCreate:1", "cuMemMap:2", "cuMemMap:4", "cuMemSetAccess:1"}) {
    SCOPED_TRACE(spec);
    ScopedEnv fail("DEVMEM_FAKE_CUDA_FAIL", spec);
    EXPECT_FALSE(backend->map(base, 4 * kG).ok());
    EXPECT_EQ(Live("handles"), 3u);
    EXPECT_EQ(Live("mappings"), 1u);
    EXPECT_EQ(backend->handle_reserve_bytes(), 2 * kG);
  }
  backend->release_handle_reserve();
  EXPECT_EQ(Live("used_bytes"), used);
  // The range is free again: it maps whole.
  ASSERT_TRUE(backend->map(base, 4 * kG).ok());
  ASSERT_EQ(CudaMemsetSync(0, base, 0x11, 4 * kG), absl::OkStatus());
  backend->unmap(base, 4 * kG);
  backend->unmap(base + 6 * kG, kG);
  backend->release_address(base, 8 * kG);
  backend->release_handle_reserve();
  ExpectNothingLive();
}

TEST(FakeCudaTest, ReserveFailuresAreErrors) {
  auto backend = CudaBackend();
  ASSERT_TRUE(backend);
  // More address space than the device has (the fake has 64 GiB).
  absl::StatusOr<void*> huge = backend->reserve_address(size_t{1} << 50);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  EXPECT_TRUE(absl::StrContains(huge.status().message(), "cuMemAddressReserve"));
  ScopedEnv fail("DEVMEM_FAKE_CUDA_FAIL", "cuMemAddressReserve:1");
  absl::StatusOr<void*> broken = backend->reserve_address(kG);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInternal) << broken.status();
  ExpectNothingLive();
}

// A device without virtual memory management: Unimplemented with the reason, and the
// allocator (expandable_segments:auto) uses regular segments.
TEST(FakeCudaTest, NoVirtualMemoryMeansRegularSegments) {
  ScopedEnv no_vmm("DEVMEM_FAKE_CUDA_NO_VMM", "1");
  auto backend = CudaBackend();
  ASSERT_TRUE(backend);
  EXPECT_FALSE(backend->caps().virtual_memory);
  EXPECT_EQ(backend->granularity(), 0u);
  absl::StatusOr<void*> r = backend->reserve_address(kG);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "VIRTUAL_MEMORY_MANAGEMENT"))
      << r.status();
  Config config;
  config.backend = BackendKind::kCuda;
  {
    CachingAllocator alloc(std::move(backend), config);
    void* p = alloc.allocate(3 * kMiB);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(Live("allocations"), 1u);
    EXPECT_EQ(Live("mappings"), 0u);
    alloc.free(p);
    alloc.empty_cache();
    EXPECT_EQ(Live("allocations"), 0u);
  }
  ExpectNothingLive();
}

// ---------------------------------------------------------------------------------
// FakeCudaEntryPointTest: each case in a fresh process (the driver's entry points are
// resolved once per process), through a death test that expects exit status 0.

// In a fresh process: a backend whose virtual memory is unavailable for a reason that
// contains `reason`, and an allocator that still works on regular segments.
void ExpectNoVirtualMemoryBecause(const char* reason) {
  bool ok = true;
  {
    auto backend = CudaBackend();
    if (!backend) std::exit(2);
    ok = !backend->caps().virtual_memory && backend->granularity() == 0;
    const std::string why(backend->reserve_address(kG).status().message());
    if (!absl::StrContains(why, reason)) {
      std::fprintf(stderr, "the reason is: %s\n", why.c_str());
      ok = false;
    }
    Config config;
    config.backend = BackendKind::kCuda;
    CachingAllocator alloc(std::move(backend), config);
    alloc.free(alloc.allocate(5 * kMiB));
    ok = ok && Live("allocations") == 1;
  }
  std::exit(ok && Live("allocations") == 0 ? 0 : 1);
}

TEST(FakeCudaEntryPointTest, MissingDriverSymbolMeansNoVirtualMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ScopedEnv missing("DEVMEM_FAKE_CUDA_MISSING", "cuMemSetAccess");
  EXPECT_EXIT(ExpectNoVirtualMemoryBecause("the CUDA driver has no cuMemSetAccess"),
              ::testing::ExitedWithCode(0), "");
}

TEST(FakeCudaEntryPointTest, DriverOlderThanTheToolkitMeansNoVirtualMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ScopedEnv old("DEVMEM_FAKE_CUDA_DRIVER_VERSION", "11080");
  EXPECT_EXIT(ExpectNoVirtualMemoryBecause("cudaGetDriverEntryPoint(cuGetErrorString): "
                                           "invalid argument (cudaErrorInvalidValue"),
              ::testing::ExitedWithCode(0), "");
}

// ---------------------------------------------------------------------------------
// FakeCudaAllocatorTest: CachingAllocator over the CUDA backend, with regular
// ("expandable_segments:false") and expandable segments.

class FakeCudaAllocatorTest : public fake_cuda_test::CudaAllocatorTest {
 protected:
  void TearDown() override {
    if (!alloc_) return;
    ExpectValidAndEmptied();
    alloc_.reset();
    ExpectNothingLive();
  }
};

TEST_P(FakeCudaAllocatorTest, SegmentsFollowTheConfiguration) {
  void* p = alloc_->allocate(3 * kMiB);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(Live("mappings") > 0, Expandable());
  EXPECT_EQ(Live("allocations") > 0, !Expandable());
  ASSERT_EQ(CudaMemsetSync(0, p, 0x5a, 3 * kMiB), absl::OkStatus());
  alloc_->free(p);
}

// A block freed while another stream still uses it is not handed out again until that
// stream reaches the free.
TEST_P(FakeCudaAllocatorTest, CrossStreamFreeWaitsForTheOtherStream) {
  Backend& backend = alloc_->backend();
  absl::StatusOr<Stream> s1 = backend.create_stream();
  absl::StatusOr<Stream> s2 = backend.create_stream();
  ASSERT_TRUE(s1.ok() && s2.ok());
  void* p = alloc_->allocate(5 * kMiB, *s1);
  alloc_->record_stream(p, *s2);
  {
    testutil::StreamBlocker blocker(backend, *s2);
    alloc_->free(p);
    void* q = alloc_->allocate(5 * kMiB, *s1);
    EXPECT_NE(q, p);  // p is still in use on s2
    alloc_->free(q);
    blocker.Release();
    backend.synchronize_stream(*s2);
  }
  alloc_->process_events();
  void* again = alloc_->allocate(5 * kMiB, *s1);
  EXPECT_TRUE(alloc_->validate().ok()) << alloc_->validate();
  alloc_->free(again);
  alloc_->empty_cache();  // a stream must outlive the memory cached for it
  backend.destroy_stream(*s1);
  backend.destroy_stream(*s2);
}

TEST_P(FakeCudaAllocatorTest, OutOfMemoryIsReportedAndHarmless) {
  std::vector<void*> live;
  live.push_back(alloc_->allocate(400 * kMiB));
  live.push_back(alloc_->allocate(400 * kMiB));
  EXPECT_THROW(alloc_->allocate(400 * kMiB), OutOfMemoryError);
  EXPECT_TRUE(alloc_->validate().ok()) << alloc_->validate();
  alloc_->free(live.back());
  live.back() = alloc_->allocate(400 * kMiB);  // the freed memory serves again
  ASSERT_EQ(CudaMemsetSync(0, live.back(), 1, 400 * kMiB), absl::OkStatus());
  for (void* p : live) alloc_->free(p);
}

TEST_P(FakeCudaAllocatorTest, DriverErrorsAreNotOutOfMemory) {
  {
    ScopedEnv fail("DEVMEM_FAKE_CUDA_FAIL", Expandable() ? "cuMemMap:2" : "cudaMalloc:1");
    try {
      alloc_->allocate(30 * kMiB);
      ADD_FAILURE() << "allocate succeeded";
    } catch (const std::bad_alloc& e) {
      ADD_FAILURE() << "a driver error became out of memory: " << e.what();
    } catch (const std::runtime_error& e) {
      EXPECT_TRUE(absl::StrContains(e.what(), Expandable() ? "cuMemMap" : "cudaMalloc"))
          << e.what();
    }
  }
  EXPECT_TRUE(alloc_->validate().ok()) << alloc_->validate();
  EXPECT_EQ(alloc_->stats().reserved_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(Live("used_bytes"), 0u);
  alloc_->free(alloc_->allocate(30 * kMiB));
}

// Work queued on a stream may use a block after its free (stream order); the memory
// goes back to the device only once the stream got past that work. The fake checks
// the work's memory when the stream runs it and aborts if it was unmapped or freed.
// The stream is released when the allocator waits for it (a HookedBackend: the wait is
// for an event recorded on the stream under the device lock, allocator/release_fence.h),
// not after a sleep: the kernel runs exactly while the allocator says it waits.
TEST_P(FakeCudaAllocatorTest, MemoryGoesBackOnlyAfterItsStreamPassedTheWork) {
  const Config config = alloc_->config();
  alloc_.reset();  // this test's allocator is the hooked one
  auto owned = std::make_unique<testutil::HookedBackend>(CudaBackend());
  testutil::HookedBackend* hooks = owned.get();
  CachingAllocator alloc(std::move(owned), config);
  Backend& backend = alloc.backend();
  absl::StatusOr<Stream> s = backend.create_stream();
  ASSERT_TRUE(s.ok());
  void* p = alloc.allocate(24 * kMiB, *s);
  testutil::StreamBlocker blocker(backend, *s);
  // A "kernel" using p, queued behind the blocked host function.
  ASSERT_EQ(cudaMemsetAsync(p, 7, 24 * kMiB, reinterpret_cast<cudaStream_t>(s->handle)),
            cudaSuccess);
  alloc.free(p);
  int records = 0;  // events recorded on *s (the hooks run on this thread only)
  testutil::HookGuard record_hook =
      hooks->before_record_event.Set([&](Stream stream) { records += stream == *s ? 1 : 0; });
  testutil::HookGuard rerecord_hook = hooks->before_rerecord_event.Set(
      [&](Event, Stream stream) { records += stream == *s ? 1 : 0; });
  testutil::HookGuard sync_event_hook =
      hooks->before_synchronize_event.Set([&](Event) { blocker.Release(); });
  alloc.empty_cache();  // must wait for the stream before unmapping or freeing
  EXPECT_GE(records, 1);
  hooks->before_record_event = nullptr;
  hooks->before_rerecord_event = nullptr;
  hooks->before_synchronize_event = nullptr;
  EXPECT_EQ(alloc.stats().reserved_bytes[kAggregatePool].current, 0);
  EXPECT_TRUE(alloc.validate().ok());
  backend.destroy_stream(*s);
}

INSTANTIATE_TEST_SUITE_P(Segments, FakeCudaAllocatorTest, fake_cuda_test::SegmentKinds(),
                         fake_cuda_test::SegmentKindName);

// ---------------------------------------------------------------------------------
// FakeCudaSelfTest: the fake catches what it promises to.

using fake_cuda_test::DriverFn;  // the driver's entry points, as the backend fetches them

// One reservation of 4 granules with one 2-granule mapping at its start, and the
// driver calls to take it down.
class FakeCudaSelfTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // a current context for the driver
    auto reserve = DriverFn<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
    auto create = DriverFn<decltype(&cuMemCreate)>("cuMemCreate");
    auto map = DriverFn<decltype(&cuMemMap)>("cuMemMap");
    auto access = DriverFn<decltype(&cuMemSetAccess)>("cuMemSetAccess");
    ASSERT_EQ(reserve(&base_, 4 * kG, 0, 0, 0), CUDA_SUCCESS);
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    ASSERT_EQ(create(&handle_, 2 * kG, &prop, 0), CUDA_SUCCESS);
    ASSERT_EQ(map(base_, 2 * kG, 0, handle_, 0), CUDA_SUCCESS);
    CUmemAccessDesc desc{};
    desc.location = prop.location;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    ASSERT_EQ(access(base_, 2 * kG, &desc, 1), CUDA_SUCCESS);
  }
  void TearDown() override {
    if (base_ == 0) return;
    ASSERT_EQ(unmap_(base_, 2 * kG), CUDA_SUCCESS);
    ASSERT_EQ(release_(handle_), CUDA_SUCCESS);
    ASSERT_EQ(free_(base_, 4 * kG), CUDA_SUCCESS);
    ExpectNothingLive();
  }

  CUdeviceptr base_ = 0;
  CUmemGenericAllocationHandle handle_ = 0;
  decltype(&cuMemUnmap) unmap_ = DriverFn<decltype(&cuMemUnmap)>("cuMemUnmap");
  decltype(&cuMemRelease) release_ = DriverFn<decltype(&cuMemRelease)>("cuMemRelease");
  decltype(&cuMemAddressFree) free_ =
      DriverFn<decltype(&cuMemAddressFree)>("cuMemAddressFree");
};

TEST_F(FakeCudaSelfTest, DriverMisuseAborts) {
  auto access = DriverFn<decltype(&cuMemSetAccess)>("cuMemSetAccess");
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  EXPECT_DEATH(unmap_(base_, kG), "misuse: cuMemUnmap.*ends inside the mapping");
  EXPECT_DEATH(unmap_(base_, 3 * kG), "misuse: cuMemUnmap.*is not mapped");
  EXPECT_DEATH(access(base_, 4 * kG, &desc, 1), "misuse: cuMemSetAccess.*is not mapped");
  EXPECT_DEATH(free_(base_, 4 * kG), "misuse: cuMemAddressFree.*still mapped");
  EXPECT_DEATH(free_(base_, 2 * kG), "misuse: cuMemAddressFree.*not a reservation");
  EXPECT_DEATH(
      {
        release_(handle_);
        release_(handle_);
      },
      "misuse: cuMemRelease.*not a live handle");
}

TEST_F(FakeCudaSelfTest, RuntimeMisuseAborts) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  // 512-byte aligned, and to nothing more.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 512, 0u);
  EXPECT_NE(reinterpret_cast<uintptr_t>(p) % 1024, 0u);
  EXPECT_DEATH(*static_cast<volatile char*>(p) = 1, "");  // device memory: not the host's
  EXPECT_DEATH(cudaFree(static_cast<char*>(p) + 512), "misuse: cudaFree");
  EXPECT_DEATH(
      {
        cudaFree(p);
        cudaFree(p);
      },
      "misuse: cudaFree.*freed already");
  EXPECT_DEATH(
      {
        cudaLaunchHostFunc(
            nullptr, [](void*) { cudaGetLastError(); }, nullptr);
        cudaStreamSynchronize(nullptr);
      },
      "misuse: cudaGetLastError called from inside a host function");
  EXPECT_DEATH(cudaMemset(static_cast<char*>(p) + 4000, 0, 4096),
               "misuse: cudaMemset.*runs past the end");
  // Released while a stream still had work on it: the stream is held in a host
  // function until the memory is gone.
  static std::atomic<bool> freed{false};
  EXPECT_DEATH(
      {
        cudaLaunchHostFunc(
            nullptr,
            [](void*) {
              while (!freed.load()) std::this_thread::sleep_for(milliseconds(1));
            },
            nullptr);
        cudaMemset(p, 0, 4096);
        cudaFree(p);
        freed.store(true);
        cudaStreamSynchronize(nullptr);
      },
      "misuse: a stream reached cudaMemset .* released while that work was still queued");
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_DEATH(cudaStreamSynchronize(s),
               "misuse: cudaStreamSynchronize: stream .* not a live");
  ASSERT_EQ(cudaFree(p), cudaSuccess);
}

TEST_F(FakeCudaSelfTest, LeaksFailTheProcess) {
  EXPECT_EXIT(
      {
        void* p = nullptr;
        cudaMalloc(&p, 1000);
        cudaEvent_t e = nullptr;
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
        std::exit(0);
      },
      ::testing::ExitedWithCode(1),
      "leaked at exit:(.|\n)*cudaMalloc .* \\(1000 bytes\\)(.|\n)*mapping "
      "(.|\n)*reservation (.|\n)*event ");
}

// The legacy default stream waits for blocking streams' earlier work; a non-blocking
// stream does not.
TEST_F(FakeCudaSelfTest, LegacyDefaultStreamWaitsForBlockingStreams) {
  cudaGetLastError();  // the thread's last error is not this test's business before
  cudaStream_t blocking = nullptr;
  cudaStream_t non_blocking = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&blocking, cudaStreamDefault), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&non_blocking, cudaStreamNonBlocking), cudaSuccess);
  std::promise<void> go;
  std::shared_future<void> gate = go.get_future().share();
  auto* wait = new std::shared_future<void>(gate);
  ASSERT_EQ(cudaLaunchHostFunc(
                blocking,
                [](void* f) {
                  std::unique_ptr<std::shared_future<void>> future(
                      static_cast<std::shared_future<void>*>(f));
                  future->wait();
                },
                wait),
            cudaSuccess);
  cudaEvent_t on_legacy = nullptr;
  cudaEvent_t on_non_blocking = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&on_legacy, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&on_non_blocking, cudaEventDisableTiming),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(on_legacy, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(on_non_blocking, non_blocking), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(on_non_blocking), cudaSuccess);
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(cudaEventQuery(on_legacy), cudaErrorNotReady);
  EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);  // not ready is not an error
  go.set_value();
  ASSERT_EQ(cudaEventSynchronize(on_legacy), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(on_legacy), cudaSuccess);
  for (cudaEvent_t e : {on_legacy, on_non_blocking})
    ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
  for (cudaStream_t s : {blocking, non_blocking})
    ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// --- cpu_pinned: page-locked host memory -------------------------------------------

std::unique_ptr<Backend> Pinned() {
  absl::StatusOr<std::unique_ptr<Backend>> b = NewCudaPinnedHostBackend();
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *std::move(b) : nullptr;
}

TEST(FakeCudaPinnedHostTest, HostTouchableMemoryCachedLikeAnyDevice) {
  {
    CachingAllocator pinned(Pinned(), Config{});
    EXPECT_EQ(pinned.device(), (DeviceId{DeviceType::kCpuPinned, 0}));
    EXPECT_EQ(pinned.device().ToString(), "cpu_pinned");
    EXPECT_TRUE(pinned.backend().caps().host_accessible);
    void* p = pinned.allocate(kMiB, kPinnedHostStream);
    std::memset(p, 7, kMiB);  // cudaHostAlloc memory is the host's
    EXPECT_EQ(Live("pinned"), 1u);
    pinned.free(p);
    void* q = pinned.allocate(kMiB, kPinnedHostStream);
    EXPECT_EQ(q, p) << "no stream used it: cached and reused at once";
    EXPECT_EQ(pinned.stats().num_device_alloc, 1);
    pinned.free(q);
    pinned.empty_cache();
    EXPECT_EQ(Live("pinned"), 0u);
  }
  ExpectNothingLive();
}

// A staging buffer whose copy is still queued on a GPU stream is not handed out again:
// the next copy's host-side fill would overwrite what the pending copy reads.
TEST(FakeCudaPinnedHostTest, ReuseWaitsForTheGpuStreamsThatUsedTheBlock) {
  std::unique_ptr<Backend> gpu = CudaBackend();
  ASSERT_TRUE(gpu);
  absl::StatusOr<Stream> copies = gpu->create_stream();
  ASSERT_TRUE(copies.ok()) << copies.status();
  {
    CachingAllocator pinned(Pinned(), Config{});
    void* p = pinned.allocate(kMiB, kPinnedHostStream);
    {
      testutil::StreamBlocker pending(*gpu, *copies);  // the "copy" has not run
      pinned.record_stream(p, *copies);
      pinned.free(p);
      void* q = pinned.allocate(kMiB, kPinnedHostStream);
      EXPECT_NE(q, p) << "reused while a copy on the GPU stream may still read it";
      pinned.free(q);
      pending.Release();
      gpu->synchronize_stream(*copies);
    }
    pinned.process_events();
    void* again = pinned.allocate(kMiB, kPinnedHostStream);
    EXPECT_EQ(again, p) << "the copy completed: the block is free again";
    pinned.free(again);
    EXPECT_TRUE(pinned.validate().ok()) << pinned.validate();
    pinned.empty_cache();
  }
  gpu->destroy_stream(*copies);
  gpu.reset();
  ExpectNothingLive();
}

TEST(FakeCudaPinnedHostTest, TheFactoryGivesCudaPinnedMemoryWhereThereIsADevice) {
  std::unique_ptr<Backend> b = MakePinnedHostBackend();
  EXPECT_EQ(b->device(), (DeviceId{DeviceType::kCpuPinned, 0}));
  EXPECT_TRUE(absl::StrContains(b->info().name, "cudaHostAlloc")) << b->info().name;
  absl::StatusOr<void*> p = b->allocate_segment(4096);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Live("pinned"), 1u);
  b->free_segment(*p, 4096);
}

// No GPU (DEVMEM_FAKE_CUDA_DEVICES=0): cpu_pinned is plain host memory, and says so in
// one line. In a child process (InChild: a fresh exec of this binary), because the
// fake reads its device count once per process, at the first CUDA call: in a process
// where any earlier case had called it, the fake has its two default devices whatever
// the variable says, and MakePinnedHostBackend gives cudaHostAlloc memory. ctest runs
// it in fake_cuda.no_device, which sets the variable for the whole process; here it is
// set for the child either way.
TEST(PinnedHostWithoutADevice, IsPlainHostMemoryWithAMessage) {
  ScopedEnv no_device("DEVMEM_FAKE_CUDA_DEVICES", "0");
  fake_cuda_test::InChild([] {
    testing::internal::CaptureStderr();
    std::unique_ptr<Backend> b = MakePinnedHostBackend();
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_TRUE(absl::StrContains(err, "devmem: cpu_pinned is plain host memory here ("))
        << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_EQ(b->device(), (DeviceId{DeviceType::kCpuPinned, 0}));
    absl::StatusOr<void*> p = b->allocate_segment(4096);
    ASSERT_TRUE(p.ok()) << p.status();
    std::memset(*p, 1, 4096);
    b->free_segment(*p, 4096);
    EXPECT_EQ(Live("pinned"), 0u);
  });
}

}  // namespace
}  // namespace devmem

namespace devmem {
namespace {

// The physical-handle reserve on the CUDA backend (allocator/driver_calls.h). On a
// GPU the stream is rarely idle, so a proactive recycle is deferred until its event
// completes (expandable_segments.h): the map that triggered it creates, and the
// unmapped granules then wait in the reserve, where the next map takes them instead
// of calling cuMemCreate. Each range is one cuMemUnmap and one cuMemSetAccess, and
// empty_cache releases everything.
TEST(FakeCudaVmmCostTest, ARecycledGranuleKeepsItsHandleForTheNextMap) {
  {
    Config base;
    base.backend = BackendKind::kCuda;
    absl::StatusOr<Config> config =
        ParseConfig("expandable_segments:true,expandable_recycle_threshold:0", base);
    ASSERT_TRUE(config.ok()) << config.status();
    auto backend = CudaBackend();
    ASSERT_TRUE(backend);
    CachingAllocator alloc(std::move(backend), *config);
    std::vector<void*> all;
    for (int i = 0; i < 8; ++i) all.push_back(alloc.allocate(16 * kMiB));
    for (int i = 0; i < 8; i += 2) alloc.free(all[i]);  // four 16 MiB holes
    ASSERT_EQ(alloc.stats().driver.count(DriverCall::kCreate), 64);
    // The stream is kept busy (a host function waits on `gate`) while `big` is placed,
    // so that its recycle is deferred, as on a GPU that is working; without the gate
    // the fake's stream may or may not be idle by then, and the figures below with it.
    std::promise<void> gate;
    std::shared_future<void> opened = gate.get_future().share();
    ASSERT_TRUE(alloc.backend().launch_host_fn(Stream{}, [opened] { opened.wait(); }).ok());
    void* big = alloc.allocate(32 * kMiB);  // fits no hole: two holes are to move
    gate.set_value();
    alloc.backend().synchronize_stream(Stream{});
    alloc.process_events();  // the deferred recycle: two holes unmapped
    const DriverCallStats warm = alloc.stats().driver;
    EXPECT_EQ(warm.handle_reserve_bytes, static_cast<int64_t>(32 * kMiB));
    EXPECT_EQ(Live("handles"), 80u) << "unmapped, not released";
    void* more = alloc.allocate(32 * kMiB);  // maps 32 MiB: from the reserve
    ASSERT_EQ(CudaMemsetSync(0, more, 0x21, 32 * kMiB), absl::OkStatus());
    const DriverCallStats after = alloc.stats().driver;
    EXPECT_EQ(after.count(DriverCall::kCreate), warm.count(DriverCall::kCreate))
        << "no cuMemCreate once warm";
    EXPECT_EQ(after.count(DriverCall::kRelease), 0);
    EXPECT_EQ(after.count(DriverCall::kMap) - warm.count(DriverCall::kMap), 16);
    EXPECT_EQ(after.count(DriverCall::kSetAccess) - warm.count(DriverCall::kSetAccess), 1);
    // With threshold 0 this map also recycles the last two holes proactively: at once
    // when the stream is idle by then (their handles go to the reserve), else deferred
    // (the reserve is empty until the poll). Both are right; no handle is created.
    EXPECT_TRUE(after.handle_reserve_bytes == 0 ||
                after.handle_reserve_bytes == static_cast<int64_t>(32 * kMiB))
        << after.handle_reserve_bytes;
    EXPECT_EQ(Live("handles"), 80u) << "the same physical memory, mapped elsewhere";
    EXPECT_GT(after.ns[static_cast<int>(DriverCall::kMap)], 0) << "time is measured";
    EXPECT_TRUE(alloc.validate().ok()) << alloc.validate();
    for (void* p : {big, more}) alloc.free(p);
    for (int i = 1; i < 8; i += 2) alloc.free(all[i]);
    alloc.empty_cache();
    EXPECT_EQ(alloc.stats().driver.count(DriverCall::kRelease), 80);
    EXPECT_EQ(alloc.stats().driver.handle_reserve_bytes, 0);
  }
  ExpectNothingLive();
}

}  // namespace
}  // namespace devmem

namespace devmem {
namespace {

// A proactive recycle waits for an event (expandable_segments.h) and then unmaps only
// blocks free since before it (Block::free_seq). A block the user frees into a thread
// cache after the event, with work queued on its stream after the event, is not free
// since before it, however long ago the pool last had it free: when a cache gives it
// back (here at its thread's exit), it must count as freed then. The stream is held
// by two host functions: `before` keeps the recycle deferred, `after` (queued behind
// the event) keeps the memset on the cached blocks from running until the poll has
// decided; unmapping them would leave that memset over unmapped memory, which the
// fake reports when the stream runs it.
TEST(FakeCudaThreadCacheTest, ABlockCachedAfterARecycleEventIsNotUnmappedByIt) {
  {
    Config base;
    base.backend = BackendKind::kCuda;
    absl::StatusOr<Config> config = ParseConfig(
        "expandable_segments:true,expandable_recycle_threshold:0,thread_cache:true,"
        "thread_cache_max_size:256KiB",
        base);
    ASSERT_TRUE(config.ok()) << config.status();
    auto backend = CudaBackend();
    ASSERT_TRUE(backend);
    CachingAllocator alloc(std::move(backend), *config);
    constexpr size_t kBlock = 256 * kKiB;  // cached (thread_cache_max_size)
    std::vector<void*> granule;            // fill the small pool's first granule
    for (size_t i = 0; i < kG / kBlock; ++i) granule.push_back(alloc.allocate(kBlock));
    ASSERT_EQ(alloc.stats().driver.count(DriverCall::kMap), 1);
    // The first map may have decided a recycle too (the fake may report an event on an
    // idle stream as not yet complete): that decision ends here, with nothing to take.
    alloc.backend().synchronize_stream(Stream{});
    alloc.process_events();

    std::promise<void> open_before, open_after, after_reached;
    std::shared_future<void> before = open_before.get_future().share();
    std::shared_future<void> after = open_after.get_future().share();
    ASSERT_TRUE(alloc.backend().launch_host_fn(Stream{}, [before] { before.wait(); }).ok());
    // Maps a second granule: over the threshold (0), so a recycle is decided; the
    // stream is busy, so it waits for an event recorded now.
    void* next = alloc.allocate(kBlock);
    ASSERT_EQ(alloc.stats().driver.count(DriverCall::kMap), 2);
    ASSERT_TRUE(alloc.backend()
                    .launch_host_fn(Stream{}, [after, &after_reached] {
                      after_reached.set_value();
                      after.wait();
                    })
                    .ok());
    // Work on the first granule's blocks, queued after the event; then another thread
    // frees them into its cache and exits, which gives them back to the pool.
    for (void* p : granule) ASSERT_EQ(cudaMemsetAsync(p, 0x5c, kBlock, nullptr), cudaSuccess);
    std::thread worker([&] {
      void* own = alloc.allocate(512);  // makes the thread's cache
      for (void* p : granule) alloc.free(p);
      alloc.free(own);
    });
    worker.join();

    open_before.set_value();
    after_reached.get_future().wait();  // the event is complete; the memset is not run
    const size_t mappings = Live("mappings");
    alloc.process_events();  // the deferred recycle
    EXPECT_EQ(alloc.stats().driver.count(DriverCall::kUnmap), 0)
        << "the first granule was unmapped while a memset on it waits on its stream";
    EXPECT_EQ(Live("mappings"), mappings);
    open_after.set_value();
    alloc.backend().synchronize_stream(Stream{});
    EXPECT_TRUE(alloc.validate().ok()) << alloc.validate();
    alloc.free(next);
    alloc.empty_cache();
  }
  ExpectNothingLive();
}

}  // namespace
}  // namespace devmem
