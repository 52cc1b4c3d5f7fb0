// tests/driver_calls_test.cc: driver calls counted by kind, the physical-handle
// reserve, and the sim driver cost model (allocator/driver_calls.h).
//
// The counts here are the calls the CUDA backend makes for the same operations (the
// sim backend emulates them call for call; tests/fake_cuda/ checks the CUDA side):
// a map of n granules is n cuMemMap, one cuMemSetAccess and one cuMemCreate per
// granule the reserve lacks; an unmap of a contiguous range is one cuMemUnmap.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/driver_calls.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::MakeSimAllocator;
using testutil::SimAllocator;

constexpr size_t kGranule = 2 * kMiB;

int64_t Calls(const CachingAllocator& a, DriverCall c) {
  return a.stats().driver.count(c);
}

// Eight 16 MiB buffers, every other one freed: four 16 MiB holes between survivors
// (the pattern of caching_allocator_recycle_test.cc).
std::vector<void*> MakeHoles(CachingAllocator& a) {
  std::vector<void*> all;
  for (int i = 0; i < 8; ++i) all.push_back(a.allocate(16 * kMiB));
  std::vector<void*> survivors;
  for (int i = 0; i < 8; ++i) {
    if (i % 2 == 0) {
      a.free(all[i]);
    } else {
      survivors.push_back(all[i]);
    }
  }
  return survivors;
}

TEST(DriverCallsTest, MapsCountOneCreateAndMapPerGranuleAndOneSetAccessPerRange) {
  SimAllocator t = MakeSimAllocator("expandable_segments:true");
  void* p = t->allocate(16 * kMiB);
  const DriverCallStats d = t->stats().driver;
  EXPECT_EQ(d.count(DriverCall::kAddressReserve), 1);
  EXPECT_EQ(d.count(DriverCall::kCreate), 8);
  EXPECT_EQ(d.count(DriverCall::kMap), 8);
  EXPECT_EQ(d.count(DriverCall::kSetAccess), 1) << "one cuMemSetAccess for the range";
  EXPECT_EQ(d.count(DriverCall::kMalloc), 0);
  t->free(p);
  t->empty_cache();
  const DriverCallStats e = t->stats().driver;
  EXPECT_EQ(e.count(DriverCall::kUnmap), 1) << "one cuMemUnmap for the range";
  EXPECT_EQ(e.count(DriverCall::kRelease), 8);
  EXPECT_EQ(e.count(DriverCall::kAddressFree), 1);
  EXPECT_EQ(e.handle_reserve_bytes, 0);
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

TEST(DriverCallsTest, RegularSegmentsCountMallocAndFree) {
  SimAllocator t = MakeSimAllocator("expandable_segments:false");
  t->free(t->allocate(4 * kMiB));
  t->empty_cache();
  const DriverCallStats d = t->stats().driver;
  EXPECT_EQ(d.count(DriverCall::kMalloc), 1);
  EXPECT_EQ(d.count(DriverCall::kFree), 1);
  EXPECT_EQ(d.count(DriverCall::kCreate), 0);
}

// The point of the reserve: a recycled granule keeps its physical memory and is
// mapped elsewhere, so a warm device remaps without cuMemCreate (7.6-193 us each on
// an A100) or cuMemRelease.
TEST(DriverCallsTest, ARecycledGranuleKeepsItsHandleAndIsMappedElsewhere) {
  SimAllocator t =
      MakeSimAllocator("expandable_segments:true,expandable_recycle_threshold:0");
  std::vector<void*> survivors = MakeHoles(*t);
  const DriverCallStats warm = t->stats().driver;
  ASSERT_EQ(warm.count(DriverCall::kCreate), 64) << "128 MiB of 2 MiB granules";
  // 32 MiB fits in none of the holes: two holes' granules are unmapped and mapped
  // again past the survivors (caching_allocator_recycle_test.cc pins the policy).
  void* big = t->allocate(32 * kMiB);
  const DriverCallStats after = t->stats().driver;
  EXPECT_EQ(after.count(DriverCall::kCreate), 64) << "no cuMemCreate once warm";
  EXPECT_EQ(after.count(DriverCall::kRelease), 0) << "the handles were kept";
  EXPECT_EQ(after.count(DriverCall::kUnmap) - warm.count(DriverCall::kUnmap), 2)
      << "one cuMemUnmap per hole";
  EXPECT_EQ(after.count(DriverCall::kMap) - warm.count(DriverCall::kMap), 16);
  EXPECT_EQ(after.count(DriverCall::kSetAccess) - warm.count(DriverCall::kSetAccess), 1);
  EXPECT_EQ(after.handle_reserve_bytes, 0) << "the map took every recycled granule";
  EXPECT_EQ(t.sim->used_bytes(), 128 * kMiB);
  EXPECT_VALID(*t);
  t->free(big);
  for (void* p : survivors) t->free(p);
  t->empty_cache();
  EXPECT_EQ(Calls(*t, DriverCall::kRelease), 64);
  EXPECT_EQ(t.sim->used_bytes(), 0u);
}

// Memory given back (trim, empty_cache, garbage collection, the OOM retry) includes
// the reserve: unmapped memory must not stay charged to the device.
TEST(DriverCallsTest, TrimReleasesTheHandleReserve) {
  SimAllocator t = MakeSimAllocator("expandable_segments:true");
  void* p = t->allocate(16 * kMiB);
  t->free(p);
  t->trim(0);
  const DriverCallStats d = t->stats().driver;
  EXPECT_EQ(d.handle_reserve_bytes, 0);
  EXPECT_EQ(d.count(DriverCall::kRelease), 8);
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  EXPECT_EQ(t.sim->handle_reserve_bytes(), 0u);
}

// The sim backend's own contract: unmap keeps the memory charged in the reserve, map
// takes from it first, release_handle_reserve gives it back.
TEST(DriverCallsTest, SimUnmapKeepsGranulesChargedUntilReleased) {
  SimOptions o;
  o.capacity = 8 * kGranule;
  std::unique_ptr<SimBackend> sim = NewSimBackend(o);
  absl::StatusOr<void*> va = sim->reserve_address(16 * kGranule);
  ASSERT_TRUE(va.ok()) << va.status();
  char* base = static_cast<char*>(*va);
  ASSERT_TRUE(sim->map(base, 8 * kGranule).ok());
  sim->unmap(base, 8 * kGranule);
  EXPECT_EQ(sim->used_bytes(), 8 * kGranule) << "the reserve is still device memory";
  EXPECT_EQ(sim->handle_reserve_bytes(), 8 * kGranule);
  EXPECT_EQ(sim->mem_info().free_bytes, 0u);
  // The device is full, but the reserve has the granules: the map is served from it.
  ASSERT_TRUE(sim->map(base + 8 * kGranule, 8 * kGranule).ok());
  EXPECT_EQ(sim->handle_reserve_bytes(), 0u);
  EXPECT_EQ(sim->driver_calls().count(DriverCall::kCreate), 8);
  sim->unmap(base + 8 * kGranule, 8 * kGranule);
  EXPECT_EQ(sim->release_handle_reserve(), 8 * kGranule);
  EXPECT_EQ(sim->used_bytes(), 0u);
  EXPECT_EQ(sim->driver_calls().count(DriverCall::kRelease), 8);
  sim->release_address(base, 16 * kGranule);
}

// The cost model: each call is charged its configured cost, and nothing is slept.
TEST(DriverCallsTest, TheCostModelChargesEachCallItsCost) {
  SimAllocator t = MakeSimAllocator("expandable_segments:true,sim_driver_cost:create=100/map=2");
  t->free(t->allocate(16 * kMiB));
  t->empty_cache();
  const DriverCallStats d = t->stats().driver;
  const SimDriverCosts a100 = A100Costs();
  auto cost = [&](DriverCall c) { return a100.ns[static_cast<int>(c)]; };
  EXPECT_EQ(d.ns[static_cast<int>(DriverCall::kCreate)], 8 * 100'000);
  EXPECT_EQ(d.ns[static_cast<int>(DriverCall::kMap)], 8 * 2'000);
  EXPECT_EQ(d.ns[static_cast<int>(DriverCall::kSetAccess)],
            static_cast<int64_t>(cost(DriverCall::kSetAccess)));
  EXPECT_EQ(d.ns[static_cast<int>(DriverCall::kRelease)],
            static_cast<int64_t>(8 * cost(DriverCall::kRelease)));
  int64_t sum = 0;
  for (int i = 0; i < kNumDriverCalls; ++i) sum += d.ns[i];
  EXPECT_EQ(d.total_ns(), sum);

  SimAllocator free_calls = MakeSimAllocator("expandable_segments:true,sim_driver_cost:none");
  free_calls->free(free_calls->allocate(16 * kMiB));
  EXPECT_EQ(free_calls->stats().driver.total_ns(), 0);
  EXPECT_EQ(free_calls->stats().driver.count(DriverCall::kCreate), 8);
}

TEST(DriverCallsTest, SimDriverCostParsesAndPrintsBack) {
  for (const char* text : {"a100", "none", "create=193/unmap=26", "map=0.5"}) {
    absl::StatusOr<Config> c = ParseConfig(std::string("sim_driver_cost:") + text);
    ASSERT_TRUE(c.ok()) << text << ": " << c.status();
    EXPECT_EQ(FormatSimDriverCosts(c->sim_driver_cost), text);
  }
  absl::StatusOr<Config> c = ParseConfig("sim_driver_cost:create=7.6");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sim_driver_cost.ns[static_cast<int>(DriverCall::kCreate)], 7600u);
}

TEST(DriverCallsTest, BadSimDriverCostsNameTheKeyAndThePart) {
  const std::pair<const char*, const char*> cases[] = {
      {"sim_driver_cost:fast", "\"fast\""},
      {"sim_driver_cost:mmap=1", "\"mmap\""},
      {"sim_driver_cost:create=-1", "\"-1\""},
      {"sim_driver_cost:create=abc", "\"abc\""},
      {"sim_driver_cost:create=2000000", "\"2000000\""},
      // Driver calls the sim never makes (IPC: it shares no memory).
      {"sim_driver_cost:export=5", "\"export\", not one of malloc"},
      {"sim_driver_cost:import=5", "never exports or imports"},
  };
  for (const auto& [text, part] : cases) {
    absl::StatusOr<Config> c = ParseConfig(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find("sim_driver_cost"), std::string_view::npos)
        << c.status();
    EXPECT_NE(c.status().message().find(part), std::string_view::npos) << c.status();
  }
}

}  // namespace
}  // namespace devmem
