// tests/config_reach_test.cc: every configuration key reaches the component it
// configures. config_test.cc checks that each key parses into its Config field; this
// checks that the field then changes what the backend or the allocator does (a key
// read into Config and never passed on, like sim_free_latency_us once was, fails here).
//
// One case per key, table-driven: each sets the key to a non-default value and observes
// the effect through the public API, compared with the default. A key of the runtime
// layer is listed in kRuntimeKeys with the test that covers it; a new key in neither
// place fails KeysAreAllCovered.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/stack_sampler.h"
#include "allocator/arena.h"
#include "allocator/backend.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/errors.h"
#include "allocator/snapshot.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using Clock = std::chrono::steady_clock;

Config Parse(std::string_view text) {
  absl::StatusOr<Config> c = ParseConfig(text);
  EXPECT_TRUE(c.ok()) << text << ": " << c.status();
  return c.ok() ? *c : Config{};
}

std::unique_ptr<Backend> BackendFor(std::string_view text, int index = 0) {
  absl::StatusOr<std::unique_ptr<Backend>> b = MakeBackend(Parse(text), index);
  EXPECT_TRUE(b.ok()) << text << ": " << b.status();
  return b.ok() ? *std::move(b) : nullptr;
}

std::unique_ptr<CachingAllocator> Allocator(std::string_view text) {
  const Config config = Parse(text);
  absl::StatusOr<std::unique_ptr<Backend>> b = MakeBackend(config, 0);
  EXPECT_TRUE(b.ok()) << text << ": " << b.status();
  return std::make_unique<CachingAllocator>(*std::move(b), config);
}

// Nanoseconds that `fn` takes.
int64_t Elapsed(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

// Which of the first 64 segment allocations fail.
uint64_t FailurePattern(Backend& b) {
  uint64_t bits = 0;
  for (int i = 0; i < 64; ++i) {
    absl::StatusOr<void*> p = b.allocate_segment(2 * kMiB);
    if (p.ok()) {
      b.free_segment(*p, 2 * kMiB);
    } else {
      bits |= uint64_t{1} << i;
    }
  }
  return bits;
}

constexpr const char* kSim = "backend:sim,sim_capacity:128MiB,expandable_segments:false";

struct ReachCase {
  std::string_view key;
  std::function<void()> check;  // fails (EXPECT) when the key does not reach
};

const std::vector<ReachCase>& Cases() {
  static const auto* cases = new std::vector<ReachCase>{
      {"backend",
       [] {
         EXPECT_EQ(BackendFor("backend:cpu")->device().type, DeviceType::kCpu);
         EXPECT_EQ(BackendFor("backend:sim")->device().type, DeviceType::kSim);
       }},
      {"sim_capacity",
       [] {
         EXPECT_EQ(BackendFor("backend:sim,sim_capacity:96MiB")->mem_info().total_bytes,
                   96 * kMiB);
       }},
      {"sim_alloc_latency_us",
       [] {
         auto b = BackendFor("backend:sim,sim_alloc_latency_us:20000");
         void* p = nullptr;
         EXPECT_GE(Elapsed([&] { p = *b->allocate_segment(2 * kMiB); }), 20'000'000);
         b->free_segment(p, 2 * kMiB);
       }},
      {"sim_free_latency_us",
       [] {
         auto b = BackendFor("backend:sim,sim_free_latency_us:20000");
         void* p = *b->allocate_segment(2 * kMiB);
         EXPECT_GE(Elapsed([&] { b->free_segment(p, 2 * kMiB); }), 20'000'000);
       }},
      {"sim_fail_nth",
       [] {
         auto b = BackendFor("backend:sim,sim_fail_nth:3");
         EXPECT_EQ(FailurePattern(*b), uint64_t{1} << 2);
       }},
      {"sim_fail_probability",
       [] {
         EXPECT_EQ(FailurePattern(*BackendFor("backend:sim,sim_fail_probability:1")), ~uint64_t{0});
         EXPECT_EQ(FailurePattern(*BackendFor("backend:sim")), 0u);
       }},
      {"sim_seed",
       [] {
         auto pattern = [](std::string_view seed) {
           return FailurePattern(
               *BackendFor(std::string("backend:sim,sim_fail_probability:0.5,sim_seed:") +
                         std::string(seed)));
         };
         EXPECT_EQ(pattern("1"), pattern("1"));
         EXPECT_NE(pattern("1"), pattern("2"));
       }},
      {"sim_devices",
       [] {
         EXPECT_FALSE(MakeBackend(Parse("backend:sim,sim_devices:2"), 2).ok());
         EXPECT_TRUE(MakeBackend(Parse("backend:sim,sim_devices:3"), 2).ok());
       }},
      {"sim_driver_cost",
       [] {
         // Through the factory to the backend: one segment costs what the key says.
         auto b = BackendFor("backend:sim,sim_driver_cost:malloc=7/free=3");
         b->free_segment(*b->allocate_segment(2 * kMiB), 2 * kMiB);
         EXPECT_EQ(b->driver_calls().total_ns(), 10'000);
         auto d = BackendFor("backend:sim");
         d->free_segment(*d->allocate_segment(2 * kMiB), 2 * kMiB);
         EXPECT_EQ(d->driver_calls().total_ns(), 100'000);
       }},
      {"max_split_size_mb",
       [] {
         // A 24 MiB block is oversize at 20 MiB: a 12 MiB request takes a new segment.
         auto a = Allocator(std::string(kSim) + ",max_split_size_mb:20");
         a->free(a->allocate(24 * kMiB));
         void* p = a->allocate(12 * kMiB);
         EXPECT_EQ(a->stats().max_split_size, static_cast<int64_t>(20 * kMiB));
         EXPECT_EQ(a->stats().num_device_alloc, 2) << "the oversize block served a small request";
         a->free(p);
         auto d = Allocator(kSim);
         d->free(d->allocate(24 * kMiB));
         d->free(d->allocate(12 * kMiB));
         EXPECT_EQ(d->stats().num_device_alloc, 1);
       }},
      {"garbage_collection_threshold",
       [] {
         // 22 MiB cached; a 40 MiB miss would reserve 62 of 128 MiB, over 0.4: the
         // cached segment is released first.
         auto a = Allocator(std::string(kSim) + ",garbage_collection_threshold:0.4");
         a->free(a->allocate(22 * kMiB));
         a->free(a->allocate(40 * kMiB));
         EXPECT_EQ(a->stats().num_device_free, 1);
         auto d = Allocator(kSim);
         d->free(d->allocate(22 * kMiB));
         d->free(d->allocate(40 * kMiB));
         EXPECT_EQ(d->stats().num_device_free, 0);
       }},
      {"expandable_segments",
       [] {
         auto on = Allocator("backend:sim,sim_capacity:128MiB,expandable_segments:true");
         void* p = on->allocate(4 * kMiB);
         EXPECT_TRUE(on->snapshot().segments.at(0).expandable);
         on->free(p);
         auto off = Allocator(kSim);
         void* q = off->allocate(4 * kMiB);
         EXPECT_FALSE(off->snapshot().segments.at(0).expandable);
         off->free(q);
       }},
      {"expandable_recycle_threshold",
       [] {
         // 16 MiB cached in a hole between live blocks; a 24 MiB request maps anew. With
         // threshold 0 the idle hole is unmapped first; with none it is kept.
         auto run = [](std::string_view threshold) {
           auto a = Allocator(std::string("backend:sim,sim_capacity:128MiB,"
                                          "expandable_segments:true,"
                                          "expandable_recycle_threshold:") +
                              std::string(threshold));
           void* x = a->allocate(8 * kMiB);
           void* hole = a->allocate(16 * kMiB);
           void* y = a->allocate(8 * kMiB);
           a->free(hole);
           void* big = a->allocate(24 * kMiB);
           const int64_t unmaps = a->stats().num_device_free;
           for (void* p : {x, y, big}) a->free(p);
           return unmaps;
         };
         EXPECT_GT(run("0"), 0);
         EXPECT_EQ(run("none"), 0);
       }},
      {"stack_sample_bytes",
       [] {
         auto every = Allocator(std::string(kSim) + ",stack_sample_bytes:1");
         void* p = every->allocate(4096);
         EXPECT_EQ(stack_sampler::LiveStacks(every.get()).size(), 1u);
         every->free(p);
         auto off = Allocator(std::string(kSim) + ",stack_sample_bytes:0");
         void* q = off->allocate(64 * kMiB);
         EXPECT_TRUE(stack_sampler::LiveStacks(off.get()).empty());
         off->free(q);
         stack_sampler::SetMeanBytes(kDefaultStackSampleBytes);
       }},
      {"arena_max_waste",
       [] {
         // A scope whose every 64 KiB chunk keeps one 512 B buffer live among dead
         // 16 KiB temporaries: with the default bound requests spill to the pool once
         // a chunk's worth is dead; with 0 (off) the scope takes chunk after chunk.
         auto spills = [](std::string_view conf) {
           auto a = Allocator(std::string(kSim) + std::string(conf));
           std::vector<void*> kept;
           int64_t n = 0;
           {
             ArenaScope scope(*a, "step",
                              ArenaOptions{.chunk_size = 64 * kKiB, .stream = {},
                                           .max_waste_fraction = {}});
             for (int i = 0; i < 8; ++i) {
               kept.push_back(a->allocate(512));
               for (int j = 0; j < 4; ++j) a->free(a->allocate(16 * kKiB));
             }
             n = scope.summary().spills;
           }
           for (void* p : kept) a->free(p);
           return n;
         };
         EXPECT_GT(spills(""), 0);
         EXPECT_EQ(spills(",arena_max_waste:0"), 0);
       }},
      {"per_process_memory_fraction",
       [] {
         auto a = Allocator(std::string(kSim) + ",per_process_memory_fraction:0.25");
         EXPECT_THROW(a->allocate(40 * kMiB), OutOfMemoryError);
         a->free(a->allocate(30 * kMiB));
         auto d = Allocator(kSim);
         d->free(d->allocate(40 * kMiB));
       }},
  };
  return *cases;
}

// Keys the runtime layer reads (runtime/), with the tests that show them reaching it.
const std::set<std::string_view> kRuntimeKeys = {
    "trace_entries",        // runtime_trace_test.cc
    "http",                 // runtime_http_test.cc
    "http_token_file",      // runtime_http_test.cc
    "http_allow_remote",    // runtime_http_test.cc
    "http_allowed_hosts",   // runtime_http_test.cc (HttpAllowedHostsWidensTheHostCheck)
    "http_metrics_token",   // runtime_http_test.cc (HttpMetricsTokenGuardsMetricsToo)
    "oom_dump_dir",         // runtime_oom_test.cc
    "flight_recorder",      // postmortem_test.py (flight_recorder_child.cc runs the runtime)
    "site_top_k",           // runtime_metrics_test.cc
    // Reached through CachingAllocator, tested where they act: thread_cache_test.cc
    // (OffMeansNoThreadCachedBlocks, CountsAndBytesAreBounded,
    // LargeRequestsAndRecordStreamBypassTheCache).
    "thread_cache", "thread_cache_max_size", "thread_cache_max_bytes",
    "thread_cache_max_blocks",
};

TEST(ConfigReachTest, KeysAreAllCovered) {
  std::set<std::string_view> covered = kRuntimeKeys;
  for (const ReachCase& c : Cases()) covered.insert(c.key);
  for (const ConfigKeyDoc& doc : ConfigKeys()) {
    EXPECT_TRUE(covered.count(doc.key)) << "key " << doc.key
                                        << " has no reach case here and is not a runtime key";
  }
}

class ConfigReachKeyTest : public ::testing::TestWithParam<size_t> {};

TEST_P(ConfigReachKeyTest, ReachesItsComponent) {
  const ReachCase& c = Cases()[GetParam()];
  SCOPED_TRACE(std::string(c.key));
  c.check();
}

INSTANTIATE_TEST_SUITE_P(Keys, ConfigReachKeyTest,
                         ::testing::Range(size_t{0}, Cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::string(Cases()[info.param].key);
                         });

}  // namespace
}  // namespace devmem
