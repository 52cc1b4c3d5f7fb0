// tests/memtrace_timeline_test.cc: memtrace timeline's reader and bucketing
// (tools/timeline/timeline.h): the trace rule shared with replay, bounded intervals when time
// goes backwards, the sparse per-site series against what they must add up to, and
// site names spelled as the rest of devmem spells them.
#include "tools/timeline/timeline.h"

#include <gtest/gtest.h>

#include <string>

#include "allocator/arena.h"
#include "allocator/site.h"
#include "runtime/json.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

std::string Alloc(uint64_t addr, uint64_t size, uint64_t site, int64_t time_ns) {
  return "{\"action\":\"alloc\",\"addr\":" + std::to_string(addr) + ",\"size\":" +
         std::to_string(size) + ",\"site\":" + std::to_string(site) +
         ",\"time_ns\":" + std::to_string(time_ns) + "}\n";
}
std::string Free(uint64_t addr, int64_t time_ns) {
  return "{\"action\":\"free\",\"addr\":" + std::to_string(addr) +
         ",\"time_ns\":" + std::to_string(time_ns) + "}\n";
}
// A segment event, so that no replay runs (the tests look at allocated bytes only).
std::string Segment(int64_t time_ns) {
  return "{\"action\":\"segment_alloc\",\"addr\":1,\"size\":1073741824,\"time_ns\":" +
         std::to_string(time_ns) + "}\n";
}

TEST(TimelineTest, TimeGoingBackwardsStaysWithinMaxPoints) {
  // Times alternate between the end and the start of the range: every step back used
  // to open another interval (16,000 points from an 800-point default).
  std::string text = Segment(1);
  for (int i = 0; i < 2000; ++i) {
    text += Alloc(1000 + i, 512, 1, i % 2 == 0 ? 1'000'000 : 1);
  }
  TimelineOptions options;
  options.max_points = 16;
  absl::StatusOr<Timeline> t = BuildTimeline(text, "t.jsonl", options);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_LE(t->x.size(), 16u);
  EXPECT_EQ(t->time_backwards, 1000u);
  EXPECT_EQ(t->peak_allocated, 2000u * 512);
  for (size_t i = 1; i < t->x.size(); ++i) EXPECT_LT(t->x[i - 1], t->x[i]);
}

std::string WithSeq(uint64_t seq, std::string event) {
  return "{\"seq\":" + std::to_string(seq) + "," + event.substr(1);
}

// A live ring trace leaves out the numbers of the events it lost: a free lost in such a
// gap is implied at the address's next alloc (the live trace of a two-thread process
// read as "already live" and drew nothing); without a gap a double alloc stays an error.
TEST(TimelineTest, AFreeLostInASeqGapIsImpliedAtTheNextAlloc) {
  const std::string seg = WithSeq(1, Segment(1));
  // seq 4 (the free of 7 at time 3) was lost: 5 re-allocates 7.
  absl::StatusOr<Timeline> t = BuildTimeline(
      seg + WithSeq(2, Alloc(7, 512, 1, 2)) + WithSeq(3, Alloc(8, 256, 2, 2)) +
          WithSeq(5, Alloc(7, 1024, 1, 4)) + WithSeq(6, Free(7, 5)) + WithSeq(7, Free(8, 6)),
      "live", {});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->implied_frees, 1u);
  EXPECT_EQ(t->unmatched_frees, 0u);
  EXPECT_EQ(t->peak_allocated, 1024u + 256) << "not 512 + 256 + 1024: the old buffer ended";
  EXPECT_EQ(t->allocated.back(), 0u);
  // The same without the gap: the double alloc is refused, naming the line.
  t = BuildTimeline(seg + WithSeq(2, Alloc(7, 512, 1, 2)) + WithSeq(3, Alloc(7, 1024, 1, 4)),
                    "live", {});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("live:3: alloc of addr 7, which is already live"),
            std::string::npos)
      << t.status();
  // A gap before the first alloc of the address implies nothing.
  t = BuildTimeline(seg + WithSeq(5, Alloc(7, 512, 1, 2)) + WithSeq(6, Alloc(7, 512, 1, 3)),
                    "live", {});
  ASSERT_FALSE(t.ok());
}

TEST(TimelineTest, DoubleAllocIsAnErrorAndUnmatchedFreesAreCounted) {
  absl::StatusOr<Timeline> t =
      BuildTimeline(Alloc(7, 512, 1, 1) + Alloc(7, 512, 1, 2), "t.jsonl", {});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("t.jsonl:2: alloc of addr 7, which is already live"),
            std::string::npos)
      << t.status();
  // Frees first (a trace cut from a ring), then a real pair: counted, skipped.
  t = BuildTimeline(Segment(1) + Free(5, 1) + Free(6, 2) + Alloc(7, 512, 1, 3) + Free(7, 4),
                    "t.jsonl", {});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->unmatched_frees, 2u);
  EXPECT_EQ(t->events, 3u);  // the segment event and the pair
  EXPECT_EQ(t->peak_allocated, 512u);
}

TEST(TimelineTest, TopSitesAndOtherAddUpToAllocatedAtEveryPoint) {
  // 50 sites; site s holds s * 512 bytes from time s, and the even ones free theirs
  // at time 100 + s. Top 3 drawn separately, the other 47 summed.
  std::string text = Segment(1);
  for (int s = 1; s <= 50; ++s) text += Alloc(s, 512 * s, s, s);
  for (int s = 2; s <= 50; s += 2) text += Free(s, 100 + s);
  TimelineOptions options;
  options.max_points = 200;
  options.top_sites = 3;
  absl::StatusOr<Timeline> t = BuildTimeline(text, "t.jsonl", options);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->site_names.size(), 4u);
  EXPECT_EQ(t->site_names[0], "site 50");
  EXPECT_EQ(t->site_names[1], "site 49");
  EXPECT_EQ(t->site_names[2], "site 48");
  EXPECT_EQ(t->site_names[3], "other sites");
  EXPECT_EQ(t->site_peak_bytes[0], 50u * 512);
  uint64_t all_sites = 0;
  for (int s = 1; s <= 47; ++s) all_sites += 512 * s;
  EXPECT_EQ(t->site_peak_bytes[3], all_sites);
  // Every series holds the state after its interval's last event.
  const size_t last = t->x.size() - 1;
  uint64_t end_sum = 0;
  for (const auto& series : t->by_site) end_sum += series[last];
  uint64_t odd = 0;
  for (int s = 1; s <= 50; s += 2) odd += 512 * s;
  EXPECT_EQ(end_sum, odd);
  EXPECT_EQ(t->by_site[0][last], 0u);       // site 50 freed
  EXPECT_EQ(t->by_site[1][last], 49u * 512);
  for (size_t i = 0; i < t->x.size(); ++i) {
    uint64_t sum = 0;
    for (const auto& series : t->by_site) sum += series[i];
    EXPECT_EQ(sum, t->allocated[i]) << "point " << i;
    EXPECT_LE(t->allocated[i], t->allocated_max[i]);
  }
}

TEST(TimelineTest, PointsAreTheStateAfterTheLastEventOfTheirInterval) {
  // Alloc 4096 at t=0, 1024 at t=10, free both at t=100: with 4 points over 0..100
  // the intervals are [0,25), [25,50), [50,75), [75,101). The final frees must show
  // (allocated 0 at the last point, at x = 100), while the first interval's point
  // says what it ends with and its highest.
  const std::string text = Segment(0) + Alloc(1, 4096, 1, 0) + Alloc(2, 1024, 1, 10) +
                           Free(1, 100) + Free(2, 100);
  TimelineOptions options;
  options.max_points = 4;
  absl::StatusOr<Timeline> t = BuildTimeline(text, "t.jsonl", options);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->x.size(), 2u);
  EXPECT_EQ(t->x[0], 10);  // the interval's last event
  EXPECT_EQ(t->allocated[0], 5120u);
  EXPECT_EQ(t->x[1], 100);
  EXPECT_EQ(t->allocated[1], 0u);
  EXPECT_EQ(t->allocated_max[1], 5120u);
  EXPECT_EQ(t->x_end, 100);
}

TEST(TimelineTest, SitesCarryTheirKindAndId) {
  const std::string header =
      "{\"schema\":\"devmem.trace/1\",\"sites\":[{\"id\":3,\"file\":\"m.py\","
      "\"line\":4,\"function\":\"f\",\"tag\":\"\",\"kind\":\"clone\"}]}\n";
  absl::StatusOr<Timeline> t =
      BuildTimeline(header + Segment(0) + Alloc(1, 512, 3, 1) + Alloc(2, 256, 9, 2), "t", {});
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->site_names.size(), 2u);
  EXPECT_EQ(t->site_names[0], "m.py:4 (f)");
  EXPECT_EQ(t->site_kinds[0], "clone");
  EXPECT_EQ(t->site_ids[0], 3u);
  EXPECT_EQ(t->site_names[1], "site 9");  // not in the table
  EXPECT_EQ(t->site_kinds[1], "");
}

// A site is named as SiteInfo::ToString names it everywhere else (metrics, snapshots,
// OOM reports), with the kind beside the name instead of after it: an arena chunk's
// site is `step @ <arena>` (its line 0 left out; it was `step @ <arena>:0`), and a
// site with a ScopedSite frame starts with that frame. The arena site is the one a
// real ArenaScope's chunk carries, written into the header by the trace writer.
TEST(TimelineTest, SiteNamesAreSpelledAsEverywhereElse) {
  testutil::SimAllocator t = testutil::MakeSimAllocator();
  SiteId arena_site = kUnknownSite;
  uintptr_t chunk = 0;
  size_t chunk_size = 0;
  {
    ArenaScope step(*t.alloc, "step");
    void* p = t.alloc->allocate(1000);
    for (const SegmentInfo& s : t.alloc->snapshot().segments) {
      for (const BlockInfo& b : s.blocks) {
        if (b.state == BlockState::kAllocated && GetSite(b.site).kind == SiteKind::kArena) {
          arena_site = b.site;
          chunk = b.addr;
          chunk_size = b.size;
        }
      }
    }
    t.alloc->free(p);
  }
  ASSERT_NE(arena_site, kUnknownSite) << "no arena chunk in the snapshot";
  const SiteInfo arena = GetSite(arena_site);
  ASSERT_EQ(arena.ToString(), "step @ <arena> (arena)");  // as docs/metrics.md spells it
  SiteInfo framed;
  framed.file = "model.py";
  framed.line = 10;
  framed.kind = SiteKind::kClone;
  framed.outer_file = "train.py";
  framed.outer_line = 3;
  const SiteId framed_id = arena_site + 1;
  const std::string header =
      TraceHeaderFromSites({{arena_site, arena}, {framed_id, framed}}) + "\n";
  absl::StatusOr<Timeline> tl =
      BuildTimeline(header + Segment(0) + Alloc(chunk, chunk_size, arena_site, 1) +
                        Alloc(chunk + chunk_size, 512, framed_id, 2),
                    "t", {});
  ASSERT_TRUE(tl.ok()) << tl.status();
  ASSERT_EQ(tl->site_names.size(), 2u);
  EXPECT_EQ(tl->site_names[0], "step @ <arena>");
  EXPECT_EQ(tl->site_kinds[0], "arena");
  EXPECT_EQ(tl->site_names[0] + " (" + tl->site_kinds[0] + ")", arena.ToString());
  EXPECT_EQ(tl->site_names[1], "train.py:3 > model.py:10");
  EXPECT_EQ(tl->site_names[1] + " (" + tl->site_kinds[1] + ")", framed.ToString());
}

}  // namespace
}  // namespace devmem
