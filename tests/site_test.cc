// tests/site_test.cc: the site table and its pointer index (allocator/site.h):
// identity (same arguments, same id; any differing part, a different id), stability
// across threads, tags and their nesting, and the printed form.
//
// The site table is global to the process, so every test uses its own tags or file
// names and compares counts as differences.
#include "allocator/site.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <source_location>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/json.h"
#include "runtime/runtime.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

// One fixed source location, reached from many calls.
std::source_location FixedLoc() { return std::source_location::current(); }

SiteId InternHere(SiteKind kind = SiteKind::kAlloc, std::string_view tag = {},
                  std::source_location loc = std::source_location::current()) {
  return InternSite(loc, kind, tag);
}

TEST(SiteTest, SameLocationGivesTheSameId) {
  const std::source_location loc = FixedLoc();
  SiteId first = InternSite(loc, SiteKind::kAlloc);
  EXPECT_NE(first, kUnknownSite);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(InternSite(loc, SiteKind::kAlloc), first);
  // A copy of the location, and the location reached again, are the same site.
  std::source_location copy = loc;
  EXPECT_EQ(InternSite(copy, SiteKind::kAlloc), first);
  EXPECT_EQ(InternSite(FixedLoc(), SiteKind::kAlloc), first);
}

TEST(SiteTest, RecordsWhatTheLocationSays) {
  const std::source_location loc = std::source_location::current();
  SiteId id = InternSite(loc, SiteKind::kClone, "site_test.records");
  SiteInfo info = GetSite(id);
  EXPECT_EQ(info.file, loc.file_name());
  EXPECT_EQ(info.line, loc.line());
  EXPECT_EQ(info.function, loc.function_name());
  EXPECT_EQ(info.tag, "site_test.records");
  EXPECT_EQ(info.kind, SiteKind::kClone);
}

TEST(SiteTest, DifferentLinesAreDifferentSites) {
  SiteId a = InternHere();
  SiteId b = InternHere();
  EXPECT_NE(a, b);
  EXPECT_EQ(GetSite(a).line + 1, GetSite(b).line);
}

TEST(SiteTest, DifferentColumnsOnOneLineAreDifferentSites) {
  // clang-format off
  std::source_location a = std::source_location::current(), b = std::source_location::current();
  // clang-format on
  ASSERT_EQ(a.line(), b.line());
  ASSERT_NE(a.column(), b.column()) << "the compiler reports no columns";
  // Same file pointer, same line: the pointer index must still tell them apart.
  ASSERT_EQ(a.file_name(), b.file_name());
  SiteId ia = InternSite(a, SiteKind::kAlloc);
  SiteId ib = InternSite(b, SiteKind::kAlloc);
  EXPECT_NE(ia, ib);
  EXPECT_EQ(InternSite(a, SiteKind::kAlloc), ia);
  EXPECT_EQ(InternSite(b, SiteKind::kAlloc), ib);
}

TEST(SiteTest, DifferentKindsAreDifferentSites) {
  const std::source_location loc = FixedLoc();
  absl::flat_hash_set<SiteId> ids;
  for (int k = 0; k < kNumSiteKinds; ++k) {
    SiteId id = InternSite(loc, static_cast<SiteKind>(k));
    EXPECT_EQ(GetSite(id).kind, static_cast<SiteKind>(k));
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(kNumSiteKinds));
  // And each is found again.
  for (int k = 0; k < kNumSiteKinds; ++k) {
    EXPECT_TRUE(ids.contains(InternSite(loc, static_cast<SiteKind>(k))));
  }
}

TEST(SiteTest, TagsDistinguishSitesByText) {
  const std::source_location loc = FixedLoc();
  SiteId untagged = InternSite(loc, SiteKind::kAlloc);
  SiteId a = InternSite(loc, SiteKind::kAlloc, "site_test.tag_a");
  SiteId b = InternSite(loc, SiteKind::kAlloc, "site_test.tag_b");
  EXPECT_NE(untagged, a);
  EXPECT_NE(untagged, b);
  EXPECT_NE(a, b);
  // Equal text in different storage is the same tag.
  std::string copy = "site_test.tag_";
  copy += "a";
  EXPECT_EQ(InternSite(loc, SiteKind::kAlloc, copy), a);
  std::string other(copy);
  other[other.size() - 1] = 'b';
  EXPECT_EQ(InternSite(loc, SiteKind::kAlloc, other), b);
}

TEST(SiteTest, NewSitesGrowTheCountOnce) {
  static int run = 0;  // a new file name on every run (--gtest_repeat)
  const std::string file = "site_test/count" + std::to_string(run++) + ".cc";
  const size_t before = SiteCount();
  EXPECT_GE(before, 1u);  // the unknown site
  SiteId id = InternNamedSite(file, 1, "f", SiteKind::kAlloc);
  EXPECT_EQ(SiteCount(), before + 1);
  EXPECT_EQ(id, before);  // ids are handed out densely
  EXPECT_EQ(InternNamedSite(file, 1, "f", SiteKind::kAlloc), id);
  EXPECT_EQ(SiteCount(), before + 1);
}

TEST(SiteTest, UnknownIdsGiveTheUnknownSite) {
  for (SiteId id : {kUnknownSite, static_cast<SiteId>(SiteCount()), SiteId{0xffffffff}}) {
    SiteInfo info = GetSite(id);
    EXPECT_EQ(info.file, "<unknown>");
    EXPECT_EQ(info.line, 0u);
    EXPECT_EQ(info.function, "");
    EXPECT_EQ(info.tag, "");
    EXPECT_EQ(info.kind, SiteKind::kAlloc);
  }
}

TEST(SiteTest, NamedSites) {
  SiteId a = InternNamedSite("train.cc", 40, "step", SiteKind::kAlloc, "site_test.named");
  EXPECT_EQ(InternNamedSite("train.cc", 40, "step", SiteKind::kAlloc, "site_test.named"), a);
  EXPECT_NE(InternNamedSite("train.cc", 41, "step", SiteKind::kAlloc, "site_test.named"), a);
  EXPECT_NE(InternNamedSite("train.cc", 40, "step2", SiteKind::kAlloc, "site_test.named"),
            a);
  EXPECT_NE(InternNamedSite("train2.cc", 40, "step", SiteKind::kAlloc, "site_test.named"),
            a);
  EXPECT_NE(InternNamedSite("train.cc", 40, "step", SiteKind::kClone, "site_test.named"), a);
  SiteInfo info = GetSite(a);
  EXPECT_EQ(info.file, "train.cc");
  EXPECT_EQ(info.line, 40u);
  EXPECT_EQ(info.function, "step");
  EXPECT_EQ(info.tag, "site_test.named");
}

TEST(SiteTest, NamedSitesTakeTheTagLiterally) {
  ScopedSiteTag tag("site_test.scope_for_named");
  SiteId id = InternNamedSite("site_test/literal.cc", 3, "g", SiteKind::kAlloc);
  EXPECT_EQ(GetSite(id).tag, "");
}

// --- hostile strings and the bound on the table -----------------------------------

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD

size_t CountOf(std::string_view haystack, std::string_view needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string_view::npos;
       at = haystack.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// Invalid UTF-8 in a tag, file or function is replaced once, at interning (a lone
// continuation byte, a truncated sequence, a surrogate, an overlong, a byte never
// valid), so every SiteInfo is valid UTF-8; valid multibyte text is kept as it is.
TEST(SiteTest, InvalidUtf8IsReplacedWhenInterned) {
  const std::string bad_tag = "site_test.\x80\xC3(\xED\xA0\x80)\xC0\xAF\xFF!";
  const SiteId id =
      InternNamedSite("site_test/\xFE.cc", 7, "fn\xE2\x82", SiteKind::kAlloc, bad_tag);
  const SiteInfo info = GetSite(id);
  EXPECT_EQ(info.file, "site_test/" + kReplacement + ".cc");
  EXPECT_EQ(info.function, "fn" + kReplacement + kReplacement);
  EXPECT_EQ(info.tag.substr(0, 10), "site_test.");
  // One each: \x80, \xC3, \xED \xA0 \x80 (a surrogate: three), \xC0 \xAF, \xFF.
  EXPECT_EQ(CountOf(info.tag, kReplacement), 8u) << info.tag;
  EXPECT_EQ(info.tag.find('\xFF'), std::string::npos);
  // The same bytes give the same site (the key is the caller's text), and through
  // InternSite and the pointer index too.
  EXPECT_EQ(InternNamedSite("site_test/\xFE.cc", 7, "fn\xE2\x82", SiteKind::kAlloc, bad_tag),
            id);
  const std::source_location loc = FixedLoc();
  const SiteId via_loc = InternSite(loc, SiteKind::kArena, bad_tag);
  EXPECT_EQ(InternSite(loc, SiteKind::kArena, bad_tag), via_loc);
  EXPECT_EQ(GetSite(via_loc).tag, info.tag);
  const std::string good = "site_test.\xC3\xA9\xE6\x97\xA5\xF0\x9F\x99\x82";  // é日🙂
  EXPECT_EQ(GetSite(InternNamedSite("f.cc", 1, "f", SiteKind::kAlloc, good)).tag, good);
}

// What was seen once: one tag of invalid UTF-8 made every JSON view fail. The stats
// and snapshot JSON of an allocator holding a block of such a site are valid JSON
// (nlohmann::json refuses invalid UTF-8) and carry the replaced tag.
TEST(SiteTest, InvalidUtf8TagsKeepJsonViewsValid) {
  testutil::SimAllocator t = testutil::MakeSimAllocator();
  const SiteId site =
      InternNamedSite("site_test/json.cc", 3, "f", SiteKind::kAlloc, "site_test.j\xFF\xC3");
  void* p = t->allocate(4096, Stream{}, site);
  const std::string stats = DeviceStatsToJson(t->device(), t->stats(), t->site_stats());
  RuntimeSnapshot snap;
  snap.devices.push_back(t->snapshot());
  const std::string snapshot = SnapshotToJson(snap);
  for (const std::string* json : {&stats, &snapshot}) {
    nlohmann::json parsed;
    ASSERT_NO_THROW(parsed = nlohmann::json::parse(*json)) << json->substr(0, 200);
    EXPECT_NE(parsed.dump().find("site_test.j" + kReplacement + kReplacement),
              std::string::npos);
  }
  t->free(p);
}

// Tags are cut to kMaxSiteTagBytes (tags agreeing that far are one site); file and
// function names to kMaxSiteNameBytes.
TEST(SiteTest, LongTagsAndNamesAreCut) {
  const std::string long_tag = "site_test.long" + std::string(10000, 't');
  const SiteId a = InternNamedSite("f.cc", 1, "f", SiteKind::kAlloc, long_tag + "a");
  EXPECT_EQ(GetSite(a).tag, long_tag.substr(0, kMaxSiteTagBytes));
  EXPECT_EQ(InternNamedSite("f.cc", 1, "f", SiteKind::kAlloc, long_tag + "b"), a);
  const std::source_location loc = FixedLoc();
  EXPECT_EQ(GetSite(InternSite(loc, SiteKind::kAlloc, long_tag)).tag.size(),
            kMaxSiteTagBytes);
  {
    ScopedSiteTag scoped(long_tag);
    EXPECT_EQ(CurrentSiteTag().size(), kMaxSiteTagBytes);
  }
  const std::string long_name = "site_test/" + std::string(100000, 'n');
  const SiteInfo info = GetSite(InternNamedSite(long_name, 1, long_name, SiteKind::kAlloc));
  EXPECT_EQ(info.file.size(), kMaxSiteNameBytes);
  EXPECT_EQ(info.function.size(), kMaxSiteNameBytes);
}

// The table holds kMaxSites ids; after that every new site is the `other` site, and
// stderr says so. Run in a child process: filling the table would change every later
// test of this binary. The child exits 0 only when each check holds (gtest assertions
// do not cross the fork), and prints which one failed otherwise.
TEST(SiteDeathTest, TheTableIsBoundedWithAnOtherSite) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto check = [](bool ok, const char* what) {
          if (!ok) {
            std::fprintf(stderr, "check failed: %s\n", what);
            std::_Exit(1);
          }
        };
        const SiteId first = InternNamedSite("site_test/fill.cc", 0, "f", SiteKind::kAlloc);
        uint32_t line = 1;
        while (SiteCount() < kMaxSites - 1) {
          InternNamedSite("site_test/fill.cc", line++, "f", SiteKind::kAlloc);
        }
        const SiteId other = InternNamedSite("site_test/over.cc", 1, "f", SiteKind::kAlloc);
        check(SiteCount() == kMaxSites, "the table stops at kMaxSites");
        check(GetSite(other).file == kOtherSiteFile, "the next site is <other>");
        check(GetSite(other).tag == "other", "the other site's tag");
        for (uint32_t i = 0; i < 1000; ++i) {
          check(InternNamedSite("site_test/over.cc", i + 2, "f", SiteKind::kClone, "t") ==
                    other,
                "new sites go to <other>");
        }
        const std::source_location loc = FixedLoc();
        check(InternSite(loc, SiteKind::kContiguous, "site_test.new_tag") == other,
              "InternSite too");
        check(InternSite(loc, SiteKind::kContiguous, "site_test.new_tag") == other,
              "and again (not cached as another id)");
        check(SiteCount() == kMaxSites, "the table did not grow");
        check(InternNamedSite("site_test/fill.cc", 0, "f", SiteKind::kAlloc) == first,
              "known sites keep their ids");
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "site table is full");
}

TEST(ScopedSiteTagTest, NestsAndRestores) {
  EXPECT_EQ(CurrentSiteTag(), "");
  {
    ScopedSiteTag outer("site_test.outer");
    EXPECT_EQ(CurrentSiteTag(), "site_test.outer");
    {
      ScopedSiteTag inner("site_test.inner");
      EXPECT_EQ(CurrentSiteTag(), "site_test.inner");
      {
        // A tag made from the current one (a view of the thread-local) is safe.
        ScopedSiteTag same(CurrentSiteTag());
        EXPECT_EQ(CurrentSiteTag(), "site_test.inner");
      }
      EXPECT_EQ(CurrentSiteTag(), "site_test.inner");
    }
    EXPECT_EQ(CurrentSiteTag(), "site_test.outer");
    {
      ScopedSiteTag cleared("");
      EXPECT_EQ(CurrentSiteTag(), "");
    }
    EXPECT_EQ(CurrentSiteTag(), "site_test.outer");
  }
  EXPECT_EQ(CurrentSiteTag(), "");
}

TEST(ScopedSiteTagTest, InternSiteUsesTheCurrentTag) {
  const std::source_location loc = FixedLoc();
  SiteId untagged = InternSite(loc, SiteKind::kAlloc);
  SiteId tagged_explicitly = InternSite(loc, SiteKind::kAlloc, "site_test.scoped");
  {
    ScopedSiteTag tag("site_test.scoped");
    SiteId in_scope = InternSite(loc, SiteKind::kAlloc);
    EXPECT_NE(in_scope, untagged);
    EXPECT_EQ(in_scope, tagged_explicitly);
    EXPECT_EQ(GetSite(in_scope).tag, "site_test.scoped");
    // An explicit tag wins over the scope's.
    EXPECT_EQ(GetSite(InternSite(loc, SiteKind::kAlloc, "site_test.explicit")).tag,
              "site_test.explicit");
    {
      ScopedSiteTag inner("site_test.scoped_inner");
      EXPECT_EQ(GetSite(InternSite(loc, SiteKind::kAlloc)).tag, "site_test.scoped_inner");
    }
    EXPECT_EQ(InternSite(loc, SiteKind::kAlloc), in_scope);
  }
  EXPECT_EQ(InternSite(loc, SiteKind::kAlloc), untagged);
}

TEST(ScopedSiteTagTest, TagsArePerThread) {
  ScopedSiteTag tag("site_test.main_thread");
  std::string seen = "unset";
  std::thread t([&] { seen = std::string(CurrentSiteTag()); });
  t.join();
  EXPECT_EQ(seen, "");
  EXPECT_EQ(CurrentSiteTag(), "site_test.main_thread");
}

// 100 distinct sites (first interned concurrently: racing inserts into the table and the
// pointer index), interned by 4 threads at once, twice each.
std::vector<SiteId> InternHundredSites() {
  std::vector<SiteId> ids;
  const std::source_location loc = FixedLoc();
  for (int round = 0; round < 2; ++round) {
    ids.clear();
    for (int i = 0; i < 100; ++i) {
      std::string tag = "site_test.concurrent." + std::to_string(i);
      switch (i % 3) {
        case 0: ids.push_back(InternSite(loc, SiteKind::kAlloc, tag)); break;
        case 1: ids.push_back(InternSite(loc, static_cast<SiteKind>(i % kNumSiteKinds), tag)); break;
        default:
          ids.push_back(InternNamedSite("site_test/concurrent.cc", static_cast<uint32_t>(i),
                                        "fn", SiteKind::kAlloc, tag));
      }
    }
  }
  return ids;
}

TEST(SiteTest, IdsAgreeAcrossThreads) {
  constexpr int kThreads = 4;
  std::vector<std::vector<SiteId>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&results, t] { results[t] = InternHundredSites(); });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(results[t], results[0]) << "thread " << t;
  absl::flat_hash_set<SiteId> distinct(results[0].begin(), results[0].end());
  EXPECT_EQ(distinct.size(), 100u);
  EXPECT_FALSE(distinct.contains(kUnknownSite));
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(GetSite(results[0][i]).tag, "site_test.concurrent." + std::to_string(i));
  }
  // The main thread (a cold cache) agrees too.
  EXPECT_EQ(InternHundredSites(), results[0]);
}

TEST(SiteTest, ManySitesThroughTheCacheStayDistinct) {
  // 1000 sites that share a location and differ only in the tag: they collide in the
  // direct-mapped cache; every lookup must still return its own id.
  const std::source_location loc = FixedLoc();
  std::vector<SiteId> ids;
  for (int i = 0; i < 1000; ++i) {
    ids.push_back(InternSite(loc, SiteKind::kArena, "site_test.many." + std::to_string(i)));
  }
  for (int i = 999; i >= 0; --i) {
    EXPECT_EQ(InternSite(loc, SiteKind::kArena, "site_test.many." + std::to_string(i)),
              ids[i]);
  }
  absl::flat_hash_set<SiteId> distinct(ids.begin(), ids.end());
  EXPECT_EQ(distinct.size(), 1000u);
}

// 256 call sites: one per instantiation (each has its own function name).
template <int N>
std::source_location SiteOf() {
  return std::source_location::current();
}
template <int... N>
std::vector<std::source_location> SitesOf(std::integer_sequence<int, N...>) {
  return {SiteOf<N>()...};
}

TEST(SiteTest, KnownSitesAreFoundWithoutTheTableAcrossThreads) {
  // Interning a known site is a read-only lookup, however many sites are hot: 256 of
  // them in rotation (a 64-entry per-thread cache missed on every call here and took
  // the table's lock) never reach the table once each was interned.
  const std::vector<std::source_location> locs =
      SitesOf(std::make_integer_sequence<int, 256>{});
  std::vector<SiteId> ids;
  for (const std::source_location& loc : locs) ids.push_back(InternSite(loc, SiteKind::kAlloc));
  EXPECT_EQ(absl::flat_hash_set<SiteId>(ids.begin(), ids.end()).size(), 256u);
  const uint64_t before = internal::SiteTableLookups();
  for (int round = 0; round < 4; ++round) {
    for (size_t i = 0; i < locs.size(); ++i) {
      ASSERT_EQ(InternSite(locs[i], SiteKind::kAlloc), ids[i]) << i;
    }
  }
  EXPECT_EQ(internal::SiteTableLookups(), before);
  // From another thread too: the index is the process's, not the thread's.
  std::thread other([&] {
    for (size_t i = 0; i < locs.size(); ++i) EXPECT_EQ(InternSite(locs[i], SiteKind::kAlloc), ids[i]);
  });
  other.join();
  EXPECT_EQ(internal::SiteTableLookups(), before);
}

// The per-thread front answers plain interns (no tag, no ScopedSite frame) by the
// source_location's identity and kind (site.cc): whatever it caches, every other part
// of the identity must still count.
TEST(SiteTest, ThePerThreadFrontKeepsKindsTagsAndFramesApart) {
  const std::source_location loc = FixedLoc();
  const SiteId alloc = InternSite(loc, SiteKind::kAlloc);
  const SiteId clone = InternSite(loc, SiteKind::kClone);
  EXPECT_NE(alloc, clone);
  // kAlloc and kClone of one location share a front slot: each lookup evicts the
  // other's entry, and each must still get its own id, read-only.
  const uint64_t before = internal::SiteTableLookups();
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(InternSite(loc, SiteKind::kAlloc), alloc) << i;
    ASSERT_EQ(InternSite(loc, SiteKind::kClone), clone) << i;
  }
  EXPECT_EQ(internal::SiteTableLookups(), before);
  {
    // A frame makes the same location a chain, although its plain site is cached.
    const std::source_location outer = std::source_location::current();
    ScopedSite frame(outer);
    const SiteId chained = InternSite(loc, SiteKind::kAlloc);
    EXPECT_NE(chained, alloc);
    EXPECT_EQ(GetSite(chained).outer_line, outer.line());
  }
  EXPECT_EQ(InternSite(loc, SiteKind::kAlloc), alloc);
  {
    ScopedSiteTag tag("site_test.front");
    EXPECT_EQ(GetSite(InternSite(loc, SiteKind::kAlloc)).tag, "site_test.front");
  }
  EXPECT_EQ(InternSite(loc, SiteKind::kAlloc), alloc);
}

// A thread_local destructor that runs after the thread's front was freed (thread exit)
// still interns correctly, through the index, and makes no new front (which would
// leak: LeakSanitizer in the ASan build).
TEST(SiteTest, InterningAfterTheThreadsFrontIsFreedUsesTheIndex) {
  const std::source_location loc = FixedLoc();
  const SiteId id = InternSite(loc, SiteKind::kToDevice);
  struct InternsAtExit {
    std::source_location loc;
    SiteId* out = nullptr;
    ~InternsAtExit() {
      if (out != nullptr) *out = InternSite(loc, SiteKind::kToDevice);
    }
  };
  SiteId at_exit = kUnknownSite;
  std::thread t([&] {
    // Constructed before the thread's front, so destroyed after it.
    thread_local InternsAtExit guard;
    guard.loc = loc;
    EXPECT_EQ(InternSite(loc, SiteKind::kToDevice), id);  // makes the front
    guard.out = &at_exit;
  });
  t.join();
  EXPECT_EQ(at_exit, id);
}

TEST(SiteTest, RacingFirstInternsIndexOneId) {
  // 4 threads intern the same new sites at once, each through the index's slow path:
  // every thread gets the same id for a site, and a later lookup is read-only.
  const std::vector<std::source_location> locs =
      SitesOf(std::make_integer_sequence<int, 256>{});
  constexpr int kThreads = 4;
  std::vector<std::vector<SiteId>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 64; ++i) {
        results[t].push_back(InternSite(locs[i], SiteKind::kClone, "site_test.racing"));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 1; t < kThreads; ++t) EXPECT_EQ(results[t], results[0]) << "thread " << t;
  const uint64_t before = internal::SiteTableLookups();
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(InternSite(locs[i], SiteKind::kClone, "site_test.racing"), results[0][i]);
  }
  EXPECT_EQ(internal::SiteTableLookups(), before);
}

TEST(SiteInfoTest, ToString) {
  EXPECT_EQ((SiteInfo{"tensor/tensor.cc", 120, "f", "", SiteKind::kClone}).ToString(),
            "tensor/tensor.cc:120 (clone)");
  EXPECT_EQ((SiteInfo{"train.cc", 40, "f", "optimizer", SiteKind::kAlloc}).ToString(),
            "optimizer @ train.cc:40 (alloc)");
  // The path is kept as given, not cut to its base name.
  EXPECT_EQ((SiteInfo{"/src/devmem/tensor/ops.cc", 7, "", "", SiteKind::kToDevice})
                .ToString(),
            "/src/devmem/tensor/ops.cc:7 (to_device)");
  EXPECT_EQ(GetSite(kUnknownSite).ToString(), "<unknown> (alloc)");
}

TEST(SiteInfoTest, ToStringShowsTheOuterFrameFirst) {
  SiteInfo s{"lib/helpers.cc", 30, "Helper", "opt", SiteKind::kClone};
  s.outer_file = "train.cc";
  s.outer_line = 12;
  s.outer_function = "main";
  EXPECT_EQ(s.ToString(), "opt @ train.cc:12 > lib/helpers.cc:30 (clone)");
}

std::source_location OuterLoc() { return std::source_location::current(); }
std::source_location InnerLoc() { return std::source_location::current(); }

TEST(ScopedSiteTest, RecordsTheOutermostFrameOnly) {
  const std::source_location outer = OuterLoc();
  const SiteId bare = InternSite(InnerLoc(), SiteKind::kAlloc);
  SiteId chained = kUnknownSite;
  {
    ScopedSite a(outer);
    {
      ScopedSite b;  // an inner frame: not recorded in the site
      EXPECT_EQ(ScopedSiteDepth(), 2u);
      chained = InternSite(InnerLoc(), SiteKind::kAlloc);
      EXPECT_EQ(InternSite(InnerLoc(), SiteKind::kAlloc), chained);  // the cache
    }
    EXPECT_EQ(InternSite(InnerLoc(), SiteKind::kAlloc), chained);
    // The allocation at the frame's own location is not a chain.
    EXPECT_EQ(InternSite(outer, SiteKind::kAlloc), InternSite(outer, SiteKind::kAlloc));
    EXPECT_FALSE(GetSite(InternSite(outer, SiteKind::kAlloc)).has_outer());
  }
  EXPECT_EQ(ScopedSiteDepth(), 0u);
  EXPECT_EQ(OutermostScopedSite(), nullptr);
  EXPECT_NE(chained, bare);
  EXPECT_EQ(InternSite(InnerLoc(), SiteKind::kAlloc), bare);  // popped: no chain again
  const SiteInfo info = GetSite(chained);
  EXPECT_EQ(info.line, InnerLoc().line());
  EXPECT_EQ(info.outer_line, outer.line());
  EXPECT_EQ(info.outer_file, outer.file_name());
  EXPECT_EQ(info.outer_function, outer.function_name());
  EXPECT_FALSE(GetSite(bare).has_outer());
}

TEST(ScopedSiteTest, DepthIsBoundedAndPopsMatchPushes) {
  const std::source_location outer = OuterLoc();
  std::vector<std::unique_ptr<ScopedSite>> frames;
  frames.push_back(std::make_unique<ScopedSite>(outer));
  for (size_t i = 1; i < kMaxScopedSiteDepth + 5; ++i) {
    frames.push_back(std::make_unique<ScopedSite>());
  }
  EXPECT_EQ(ScopedSiteDepth(), kMaxScopedSiteDepth + 5);
  EXPECT_EQ(GetSite(InternSite(InnerLoc(), SiteKind::kClone)).outer_line, outer.line());
  while (!frames.empty()) frames.pop_back();  // innermost first
  EXPECT_EQ(ScopedSiteDepth(), 0u);
  EXPECT_FALSE(GetSite(InternSite(InnerLoc(), SiteKind::kClone)).has_outer());
}

TEST(ScopedSiteTest, FramesArePerThread) {
  ScopedSite mine;
  SiteId other = kUnknownSite;
  std::thread t([&] { other = InternSite(InnerLoc(), SiteKind::kAlloc); });
  t.join();
  EXPECT_FALSE(GetSite(other).has_outer());
  EXPECT_TRUE(GetSite(InternSite(InnerLoc(), SiteKind::kAlloc)).has_outer());
}

TEST(ScopedSiteTest, NamedChainsAreInternedByTheirFrames) {
  const SiteId a = InternNamedSiteChain("lib.cc", 3, "h", SiteKind::kClone, "", "user.cc",
                                        9, "main");
  EXPECT_EQ(InternNamedSiteChain("lib.cc", 3, "h", SiteKind::kClone, "", "user.cc", 9,
                                 "main"),
            a);
  EXPECT_NE(InternNamedSite("lib.cc", 3, "h", SiteKind::kClone), a);
  EXPECT_EQ(GetSite(a).ToString(), "user.cc:9 > lib.cc:3 (clone)");
}

TEST(SiteKindTest, NamesAndCopyKinds) {
  EXPECT_EQ(SiteKindName(SiteKind::kAlloc), "alloc");
  EXPECT_EQ(SiteKindName(SiteKind::kClone), "clone");
  EXPECT_EQ(SiteKindName(SiteKind::kContiguous), "contiguous");
  EXPECT_EQ(SiteKindName(SiteKind::kToDevice), "to_device");
  EXPECT_EQ(SiteKindName(SiteKind::kArena), "arena");
  EXPECT_FALSE(IsCopyKind(SiteKind::kAlloc));
  EXPECT_TRUE(IsCopyKind(SiteKind::kClone));
  EXPECT_TRUE(IsCopyKind(SiteKind::kContiguous));
  EXPECT_TRUE(IsCopyKind(SiteKind::kToDevice));
  EXPECT_FALSE(IsCopyKind(SiteKind::kArena));
}

}  // namespace
}  // namespace devmem
