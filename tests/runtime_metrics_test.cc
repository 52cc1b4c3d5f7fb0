// tests/runtime_metrics_test.cc: the Prometheus families of runtime/metrics.h, the
// size histogram of runtime/size_histogram.h, and label hygiene, against allocators
// on simulated devices (no runtime, no HTTP: runtime_http_test.cc serves them).
#include "runtime/metrics.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "allocator/caching_allocator.h"
#include "allocator/errors.h"
#include "allocator/site.h"
#include "runtime/size_histogram.h"
#include "tests/hooked_backend.h"
#include "tests/metrics_test_util.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::FindSample;
using testutil::ParsePrometheusText;
using testutil::PromtoolCheck;
using testutil::Sample;
using testutil::SamplesOf;
using testutil::SampleValue;

// One sim allocator, its histogram and a collector over it.
struct Fixture {
  explicit Fixture(std::string_view conf = "", int top_k = 10) {
    testutil::SimAllocator t = testutil::MakeSimAllocator(conf);
    alloc = std::shared_ptr<CachingAllocator>(std::move(t.alloc));
    alloc->set_observer(&sizes);
    collector = std::make_unique<MetricsCollector>(
        [a = alloc] { return std::vector<std::shared_ptr<CachingAllocator>>{a}; },
        MetricsOptions{.site_top_k = top_k, .sizes = &sizes});
  }
  ~Fixture() { alloc->set_observer(nullptr); }
  std::vector<Sample> Scrape() const { return ParsePrometheusText(collector->Text()); }

  SizeHistogram sizes;
  std::shared_ptr<CachingAllocator> alloc;
  std::unique_ptr<MetricsCollector> collector;
};

SiteId Site(uint32_t line, SiteKind kind = SiteKind::kAlloc, std::string_view tag = {}) {
  return InternNamedSite("tests/runtime_metrics_test.cc", line, "Test", kind, tag);
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                                                    : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// Every family docs/metrics.md lists: name, type, label names of each series.
struct FamilySpec {
  const char* name;
  const char* type;
  std::set<std::string> labels;
};
const std::vector<FamilySpec>& Families() {
  static const auto* families = new std::vector<FamilySpec>{
      {"devmem_allocated_bytes", "gauge", {"device", "pool"}},
      {"devmem_reserved_bytes", "gauge", {"device", "pool"}},
      {"devmem_active_bytes", "gauge", {"device", "pool"}},
      {"devmem_cached_bytes", "gauge", {"device", "pool"}},
      {"devmem_pending_bytes", "gauge", {"device", "pool"}},
      {"devmem_thread_cached_bytes", "gauge", {"device", "pool"}},
      {"devmem_thread_cached_blocks", "gauge", {"device", "pool"}},
      {"devmem_requested_bytes", "gauge", {"device", "pool"}},
      {"devmem_inactive_split_bytes", "gauge", {"device", "pool"}},
      {"devmem_live_buffers", "gauge", {"device", "pool"}},
      {"devmem_segments", "gauge", {"device", "pool"}},
      {"devmem_free_bytes", "gauge", {"device", "pool"}},
      {"devmem_free_blocks", "gauge", {"device", "pool"}},
      {"devmem_largest_free_block_bytes", "gauge", {"device", "pool"}},
      {"devmem_fragmentation_ratio", "gauge", {"device", "pool"}},
      {"devmem_allocations_total", "counter", {"device", "pool"}},
      {"devmem_frees_total", "counter", {"device", "pool"}},
      {"devmem_allocated_bytes_total", "counter", {"device", "pool"}},
      {"devmem_peak_allocated_bytes", "gauge", {"device"}},
      {"devmem_peak_reserved_bytes", "gauge", {"device"}},
      {"devmem_device_total_bytes", "gauge", {"device"}},
      {"devmem_device_free_bytes", "gauge", {"device"}},
      {"devmem_device_allocations_total", "counter", {"device"}},
      {"devmem_device_frees_total", "counter", {"device"}},
      {"devmem_cache_hits_total", "counter", {"device"}},
      {"devmem_cache_misses_total", "counter", {"device"}},
      {"devmem_alloc_retries_total", "counter", {"device"}},
      {"devmem_ooms_total", "counter", {"device"}},
      {"devmem_private_pool_bytes", "gauge", {"device", "kind"}},
      {"devmem_private_pools", "gauge", {"device"}},
      {"devmem_driver_calls_total", "counter", {"device", "call"}},
      {"devmem_driver_seconds_total", "counter", {"device", "call"}},
      {"devmem_handle_reserve_bytes", "gauge", {"device"}},
      {"devmem_device_info", "gauge", {"device", "uuid", "name", "backend"}},
      {"devmem_site_live_bytes", "gauge", {"device", "site"}},
      {"devmem_site_live_buffers", "gauge", {"device", "site"}},
      {"devmem_clones_total", "counter", {"device", "site", "kind"}},
      {"devmem_clone_bytes_total", "counter", {"device", "site", "kind"}},
      {"devmem_allocation_size_bytes", "histogram", {"device"}},
      {"devmem_arena_live_bytes", "gauge", {"device", "arena"}},
      {"devmem_arena_escaped_bytes", "gauge", {"device", "arena"}},
      {"devmem_arena_chunk_bytes", "gauge", {"device", "arena"}},
      {"devmem_arena_open_scopes", "gauge", {"device", "arena"}},
      {"devmem_arena_scopes_total", "counter", {"device", "arena"}},
      {"devmem_arena_allocations_total", "counter", {"device", "arena"}},
      {"devmem_arena_allocated_bytes_total", "counter", {"device", "arena"}},
      {"devmem_arena_escapes_total", "counter", {"device", "arena"}},
      {"devmem_arena_pool_chunks_total", "counter", {"device", "arena"}},
      {"devmem_arena_spills_total", "counter", {"device", "arena"}},
      {"devmem_arena_retained_bytes", "gauge", {"device"}},
      {"devmem_arena_chunks_returned_total", "counter", {"device"}},
  };
  return *families;
}

TEST(MetricsTest, EveryFamilyIsPresentWithItsTypeAndLabels) {
  Fixture f;
  void* p = f.alloc->allocate(4096, {}, Site(10));
  void* q = f.alloc->allocate(3 * kMiB, {}, Site(11, SiteKind::kClone));
  void* escaped;
  {
    ArenaScope step(*f.alloc, "step");  // the devmem_arena_* families have a series
    escaped = f.alloc->allocate(1000, {}, Site(12));
  }
  const std::string text = f.collector->Text();
  const std::vector<Sample> samples = ParsePrometheusText(text);
  for (const FamilySpec& family : Families()) {
    SCOPED_TRACE(family.name);
    EXPECT_NE(text.find(std::string("# TYPE ") + family.name + " " + family.type + "\n"),
              std::string::npos);
    EXPECT_NE(text.find(std::string("# HELP ") + family.name + " "), std::string::npos);
    const std::string base = family.name;
    int series = 0;
    for (const Sample& s : samples) {
      const bool histogram_part = s.name == base + "_bucket" || s.name == base + "_sum" ||
                                  s.name == base + "_count";
      if (s.name != base && !histogram_part) continue;
      ++series;
      std::set<std::string> names;
      for (const auto& [k, v] : s.labels) names.insert(k);
      if (s.name == base + "_bucket") names.erase("le");
      EXPECT_EQ(names, family.labels) << s.name;
      EXPECT_EQ(s.labels.at("device"), "sim:0");
      if (family.labels.contains("pool")) {
        EXPECT_TRUE(s.labels.at("pool") == "small" || s.labels.at("pool") == "large");
      }
    }
    EXPECT_GT(series, 0);
  }
  // Nothing outside the list (docs/metrics.md and this list are kept together).
  for (const Sample& s : samples) {
    bool listed = false;
    for (const FamilySpec& family : Families()) {
      const std::string base = family.name;
      listed = listed || s.name == base || s.name == base + "_bucket" ||
               s.name == base + "_sum" || s.name == base + "_count";
    }
    EXPECT_TRUE(listed) << s.name << " is not in docs/metrics.md's list";
  }
  EXPECT_EQ(SampleValue(samples, "devmem_device_info",
                        {{"device", "sim:0"}, {"backend", "sim"}}),
            1);
  f.alloc->free(p);
  f.alloc->free(q);
  f.alloc->free(escaped);
}

TEST(MetricsTest, ArenaFamiliesFollowTheArenas) {
  Fixture f;
  void* kept;
  {
    ArenaScope step(*f.alloc, "step");
    f.alloc->free(f.alloc->allocate(5000, {}, Site(20)));
    kept = f.alloc->allocate(1000, {}, Site(21));
  }
  const std::map<std::string, std::string> step = {{"device", "sim:0"}, {"arena", "step"}};
  std::vector<Sample> s = f.Scrape();
  EXPECT_EQ(SampleValue(s, "devmem_arena_live_bytes", step), 1024);
  EXPECT_EQ(SampleValue(s, "devmem_arena_escaped_bytes", step), 1024);
  EXPECT_EQ(SampleValue(s, "devmem_arena_chunk_bytes", step), kMinArenaChunkSize);
  EXPECT_EQ(SampleValue(s, "devmem_arena_scopes_total", step), 1);
  EXPECT_EQ(SampleValue(s, "devmem_arena_allocations_total", step), 2);
  EXPECT_EQ(SampleValue(s, "devmem_arena_allocated_bytes_total", step), 5120 + 1024);
  EXPECT_EQ(SampleValue(s, "devmem_arena_escapes_total", step), 1);
  EXPECT_EQ(SampleValue(s, "devmem_arena_open_scopes", step), 0);
  EXPECT_EQ(SampleValue(s, "devmem_arena_pool_chunks_total", step), 1);
  EXPECT_EQ(SampleValue(s, "devmem_arena_retained_bytes", {{"device", "sim:0"}}), 0);
  f.alloc->free(kept);
  s = f.Scrape();
  EXPECT_EQ(SampleValue(s, "devmem_arena_escaped_bytes", step), 0);
  EXPECT_EQ(SampleValue(s, "devmem_arena_chunk_bytes", step), 0);
  EXPECT_EQ(SampleValue(s, "devmem_arena_retained_bytes", {{"device", "sim:0"}}),
            kMinArenaChunkSize);  // a scope's first chunk is the smallest (arena.h)
  f.alloc->empty_cache();
  EXPECT_EQ(SampleValue(f.Scrape(), "devmem_arena_chunks_returned_total", {{"device", "sim:0"}}), 1);
}

// The spelling docs/metrics.md gives an arena chunk's site: the arena's name as the tag,
// the file "<arena>", no line (a named site's line 0 is left out) and the kind. The
// snapshot's "where", the snapshot reader and memtrace's site names are the same
// SiteInfo::ToString, so this one literal pins them all.
TEST(MetricsTest, ArenaChunkSiteLabelIsSpelledAsDocumented) {
  Fixture f;
  void* kept;
  {
    ArenaScope step(*f.alloc, "step");
    kept = f.alloc->allocate(1000, {}, Site(22));
  }
  const std::vector<Sample> s = f.Scrape();
  EXPECT_EQ(SampleValue(s, "devmem_site_live_bytes",
                        {{"device", "sim:0"}, {"site", "step @ <arena> (arena)"}}),
            kMinArenaChunkSize);
  f.alloc->free(kept);
}

// A scrape (and a snapshot) asks the driver for its memory figures without holding the
// device lock: from inside mem_info, another thread's stats() gets the lock. (Were the
// lock held, that thread would wait for the scrape: the check gives up after 10 s and
// fails rather than hang.)
TEST(MetricsTest, AScrapeCallsMemInfoOutsideTheDeviceLock) {
  testutil::HookedBackend* hooks = nullptr;
  testutil::SimAllocator t = testutil::MakeHookedSimAllocator("", &hooks);
  std::shared_ptr<CachingAllocator> alloc(std::move(t.alloc));
  CachingAllocator* raw = alloc.get();  // the hook lives in the allocator's backend
  MetricsCollector collector(
      [alloc] { return std::vector<std::shared_ptr<CachingAllocator>>{alloc}; },
      MetricsOptions{});
  void* p = alloc->allocate(4096, {}, Site(40));
  int calls = 0;
  int locked_out = 0;
  testutil::HookGuard mem_info_hook = hooks->before_mem_info.Set([&] {
    ++calls;
    std::future<DeviceStats> other =
        std::async(std::launch::async, [raw] { return raw->stats(); });
    if (other.wait_for(std::chrono::seconds(10)) != std::future_status::ready) ++locked_out;
  });
  const std::vector<Sample> samples = ParsePrometheusText(collector.Text());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(SampleValue(samples, "devmem_device_total_bytes", {{"device", "sim:0"}}), kGiB);
  (void)alloc->snapshot();
  EXPECT_EQ(calls, 2);
  hooks->before_mem_info = nullptr;
  EXPECT_EQ(locked_out, 0) << "mem_info ran under the device lock";
  alloc->free(p);
}

TEST(MetricsTest, PromtoolFindsNothingToComplainAbout) {
  Fixture f("", /*top_k=*/2);
  std::vector<void*> held;
  for (uint32_t line = 20; line < 26; ++line) {
    held.push_back(f.alloc->allocate(line * 1000, {}, Site(line)));
    held.push_back(f.alloc->allocate(line * 1000, {}, Site(line, SiteKind::kContiguous)));
  }
  // A file name with quotes, a backslash, a newline and invalid UTF-8.
  held.push_back(f.alloc->allocate(
      1000, {}, InternNamedSite("we\"ird\\na\nme\xff\xfe.cc", 7, "f", SiteKind::kToDevice)));
  EXPECT_EQ(PromtoolCheck(f.collector->Text()), "");
  for (void* p : held) f.alloc->free(p);
  EXPECT_EQ(PromtoolCheck(f.collector->Text()), "");
}

TEST(MetricsTest, CountersAndGaugesFollowTheAllocator) {
  // The free-set figures are pinned: freed small blocks go to the free sets, not to a
  // thread cache (whose bytes are not free-set bytes).
  Fixture f("thread_cache:false");
  const std::vector<Sample> before = f.Scrape();
  const std::map<std::string, std::string> small = {{"device", "sim:0"}, {"pool", "small"}};
  const std::map<std::string, std::string> large = {{"device", "sim:0"}, {"pool", "large"}};
  const std::map<std::string, std::string> dev = {{"device", "sim:0"}};
  EXPECT_EQ(SampleValue(before, "devmem_allocations_total", small), 0);
  EXPECT_EQ(SampleValue(before, "devmem_reserved_bytes", small), 0);

  std::vector<void*> held;
  for (int i = 0; i < 5; ++i) held.push_back(f.alloc->allocate(1000, {}, Site(30)));
  void* big = f.alloc->allocate(3 * kMiB, {}, Site(31));
  std::vector<Sample> now = f.Scrape();
  EXPECT_EQ(SampleValue(now, "devmem_allocations_total", small), 5);
  EXPECT_EQ(SampleValue(now, "devmem_allocations_total", large), 1);
  EXPECT_EQ(SampleValue(now, "devmem_live_buffers", small), 5);
  EXPECT_EQ(SampleValue(now, "devmem_allocated_bytes", small), 5 * 1024);
  EXPECT_EQ(SampleValue(now, "devmem_requested_bytes", small), 5 * 1000);
  EXPECT_EQ(SampleValue(now, "devmem_allocated_bytes", large), 3 * kMiB);
  EXPECT_EQ(SampleValue(now, "devmem_reserved_bytes", small), 2 * kMiB);
  EXPECT_EQ(SampleValue(now, "devmem_reserved_bytes", large), 20 * kMiB);
  EXPECT_EQ(SampleValue(now, "devmem_cached_bytes", large), 17 * kMiB);
  EXPECT_EQ(SampleValue(now, "devmem_largest_free_block_bytes", large), 17 * kMiB);
  EXPECT_EQ(SampleValue(now, "devmem_fragmentation_ratio", large), 0);
  EXPECT_EQ(SampleValue(now, "devmem_device_allocations_total", dev), 2);
  EXPECT_EQ(SampleValue(now, "devmem_cache_misses_total", dev), 2);
  EXPECT_EQ(SampleValue(now, "devmem_cache_hits_total", dev), 4);
  EXPECT_EQ(SampleValue(now, "devmem_peak_allocated_bytes", dev), 5 * 1024 + 3 * kMiB);
  EXPECT_EQ(SampleValue(now, "devmem_device_total_bytes", dev), kGiB);
  EXPECT_EQ(SampleValue(now, "devmem_device_free_bytes", dev), kGiB - 22 * kMiB);
  EXPECT_EQ(SampleValue(now, "devmem_allocation_size_bytes_count", dev), 6);
  EXPECT_EQ(SampleValue(now, "devmem_allocation_size_bytes_sum", dev), 5 * 1000 + 3 * kMiB);
  EXPECT_EQ(SampleValue(now, "devmem_allocation_size_bytes_bucket",
                        {{"device", "sim:0"}, {"le", "1024"}}),
            5);
  EXPECT_EQ(SampleValue(now, "devmem_allocation_size_bytes_bucket",
                        {{"device", "sim:0"}, {"le", "2097152"}}),
            5);
  EXPECT_EQ(SampleValue(now, "devmem_allocation_size_bytes_bucket",
                        {{"device", "sim:0"}, {"le", "4194304"}}),
            6);

  // Free every other small block: two free holes of 1 KiB and the segment's tail.
  f.alloc->free(held[1]);
  f.alloc->free(held[3]);
  f.alloc->free(big);
  now = f.Scrape();
  EXPECT_EQ(SampleValue(now, "devmem_frees_total", small), 2);
  EXPECT_EQ(SampleValue(now, "devmem_frees_total", large), 1);
  EXPECT_EQ(SampleValue(now, "devmem_peak_allocated_bytes", dev), 5 * 1024 + 3 * kMiB);
  EXPECT_EQ(SampleValue(now, "devmem_allocated_bytes", large), 0);
  const double tail = 2 * kMiB - 5 * 1024;
  EXPECT_EQ(SampleValue(now, "devmem_largest_free_block_bytes", small), tail);
  EXPECT_DOUBLE_EQ(SampleValue(now, "devmem_fragmentation_ratio", small),
                   1.0 - tail / (tail + 2 * 1024));
  f.alloc->empty_cache();
  now = f.Scrape();
  EXPECT_EQ(SampleValue(now, "devmem_device_frees_total", dev), 1);
  EXPECT_EQ(SampleValue(now, "devmem_reserved_bytes", large), 0);
  for (void* p : {held[0], held[2], held[4]}) f.alloc->free(p);
}

// Every family's every series against the allocator's own figures (its snapshot,
// site_stats() and the size histogram), in a state where figures that a planted bug
// could confuse differ: peaks above current values, a fragmented pool, an OOM, a
// copy site, device info whose labels all differ. A family this test does not check
// fails it, so a new family comes with its check.
TEST(MetricsTest, EveryValueMatchesTheAllocatorsOwnFigures) {
  // Free-set figures pinned, as above.
  Fixture f("sim_capacity:64MiB,thread_cache:false", /*top_k=*/2);
  void* p40 = f.alloc->allocate(40 * kMiB, {}, Site(90));
  EXPECT_THROW(f.alloc->allocate(40 * kMiB, {}, Site(91)), OutOfMemoryError);
  f.alloc->free(p40);
  f.alloc->empty_cache();
  std::vector<void*> held;
  for (int i = 0; i < 6; ++i) held.push_back(f.alloc->allocate(1000, {}, Site(92 + i % 3)));
  f.alloc->free(held[1]);
  f.alloc->free(held[3]);
  void* copy = f.alloc->allocate(3 * kMiB, {}, Site(96, SiteKind::kClone));
  // A private pool (CUDA graphs) holding one live block, so that its figures are not 0.
  f.alloc->begin_allocate_to_pool(PoolId{3, 1}, [](Stream) { return true; });
  void* graph = f.alloc->allocate(64 * kKiB, {}, Site(97));
  f.alloc->end_allocate_to_pool(PoolId{3, 1});

  const std::vector<Sample> samples = f.Scrape();
  const AllocatorSnapshot snap = f.alloc->snapshot();
  const std::vector<SiteStats> sites = f.alloc->site_stats();
  const DeviceStats& st = snap.stats;
  // The state tells the figures apart.
  ASSERT_GT(st.reserved_bytes[kAggregatePool].peak, st.reserved_bytes[kAggregatePool].current);
  ASSERT_GT(st.allocated_bytes[kAggregatePool].peak,
            st.allocated_bytes[kAggregatePool].current);
  ASSERT_GT(st.num_ooms, 0);
  ASSERT_NE(snap.info.uuid, snap.info.name);
  ASSERT_NE(snap.info.uuid, snap.info.backend);
  ASSERT_NE(snap.info.name, snap.info.backend);

  std::set<std::string> checked;
  const std::map<std::string, std::string> dev = {{"device", "sim:0"}};
  auto check = [&](const std::string& family, const std::map<std::string, std::string>& labels,
                   double expected) {
    checked.insert(family);
    EXPECT_EQ(SampleValue(samples, family, labels), expected) << family;
  };
  // Per pool.
  for (StatPool p : {kSmallPool, kLargePool}) {
    const std::map<std::string, std::string> l = {{"device", "sim:0"},
                                                  {"pool", p == kSmallPool ? "small" : "large"}};
    SCOPED_TRACE(l.at("pool"));
    size_t largest = 0, free_total = 0, free_count = 0;
    for (const SegmentInfo& seg : snap.segments) {
      // Free-set figures are the shared pool's: a private pool's blocks serve only it.
      if (seg.small_pool != (p == kSmallPool) || !seg.private_pool.is_default()) continue;
      for (const BlockInfo& b : seg.blocks) {
        if (b.state != BlockState::kFree) continue;
        largest = std::max(largest, b.size);
        free_total += b.size;
        ++free_count;
      }
    }
    ASSERT_GT(free_count, 0u);  // so that a counter stuck at 0 fails
    check("devmem_free_bytes", l, static_cast<double>(free_total));
    check("devmem_free_blocks", l, static_cast<double>(free_count));
    check("devmem_allocated_bytes", l, st.allocated_bytes[p].current);
    check("devmem_reserved_bytes", l, st.reserved_bytes[p].current);
    check("devmem_active_bytes", l, st.active_bytes[p].current);
    check("devmem_cached_bytes", l, st.reserved_bytes[p].current - st.allocated_bytes[p].current);
    check("devmem_pending_bytes", l, st.pending_bytes[p].current);
    // Caches off here: ThreadCachedBlocksAreTheirOwnSeries checks them with caches on.
    check("devmem_thread_cached_bytes", l, 0);
    check("devmem_thread_cached_blocks", l, 0);
    check("devmem_requested_bytes", l, st.requested_bytes[p].current);
    check("devmem_inactive_split_bytes", l, st.inactive_split_bytes[p].current);
    check("devmem_live_buffers", l, st.allocation[p].current);
    check("devmem_segments", l, st.segment[p].current);
    check("devmem_largest_free_block_bytes", l, static_cast<double>(largest));
    check("devmem_fragmentation_ratio", l,
          free_total == 0 ? 0.0 : 1.0 - static_cast<double>(largest) / free_total);
    check("devmem_allocations_total", l, st.allocation[p].allocated);
    check("devmem_frees_total", l, st.allocation[p].freed);
    check("devmem_allocated_bytes_total", l, st.allocated_bytes[p].allocated);
  }
  // Per device.
  check("devmem_peak_allocated_bytes", dev, st.allocated_bytes[kAggregatePool].peak);
  check("devmem_peak_reserved_bytes", dev, st.reserved_bytes[kAggregatePool].peak);
  check("devmem_device_total_bytes", dev, snap.mem_info.total_bytes);
  check("devmem_device_free_bytes", dev, snap.mem_info.free_bytes);
  check("devmem_device_allocations_total", dev, st.num_device_alloc);
  check("devmem_device_frees_total", dev, st.num_device_free);
  check("devmem_cache_hits_total", dev, st.cache_hits);
  check("devmem_cache_misses_total", dev, st.cache_misses);
  check("devmem_alloc_retries_total", dev, st.num_alloc_retries);
  check("devmem_ooms_total", dev, st.num_ooms);
  ASSERT_EQ(st.private_reserved_bytes, 2 * static_cast<int64_t>(kMiB));  // a small segment
  ASSERT_EQ(st.private_allocated_bytes, 64 * static_cast<int64_t>(kKiB));
  check("devmem_private_pool_bytes", {{"device", "sim:0"}, {"kind", "reserved"}},
        st.private_reserved_bytes);
  check("devmem_private_pool_bytes", {{"device", "sim:0"}, {"kind", "allocated"}},
        st.private_allocated_bytes);
  check("devmem_private_pools", dev, 1);
  check("devmem_handle_reserve_bytes", dev, st.driver.handle_reserve_bytes);
  // Driver calls: one series per kind, each its own count and time.
  for (int i = 0; i < kNumDriverCalls; ++i) {
    const std::string call(DriverCallName(static_cast<DriverCall>(i)));
    check("devmem_driver_calls_total", {{"device", "sim:0"}, {"call", call}},
          st.driver.calls[i]);
    check("devmem_driver_seconds_total", {{"device", "sim:0"}, {"call", call}},
          static_cast<double>(st.driver.ns[i]) / 1e9);
  }
  ASSERT_GT(st.driver.count(DriverCall::kMap) + st.driver.count(DriverCall::kMalloc), 0)
      << "so that a series stuck at 0 fails";
  // Each label of device_info holds its own field.
  check("devmem_device_info",
        {{"device", "sim:0"}, {"uuid", snap.info.uuid}, {"name", snap.info.name},
         {"backend", snap.info.backend}},
        1);
  EXPECT_EQ(SamplesOf(samples, "devmem_device_info").size(), 1u);
  // Sites: the labelled sites hold their own live figures, "other" the rest, and the
  // series add up to the allocator's totals (top_k = 2 of the 4 live sites).
  double live_bytes = 0, live_buffers = 0, copies = 0, copy_bytes = 0;
  int64_t want_bytes = 0, want_buffers = 0, want_copies = 0, want_copy_bytes = 0;
  for (size_t id = 0; id < sites.size(); ++id) {
    want_bytes += sites[id].live_bytes;
    want_buffers += sites[id].live_count;
    if (id > 0 && IsCopyKind(GetSite(static_cast<SiteId>(id)).kind)) {
      want_copies += sites[id].total_count;
      want_copy_bytes += sites[id].total_bytes;
    }
  }
  const std::vector<Sample> live = SamplesOf(samples, "devmem_site_live_bytes");
  EXPECT_EQ(live.size(), 3u);  // 2 labelled + other
  for (const Sample& s : live) {
    live_bytes += s.value;
    if (s.labels.at("site") == "other") continue;
    int matched = 0;  // a labelled series must name exactly one live site
    for (size_t id = 1; id < sites.size(); ++id) {
      if (GetSite(static_cast<SiteId>(id)).ToString() == s.labels.at("site")) {
        EXPECT_EQ(s.value, sites[id].live_bytes) << s.labels.at("site");
        ++matched;
      }
    }
    EXPECT_EQ(matched, 1) << "site label \"" << s.labels.at("site")
                          << "\" names no site (or several)";
  }
  for (const Sample& s : SamplesOf(samples, "devmem_site_live_buffers")) live_buffers += s.value;
  for (const Sample& s : SamplesOf(samples, "devmem_clones_total")) copies += s.value;
  for (const Sample& s : SamplesOf(samples, "devmem_clone_bytes_total")) copy_bytes += s.value;
  EXPECT_EQ(live_bytes, want_bytes);
  EXPECT_EQ(live_buffers, want_buffers);
  EXPECT_EQ(copies, want_copies);
  EXPECT_EQ(copy_bytes, want_copy_bytes);
  EXPECT_EQ(want_copy_bytes, 3 * kMiB);
  checked.insert({"devmem_site_live_bytes", "devmem_site_live_buffers", "devmem_clones_total",
                  "devmem_clone_bytes_total"});
  // The size histogram against the SizeHistogram it reads.
  const std::vector<SizeHistogram::Counts> counts = f.sizes.counts();
  ASSERT_EQ(counts.size(), 1u);
  ASSERT_GT(counts[0].count, 0u);
  checked.insert("devmem_allocation_size_bytes");
  EXPECT_EQ(SampleValue(samples, "devmem_allocation_size_bytes_count", dev), counts[0].count);
  EXPECT_EQ(SampleValue(samples, "devmem_allocation_size_bytes_sum", dev), counts[0].sum_bytes);

  // The devmem_arena_* values are checked one by one in ArenaFamiliesFollowTheArenas.
  for (const FamilySpec& family : Families()) {
    if (std::string_view(family.name).starts_with("devmem_arena_")) checked.insert(family.name);
  }
  for (const FamilySpec& family : Families()) {
    EXPECT_TRUE(checked.contains(family.name)) << family.name << " has no value check here";
  }
  for (void* p : held) {
    if (p != held[1] && p != held[3]) f.alloc->free(p);
  }
  f.alloc->free(copy);
  f.alloc->free(graph);
  f.alloc->release_pool(PoolId{3, 1});
}

// Blocks freed into a thread cache are neither allocated nor free-set bytes: their own
// series says where the cached bytes are, and that they add up to reserved.
TEST(MetricsTest, ThreadCachedBlocksAreTheirOwnSeries) {
  Fixture f("thread_cache:true");
  std::vector<void*> held;
  for (int i = 0; i < 6; ++i) held.push_back(f.alloc->allocate(4096, {}, Site(100)));
  for (int i = 0; i < 4; ++i) f.alloc->free(held[i]);  // into this thread's cache
  const std::vector<Sample> samples = f.Scrape();
  const DeviceStats st = f.alloc->stats();
  ASSERT_EQ(st.thread_cached[kSmallPool].current, 4) << "the frees went to the cache";
  const std::map<std::string, std::string> small = {{"device", "sim:0"}, {"pool", "small"}};
  const std::map<std::string, std::string> large = {{"device", "sim:0"}, {"pool", "large"}};
  EXPECT_EQ(SampleValue(samples, "devmem_thread_cached_bytes", small), 4 * 4096);
  EXPECT_EQ(SampleValue(samples, "devmem_thread_cached_blocks", small), 4);
  EXPECT_EQ(SampleValue(samples, "devmem_thread_cached_bytes", large), 0);
  EXPECT_EQ(SampleValue(samples, "devmem_thread_cached_blocks", large), 0);
  EXPECT_EQ(SampleValue(samples, "devmem_allocated_bytes", small) +
                SampleValue(samples, "devmem_pending_bytes", small) +
                SampleValue(samples, "devmem_thread_cached_bytes", small) +
                SampleValue(samples, "devmem_free_bytes", small),
            SampleValue(samples, "devmem_reserved_bytes", small));
  // empty_cache drains the caches: the series follows.
  f.alloc->empty_cache();
  EXPECT_EQ(SampleValue(f.Scrape(), "devmem_thread_cached_bytes", small), 0);
  for (int i = 4; i < 6; ++i) f.alloc->free(held[i]);
}

TEST(MetricsTest, OomsAndRetriesAreCounted) {
  Fixture f("sim_capacity:64MiB");
  void* p = f.alloc->allocate(40 * kMiB);
  EXPECT_THROW(f.alloc->allocate(40 * kMiB), OutOfMemoryError);
  const std::vector<Sample> now = f.Scrape();
  EXPECT_EQ(SampleValue(now, "devmem_ooms_total", {{"device", "sim:0"}}), 1);
  EXPECT_GE(SampleValue(now, "devmem_alloc_retries_total", {{"device", "sim:0"}}), 1);
  f.alloc->free(p);
}

TEST(MetricsTest, SiteLabelIsBoundedToTopKPlusOther) {
  constexpr int kTopK = 3;
  Fixture f("", kTopK);
  // Ten sites; site 40+i holds (i + 1) blocks of 4 KiB.
  std::vector<void*> held;
  for (uint32_t i = 0; i < 10; ++i) {
    for (uint32_t n = 0; n <= i; ++n) held.push_back(f.alloc->allocate(4096, {}, Site(40 + i)));
  }
  std::vector<Sample> now = f.Scrape();
  std::vector<Sample> live = SamplesOf(now, "devmem_site_live_bytes");
  ASSERT_EQ(live.size(), kTopK + 1u);
  double other = -1;
  std::set<std::string> sites;
  for (const Sample& s : live) {
    sites.insert(s.labels.at("site"));
    if (s.labels.at("site") == "other") other = s.value;
  }
  for (uint32_t line : {47u, 48u, 49u}) {
    EXPECT_TRUE(sites.contains(GetSite(Site(line)).ToString())) << line;
  }
  EXPECT_EQ(other, (1 + 2 + 3 + 4 + 5 + 6 + 7) * 4096.0);
  EXPECT_EQ(SampleValue(now, "devmem_site_live_buffers",
                        {{"site", GetSite(Site(49)).ToString()}}),
            10);

  // Copy sites: five clone sites, then a larger one later. The counters' site set is
  // the first K (largest first) and stays; "other" only grows.
  std::vector<void*> copies;
  for (uint32_t i = 0; i < 5; ++i) {
    copies.push_back(f.alloc->allocate(4096 * (i + 1), {}, Site(60 + i, SiteKind::kClone)));
  }
  now = f.Scrape();
  std::vector<Sample> clones = SamplesOf(now, "devmem_clones_total");
  // K labelled sites plus "other" for each of the three copy kinds.
  ASSERT_EQ(clones.size(), kTopK + 3u);
  const std::map<std::string, std::string> other_clone = {{"site", "other"},
                                                          {"kind", "clone"}};
  EXPECT_EQ(SampleValue(now, "devmem_clones_total", other_clone), 2);
  EXPECT_EQ(SampleValue(now, "devmem_clone_bytes_total", other_clone), 3 * 4096);
  for (uint32_t line : {62u, 63u, 64u}) {
    EXPECT_EQ(SampleValue(now, "devmem_clones_total",
                          {{"site", GetSite(Site(line, SiteKind::kClone)).ToString()},
                           {"kind", "clone"}}),
              1);
  }
  copies.push_back(f.alloc->allocate(kMiB, {}, Site(70, SiteKind::kClone)));
  now = f.Scrape();
  EXPECT_EQ(SamplesOf(now, "devmem_clones_total").size(), kTopK + 3u);
  EXPECT_EQ(SampleValue(now, "devmem_clones_total", other_clone), 3);
  EXPECT_EQ(SampleValue(now, "devmem_clone_bytes_total", other_clone), 3 * 4096 + kMiB);
  for (void* p : held) f.alloc->free(p);
  for (void* p : copies) f.alloc->free(p);
  // Counters stay after the buffers die; live bytes drop to zero.
  now = f.Scrape();
  EXPECT_EQ(SampleValue(now, "devmem_clones_total", other_clone), 3);
  EXPECT_EQ(SamplesOf(now, "devmem_site_live_bytes").size(), 1u);
  EXPECT_EQ(SampleValue(now, "devmem_site_live_bytes", {{"site", "other"}}), 0);
}

TEST(MetricsTest, SitesThatReadTheSameShareOneSeries) {
  Fixture f;
  // Two ids, one description: same file, line and kind, different function.
  const SiteId a = InternNamedSite("tests/same.cc", 5, "f<int>", SiteKind::kClone);
  const SiteId b = InternNamedSite("tests/same.cc", 5, "f<float>", SiteKind::kClone);
  ASSERT_NE(a, b);
  ASSERT_EQ(GetSite(a).ToString(), GetSite(b).ToString());
  void* p = f.alloc->allocate(1024, {}, a);
  void* q = f.alloc->allocate(2048, {}, b);
  const std::string text = f.collector->Text();
  EXPECT_EQ(PromtoolCheck(text), "");
  const std::vector<Sample> now = ParsePrometheusText(text);
  EXPECT_EQ(SampleValue(now, "devmem_site_live_bytes", {{"site", GetSite(a).ToString()}}),
            3072);
  EXPECT_EQ(SampleValue(now, "devmem_clones_total", {{"site", GetSite(a).ToString()}}), 2);
  f.alloc->free(p);
  f.alloc->free(q);
}

TEST(MetricsTest, EveryDeviceGetsItsOwnSeries) {
  Config config = testutil::MakeSimConfig("");
  auto a0 = std::make_shared<CachingAllocator>(MakeSimBackend(config, 0), config);
  auto a1 = std::make_shared<CachingAllocator>(MakeSimBackend(config, 1), config);
  MetricsCollector collector([&] { return std::vector{a0, a1}; }, {});
  void* p = a1->allocate(1000);
  const std::vector<Sample> now = ParsePrometheusText(collector.Text());
  EXPECT_EQ(SampleValue(now, "devmem_allocations_total", {{"device", "sim:0"}, {"pool", "small"}}), 0);
  EXPECT_EQ(SampleValue(now, "devmem_allocations_total", {{"device", "sim:1"}, {"pool", "small"}}), 1);
  EXPECT_EQ(SamplesOf(now, "devmem_device_info").size(), 2u);
  // No histogram without a SizeHistogram.
  EXPECT_EQ(FindSample(now, "devmem_allocation_size_bytes_count", {}), nullptr);
  a1->free(p);
}

TEST(SanitizeLabelValueTest, KeepsValidTextAndRepairsTheRest) {
  EXPECT_EQ(SanitizeLabelValue("tensor/ops.cc:40 (clone)"), "tensor/ops.cc:40 (clone)");
  EXPECT_EQ(SanitizeLabelValue("caf\xC3\xA9"), "caf\xC3\xA9");       // é stays
  EXPECT_EQ(SanitizeLabelValue("a\xFF" "b"), "a\xEF\xBF\xBD" "b");     // stray byte
  EXPECT_EQ(SanitizeLabelValue("a\xC3"), "a\xEF\xBF\xBD");            // cut sequence
  EXPECT_EQ(SanitizeLabelValue("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(SanitizeLabelValue("\xED\xA0\x80"),                        // surrogate
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(SanitizeLabelValue("a\nb\tc\x7F"), "a b c ");
}

TEST(SanitizeLabelValueTest, BoundsTheLengthOnCharacterBoundaries) {
  std::string long_name;
  for (int i = 0; i < 100; ++i) long_name += "dir\xC3\xA9/";  // 6 bytes each
  long_name += "file.cc:120 (clone)";
  const std::string s = SanitizeLabelValue(long_name, 64);
  EXPECT_LE(s.size(), 64u);
  EXPECT_TRUE(IsValidUtf8(s)) << s;
  EXPECT_NE(s.find("..."), std::string::npos);
  EXPECT_TRUE(s.starts_with("dir\xC3\xA9/")) << s;
  EXPECT_TRUE(s.ends_with("file.cc:120 (clone)")) << s;
  for (size_t max : {16u, 17u, 18u, 19u, 20u, 33u, 160u}) {
    const std::string t = SanitizeLabelValue(long_name, max);
    EXPECT_LE(t.size(), max);
    EXPECT_TRUE(IsValidUtf8(t)) << max;
  }
}

TEST(SizeHistogramTest, BucketsArePowersOfTwo) {
  EXPECT_EQ(SizeHistogram::BucketOf(0), 0);
  EXPECT_EQ(SizeHistogram::BucketOf(1), 0);
  EXPECT_EQ(SizeHistogram::BucketOf(512), 0);
  EXPECT_EQ(SizeHistogram::BucketOf(513), 1);
  EXPECT_EQ(SizeHistogram::BucketOf(1024), 1);
  EXPECT_EQ(SizeHistogram::BucketOf(kMiB), 11);
  EXPECT_EQ(SizeHistogram::BucketOf(kMiB + 1), 12);
  EXPECT_EQ(SizeHistogram::BucketOf(size_t{1} << 40), SizeHistogram::kNumFiniteBuckets - 1);
  EXPECT_EQ(SizeHistogram::BucketOf((size_t{1} << 40) + 1), SizeHistogram::kNumFiniteBuckets);
  EXPECT_EQ(SizeHistogram::BucketOf(SIZE_MAX), SizeHistogram::kNumFiniteBuckets);
}

TEST(SizeHistogramTest, CountsAllocEventsPerDevice) {
  SizeHistogram h;
  const DeviceId sim1{DeviceType::kSim, 1};
  auto event = [](AllocAction action, DeviceId device, size_t requested) {
    AllocEvent e;
    e.action = action;
    e.device = device;
    e.requested = requested;
    return e;
  };
  h.on_event(event(AllocAction::kAlloc, sim1, 100));
  h.on_event(event(AllocAction::kFree, sim1, 100));
  h.on_event(event(AllocAction::kAlloc, DeviceId{}, 5000));
  const std::vector<SizeHistogram::Counts> counts = h.counts();
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_EQ(counts[0].device, DeviceId{});  // cpu sorts first
  EXPECT_EQ(counts[0].count, 1u);
  EXPECT_EQ(counts[0].buckets[SizeHistogram::BucketOf(5000)], 1u);
  EXPECT_EQ(counts[1].device, sim1);
  EXPECT_EQ(counts[1].count, 1u);
  EXPECT_EQ(counts[1].sum_bytes, 100u);
}

AllocEvent AllocOf(DeviceId device, size_t requested) {
  AllocEvent e;
  e.action = AllocAction::kAlloc;
  e.device = device;
  e.requested = requested;
  return e;
}

TEST(SizeHistogramTest, OnEventCountsAsRecordDoesOnEveryPath) {
  // on_event has a fast path of its own beside record()'s (size_histogram.h). Events
  // that alternate between histograms and devices take each one's slow path, repeats
  // its fast path; every request must land exactly once, in its bucket and its sum.
  SizeHistogram a, b;
  const DeviceId sim0{DeviceType::kSim, 0};
  const DeviceId sim1{DeviceType::kSim, 1};
  const size_t sizes[] = {0, 1, 512, 513, 3000, kMiB + 1, (size_t{1} << 40) + 1};
  using Key = std::pair<const SizeHistogram*, DeviceId>;
  std::map<Key, SizeHistogram::Counts> want;
  auto count = [&](SizeHistogram& h, DeviceId device, size_t requested, bool as_event) {
    if (as_event) {
      h.on_event(AllocOf(device, requested));
    } else {
      h.record(device, requested);
    }
    SizeHistogram::Counts& w = want[Key{&h, device}];
    w.device = device;
    ++w.buckets[static_cast<size_t>(SizeHistogram::BucketOf(requested))];
    ++w.count;
    w.sum_bytes += requested;
  };
  for (const size_t n : sizes) {
    count(a, sim0, n, true);   // slow (the thread last counted elsewhere)
    count(a, sim0, n, true);   // fast
    count(a, sim1, n, false);  // slow
    count(a, sim1, n, true);   // fast
    count(b, sim1, n, true);   // slow: another histogram
    count(a, sim1, n, true);   // slow again
    count(b, sim0, n, false);  // slow
    count(b, sim0, n, false);  // fast
  }
  AllocEvent free_event = AllocOf(sim0, 4096);
  free_event.action = AllocAction::kFree;  // ignored on either path
  a.on_event(free_event);
  b.on_event(free_event);
  for (const SizeHistogram* h : {&a, &b}) {
    const std::vector<SizeHistogram::Counts> counts = h->counts();
    ASSERT_EQ(counts.size(), 2u);
    for (const SizeHistogram::Counts& c : counts) {
      const SizeHistogram::Counts& w = want[Key{h, c.device}];
      EXPECT_EQ(c.buckets, w.buckets) << c.device.ToString();
      EXPECT_EQ(c.count, w.count) << c.device.ToString();
      EXPECT_EQ(c.sum_bytes, w.sum_bytes) << c.device.ToString();
    }
  }
}

TEST(SizeHistogramTest, CountsAddUpAcrossThreads) {
  // Each thread counts into its own shard (no shared read-modify-write on the hot
  // path); counts() must add up every shard, including those of exited threads.
  SizeHistogram h;
  const DeviceId sim0{DeviceType::kSim, 0};
  constexpr int kThreads = 4;
  constexpr int kPerThread = 1000;
  std::latch all_recorded(kThreads);  // so all are alive at once: one shard each
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&h, &all_recorded, sim0, t] {
      for (int i = 0; i < kPerThread; ++i) h.on_event(AllocOf(sim0, 600 + t));  // bucket 1
      h.on_event(AllocOf(DeviceId{}, 5000));
      all_recorded.arrive_and_wait();
    });
  }
  for (std::thread& t : threads) t.join();
  h.on_event(AllocOf(sim0, 100));  // the main thread's: it takes over an exited shard
  const std::vector<SizeHistogram::Counts> counts = h.counts();
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_EQ(counts[0].count, uint64_t{kThreads});
  EXPECT_EQ(counts[0].sum_bytes, uint64_t{kThreads} * 5000);
  EXPECT_EQ(counts[1].device, sim0);
  EXPECT_EQ(counts[1].count, uint64_t{kThreads} * kPerThread + 1);
  EXPECT_EQ(counts[1].buckets[0], 1u);
  EXPECT_EQ(counts[1].buckets[1], uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(counts[1].sum_bytes, uint64_t{kPerThread} * (600 + 601 + 602 + 603) + 100);
  EXPECT_EQ(h.shard_count(), static_cast<size_t>(kThreads));
}

TEST(SizeHistogramTest, PerThreadShardsAreTakenOverAfterExit) {
  // Threads that come and go one at a time (a pool that recycles threads) reuse one
  // shard between them: the memory is bounded by the threads alive at once, and the
  // counts of every exited thread are kept.
  SizeHistogram h;
  const DeviceId sim0{DeviceType::kSim, 0};
  for (int t = 0; t < 20; ++t) {
    std::thread([&h, sim0] { h.on_event(AllocOf(sim0, 1024)); }).join();
  }
  EXPECT_EQ(h.shard_count(), 1u);
  const std::vector<SizeHistogram::Counts> counts = h.counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].count, 20u);
  EXPECT_EQ(counts[0].sum_bytes, 20u * 1024);
}

TEST(SizeHistogramTest, PerThreadShardsOutliveTheirHistogram) {
  // A thread keeps its shard of a destroyed histogram until it exits (ASan: no use
  // after free either way), and a new histogram at the same address is a new one.
  const DeviceId sim0{DeviceType::kSim, 0};
  std::mutex mu;
  std::condition_variable cv;
  int step = 0;
  auto h = std::make_unique<SizeHistogram>();
  std::thread worker([&] {
    h->on_event(AllocOf(sim0, 512));
    std::unique_lock<std::mutex> lock(mu);
    step = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return step == 2; });
    h->on_event(AllocOf(sim0, 512));  // the new histogram's first event on this thread
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return step == 1; });
    h = std::make_unique<SizeHistogram>();  // the first one dies
    step = 2;
    cv.notify_all();
  }
  worker.join();
  const std::vector<SizeHistogram::Counts> counts = h->counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].count, 1u);
}

}  // namespace
}  // namespace devmem
