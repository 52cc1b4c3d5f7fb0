// tests/caching_allocator_errors_test.cc: what CachingAllocator does with bad input.
//
// allocator/errors.h: everything the caller got wrong (an unknown, interior or already
// freed pointer; a size that overflows) is an InvalidArgumentError whose message names
// the pointer or size and the device, and state is unchanged when one is thrown. Each
// case below checks the exception type, the message, stats() before == after, the
// snapshot before == after, and validate().
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <chrono>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/caching_allocator.h"
#include "allocator/errors.h"
#include "allocator/observer.h"
#include "allocator/oom_report.h"
#include "allocator/snapshot.h"
#include "tests/test_util.h"
#include "tests/text_assertions.h"

namespace devmem {
namespace {

using testutil::MakeSimAllocator;
using testutil::MentionsPointer;
using testutil::MentionsSize;
using testutil::NewStream;
using testutil::SimAllocator;
using testutil::StatsEqual;
using testutil::StreamBlocker;

constexpr size_t kMax = std::numeric_limits<size_t>::max();

char* Ptr(void* p) { return static_cast<char*>(p); }

// Segment and block layout, for comparing snapshots.
std::string Layout(const AllocatorSnapshot& snap) {
  std::string out;
  for (const SegmentInfo& s : snap.segments) {
    absl::StrAppend(&out, "seg 0x", absl::Hex(s.addr), "+", s.size, ":");
    for (const BlockInfo& b : s.blocks) {
      absl::StrAppend(&out, " [0x", absl::Hex(b.addr), " ", b.size, " ",
                      std::string(BlockStateName(b.state)), " req=", b.requested, "]");
    }
    out += "\n";
  }
  return out;
}

// Runs `bad`, which must throw InvalidArgumentError, and checks that nothing changed.
// Returns the message.
std::string ExpectInvalidArgument(SimAllocator& t, const std::function<void()>& bad) {
  DeviceStats before = t->stats();
  std::string layout_before = Layout(t->snapshot());
  std::vector<SiteStats> sites_before = t->site_stats();
  std::string message;
  try {
    bad();
    ADD_FAILURE() << "no exception was thrown";
  } catch (const InvalidArgumentError& e) {
    message = e.what();
  } catch (const OutOfMemoryError& e) {
    ADD_FAILURE() << "OutOfMemoryError instead of InvalidArgumentError: " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception " << typeid(e).name() << ": " << e.what();
  } catch (...) {
    ADD_FAILURE() << "unexpected non-std exception";
  }
  EXPECT_TRUE(StatsEqual(before, t->stats()));
  EXPECT_EQ(layout_before, Layout(t->snapshot()));
  std::vector<SiteStats> sites_after = t->site_stats();
  size_t n = std::max(sites_before.size(), sites_after.size());
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(testutil::SiteStatsFor(sites_before, static_cast<SiteId>(i)),
              testutil::SiteStatsFor(sites_after, static_cast<SiteId>(i)))
        << "site " << i << " changed";
  }
  EXPECT_VALID(*t);
  // The message names the device too.
  EXPECT_NE(message.find(t->device().ToString()), std::string::npos)
      << "message does not name the device: " << message;
  return message;
}

TEST(CachingAllocatorErrorsTest, FreeOfUnknownPointer) {
  SimAllocator t = MakeSimAllocator();
  void* keep = t->allocate(4096);
  int local = 0;
  void* candidates[] = {&local, reinterpret_cast<void*>(uintptr_t{0x1000}),
                        reinterpret_cast<void*>(uintptr_t{0xdead0000})};
  for (void* bad : candidates) {
    SCOPED_TRACE(bad);
    std::string msg = ExpectInvalidArgument(t, [&] { t->free(bad); });
    EXPECT_TRUE(MentionsPointer(msg, bad)) << msg;
  }
  // A pointer from another allocator.
  SimAllocator other = MakeSimAllocator();
  void* foreign = other->allocate(4096);
  if (t->find_allocation(foreign).has_value()) {
    GTEST_SKIP() << "the two sim devices share addresses";
  }
  std::string msg = ExpectInvalidArgument(t, [&] { t->free(foreign); });
  EXPECT_TRUE(MentionsPointer(msg, foreign)) << msg;
  EXPECT_TRUE(other->find_allocation(foreign).has_value());
  other->free(foreign);
  t->free(keep);
  EXPECT_VALID(*t);
}

// The pool's messages (thread-cached double frees: thread_cache_test.cc).
TEST(CachingAllocatorErrorsTest, DoubleFree) {
  SimAllocator t = MakeSimAllocator("thread_cache:false");
  void* p = t->allocate(4096);
  void* q = t->allocate(4096);  // keeps the segment split
  t->free(p);
  std::string msg = ExpectInvalidArgument(t, [&] { t->free(p); });
  EXPECT_TRUE(MentionsPointer(msg, p)) << msg;
  // Large pool too, and after coalescing into the rest of the segment.
  void* big = t->allocate(5 * kMiB);
  t->free(big);
  msg = ExpectInvalidArgument(t, [&] { t->free(big); });
  EXPECT_TRUE(MentionsPointer(msg, big)) << msg;
  // The allocator still works, and p's block is handed out once only.
  void* r = t->allocate(4096);
  void* s = t->allocate(4096);
  EXPECT_NE(r, s);
  for (void* x : {q, r, s}) t->free(x);
  EXPECT_VALID(*t);
}

TEST(CachingAllocatorErrorsTest, FreeOfInteriorPointer) {
  SimAllocator t = MakeSimAllocator();
  void* p = t->allocate(8192);
  void* big = t->allocate(4 * kMiB);
  for (void* bad : {static_cast<void*>(Ptr(p) + 1), static_cast<void*>(Ptr(p) + 512),
                    static_cast<void*>(Ptr(p) + 8191), static_cast<void*>(Ptr(big) + kMiB)}) {
    SCOPED_TRACE(bad);
    std::string msg = ExpectInvalidArgument(t, [&] { t->free(bad); });
    EXPECT_TRUE(MentionsPointer(msg, bad)) << msg;
  }
  EXPECT_TRUE(t->find_allocation(p).has_value()) << "the block must still be allocated";
  EXPECT_TRUE(t->find_allocation(big).has_value());
  // A pointer into the free rest of a segment (a free block, or inside one).
  void* in_rest = Ptr(p) + 8192;
  std::string msg = ExpectInvalidArgument(t, [&] { t->free(in_rest); });
  EXPECT_TRUE(MentionsPointer(msg, in_rest)) << msg;
  void* deep_in_rest = Ptr(p) + kMiB;
  msg = ExpectInvalidArgument(t, [&] { t->free(deep_in_rest); });
  EXPECT_TRUE(MentionsPointer(msg, deep_in_rest)) << msg;
  t->free(p);
  t->free(big);
  EXPECT_VALID(*t);
}

// A pointer one past the end of a live block is named as such (with the block it ends),
// not reported as a plain double free; at the end of a segment too, where no block
// starts at it.
TEST(CachingAllocatorErrorsTest, FreeOfPointerOnePastTheEnd) {
  SimAllocator t = MakeSimAllocator("expandable_segments:false,thread_cache:false");
  void* p = t->allocate(8192);  // the rest of its 2 MiB segment stays free
  void* end = Ptr(p) + 8192;
  std::string msg = ExpectInvalidArgument(t, [&] { t->free(end); });
  EXPECT_TRUE(MentionsPointer(msg, end)) << msg;
  EXPECT_TRUE(MentionsPointer(msg, p)) << msg;
  EXPECT_CONTAINS(msg, "one past the end of the allocated block");
  EXPECT_CONTAINS(msg, "8192 bytes");
  void* whole = t->allocate(20 * kMiB);  // exactly one large segment, one block
  void* whole_end = Ptr(whole) + 20 * kMiB;
  msg = ExpectInvalidArgument(t, [&] { t->free(whole_end); });
  EXPECT_TRUE(MentionsPointer(msg, whole)) << msg;
  EXPECT_CONTAINS(msg, "one past the end of the allocated block");
  // A true double free with no live block before it still says so.
  void* q = t->allocate(8192);
  void* r = t->allocate(8192);
  t->free(p);
  msg = ExpectInvalidArgument(t, [&] { t->free(p); });
  EXPECT_CONTAINS(msg, "double free");
  EXPECT_EQ(msg.find("one past the end"), std::string::npos) << msg;
  for (void* x : {whole, q, r}) t->free(x);
  EXPECT_VALID(*t);
}

// The rule of allocator/backend.h: a stream callback that calls the allocator gets an
// InvalidArgumentError, and never waits for the device lock. The lock is held here by
// empty_cache(), which is synchronizing the very stream the callback runs on: an
// observer releases the stream (so the callback runs) when release_segment emits its
// segment_free event under the lock, just before it synchronizes. A callback that
// waited for the lock would deadlock with it.
TEST(CachingAllocatorErrorsTest, StreamCallbackCallingTheAllocatorGetsAnErrorNotAHang) {
  SimAllocator t = MakeSimAllocator("expandable_segments:false");
  const Stream s = NewStream(*t);
  t->free(t->allocate(4096, s));  // a cached segment on s, for empty_cache to release
  auto blocker = std::make_unique<StreamBlocker>(t->backend(), s);
  std::promise<std::string> seen;
  std::future<std::string> message = seen.get_future();
  ASSERT_TRUE(t->backend()
                  .launch_host_fn(s,
                                  [&] {
                                    std::string what = "no exception";
                                    try {
                                      t->free(t->allocate(4096));
                                    } catch (const InvalidArgumentError& e) {
                                      what = e.what();
                                    }
                                    try {
                                      (void)t->stats();
                                    } catch (const InvalidArgumentError&) {
                                      what += " | stats refused";
                                    }
                                    seen.set_value(what);
                                  })
                  .ok());
  struct ReleaseOnSegmentFree : AllocatorObserver {
    StreamBlocker* blocker;
    void on_event(const AllocEvent& e) override {
      if (e.action == AllocAction::kSegmentFree) blocker->Release();
    }
  } observer;
  observer.blocker = blocker.get();
  t->set_observer(&observer);
  t->empty_cache();  // holds the lock while s runs the callback
  t->set_observer(nullptr);
  ASSERT_EQ(message.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  const std::string what = message.get();
  EXPECT_CONTAINS(what, "allocate on sim:0 from a stream callback");
  EXPECT_CONTAINS(what, "stats refused");
  // Outside a callback the same calls work.
  void* p = t->allocate(4096);
  EXPECT_EQ(t->stats().allocation[kAggregatePool].current, 1);
  t->free(p);
  EXPECT_VALID(*t);
}

TEST(CachingAllocatorErrorsTest, FreeOfPendingBlock) {
  SimAllocator t = MakeSimAllocator();
  Stream B = NewStream(*t);
  auto blocker = std::make_unique<StreamBlocker>(t->backend(), B);
  void* p = t->allocate(4096);
  t->record_stream(p, B);
  t->free(p);  // pending on B
  std::string msg = ExpectInvalidArgument(t, [&] { t->free(p); });
  EXPECT_TRUE(MentionsPointer(msg, p)) << msg;
  msg = ExpectInvalidArgument(t, [&] { t->record_stream(p, B); });
  EXPECT_TRUE(MentionsPointer(msg, p)) << msg;
  blocker->Release();
  t->backend().synchronize_stream(B);
  t->process_events();
  EXPECT_EQ(t->stats().pending_bytes[kAggregatePool].current, 0);
  EXPECT_VALID(*t);
}

TEST(CachingAllocatorErrorsTest, RecordStreamOnBadPointers) {
  SimAllocator t = MakeSimAllocator("thread_cache:false");
  Stream B = NewStream(*t);
  void* p = t->allocate(4096);
  void* q = t->allocate(4096);
  t->free(p);
  std::string msg = ExpectInvalidArgument(t, [&] { t->record_stream(p, B); });
  EXPECT_TRUE(MentionsPointer(msg, p)) << msg;
  void* interior = Ptr(q) + 512;
  msg = ExpectInvalidArgument(t, [&] { t->record_stream(interior, B); });
  EXPECT_TRUE(MentionsPointer(msg, interior)) << msg;
  int local = 0;
  msg = ExpectInvalidArgument(t, [&] { t->record_stream(&local, B); });
  EXPECT_TRUE(MentionsPointer(msg, &local)) << msg;
  // The failed record_stream on the interior pointer did not attach B to q: q's free
  // is immediate.
  t->free(q);
  EXPECT_EQ(t->stats().pending_bytes[kAggregatePool].current, 0);
  EXPECT_VALID(*t);
}

TEST(CachingAllocatorErrorsTest, SizesThatOverflowWhenRounded) {
  SimAllocator t = MakeSimAllocator("sim_capacity:64MiB");
  void* keep = t->allocate(1000);
  for (size_t n : {kMax, kMax - 100, kMax - 511}) {
    SCOPED_TRACE(n);
    std::string msg = ExpectInvalidArgument(t, [&] { t->allocate(n); });
    EXPECT_TRUE(MentionsSize(msg, n)) << msg;
  }
  for (Stream s : {Stream{}, NewStream(*t)}) {
    std::string msg = ExpectInvalidArgument(t, [&] { t->allocate(kMax, s); });
    EXPECT_TRUE(MentionsSize(msg, kMax)) << msg;
  }
  EXPECT_TRUE(t->find_allocation(keep).has_value());
  t->free(keep);
  EXPECT_VALID(*t);
}

// Sizes whose 512-byte rounding fits but whose segment size (rounded to 2 MiB) would
// not. ASSUMPTION: either error type is acceptable here (the header names overflow of
// the rounding as InvalidArgumentError; a segment that large is also simply more than
// any device has), but never a wrapped-around small segment or a crash, and nothing
// may change except the OOM counter.
TEST(CachingAllocatorErrorsTest, SizesThatOverflowOnlyAtSegmentRounding) {
  SimAllocator t = MakeSimAllocator("sim_capacity:64MiB");
  void* keep = t->allocate(1000);
  for (size_t n : {kMax - 512, kMax - 1023, kMax - kMiB, kMax - 2 * kMiB + 1,
                   kMax - 20 * kMiB, kMax / 2 + 1}) {
    SCOPED_TRACE(n);
    DeviceStats before = t->stats();
    bool threw = false;
    try {
      void* p = t->allocate(n);
      ADD_FAILURE() << "allocate(" << n << ") returned " << p;
    } catch (const InvalidArgumentError& e) {
      threw = true;
      EXPECT_TRUE(MentionsSize(e.what(), n)) << e.what();
    } catch (const OutOfMemoryError& e) {
      threw = true;
      EXPECT_EQ(e.report().requested_bytes, n);
      EXPECT_GE(e.report().rounded_bytes, n) << "the rounded size wrapped around";
      EXPECT_GE(e.report().segment_bytes, n) << "the segment size wrapped around";
      EXPECT_EQ(e.report().cause, OomCause::kTooLarge);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "unexpected " << typeid(e).name() << ": " << e.what();
    }
    EXPECT_TRUE(threw);
    DeviceStats after = t->stats();
    // An OOM counts itself (and its retry); nothing else may change (nothing is cached,
    // so the staged retry has nothing to release).
    after.num_ooms = before.num_ooms;
    after.num_alloc_retries = before.num_alloc_retries;
    after.num_sync_all_streams = before.num_sync_all_streams;
    after.cache_misses = before.cache_misses;
    EXPECT_TRUE(StatsEqual(before, after));
    EXPECT_LE(t.sim->used_bytes(), 64 * kMiB);
    EXPECT_VALID(*t);
  }
  t->free(keep);
  EXPECT_VALID(*t);
}

TEST(CachingAllocatorErrorsTest, ErrorsAreNotOutOfMemory) {
  static_assert(std::is_base_of_v<std::invalid_argument, InvalidArgumentError>);
  static_assert(!std::is_base_of_v<std::bad_alloc, InvalidArgumentError>);
  SimAllocator t = MakeSimAllocator();
  int local = 0;
  EXPECT_THROW(t->free(&local), std::invalid_argument);
  EXPECT_THROW(t->allocate(kMax), std::invalid_argument);
  EXPECT_EQ(t->stats().num_ooms, 0);
}

// Bad calls racing with good ones from another thread leave the allocator consistent.
TEST(CachingAllocatorErrorsTest, BadFreesConcurrentWithGoodTraffic) {
  SimAllocator t = MakeSimAllocator();
  std::atomic<bool> stop{false};
  std::atomic<int> unexpected{0};
  std::thread good([&] {
    std::vector<void*> live;
    for (int i = 0; i < 20000 && !stop; ++i) {
      live.push_back(t->allocate(512 + (i % 37) * 512));
      if (live.size() > 16) {
        t->free(live.front());
        live.erase(live.begin());
      }
    }
    for (void* p : live) t->free(p);
  });
  int local = 0;
  int thrown = 0;
  for (int i = 0; i < 5000; ++i) {
    try {
      t->free(&local);
    } catch (const InvalidArgumentError&) {
      ++thrown;
    } catch (...) {
      ++unexpected;
    }
  }
  stop = true;
  good.join();
  EXPECT_EQ(thrown, 5000);
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_EQ(t->stats().allocated_bytes[kAggregatePool].current, 0);
  EXPECT_VALID(*t);
}

}  // namespace
}  // namespace devmem
