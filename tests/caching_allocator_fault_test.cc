// tests/caching_allocator_fault_test.cc: CachingAllocator on a sim device whose segment
// allocations fail (SimBackend::set_failure_injection).
//
// What must hold whatever the driver does: only OutOfMemoryError escapes allocate(); a
// failed allocation changes no allocation statistic; the stats always equal a recount
// (validate()); nothing leaks (after freeing everything and empty_cache(), the device's
// used bytes and the reserved bytes are 0).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/caching_allocator.h"
#include "allocator/errors.h"
#include "allocator/oom_report.h"
#include "allocator/sim_backend.h"
#include "allocator/site.h"
#include "tests/hooked_backend.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::MakeSimAllocator;
using testutil::NewStream;
using testutil::SimAllocator;
using testutil::StatsEqual;

TEST(CachingAllocatorFaultTest, TransientSegmentFailureIsRetried) {
  SimAllocator t = MakeSimAllocator("sim_capacity:256MiB");
  ASSERT_NE(t.sim, nullptr);
  t.sim->set_failure_injection(/*fail_nth=*/1, /*probability=*/0, /*seed=*/0);
  void* p = nullptr;
  ASSERT_NO_THROW(p = t->allocate(4096));
  EXPECT_NE(p, nullptr);
  EXPECT_EQ(t.sim->injected_failures(), 1u);
  EXPECT_EQ(t.sim->segment_alloc_attempts(), 2u);
  DeviceStats s = t->stats();
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.num_device_alloc, 1);
  EXPECT_EQ(s.segment[kAggregatePool].current, 1);

  // The 2nd attempt from now fails: the large allocation after a cached one.
  const uint64_t injected_before = t.sim->injected_failures();
  t.sim->set_failure_injection(2, 0, 0);
  void* a = t->allocate(5 * kMiB);
  EXPECT_EQ(t.sim->injected_failures(), injected_before);
  void* b = nullptr;
  ASSERT_NO_THROW(b = t->allocate(30 * kMiB));
  EXPECT_EQ(t.sim->injected_failures(), injected_before + 1);
  EXPECT_EQ(t->stats().num_ooms, 0);
  EXPECT_NE(t->find_allocation(b), std::nullopt);
  for (void* x : {p, a, b}) t->free(x);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  EXPECT_VALID(*t);
}

TEST(CachingAllocatorFaultTest, PersistentFailureThrowsOomAndChangesNothing) {
  SimAllocator t = MakeSimAllocator("sim_capacity:256MiB");
  ASSERT_NE(t.sim, nullptr);
  void* p = t->allocate(4096);  // a small segment with a free rest
  void* q = t->allocate(4 * kMiB);  // a large one with a free rest
  t.sim->set_failure_injection(0, 1.0, 7);
  DeviceStats before = t->stats();
  bool oom = false;
  try {
    t->allocate(30 * kMiB);
  } catch (const OutOfMemoryError& e) {
    oom = true;
    EXPECT_EQ(e.report().requested_bytes, 30 * kMiB);
    EXPECT_EQ(e.report().allocated, static_cast<size_t>(4 * kMiB + 4096));
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected " << typeid(e).name() << ": " << e.what();
  }
  EXPECT_TRUE(oom);
  DeviceStats after = t->stats();
  EXPECT_EQ(after.num_ooms, before.num_ooms + 1);
  for (int pool = 0; pool < kNumStatPools; ++pool) {
    EXPECT_EQ(after.allocated_bytes[pool], before.allocated_bytes[pool]);
    EXPECT_EQ(after.requested_bytes[pool], before.requested_bytes[pool]);
    EXPECT_EQ(after.allocation[pool], before.allocation[pool]);
    EXPECT_EQ(after.reserved_bytes[pool], before.reserved_bytes[pool])
        << "no segment was unused, so none may have been released";
  }
  EXPECT_GT(t.sim->injected_failures(), 0u);
  EXPECT_VALID(*t);

  // Cache hits never touch the driver: they still work.
  void* small = nullptr;
  void* large = nullptr;
  EXPECT_NO_THROW(small = t->allocate(8192));
  EXPECT_NO_THROW(large = t->allocate(8 * kMiB));
  EXPECT_NE(small, nullptr);
  EXPECT_NE(large, nullptr);

  t.sim->set_failure_injection(0, 0, 0);
  void* r = nullptr;
  EXPECT_NO_THROW(r = t->allocate(30 * kMiB));
  for (void* x : {p, q, small, large, r}) t->free(x);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current, 0);
  EXPECT_VALID(*t);
}

// A cross-stream free records an event per stream. When recording throws (here the
// second of two), the free changes nothing: the block is still allocated with its
// stats and site counts, no event stays queued, validate() holds, and freeing it again
// works.
TEST(CachingAllocatorFaultTest, FreeWhoseEventRecordingThrowsChangesNothing) {
  SimAllocator t = MakeSimAllocator("sim_capacity:256MiB");
  ASSERT_NE(t.sim, nullptr);
  const Stream b = NewStream(*t);
  const Stream c = NewStream(*t);
  const SiteId site = InternNamedSite("fault_test.cc", 1, "f", SiteKind::kAlloc);
  void* p = t->allocate(3 * kMiB, Stream{}, site);
  t->record_stream(p, b);
  t->record_stream(p, c);
  const DeviceStats before = t->stats();
  const SiteStats site_before = testutil::SiteStatsFor(t->site_stats(), site);
  t.sim->set_event_failure_injection(2);
  EXPECT_THROW(t->free(p), std::runtime_error);
  t.sim->set_event_failure_injection(0);
  EXPECT_TRUE(StatsEqual(before, t->stats()));
  EXPECT_EQ(testutil::SiteStatsFor(t->site_stats(), site), site_before);
  ASSERT_TRUE(t->find_allocation(p).has_value()) << "the block was lost";
  EXPECT_EQ(t->stats().pending_bytes[kAggregatePool].current, 0);
  EXPECT_VALID(*t);
  ASSERT_NO_THROW(t->free(p));  // both events recorded this time
  t->backend().synchronize_stream(b);
  t->backend().synchronize_stream(c);
  t->process_events();
  EXPECT_EQ(t->stats().allocated_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(t->stats().pending_bytes[kAggregatePool].current, 0);
  EXPECT_VALID(*t);
}

// A driver error that is not about memory (a failed cudaMalloc or cuMemMap for another
// reason) propagates as std::runtime_error naming the call, and leaves the pool
// consistent: nothing allocated, stats as a recount says, and the allocator works once
// the driver does. Both for segment allocation and for map (expandable segments).
TEST(CachingAllocatorFaultTest, DriverErrorsLeaveThePoolConsistent) {
  for (const char* conf : {"expandable_segments:false", "expandable_segments:true"}) {
    SCOPED_TRACE(conf);
    testutil::HookedBackend* hooks = nullptr;
    SimAllocator t = testutil::MakeHookedSimAllocator(
        absl::StrCat("sim_capacity:256MiB,", conf), &hooks);
    void* keep = t->allocate(5 * kMiB);
    t->free(t->allocate(9 * kMiB));  // something cached, for the retry to release
    const int64_t allocated = t->stats().allocated_bytes[kAggregatePool].current;
    testutil::HookGuard alloc_segment_hook =
        hooks->allocate_segment_instead.Set([](size_t) -> absl::StatusOr<void*> {
          return absl::InternalError("test: the driver broke");
        });
    testutil::HookGuard map_hook = hooks->map_instead.Set(
        [](void*, size_t) { return absl::InternalError("test: the driver broke"); });
    try {
      t->allocate(64 * kMiB);
      ADD_FAILURE() << "no exception";
    } catch (const OutOfMemoryError& e) {
      ADD_FAILURE() << "a driver error is not an OOM: " << e.what();
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("the driver broke"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(t->stats().allocated_bytes[kAggregatePool].current, allocated);
    EXPECT_VALID(*t);
    hooks->allocate_segment_instead = nullptr;
    hooks->map_instead = nullptr;
    void* p = t->allocate(64 * kMiB);
    t->free(p);
    t->free(keep);
    t->empty_cache();
    EXPECT_EQ(t.sim->used_bytes(), 0u);
    EXPECT_VALID(*t);
  }
}

// Failure injection reaches map(): with expandable segments (the default), the Nth
// memory request is a map, and it fails.
TEST(CachingAllocatorFaultTest, InjectionFiresOnMapsWithExpandableSegments) {
  SimAllocator t = MakeSimAllocator("sim_capacity:256MiB,expandable_segments:true");
  ASSERT_NE(t.sim, nullptr);
  t.sim->set_failure_injection(/*fail_nth=*/1, 0, 0);
  void* p = t->allocate(4 * kMiB);  // the first map fails; the retry maps
  EXPECT_EQ(t.sim->injected_failures(), 1u);
  EXPECT_EQ(t->snapshot().segments.size(), 1u);
  EXPECT_TRUE(t->snapshot().segments[0].expandable);
  t.sim->set_failure_injection(0, /*probability=*/1.0, 0);
  const DeviceStats before = t->stats();
  EXPECT_THROW(t->allocate(64 * kMiB), OutOfMemoryError);
  EXPECT_GT(t.sim->injected_failures(), 1u);
  EXPECT_EQ(t->stats().allocated_bytes[kAggregatePool].current,
            before.allocated_bytes[kAggregatePool].current);
  t.sim->set_failure_injection(0, 0, 0);
  t->free(p);
  EXPECT_VALID(*t);
}

// A random workload under random segment failures. Each thread owns its buffers; a
// shared interval map checks that no two live buffers overlap.
class FaultWorkload {
 public:
  FaultWorkload(SimAllocator& t, std::vector<Stream> streams, uint64_t seed)
      : t_(t), streams_(std::move(streams)), seed_(seed) {}

  void Run(int thread_index, int ops) {
    std::mt19937_64 rng(seed_ * 1000003 + thread_index);
    struct Live {
      void* p;
      size_t n;
      uint64_t tag;
    };
    std::vector<Live> live;
    uint64_t next_tag = (uint64_t{static_cast<uint32_t>(thread_index)} << 40) + 1;
    auto free_one = [&](size_t i) {
      Live b = live[i];
      live[i] = live.back();
      live.pop_back();
      uint64_t got = 0;
      std::memcpy(&got, b.p, std::min<size_t>(b.n, 8));
      uint64_t want = 0;
      std::memcpy(&want, &b.tag, std::min<size_t>(b.n, 8));
      if (got != want) Fail(absl::StrCat("buffer ", b.tag, " corrupted"));
      Erase(b.p);
      // Every 8th free is cross-stream (pending until an event completes), and every
      // 32nd has its event recording fail: the free must then change nothing, and a
      // second free must work.
      if (streams_.size() > 1 && rng() % 8 == 0) {
        t_->record_stream(b.p, streams_[1 + rng() % (streams_.size() - 1)]);
        if (single_thread_ && rng() % 4 == 0) {
          t_.sim->set_event_failure_injection(1);
          bool threw = false;
          try {
            t_->free(b.p);
          } catch (const std::runtime_error&) {
            threw = true;
          }
          t_.sim->set_event_failure_injection(0);
          if (!threw && t_->find_allocation(b.p).has_value()) {
            Fail("free with a failing event neither threw nor freed");
          }
          if (threw && !t_->find_allocation(b.p).has_value()) {
            Fail("a free whose event recording threw lost the block");
          }
          if (!threw) {
            frees_++;
            return;
          }
        }
      }
      t_->free(b.p);
      frees_++;
    };
    for (int op = 0; op < ops && !failed_; ++op) {
      int dice = std::uniform_int_distribution<int>(0, 99)(rng);
      try {
        if (dice < 55 || live.empty()) {
          double e = std::uniform_real_distribution<double>(0, 25)(rng);
          size_t n = static_cast<size_t>(std::exp2(e));
          Stream s = streams_[rng() % streams_.size()];
          DeviceStats before;
          bool single = single_thread_;
          if (single) before = t_->stats();
          try {
            void* p = t_->allocate(n, s);
            uint64_t tag = next_tag++;
            std::memcpy(p, &tag, std::min<size_t>(n, 8));
            Insert(p, n);
            live.push_back({p, n, tag});
            allocs_++;
          } catch (const OutOfMemoryError& e) {
            ooms_++;
            if (single) {
              DeviceStats after = t_->stats();
              for (int pool = 0; pool < kNumStatPools; ++pool) {
                if (!(after.allocated_bytes[pool] == before.allocated_bytes[pool]) ||
                    !(after.requested_bytes[pool] == before.requested_bytes[pool]) ||
                    !(after.allocation[pool] == before.allocation[pool])) {
                  Fail("a failed allocation changed the allocation stats");
                }
              }
            }
            // Make room, as a program would.
            for (int k = 0; k < 3 && !live.empty(); ++k) free_one(rng() % live.size());
          }
        } else if (dice < 95) {
          free_one(rng() % live.size());
        } else if (dice < 97) {
          t_->empty_cache();
        } else if (dice < 99) {
          t_->trim(std::uniform_int_distribution<size_t>(0, 64 * kMiB)(rng));
        } else {
          t_->process_events();
        }
      } catch (const OutOfMemoryError& e) {
        Fail(absl::StrCat("OutOfMemoryError from a non-allocating call: ", e.what()));
      } catch (const InvalidArgumentError& e) {
        Fail(absl::StrCat("InvalidArgumentError: ", e.what()));
      } catch (const std::exception& e) {
        Fail(absl::StrCat("unexpected ", typeid(e).name(), ": ", e.what()));
      } catch (...) {
        Fail("unexpected non-std exception");
      }
      if (op % 200 == 0) {
        absl::Status v = t_->validate();
        if (!v.ok()) Fail(absl::StrCat("validate() at op ", op, ": ", v.ToString()));
      }
    }
    while (!live.empty()) free_one(live.size() - 1);
  }

  void set_single_thread(bool v) { single_thread_ = v; }
  bool failed() const { return failed_; }
  std::string failure() {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }
  int64_t ooms() const { return ooms_; }
  int64_t allocs() const { return allocs_; }
  int64_t frees() const { return frees_; }

 private:
  void Fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.empty()) failure_ = why;
    failed_ = true;
  }
  void Insert(void* p, size_t n) {
    auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto next = ranges_.lower_bound(a);
    if (next != ranges_.end() && next->first < a + n) {
      failure_ = absl::StrCat("overlap: 0x", absl::Hex(a), "+", n, " and 0x",
                              absl::Hex(next->first));
      failed_ = true;
    }
    if (next != ranges_.begin()) {
      auto prev = std::prev(next);
      if (prev->second > a) {
        failure_ = absl::StrCat("overlap: 0x", absl::Hex(a), " inside 0x",
                                absl::Hex(prev->first));
        failed_ = true;
      }
    }
    ranges_[a] = a + n;
  }
  void Erase(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    ranges_.erase(reinterpret_cast<uintptr_t>(p));
  }

  SimAllocator& t_;
  std::vector<Stream> streams_;
  uint64_t seed_;
  bool single_thread_ = false;
  std::mutex mu_;
  std::map<uintptr_t, uintptr_t> ranges_;
  std::string failure_;
  std::atomic<bool> failed_{false};
  std::atomic<int64_t> ooms_{0}, allocs_{0}, frees_{0};
};

void ExpectNoLeak(SimAllocator& t) {
  t->empty_cache();
  DeviceStats s = t->stats();
  EXPECT_EQ(s.allocated_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(s.reserved_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(s.pending_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(s.segment[kAggregatePool].current, 0);
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  EXPECT_TRUE(t->snapshot().segments.empty());
  // With regular segments every device alloc has its free; an unmap may cover parts of
  // several maps, so expandable segments balance bytes (checked above), not counts.
  if (t.config.expandable_segments == ExpandableMode::kOff) {
    EXPECT_EQ(s.num_device_alloc - s.num_device_free, 0);
  }
  EXPECT_VALID(*t);
}

// The random fault tests run with regular segments and with expandable segments (the
// default configuration), where failures are injected into map().
class CachingAllocatorFaultModeTest : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Segments, CachingAllocatorFaultModeTest,
                         ::testing::Values("expandable_segments:false",
                                           "expandable_segments:true"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param).find("true") != std::string::npos
                                      ? "expandable"
                                      : "regular";
                         });

TEST_P(CachingAllocatorFaultModeTest, RandomFailuresSingleThread) {
  const uint64_t seed = testutil::TestSeed(20240611);
  SCOPED_TRACE(absl::StrCat("seed=", seed, " (set DEVMEM_TEST_SEED to reproduce)"));
  SimAllocator t = MakeSimAllocator(absl::StrCat("sim_capacity:256MiB,", GetParam()));
  ASSERT_NE(t.sim, nullptr);
  t.sim->set_failure_injection(0, 0.3, seed);
  FaultWorkload w(t, {Stream{}, NewStream(*t)}, seed);
  w.set_single_thread(true);
  w.Run(0, 5000);
  EXPECT_FALSE(w.failed()) << w.failure();
  EXPECT_GT(t.sim->injected_failures(), 50u) << "the test did not inject failures";
  EXPECT_GT(w.allocs(), 1000);
  DeviceStats s = t->stats();
  EXPECT_EQ(s.num_ooms, w.ooms());
  EXPECT_EQ(s.allocation[kAggregatePool].allocated, w.allocs());
  EXPECT_EQ(s.num_frees, w.frees());
  t.sim->set_failure_injection(0, 0, 0);
  ExpectNoLeak(t);
}

TEST_P(CachingAllocatorFaultModeTest, RandomFailuresTwoThreads) {
  const uint64_t seed = testutil::TestSeed(77);
  SCOPED_TRACE(absl::StrCat("seed=", seed, " (set DEVMEM_TEST_SEED to reproduce)"));
  SimAllocator t = MakeSimAllocator(absl::StrCat("sim_capacity:256MiB,", GetParam()));
  ASSERT_NE(t.sim, nullptr);
  t.sim->set_failure_injection(0, 0.3, seed);
  FaultWorkload w(t, {Stream{}, NewStream(*t), NewStream(*t)}, seed);
  std::thread a([&] { w.Run(1, 4000); });
  std::thread b([&] { w.Run(2, 4000); });
  a.join();
  b.join();
  EXPECT_FALSE(w.failed()) << w.failure();
  EXPECT_GT(t.sim->injected_failures(), 50u);
  DeviceStats s = t->stats();
  EXPECT_EQ(s.num_ooms, w.ooms());
  EXPECT_EQ(s.allocation[kAggregatePool].allocated, w.allocs());
  EXPECT_EQ(s.num_frees, w.frees());
  t.sim->set_failure_injection(0, 0, 0);
  ExpectNoLeak(t);
}

// Every segment allocation fails with probability 0.9: nearly everything must come from
// the cache, the staged retry runs constantly, and nothing may leak or break.
TEST_P(CachingAllocatorFaultModeTest, MostlyFailingDriver) {
  const uint64_t seed = testutil::TestSeed(5);
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  SimAllocator t = MakeSimAllocator(absl::StrCat("sim_capacity:128MiB,max_split_size_mb:40,"
                                                 "garbage_collection_threshold:0.6,",
                                                 GetParam()));
  ASSERT_NE(t.sim, nullptr);
  t.sim->set_failure_injection(0, 0.9, seed);
  FaultWorkload w(t, {Stream{}, NewStream(*t)}, seed);
  w.set_single_thread(true);
  w.Run(0, 3000);
  EXPECT_FALSE(w.failed()) << w.failure();
  EXPECT_GT(w.ooms(), 0);
  t.sim->set_failure_injection(0, 0, 0);
  ExpectNoLeak(t);
}

}  // namespace
}  // namespace devmem
