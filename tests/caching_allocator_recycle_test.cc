// tests/caching_allocator_recycle_test.cc: expandable segments with holes.
//
// Free granules inside an expandable reservation can be unmapped ("recycled") and
// their physical memory mapped again elsewhere in the reservation: under memory
// pressure, on trim/empty_cache, and when fragmentation would grow the footprint past
// expandable_recycle_threshold x the peak of the stream's bytes in use
// (allocator/expandable_segments.cc). These tests pin that policy, the run
// bookkeeping behind it (runs split around holes and merge when gaps are mapped),
// that releasing memory waits for work queued on its stream, and the default
// (expandable_segments:auto).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/errors.h"
#include "tests/hooked_backend.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::CountSegments;
using testutil::FindSegment;
using testutil::MakeSimAllocator;
using testutil::NewStream;
using testutil::SimAllocator;
using testutil::SnapshotWellFormed;
using testutil::StreamBlocker;

uintptr_t Addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

int64_t Reserved(const CachingAllocator& a) {
  return a.stats().reserved_bytes[kAggregatePool].current;
}

// Fills `n` bytes at `p` with a pattern derived from `seed`; Check verifies it.
void Fill(void* p, size_t n, unsigned char seed) { std::memset(p, seed, n); }
bool Check(const void* p, size_t n, unsigned char seed) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; i += 4096) {
    if (c[i] != seed) return false;
  }
  return c[n - 1] == seed;
}

// The fragmentation pattern of tests/data/traces/fragmentation.jsonl, once: eight
// 16 MiB buffers, every other one freed, leaving four 16 MiB holes between survivors.
struct Holes {
  std::vector<void*> survivors;
};
Holes MakeHoles(CachingAllocator& a) {
  std::vector<void*> small;
  for (int i = 0; i < 8; ++i) {
    small.push_back(a.allocate(16 * kMiB));
    Fill(small.back(), 16 * kMiB, static_cast<unsigned char>(i + 1));
  }
  Holes h;
  for (int i = 0; i < 8; ++i) {
    if (i % 2 == 0) {
      a.free(small[i]);
    } else {
      h.survivors.push_back(small[i]);
    }
  }
  return h;
}
void CheckSurvivors(const Holes& h) {
  for (size_t k = 0; k < h.survivors.size(); ++k) {
    EXPECT_TRUE(Check(h.survivors[k], 16 * kMiB, static_cast<unsigned char>(2 * k + 2)))
        << "survivor " << k << " lost its contents";
  }
}

TEST(ExpandableRecycleTest, FragmentationMovesAddressesInsteadOfGrowingTheFootprint) {
  SimAllocator t = MakeSimAllocator("expandable_segments:true,expandable_recycle_threshold:0");
  Holes h = MakeHoles(*t);
  ASSERT_EQ(Reserved(*t), static_cast<int64_t>(128 * kMiB));
  const int64_t unmaps_before = t->stats().num_device_free;
  // 32 MiB fits in none of the 16 MiB holes: the holes' memory is unmapped and mapped
  // again past the survivors, so the footprint does not grow (threshold 0: never past
  // the peak of allocated bytes, 128 MiB).
  void* big = t->allocate(32 * kMiB);
  Fill(big, 32 * kMiB, 0x77);
  EXPECT_EQ(Reserved(*t), static_cast<int64_t>(128 * kMiB));
  EXPECT_EQ(t.sim->used_bytes(), 128 * kMiB);
  EXPECT_GT(t->stats().num_device_free, unmaps_before);
  CheckSurvivors(h);
  AllocatorSnapshot snap = t->snapshot();
  EXPECT_TRUE(SnapshotWellFormed(snap));
  EXPECT_GT(CountSegments(snap, false), 1u) << "the hole split the reservation's run";
  for (const SegmentInfo& s : snap.segments) EXPECT_TRUE(s.expandable);
  EXPECT_VALID(*t);
  t->free(big);
  for (void* p : h.survivors) t->free(p);
  EXPECT_VALID(*t);
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  EXPECT_TRUE(t->snapshot().segments.empty());
  EXPECT_VALID(*t);
}

TEST(ExpandableRecycleTest, WithThresholdNoneTheFootprintGrowsLikePyTorch) {
  SimAllocator t =
      MakeSimAllocator("expandable_segments:true,expandable_recycle_threshold:none");
  Holes h = MakeHoles(*t);
  const int64_t unmaps_before = t->stats().num_device_free;
  void* big = t->allocate(32 * kMiB);
  EXPECT_EQ(Reserved(*t), static_cast<int64_t>(160 * kMiB));
  EXPECT_EQ(t->stats().num_device_free, unmaps_before) << "nothing was unmapped";
  EXPECT_EQ(CountSegments(t->snapshot(), false), 1u);
  t->free(big);
  for (void* p : h.survivors) t->free(p);
  EXPECT_VALID(*t);
}

TEST(ExpandableRecycleTest, TheThresholdBoundsTheFootprintByThePeakOfAllocated) {
  // Threshold 0.25: 64 MiB allocated + 32 MiB requested = 96 MiB needed, but the peak
  // of allocated was 128 MiB, so up to 1.25 x 128 = 160 MiB may be mapped without
  // recycling: the program will need that memory again at its next peak.
  SimAllocator t =
      MakeSimAllocator("expandable_segments:true,expandable_recycle_threshold:0.25");
  Holes h = MakeHoles(*t);
  void* big = t->allocate(32 * kMiB);
  EXPECT_EQ(Reserved(*t), static_cast<int64_t>(160 * kMiB));
  // The next one would pass 160 MiB: 32 MiB of holes are recycled for it.
  void* big2 = t->allocate(32 * kMiB);
  EXPECT_LE(Reserved(*t), static_cast<int64_t>(1.25 * 128 * kMiB));
  CheckSurvivors(h);
  EXPECT_VALID(*t);
  for (void* p : {big, big2}) t->free(p);
  for (void* p : h.survivors) t->free(p);
  EXPECT_VALID(*t);
}

// The recycle trigger's reference is the allocator's own high-water mark of allocated
// bytes, not allocated_bytes.peak, which the user may reset at will: a program that
// calls reset_peak_stats() to measure each phase (here after its frees, between two
// peaks) must get the same maps and unmaps as one that never does. It used to read the
// peak since the reset, so every epoch unmapped holes and mapped them back.
struct MapCounts {
  int64_t maps = 0;
  int64_t unmaps = 0;
  int64_t reserved = 0;
  bool operator==(const MapCounts&) const = default;
};
MapCounts RunEpochs(bool reset_each_epoch) {
  SimAllocator t =
      MakeSimAllocator("expandable_segments:true,expandable_recycle_threshold:0.25");
  for (int epoch = 0; epoch < 3; ++epoch) {
    // MakeHoles' pattern, unfilled: 128 MiB at its peak, four 16 MiB holes after.
    std::vector<void*> buffers;
    for (int i = 0; i < 8; ++i) buffers.push_back(t->allocate(16 * kMiB));
    for (int i = 0; i < 8; i += 2) t->free(buffers[i]);
    if (reset_each_epoch) t->reset_peak_stats();
    void* big = t->allocate(32 * kMiB);  // fits in no 16 MiB hole: maps
    t->free(big);
    for (int i = 1; i < 8; i += 2) t->free(buffers[i]);
    EXPECT_VALID(*t);
  }
  const DeviceStats st = t->stats();
  return MapCounts{st.num_device_alloc, st.num_device_free,
                   st.reserved_bytes[kAggregatePool].current};
}

TEST(ExpandableRecycleTest, ResettingPeakStatsDoesNotChangeWhatIsMappedOrRecycled) {
  const MapCounts plain = RunEpochs(false);
  const MapCounts reset = RunEpochs(true);
  EXPECT_EQ(reset.maps, plain.maps);
  EXPECT_EQ(reset.unmaps, plain.unmaps);
  EXPECT_EQ(reset.reserved, plain.reserved);
  EXPECT_EQ(plain.unmaps, 0) << "within 1.25 x the 128 MiB peak nothing needs recycling";
}

TEST(ExpandableRecycleTest, UnderMemoryPressureHolesAreRecycledEvenWithThresholdNone) {
  // 128 MiB of device: the survivors and the holes fill it. Regular segments (and
  // expandable segments that only unmap their tail) fail the 32 MiB request.
  SimAllocator t = MakeSimAllocator(
      "sim_capacity:128MiB,expandable_segments:true,expandable_recycle_threshold:none");
  Holes h = MakeHoles(*t);
  void* big = nullptr;
  ASSERT_NO_THROW(big = t->allocate(32 * kMiB));
  Fill(big, 32 * kMiB, 0x55);
  void* big2 = nullptr;
  ASSERT_NO_THROW(big2 = t->allocate(32 * kMiB));
  Fill(big2, 32 * kMiB, 0x66);
  EXPECT_LE(t.sim->used_bytes(), 128 * kMiB);
  CheckSurvivors(h);
  EXPECT_TRUE(Check(big, 32 * kMiB, 0x55));
  EXPECT_EQ(t->stats().num_ooms, 0);
  // Now it is really full: 64 MiB of survivors + 64 MiB of big buffers.
  EXPECT_THROW(t->allocate(2 * kMiB), OutOfMemoryError);
  EXPECT_VALID(*t);
  for (void* p : {big, big2}) t->free(p);
  for (void* p : h.survivors) t->free(p);
  EXPECT_VALID(*t);
}

TEST(ExpandableRecycleTest, MappingAGapBetweenRunsMergesThem) {
  SimAllocator t = MakeSimAllocator("expandable_segments:true,expandable_recycle_threshold:0");
  void* a = t->allocate(8 * kMiB);
  void* b = t->allocate(8 * kMiB);
  void* c = t->allocate(8 * kMiB);
  t->free(b);
  t->trim(0);  // unmaps b's granules: a | hole | c
  AllocatorSnapshot snap = t->snapshot();
  ASSERT_EQ(CountSegments(snap, false), 2u);
  EXPECT_EQ(Reserved(*t), static_cast<int64_t>(16 * kMiB));
  EXPECT_VALID(*t);
  // The smallest mapping for 8 MiB is the gap itself (the tail would need as much,
  // and the gap is lower): the runs become one again.
  void* d = t->allocate(8 * kMiB);
  EXPECT_EQ(d, b);
  snap = t->snapshot();
  EXPECT_EQ(CountSegments(snap, false), 1u);
  EXPECT_EQ(FindSegment(snap, a), FindSegment(snap, c));
  EXPECT_EQ(FindSegment(snap, a)->size, 24 * kMiB);
  EXPECT_VALID(*t);
  for (void* p : {a, c, d}) t->free(p);
  EXPECT_VALID(*t);
}

TEST(ExpandableRecycleTest, AFreeBlockAboveAGapIsExtendedDownwards) {
  SimAllocator t = MakeSimAllocator("expandable_segments:true,expandable_recycle_threshold:0");
  void* a = t->allocate(8 * kMiB);
  void* b = t->allocate(8 * kMiB);
  void* c = t->allocate(6 * kMiB);
  void* d = t->allocate(8 * kMiB);
  t->free(b);
  t->trim(0);  // a | 8 MiB hole | c d
  t->free(c);  // a | hole | 6 MiB free, d
  ASSERT_EQ(CountSegments(t->snapshot(), false), 2u);
  const int64_t reserved = Reserved(*t);
  // 10 MiB: 6 MiB free above the hole, so mapping the hole's top 4 MiB suffices
  // (the tail would need 10 MiB).
  void* e = t->allocate(10 * kMiB);
  EXPECT_EQ(Addr(e), Addr(c) - 4 * kMiB);
  EXPECT_EQ(Reserved(*t), reserved + static_cast<int64_t>(4 * kMiB));
  EXPECT_EQ(CountSegments(t->snapshot(), false), 2u);
  EXPECT_VALID(*t);
  for (void* p : {a, d, e}) t->free(p);
  EXPECT_VALID(*t);
}

TEST(ExpandableRecycleTest, OnlyWholeFreeGranulesAreUnmapped) {
  SimAllocator t = MakeSimAllocator("expandable_segments:true");
  const size_t g = t->backend().granularity();
  // a: [0, 1.5 MiB), b: [1.5, 4.5 MiB), c: [4.5, 8.5 MiB); 10 MiB mapped. Of b, only
  // the granule [2, 4 MiB) lies wholly inside; the free tail [8.5, 10 MiB) holds none.
  ASSERT_EQ(g, 2 * kMiB);
  void* a = t->allocate(kMiB + 512 * 1024);
  void* b = t->allocate(3 * kMiB);
  void* c = t->allocate(4 * kMiB);
  ASSERT_EQ(Addr(b) - Addr(a), kMiB + 512 * 1024);
  t->free(b);
  const int64_t before = Reserved(*t);
  ASSERT_EQ(before, static_cast<int64_t>(10 * kMiB));
  t->trim(0);
  EXPECT_EQ(Reserved(*t), before - static_cast<int64_t>(g));
  EXPECT_EQ(t.sim->used_bytes(), static_cast<size_t>(before) - g);
  EXPECT_VALID(*t);
  // The partial granules around the hole stay mapped and usable.
  AllocatorSnapshot snap = t->snapshot();
  EXPECT_EQ(CountSegments(snap, false), 2u);
  for (void* p : {a, c}) t->free(p);
  EXPECT_VALID(*t);
}

// Memory is freed in stream order: work queued on the stream before free() may still
// use it. Releasing it to the device (cudaFree syncs by itself; unmapping does not)
// must wait for that work, or the work faults (on the sim, pages become PROT_NONE).
// The "kernel" is held until the allocator waits for its stream (a HookedBackend opens
// the gate then: the wait is for an event the allocator records on the stream under
// the device lock, allocator/release_fence.h), so it runs exactly when the allocator
// claims to wait for it: an allocator that released first would unmap memory the
// kernel then writes.
void ReleaseWaitsForQueuedWork(const std::string& conf) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = testutil::MakeHookedSimAllocator(conf, &hooks);
  Stream s = NewStream(*t);
  char* p = static_cast<char*>(t->allocate(8 * kMiB, s));
  std::atomic<bool> wrote{false};
  StreamBlocker gate(t->backend(), s);
  absl::Status st = t->backend().launch_host_fn(s, [p, &wrote] {
    std::memset(p, 0x3c, 8 * kMiB);  // the "kernel" still using p
    wrote = true;
  });
  ASSERT_TRUE(st.ok()) << st;
  testutil::HookGuard sync_event_hook =
      hooks->before_synchronize_event.Set([&](Event) { gate.Release(); });
  t->free(p);
  t->empty_cache();  // must wait for the stream before unmapping or freeing
  EXPECT_TRUE(wrote.load()) << "memory was released while queued work still used it";
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  EXPECT_VALID(*t);
  hooks->before_synchronize_event = nullptr;
}

TEST(ExpandableRecycleTest, ReleasingARunWaitsForWorkQueuedOnItsStream) {
  ReleaseWaitsForQueuedWork("expandable_segments:true");
}

TEST(ExpandableRecycleTest, ReleasingARegularSegmentWaitsForWorkQueuedOnItsStream) {
  ReleaseWaitsForQueuedWork("expandable_segments:false");
}

// Proactive recycling never synchronizes a stream on the allocating thread: it records
// an event on the holes' stream and unmaps once the stream has passed it (here at
// process_events(); a later allocation's poll does the same), tolerating the overshoot
// meanwhile. It used to synchronize the stream inside allocate(). Only blocks that
// were free when the event was recorded are taken: one freed afterwards may still be
// used by work queued after the event.
TEST(ExpandableRecycleTest, ProactiveRecyclingWaitsForTheStreamWithoutSynchronizingIt) {
  testutil::HookedBackend* hooks = nullptr;
  SimAllocator t = testutil::MakeHookedSimAllocator(
      "expandable_segments:true,expandable_recycle_threshold:0", &hooks);
  Stream s = NewStream(*t);
  std::vector<char*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(static_cast<char*>(t->allocate(16 * kMiB, s)));
  std::atomic<bool> wrote_hole{false};
  std::atomic<bool> wrote_late{false};
  char* hole = blocks[0];
  char* late = blocks[3];
  auto gate = std::make_unique<StreamBlocker>(t->backend(), s);
  ASSERT_TRUE(t->backend()
                  .launch_host_fn(s,
                                  [hole, &wrote_hole] {
                                    std::memset(hole, 0x3c, 16 * kMiB);
                                    wrote_hole = true;
                                  })
                  .ok());
  std::atomic<int> syncs{0};
  // An allocator that synchronized would wait here forever without the release.
  testutil::HookGuard sync_stream_hook = hooks->before_synchronize_stream.Set([&](Stream) {
    ++syncs;
    gate->Release();
  });
  t->free(blocks[0]);
  t->free(blocks[2]);
  const int64_t unmaps_before = t->stats().num_device_free;
  void* big = t->allocate(32 * kMiB, s);  // decides to recycle 32 MiB of holes
  EXPECT_EQ(syncs.load(), 0) << "allocate() synchronized the stream";
  EXPECT_FALSE(wrote_hole.load());
  EXPECT_EQ(Reserved(*t), static_cast<int64_t>(96 * kMiB)) << "the overshoot, for now";
  EXPECT_EQ(t->stats().num_device_free, unmaps_before);
  EXPECT_VALID(*t);
  t->process_events();  // the stream has not passed the event: nothing changes
  EXPECT_EQ(Reserved(*t), static_cast<int64_t>(96 * kMiB));
  // Queued after the event: once this runs, the stream has passed it.
  std::promise<void> passed;
  ASSERT_TRUE(t->backend().launch_host_fn(s, [&passed] { passed.set_value(); }).ok());

  // Work queued after the event uses `late`, which is freed after it (and coalesces
  // with the hole below it): that block must stay mapped until its stream passes it.
  StreamBlocker gate2(t->backend(), s);
  ASSERT_TRUE(t->backend()
                  .launch_host_fn(s,
                                  [late, &wrote_late] {
                                    std::memset(late, 0x5a, 16 * kMiB);
                                    wrote_late = true;
                                  })
                  .ok());
  t->free(late);
  gate->Release();  // the hole's work runs, then the event completes
  passed.get_future().wait();
  EXPECT_TRUE(wrote_hole.load());
  t->process_events();
  EXPECT_EQ(syncs.load(), 0);
  // Hole 0 (free before the event) is unmapped; holes 2 + late (free since after it)
  // are not, though larger.
  EXPECT_EQ(Reserved(*t), static_cast<int64_t>(80 * kMiB));
  EXPECT_GT(t->stats().num_device_free, unmaps_before);
  EXPECT_VALID(*t);
  gate2.Release();
  t->backend().synchronize_stream(s);
  EXPECT_TRUE(wrote_late.load());
  t->free(big);
  t->free(blocks[1]);
  EXPECT_VALID(*t);
  // The allocator outlives `gate` and synchronizes its streams when destroyed: the hook
  // must not reach the destroyed gate then.
  hooks->before_synchronize_stream = nullptr;
}

// Each stream's blocks serve only that stream, so the recycle trigger judges a
// stream's footprint by its own peak. Two streams that peak in turn each keep what
// their own peak needs: twice the device's peak in all. Judged against the device's
// peak, each of a stream's peaks unmapped its idle granules (the holes below), and its
// next peak mapped them again, forever (devmem-bench's steady_maps_2streams).
MapCounts AlternatingPeaks(int streams) {
  SimAllocator t =
      MakeSimAllocator("expandable_segments:true,expandable_recycle_threshold:0.25");
  std::vector<Stream> s;
  for (int i = 0; i < streams; ++i) s.push_back(NewStream(*t));
  MapCounts warm;
  for (int round = 0; round < 8; ++round) {
    if (round == 2) warm = MapCounts{t->stats().num_device_alloc, t->stats().num_device_free};
    const Stream stream = s[round % streams];
    // MakeHoles' pattern on this stream: 128 MiB at its peak, four 16 MiB holes, and
    // 32 MiB that fits in none of them.
    std::vector<void*> buffers;
    for (int i = 0; i < 8; ++i) buffers.push_back(t->allocate(16 * kMiB, stream));
    for (int i = 0; i < 8; i += 2) t->free(buffers[i]);
    void* big = t->allocate(32 * kMiB, stream);
    t->free(big);
    for (int i = 1; i < 8; i += 2) t->free(buffers[i]);
  }
  EXPECT_VALID(*t);
  const DeviceStats st = t->stats();
  return MapCounts{st.num_device_alloc - warm.maps, st.num_device_free - warm.unmaps,
                   st.reserved_bytes[kAggregatePool].current};
}

TEST(ExpandableRecycleTest, StreamsThatPeakInTurnStopMappingAfterTheirFirstPeak) {
  const MapCounts one = AlternatingPeaks(1);
  EXPECT_EQ(one.maps + one.unmaps, 0) << "one stream runs from its cache";
  const MapCounts two = AlternatingPeaks(2);
  EXPECT_EQ(two.maps, 0) << "after each stream's first peak";
  EXPECT_EQ(two.unmaps, 0);
  EXPECT_LE(two.reserved, 2 * static_cast<int64_t>(1.25 * 128 * kMiB))
      << "each stream within 1.25 x its own peak";
}

TEST(ExpandableRecycleTest, AnotherStreamsCacheIsTakenOnlyUnderPressure) {
  SimAllocator t = MakeSimAllocator("expandable_segments:true,expandable_recycle_threshold:0");
  Stream A = NewStream(*t);
  Stream B = NewStream(*t);
  void* a = t->allocate(16 * kMiB, A);
  t->free(a);
  void* b = t->allocate(16 * kMiB, B);
  EXPECT_EQ(Reserved(*t), static_cast<int64_t>(32 * kMiB))
      << "stream A's cache is kept for stream A";
  void* a2 = t->allocate(16 * kMiB, A);
  EXPECT_EQ(a2, a);
  t->free(a2);
  t->free(b);
  EXPECT_VALID(*t);

  SimAllocator full = MakeSimAllocator(
      "sim_capacity:32MiB,expandable_segments:true,expandable_recycle_threshold:none");
  Stream C = NewStream(*full);
  Stream D = NewStream(*full);
  void* c = full->allocate(30 * kMiB, C);
  full->free(c);
  void* d = nullptr;
  EXPECT_NO_THROW(d = full->allocate(30 * kMiB, D)) << "C's idle memory serves D when full";
  if (d != nullptr) full->free(d);
  EXPECT_VALID(*full);
}

// --- the default -----------------------------------------------------------------------

TEST(ExpandableDefaultTest, SimUsesExpandableSegmentsByDefault) {
  Config config;  // expandable_segments:auto
  config.backend = BackendKind::kSim;
  config.sim_capacity = kGiB;
  CachingAllocator a(MakeSimBackend(config), config);
  void* p = a.allocate(12 * kMiB);
  AllocatorSnapshot snap = a.snapshot();
  ASSERT_EQ(snap.segments.size(), 1u);
  EXPECT_TRUE(snap.segments[0].expandable);
  EXPECT_EQ(snap.segments[0].size, 12 * kMiB) << "mapped as needed, not a 20 MiB segment";
  a.free(p);
  EXPECT_VALID(a);
}

TEST(ExpandableDefaultTest, AutoIsSilentWhereThereIsNoVirtualMemoryAndTrueWarns) {
  for (const char* mode : {"auto", "true"}) {
    SCOPED_TRACE(mode);
    absl::StatusOr<Config> config =
        ParseConfig(absl::StrCat("backend:cpu,expandable_segments:", mode));
    ASSERT_TRUE(config.ok()) << config.status();
    absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(*config, 0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    ASSERT_FALSE((*backend)->caps().virtual_memory);
    testing::internal::CaptureStderr();
    {
      CachingAllocator a(std::move(*backend), *config);
      void* p = a.allocate(12 * kMiB);
      EXPECT_FALSE(a.snapshot().segments.at(0).expandable);
      a.free(p);
    }
    const std::string err = testing::internal::GetCapturedStderr();
    if (std::string(mode) == "auto") {
      EXPECT_EQ(err, "");
    } else {
      EXPECT_NE(err.find("expandable_segments:true needs virtual memory management"),
                std::string::npos)
          << err;
    }
  }
}

}  // namespace
}  // namespace devmem
