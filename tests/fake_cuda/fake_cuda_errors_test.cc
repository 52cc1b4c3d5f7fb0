// tests/fake_cuda/fake_cuda_errors_test.cc: driver errors that do not abort. A kernel
// faults (devmem_fake_cuda_launch_fault: a device-side assert), the device's context is
// broken for the rest of the process, and every CUDA call on it returns the error.
// Before, the next empty_cache, event poll or OOM retry ended the process from inside
// the library (FatalCuda); now:
//   FakeCudaStickyBackendTest   each backend call that returns no Status throws
//                               DriverError naming the device, the call and the error;
//   FakeCudaStickyAllocatorTest each allocator path that reaches the driver throws
//                               DriverError naming itself and the CUDA error, poisons
//                               the allocator (later calls refused with that first
//                               error), changes nothing (validate() passes, stats and
//                               snapshots are as before), and the allocator is
//                               destroyed without aborting. Regular and expandable
//                               segments.
// A sticky error lasts as long as the process, so each case runs in a child process
// (EXPECT_EXIT, threadsafe style: a fresh exec of this binary running just that case),
// which exits 0 only if no expectation failed there.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/backend.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/errors.h"
#include "allocator/types.h"
#include "cuda/cuda_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/fake_cuda/fake_cuda_test_util.h"
#include "tests/hooked_backend.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

constexpr const char* kAssertText = "device-side assert triggered (cudaErrorAssert";

using fake_cuda_test::CudaBackend;
using fake_cuda_test::InChild;  // a fresh process per case

cudaStream_t ToCuda(Stream s) { return reinterpret_cast<cudaStream_t>(s.handle); }

// A kernel on `stream` hits a device-side assert, and the stream has reached it.
void FaultAndWait(Stream stream) {
  ASSERT_EQ(devmem_fake_cuda_launch_fault(ToCuda(stream), cudaErrorAssert), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(ToCuda(stream)), cudaErrorAssert);
}

// `what` threw DriverError whose message has every one of `parts`.
void ExpectDriverError(const std::function<void()>& what,
                       const std::vector<std::string>& parts) {
  try {
    what();
    ADD_FAILURE() << "no DriverError";
  } catch (const DriverError& e) {
    for (const std::string& part : parts) {
      EXPECT_TRUE(absl::StrContains(e.what(), part)) << e.what() << "\nlacks: " << part;
    }
  }
}

TEST(FakeCudaStickyBackendTest, CallsAfterAFaultThrowNamingTheCallAndTheError) {
  InChild([] {
    auto backend = CudaBackend();
    ASSERT_TRUE(backend);
    absl::StatusOr<void*> p = backend->allocate_segment(kMiB);
    ASSERT_TRUE(p.ok());
    const Event event = backend->record_event(Stream{});
    backend->synchronize_event(event);
    FaultAndWait(Stream{});
    ExpectDriverError([&] { backend->synchronize_stream(Stream{}); },
                      {"cuda:0: cudaStreamSynchronize: ", kAssertText});
    ExpectDriverError([&] { backend->event_done(event); },
                      {"cuda:0: cudaEventQuery: ", kAssertText});
    ExpectDriverError([&] { backend->synchronize_event(event); },
                      {"cuda:0: cudaEventSynchronize: ", kAssertText});
    ExpectDriverError([&] { backend->record_event(Stream{}); },
                      {"cuda:0: cudaEventCreateWithFlags", kAssertText});
    ExpectDriverError([&] { backend->free_segment(*p, kMiB); },
                      {"cuda:0: cudaFree(", kAssertText});
    // Sticky: even where a Status is returned, so that nobody retries.
    ExpectDriverError([&] { (void)backend->allocate_segment(kMiB); },
                      {"cuda:0: cudaMalloc(", kAssertText});
  });
}

// --- the allocator ------------------------------------------------------------------

// The state every case starts from: a cached (free) segment on `s`, a live block, and
// a block freed while `s2` still uses it (pending on an event, `s2` held by a blocker).
class FakeCudaStickyAllocatorTest : public ::testing::TestWithParam<const char*> {
 protected:
  struct World {
    testutil::HookedBackend* hooks = nullptr;
    std::optional<CachingAllocator> alloc;
    Stream s, s2;
    void* live = nullptr;
    std::optional<testutil::StreamBlocker> blocker;
  };

  void Build(World& w) {
    Config base;
    base.backend = BackendKind::kCuda;
    absl::StatusOr<Config> config =
        ParseConfig(absl::StrCat(GetParam(), ",thread_cache:false"), base);
    ASSERT_TRUE(config.ok()) << config.status();
    auto owned = std::make_unique<testutil::HookedBackend>(CudaBackend());
    w.hooks = owned.get();
    w.alloc.emplace(std::move(owned), *config);
    Backend& b = w.alloc->backend();
    w.s = *b.create_stream();
    w.s2 = *b.create_stream();
    w.live = w.alloc->allocate(3 * kMiB, w.s);        // a 20 MiB segment
    void* shared = w.alloc->allocate(5 * kMiB, w.s);  // the same one
    w.alloc->free(w.alloc->allocate(30 * kMiB, w.s));  // a segment of its own, cached
    w.alloc->record_stream(shared, w.s2);
    w.blocker.emplace(b, w.s2);
    w.alloc->free(shared);  // pending on s2's event
    ASSERT_EQ(w.alloc->stats().pending_bytes[kAggregatePool].current,
              static_cast<int64_t>(5 * kMiB));
  }

  // `op` (the public call `name`) meets the fault: it throws naming itself and the
  // CUDA error, the allocator is poisoned and unchanged, and later calls are refused.
  void ExpectPoisonedBy(World& w, const char* name, const std::function<void()>& op) {
    CachingAllocator& a = *w.alloc;
    const DeviceStats before = a.stats();
    const size_t segments = a.snapshot().segments.size();
    ExpectDriverError(op, {absl::StrCat("devmem: ", name, " on cuda:0: "), kAssertText,
                           "poisoned"});
    EXPECT_TRUE(a.poisoned());
    EXPECT_TRUE(a.validate().ok()) << a.validate();
    const DeviceStats after = a.stats();
    EXPECT_EQ(after.reserved_bytes[kAggregatePool].current,
              before.reserved_bytes[kAggregatePool].current);
    EXPECT_EQ(after.allocated_bytes[kAggregatePool].current,
              before.allocated_bytes[kAggregatePool].current);
    EXPECT_EQ(a.snapshot().segments.size(), segments);
    const std::vector<std::string> refused = {"refused", kAssertText};
    ExpectDriverError([&] { a.allocate(kMiB, w.s); }, refused);
    ExpectDriverError([&] { a.free(w.live); }, refused);
    ExpectDriverError([&] { a.record_stream(w.live, w.s2); }, refused);
    ExpectDriverError([&] { a.empty_cache(); }, refused);
    ExpectDriverError([&] { a.trim(0); }, refused);
    ExpectDriverError([&] { a.process_events(); }, refused);
    EXPECT_TRUE(a.validate().ok()) << a.validate();
    EXPECT_TRUE(a.find_allocation(w.live).has_value());
    w.blocker->Release();
    w.alloc.reset();  // without a driver call, and without ending the process
  }
};

TEST_P(FakeCudaStickyAllocatorTest, EmptyCache) {
  InChild([&] {
    World w;
    Build(w);
    FaultAndWait(w.s);
    ExpectPoisonedBy(w, "empty_cache", [&] { w.alloc->empty_cache(); });
  });
}

TEST_P(FakeCudaStickyAllocatorTest, ProcessEvents) {
  InChild([&] {
    World w;
    Build(w);
    FaultAndWait(w.s);
    ExpectPoisonedBy(w, "process_events", [&] { w.alloc->process_events(); });
  });
}

TEST_P(FakeCudaStickyAllocatorTest, Trim) {
  InChild([&] {
    World w;
    Build(w);
    FaultAndWait(w.s);
    ExpectPoisonedBy(w, "trim", [&] { w.alloc->trim(0); });
  });
}

// A cross-stream free records an event: its record fails.
TEST_P(FakeCudaStickyAllocatorTest, CrossStreamFree) {
  InChild([&] {
    World w;
    Build(w);
    w.alloc->record_stream(w.live, w.s2);
    FaultAndWait(w.s);
    ExpectPoisonedBy(w, "free", [&] { w.alloc->free(w.live); });
  });
}

// A cache miss: the segment's allocation fails with the sticky error.
TEST_P(FakeCudaStickyAllocatorTest, CacheMiss) {
  InChild([&] {
    World w;
    Build(w);
    FaultAndWait(w.s);
    ExpectPoisonedBy(w, "allocate", [&] { w.alloc->allocate(200 * kMiB, w.s); });
  });
}

// Out of memory, then the staged retry waits for the stream of a cached segment (an
// event recorded on it, allocator/release_fence.h) and finds the device faulted on the
// way: the kernel that asserts is launched on `s` just before that event is recorded
// (a hook on the allocating thread, not a host function).
TEST_P(FakeCudaStickyAllocatorTest, OutOfMemoryRetry) {
  InChild([&] {
    World w;
    Build(w);
    bool launched = false;
    auto fault = [&](Stream stream) {
      if (stream != w.s || launched) return;
      launched = true;
      EXPECT_EQ(devmem_fake_cuda_launch_fault(ToCuda(stream), cudaErrorAssert),
                cudaSuccess);
    };
    testutil::HookGuard record_hook = w.hooks->before_record_event.Set(fault);
    testutil::HookGuard rerecord_hook =
        w.hooks->before_rerecord_event.Set([&](Event, Stream stream) { fault(stream); });
    // On s2: more than the 1 GiB device has left, until what s caches goes back.
    ExpectPoisonedBy(w, "allocate", [&] { w.alloc->allocate(1000 * kMiB, w.s2); });
  });
}

INSTANTIATE_TEST_SUITE_P(Segments, FakeCudaStickyAllocatorTest,
                         fake_cuda_test::SegmentKinds(), fake_cuda_test::SegmentKindName);

}  // namespace
}  // namespace devmem
