// tests/oom_report_test.cc: ChooseRemedy picks each cause from crafted numbers and
// names the right setting; OomReport::ToString carries the key figures;
// OutOfMemoryError is a std::bad_alloc whose what() is the report.
#include "allocator/oom_report.h"

#include <limits>
#include <new>
#include <string>

#include "allocator/site.h"
#include "allocator/types.h"
#include "gtest/gtest.h"
#include "tests/text_assertions.h"

namespace devmem {
namespace {

constexpr size_t kNoLimit = std::numeric_limits<size_t>::max();

// A device of 8 GiB, fully allowed, nothing free anywhere: real use unless a test
// changes the numbers.
OomReport Base() {
  OomReport r;
  r.device = DeviceId{DeviceType::kSim, 0};
  r.requested_bytes = kGiB;
  r.rounded_bytes = kGiB;
  r.segment_bytes = kGiB;
  r.device_total = 8 * kGiB;
  r.memory_limit = 8 * kGiB;
  r.driver_free = 0;
  r.allocated = 8 * kGiB;
  r.reserved = 8 * kGiB;
  r.segment_count = 8;
  return r;
}

TEST(OomCauseTest, Names) {
  EXPECT_EQ(OomCauseName(OomCause::kFragmentation), "fragmentation");
  EXPECT_EQ(OomCauseName(OomCause::kPendingStreams), "pending_streams");
  EXPECT_EQ(OomCauseName(OomCause::kMemoryFraction), "memory_fraction");
  EXPECT_EQ(OomCauseName(OomCause::kRealUse), "real_use");
  EXPECT_EQ(OomCauseName(OomCause::kTooLarge), "too_large");
}

TEST(ChooseRemedyTest, TooLargeForTheDevice) {
  OomReport r = Base();
  r.requested_bytes = r.rounded_bytes = r.segment_bytes = 16 * kGiB;
  r.allocated = r.reserved = 0;
  r.driver_free = 8 * kGiB;
  ChooseRemedy(&r, kNoLimit, false);
  EXPECT_EQ(r.cause, OomCause::kTooLarge);
  EXPECT_CONTAINS(r.remedy, "exceeds the device's total memory (8.00 GiB)");
  EXPECT_CONTAINS(r.remedy, "16.0 GiB");
}

TEST(ChooseRemedyTest, TooLargeForTheMemoryLimit) {
  OomReport r = Base();
  r.memory_limit = 4 * kGiB;  // per_process_memory_fraction 0.5
  r.requested_bytes = r.rounded_bytes = r.segment_bytes = 6 * kGiB;
  r.allocated = r.reserved = 0;
  r.driver_free = 8 * kGiB;
  ChooseRemedy(&r, kNoLimit, false);
  EXPECT_EQ(r.cause, OomCause::kTooLarge);
  EXPECT_CONTAINS(r.remedy, "exceeds the memory limit (4.00 GiB)");
  EXPECT_CONTAINS(r.remedy, "raise it to at least 0.75");
  EXPECT_CONTAINS(r.remedy, "per_process_memory_fraction");
}

TEST(ChooseRemedyTest, MemoryFraction) {
  OomReport r = Base();
  r.memory_limit = 4 * kGiB;
  r.allocated = 3 * kGiB;
  r.reserved = 3 * kGiB + 512 * kMiB;
  r.reserved_unallocated = 512 * kMiB;
  r.largest_free_block = 512 * kMiB;
  r.fragmentation = 0;
  r.driver_free = 4 * kGiB;  // the driver could give the segment: the cap is the cause
  ChooseRemedy(&r, kNoLimit, false);
  EXPECT_EQ(r.cause, OomCause::kMemoryFraction);
  // (3.5 GiB reserved + 1 GiB segment) / 8 GiB = 0.5625, rounded up to 0.57.
  EXPECT_CONTAINS(r.remedy, "raise per_process_memory_fraction to at least 0.57");
  EXPECT_CONTAINS(r.remedy, "DEVMEM_CONF=per_process_memory_fraction:0.57");
  EXPECT_CONTAINS(r.remedy, "caps reserved memory at 4.00 GiB (0.50 of 8.00 GiB)");

  // The same numbers with a driver that has no room: not the fraction's fault.
  r.driver_free = 512 * kMiB;
  ChooseRemedy(&r, kNoLimit, false);
  EXPECT_NE(r.cause, OomCause::kMemoryFraction);
}

TEST(ChooseRemedyTest, PendingStreams) {
  OomReport r = Base();
  r.allocated = 6 * kGiB;
  r.pending = 3 * kGiB / 2;
  r.reserved_unallocated = r.pending + 100 * kMiB;
  r.largest_free_block = 100 * kMiB;
  r.fragmentation = 0;
  ChooseRemedy(&r, kNoLimit, false);
  EXPECT_EQ(r.cause, OomCause::kPendingStreams);
  EXPECT_CONTAINS(r.remedy, "1.50 GiB is freed but waits for work on other streams");
  EXPECT_CONTAINS(r.remedy, "synchronize");
  EXPECT_CONTAINS(r.remedy, "record_stream");

  // Less pending than the request: something else.
  r.pending = 512 * kMiB;
  r.reserved_unallocated = r.pending + 100 * kMiB;
  ChooseRemedy(&r, kNoLimit, false);
  EXPECT_NE(r.cause, OomCause::kPendingStreams);
}

// Enough free in total, no block large enough.
OomReport Fragmented() {
  OomReport r = Base();
  r.allocated = 5 * kGiB;
  r.reserved = 7 * kGiB + 768 * kMiB;
  r.reserved_unallocated = r.reserved - r.allocated;  // 2.75 GiB
  r.largest_free_block = 256 * kMiB;
  r.free_blocks = 40;
  r.fragmentation = 1.0 - 256.0 / (2.75 * 1024);
  r.driver_free = 256 * kMiB;
  return r;
}

TEST(ChooseRemedyTest, FragmentationSuggestsBothSettings) {
  OomReport r = Fragmented();
  ChooseRemedy(&r, kNoLimit, /*expandable_segments=*/false);
  EXPECT_EQ(r.cause, OomCause::kFragmentation);
  EXPECT_CONTAINS(r.remedy, "2.75 GiB is free in cached blocks, but the largest is 256.0 MiB");
  EXPECT_CONTAINS(r.remedy, "expandable_segments:true");
  EXPECT_CONTAINS(r.remedy, "max_split_size_mb:1024");
  EXPECT_CONTAINS(r.remedy, "DEVMEM_CONF=expandable_segments:true,max_split_size_mb:1024");
}

TEST(ChooseRemedyTest, FragmentationSkipsSettingsAlreadyOn) {
  OomReport r = Fragmented();
  ChooseRemedy(&r, kNoLimit, /*expandable_segments=*/true);
  EXPECT_EQ(r.cause, OomCause::kFragmentation);
  EXPECT_NOT_CONTAINS(r.remedy, "expandable_segments:true");
  EXPECT_CONTAINS(r.remedy, "max_split_size_mb:1024");

  // A max_split_size above the suggestion is lowered to it...
  ChooseRemedy(&r, 4096 * kMiB, /*expandable_segments=*/true);
  EXPECT_CONTAINS(r.remedy, "max_split_size_mb:1024");
  // ...one at or below it is left alone.
  ChooseRemedy(&r, 512 * kMiB, /*expandable_segments=*/false);
  EXPECT_CONTAINS(r.remedy, "expandable_segments:true");
  EXPECT_NOT_CONTAINS(r.remedy, "max_split_size_mb");

  ChooseRemedy(&r, 512 * kMiB, /*expandable_segments=*/true);
  EXPECT_EQ(r.cause, OomCause::kFragmentation);
  EXPECT_CONTAINS(r.remedy, "expandable_segments are in use and max_split_size_mb is set");
  EXPECT_NOT_CONTAINS(r.remedy, "DEVMEM_CONF=");
}

TEST(ChooseRemedyTest, FragmentationDoesNotSuggestExpandableSegmentsWithoutVirtualMemory) {
  OomReport r = Fragmented();
  ChooseRemedy(&r, kNoLimit, /*expandable_segments=*/false, /*virtual_memory=*/false);
  EXPECT_EQ(r.cause, OomCause::kFragmentation);
  EXPECT_NOT_CONTAINS(r.remedy, "expandable_segments:true");
  EXPECT_CONTAINS(r.remedy, "DEVMEM_CONF=max_split_size_mb:1024");

  ChooseRemedy(&r, 512 * kMiB, /*expandable_segments=*/false, /*virtual_memory=*/false);
  EXPECT_CONTAINS(r.remedy, "this backend has no virtual memory for expandable_segments");
  EXPECT_NOT_CONTAINS(r.remedy, "DEVMEM_CONF=");
}

TEST(ChooseRemedyTest, MaxSplitSuggestionIsAPowerOfTwoOfAtLeast20) {
  struct Case {
    size_t rounded;
    std::string expected;
  };
  for (const Case& tc : {Case{3 * kMiB, "max_split_size_mb:20"},
                         Case{20 * kMiB, "max_split_size_mb:32"},
                         Case{100 * kMiB, "max_split_size_mb:128"},
                         Case{kGiB, "max_split_size_mb:1024"},
                         Case{kGiB + 512, "max_split_size_mb:2048"}}) {
    OomReport r = Base();
    r.requested_bytes = r.rounded_bytes = tc.rounded;
    r.allocated = 4 * kGiB;
    r.reserved_unallocated = 4 * kGiB;
    r.largest_free_block = tc.rounded - 512;
    r.fragmentation = 0.9;
    ChooseRemedy(&r, kNoLimit, true);
    EXPECT_EQ(r.cause, OomCause::kFragmentation) << tc.rounded;
    EXPECT_CONTAINS(r.remedy, tc.expected) << tc.rounded;
  }
}

TEST(ChooseRemedyTest, FragmentationWhenScatteredFreeAndDriverRoomWouldFit) {
  // Not enough free in the cache alone, but the free bytes are mostly scattered, and
  // with what the driver still has they would have held the request.
  OomReport r = Base();
  r.allocated = 6 * kGiB;
  r.reserved = 6 * kGiB + 700 * kMiB;
  r.reserved_unallocated = 700 * kMiB;
  r.largest_free_block = 100 * kMiB;
  r.fragmentation = 1.0 - 100.0 / 700.0;
  r.driver_free = 400 * kMiB;
  ChooseRemedy(&r, kNoLimit, false);
  EXPECT_EQ(r.cause, OomCause::kFragmentation);

  // The same bytes in few large pieces: real use.
  r.largest_free_block = 500 * kMiB;
  r.fragmentation = 1.0 - 500.0 / 700.0;
  ChooseRemedy(&r, kNoLimit, false);
  EXPECT_EQ(r.cause, OomCause::kRealUse);

  // Scattered, but far too little to matter: real use.
  r.reserved_unallocated = 70 * kMiB;
  r.largest_free_block = 10 * kMiB;
  r.fragmentation = 1.0 - 10.0 / 70.0;
  ChooseRemedy(&r, kNoLimit, false);
  EXPECT_EQ(r.cause, OomCause::kRealUse);
}

TEST(ChooseRemedyTest, RealUseNamesTheHoldersAndTheCopies) {
  SiteId model = InternNamedSite("oom_test/model.cc", 10, "Build", SiteKind::kAlloc);
  SiteId clones =
      InternNamedSite("oom_test/train.cc", 42, "Step", SiteKind::kClone, "optimizer");
  SiteId small = InternNamedSite("oom_test/misc.cc", 7, "Misc", SiteKind::kAlloc);
  OomReport r = Base();
  r.allocated = 7 * kGiB;
  r.top_sites = {{model, 4 * kGiB, 2}, {clones, 2 * kGiB, 16}, {small, kGiB, 100}};
  r.copy_bytes = 2 * kGiB;
  ChooseRemedy(&r, kNoLimit, false);
  EXPECT_EQ(r.cause, OomCause::kRealUse);
  EXPECT_CONTAINS(r.remedy, "Live buffers use 7.00 GiB of 8.00 GiB");
  EXPECT_CONTAINS(r.remedy, "oom_test/model.cc:10 (alloc) holds 4.00 GiB (57.1%) in 2 buffers");
  EXPECT_CONTAINS(r.remedy,
                  "optimizer @ oom_test/train.cc:42 (clone) holds 2.00 GiB (28.6%) in 16 "
                  "buffers");
  EXPECT_NOT_CONTAINS(r.remedy, "oom_test/misc.cc");  // only the two largest
  EXPECT_CONTAINS(r.remedy, "2.00 GiB (28.6%) was created by clone/contiguous/to");
}

TEST(ChooseRemedyTest, RealUseWithoutSitesOrCopies) {
  OomReport r = Base();
  ChooseRemedy(&r, kNoLimit, false);
  EXPECT_EQ(r.cause, OomCause::kRealUse);
  EXPECT_CONTAINS(r.remedy, "Live buffers use 8.00 GiB of 8.00 GiB");
  EXPECT_NOT_CONTAINS(r.remedy, "Largest holders");
  EXPECT_NOT_CONTAINS(r.remedy, "clone/contiguous/to");
}

TEST(ChooseRemedyTest, ZeroMemoryLimitMeansTheDevice) {
  OomReport r = Base();
  r.memory_limit = 0;
  ChooseRemedy(&r, kNoLimit, false);
  EXPECT_EQ(r.cause, OomCause::kRealUse);
}

OomReport Example() {
  OomReport r;
  r.device = DeviceId{DeviceType::kSim, 0};
  r.stream = Stream{3};
  r.site = InternNamedSite("oom_test/step.cc", 99, "Step", SiteKind::kAlloc);
  r.requested_bytes = 2 * kGiB - 100;
  r.rounded_bytes = 2 * kGiB;
  r.segment_bytes = 2 * kGiB;
  r.device_total = 8 * kGiB;
  r.memory_limit = 8 * kGiB;
  r.driver_free = 3 * kGiB / 2;
  r.allocated = 6 * kGiB;
  r.reserved = 6 * kGiB + 512 * kMiB;
  r.reserved_unallocated = 512 * kMiB;
  r.largest_free_block = 320 * kMiB;
  r.free_blocks = 3;
  r.fragmentation = 1.0 - 320.0 / 512.0;
  r.segment_count = 12;
  r.top_sites = {
      {InternNamedSite("oom_test/model.cc", 10, "Build", SiteKind::kAlloc), 4 * kGiB, 2},
      {InternNamedSite("oom_test/train.cc", 42, "Step", SiteKind::kClone, "optimizer"),
       3 * kGiB / 2, 16}};
  r.copy_bytes = 3 * kGiB / 2;
  ChooseRemedy(&r, kNoLimit, false);
  return r;
}

TEST(OomReportTest, ToStringCarriesTheKeyFigures) {
  OomReport r = Example();
  ASSERT_EQ(r.cause, OomCause::kRealUse);
  std::string text = r.ToString();
  const std::string first_line = text.substr(0, text.find('\n'));
  EXPECT_EQ(first_line,
            "devmem: out of memory on sim:0: tried to allocate 2.00 GiB (rounded 2.00 GiB); "
            "device total 8.00 GiB, driver free 1.50 GiB; 6.00 GiB allocated by devmem, "
            "512.0 MiB reserved but unallocated.");
  EXPECT_CONTAINS(text, "requested by: oom_test/step.cc:99 (alloc) on stream 3");
  EXPECT_CONTAINS(text, "reserved: 6.50 GiB in 12 segments");
  EXPECT_CONTAINS(text, "largest free block: 320.0 MiB of 512.0 MiB free in 3 cached blocks");
  EXPECT_CONTAINS(text, "fragmentation 37.5%");
  EXPECT_CONTAINS(text, "1. oom_test/model.cc:10 (alloc): 4.00 GiB in 2 buffers (66.7%)");
  EXPECT_CONTAINS(text,
                  "2. optimizer @ oom_test/train.cc:42 (clone): 1.50 GiB in 16 buffers "
                  "(25.0%)");
  EXPECT_CONTAINS(text, "created by clone/contiguous/to: 1.50 GiB (25.0% of allocated)");
  EXPECT_CONTAINS(text, "cause: real_use");
  EXPECT_CONTAINS(text, "remedy: " + r.remedy);
  EXPECT_NOT_CONTAINS(text, "memory limit:");  // no cap below the device
}

TEST(OomReportTest, ToStringShowsAMemoryLimit) {
  OomReport r = Example();
  r.memory_limit = 6 * kGiB;
  EXPECT_CONTAINS(r.ToString(), "memory limit: 6.00 GiB (75.0% of the device");
}

TEST(OutOfMemoryErrorTest, IsABadAllocCarryingTheReport) {
  OomReport r = Example();
  try {
    throw OutOfMemoryError(r);
  } catch (const std::bad_alloc& e) {
    EXPECT_EQ(std::string(e.what()), r.ToString());
    const auto* oom = dynamic_cast<const OutOfMemoryError*>(&e);
    ASSERT_NE(oom, nullptr);
    EXPECT_EQ(oom->report().rounded_bytes, r.rounded_bytes);
    EXPECT_EQ(oom->report().remedy, r.remedy);
    EXPECT_EQ(oom->report().cause, OomCause::kRealUse);
  }
}

}  // namespace
}  // namespace devmem
