// tests/runtime_trace_test.cc: the event ring (runtime/trace.h): wrap-around and
// since(N) semantics, what real allocator events carry, concurrent writers against a
// reader (no torn events), and the trace JSON Lines round trip (runtime/json.h).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <condition_variable>
#include <fstream>
#include <latch>
#include <memory>
#include <mutex>
#include <source_location>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/snapshot.h"
#include "runtime/json.h"
#include "runtime/trace.h"
#include "runtime/trace_clock.h"
#include "runtime/trace_testing.h"
#include "tools/timeline/timeline.h"

namespace devmem {
namespace {

AllocEvent Synthetic(uint64_t x) {
  AllocEvent e;
  e.action = AllocAction::kAlloc;
  e.device = DeviceId{DeviceType::kSim, 3};
  e.stream = Stream{x % 4};
  e.addr = x;
  e.size = x * 3;
  e.requested = x * 5;
  e.site = static_cast<SiteId>(x % 7);
  return e;
}

std::vector<uint64_t> Seqs(const std::vector<TraceEvent>& events) {
  std::vector<uint64_t> out;
  for (const TraceEvent& e : events) out.push_back(e.seq);
  return out;
}

TEST(TraceRingTest, WrapAroundKeepsTheNewestAndCountsTheMissed) {
  TraceRing ring(8);
  EXPECT_EQ(ring.capacity(), 8u);
  EXPECT_EQ(ring.next_seq(), 1u);
  for (uint64_t i = 1; i <= 20; ++i) ring.on_event(Synthetic(i));
  EXPECT_EQ(ring.next_seq(), 21u);

  uint64_t missed = 99;
  std::vector<TraceEvent> all = ring.since(0, SIZE_MAX, &missed);
  EXPECT_EQ(Seqs(all), (std::vector<uint64_t>{13, 14, 15, 16, 17, 18, 19, 20}));
  EXPECT_EQ(missed, 12u);
  for (const TraceEvent& e : all) {  // each event is the one recorded with that number
    EXPECT_EQ(e.addr, e.seq);
    EXPECT_EQ(e.size, e.seq * 3);
    EXPECT_EQ(e.requested, e.seq * 5);
    EXPECT_EQ(e.device, (DeviceId{DeviceType::kSim, 3}));
  }

  EXPECT_EQ(Seqs(ring.since(15, SIZE_MAX, &missed)), (std::vector<uint64_t>{16, 17, 18, 19, 20}));
  EXPECT_EQ(missed, 0u);
  EXPECT_EQ(Seqs(ring.since(10, SIZE_MAX, &missed)).front(), 13u);
  EXPECT_EQ(missed, 2u);  // 11 and 12 were overwritten
  EXPECT_TRUE(ring.since(20, SIZE_MAX, &missed).empty());
  EXPECT_EQ(missed, 0u);
  EXPECT_TRUE(ring.since(1000, SIZE_MAX, &missed).empty());
  EXPECT_EQ(Seqs(ring.since(0, 3, &missed)), (std::vector<uint64_t>{13, 14, 15}));
  EXPECT_EQ(missed, 12u);
}

TEST(TraceRingTest, CapacityThatIsNotAPowerOfTwo) {
  TraceRing ring(5);
  for (uint64_t i = 1; i <= 12; ++i) ring.on_event(Synthetic(i));
  uint64_t missed = 0;
  std::vector<TraceEvent> events = ring.since(0, SIZE_MAX, &missed);
  EXPECT_EQ(Seqs(events), (std::vector<uint64_t>{8, 9, 10, 11, 12}));
  EXPECT_EQ(missed, 7u);
  for (const TraceEvent& e : events) EXPECT_EQ(e.addr, e.seq);
}

TEST(TraceRingTest, ZeroCapacityIsRefused) {
  EXPECT_THROW(TraceRing ring(0), std::invalid_argument);
}

// A capacity whose chunk count would not fit the ring's 32-bit count is refused with
// the value in the message (it used to wrap: 2^60 events made a ring of one chunk that
// still reported a capacity of 2^60).
TEST(TraceRingTest, ACapacityOverTheMostIsRefusedByName) {
  try {
    TraceRing ring(size_t{1} << 60);
    FAIL() << "a ring of 2^60 events was made, with " << ring.ChunksForTesting() << " chunks";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("1152921504606846976"), std::string::npos) << e.what();
  }
  TraceRing largest_small(size_t{1} << 20);  // an ordinary large ring is still made
  EXPECT_EQ(largest_small.capacity(), size_t{1} << 20);
}

// What a reader gets back is exactly what was recorded, at the extremes of every field
// (the largest size and address, a 64-bit stream handle, site ids at the top of their
// 32 bits, the last device index a slot keeps: runtime/trace.h), through both writers:
// the cache-hit path (block_order only) and the locked one (pool_order given).
TEST(TraceRingTest, ExtremeFieldValuesReadBackExactly) {
  TraceRing ring(256);
  std::vector<AllocEvent> recorded;
  uint64_t block_order = 0, pool_order = 0;
  for (int a = 0; a < kNumAllocActions; ++a) {
    for (int locked = 0; locked < 2; ++locked) {
      AllocEvent e;
      e.action = static_cast<AllocAction>(a);
      e.device = a % 2 == 0 ? DeviceId{DeviceType::kCpuPinned, 0} : DeviceId{DeviceType::kCuda, 65535};
      e.stream = Stream{a % 3 == 0 ? UINTPTR_MAX : a % 3 == 1 ? uintptr_t{0} : UINTPTR_MAX - 1};
      e.addr = a % 2 == 0 ? UINTPTR_MAX : uintptr_t{1} << 63;
      e.size = a % 2 == 0 ? SIZE_MAX : SIZE_MAX - 511;
      e.requested = a % 2 == 0 ? SIZE_MAX - 1 : 0;
      e.site = a % 2 == 0 ? UINT32_MAX : UINT32_MAX - 1;
      e.block_order = &block_order;
      e.pool_order = locked != 0 ? &pool_order : nullptr;
      ring.on_event(e);
      recorded.push_back(e);
    }
  }
  uint64_t missed = 99;
  const std::vector<TraceEvent> events = ring.since(0, SIZE_MAX, &missed);
  EXPECT_EQ(missed, 0u);
  ASSERT_EQ(events.size(), recorded.size());
  for (size_t i = 0; i < events.size(); ++i) {
    SCOPED_TRACE(i);
    const TraceEvent& got = events[i];
    const AllocEvent& want = recorded[i];
    EXPECT_EQ(got.seq, i + 1);
    EXPECT_EQ(got.action, want.action);
    EXPECT_EQ(got.device, want.device);
    EXPECT_EQ(got.stream.handle, want.stream.handle);
    EXPECT_EQ(got.addr, want.addr);
    EXPECT_EQ(got.size, want.size);
    EXPECT_EQ(got.requested, want.requested);
    EXPECT_EQ(got.site, want.site);
    EXPECT_EQ(got.thread, TraceThreadNumber());
    if (i > 0) {
      EXPECT_GE(got.time_ns, events[i - 1].time_ns);
    }
  }
  // Every event stamped the block's order word, the locked ones the pool's too (the
  // last event was a locked one: both hold its stamp).
  EXPECT_EQ(block_order, pool_order);
  EXPECT_GT(pool_order, 0u);
}

TEST(TraceRingTest, AllocatorEventsCarrySiteThreadStreamAndSizes) {
  Config config;
  config.backend = BackendKind::kSim;
  config.sim_capacity = 64 * kMiB;
  config.expandable_segments = ExpandableMode::kOff;  // the events of regular segments
  CachingAllocator alloc(MakeSimBackend(config, 31), config);
  TraceRing ring(1024);
  alloc.set_observer(&ring);
  absl::StatusOr<Stream> stream = alloc.backend().create_stream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  const SiteId site = InternSite(std::source_location::current(), SiteKind::kClone, "trace-test");

  const int64_t before = NowNs();
  void* p = alloc.allocate(1000, *stream, site);
  alloc.free(p);
  uint32_t other_thread = 0;
  std::thread([&] {
    void* q = alloc.allocate(3000, *stream, site);
    alloc.free(q);
  }).join();
  EXPECT_THROW(alloc.allocate(128 * kMiB, *stream, site), OutOfMemoryError);
  const int64_t after = NowNs();
  alloc.set_observer(nullptr);

  std::vector<TraceEvent> events = ring.since(0);
  ASSERT_GE(events.size(), 6u);
  // segment_alloc, alloc, free, alloc (other thread), free, ..., oom
  EXPECT_EQ(events[0].action, AllocAction::kSegmentAlloc);
  EXPECT_EQ(events[0].size, 2 * kMiB);
  EXPECT_EQ(events[0].stream, *stream);
  const TraceEvent& a = events[1];
  EXPECT_EQ(a.action, AllocAction::kAlloc);
  EXPECT_EQ(a.addr, reinterpret_cast<uintptr_t>(p));
  EXPECT_EQ(a.size, 1024u);
  EXPECT_EQ(a.requested, 1000u);
  EXPECT_EQ(a.site, site);
  EXPECT_EQ(a.stream, *stream);
  EXPECT_EQ(a.device, (DeviceId{DeviceType::kSim, 31}));
  EXPECT_NE(a.thread, 0u);
  const TraceEvent& f = events[2];
  EXPECT_EQ(f.action, AllocAction::kFree);
  EXPECT_EQ(f.addr, a.addr);
  EXPECT_EQ(f.site, site);
  EXPECT_EQ(f.thread, a.thread);
  other_thread = events[3].thread;
  EXPECT_EQ(events[3].action, AllocAction::kAlloc);
  EXPECT_EQ(events[3].requested, 3000u);
  EXPECT_NE(other_thread, a.thread);
  EXPECT_EQ(events.back().action, AllocAction::kOom);
  EXPECT_EQ(events.back().requested, 128 * kMiB);
  EXPECT_EQ(events.back().site, site);
  // Times are in order and on the monotonic clock (within the conversion's error).
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq, i + 1);
    if (i > 0) {
      EXPECT_GE(events[i].time_ns, events[i - 1].time_ns);
    }
    EXPECT_GE(events[i].time_ns, before - 1'000'000);
    EXPECT_LE(events[i].time_ns, after + 1'000'000);
  }
}

// Two writers lap a small ring while a reader follows with since(): every event read is
// whole (its fields agree with each other), numbers only grow, and every number is
// either read or counted as missed.
TEST(TraceRingTest, ConcurrentWritersNeverTearAnEvent) {
  TraceRing ring(64);
  constexpr uint64_t kPerThread = 50000;
  std::atomic<int> running{2};
  auto writer = [&](uint64_t base) {
    for (uint64_t i = 1; i <= kPerThread; ++i) ring.on_event(Synthetic(base + i));
    running.fetch_sub(1);
  };
  std::thread w1(writer, 0), w2(writer, 1'000'000);
  uint64_t last = 0, read = 0, missed_total = 0;
  while (true) {
    const bool done = running.load() == 0;
    uint64_t missed = 0, next_after = 0;
    for (const TraceEvent& e : ring.since(last, 100, &missed, &next_after)) {
      ASSERT_GT(e.seq, last);
      ASSERT_EQ(e.size, e.addr * 3) << "torn event " << e.seq;
      ASSERT_EQ(e.requested, e.addr * 5) << "torn event " << e.seq;
      ASSERT_EQ(e.stream.handle, e.addr % 4);
      missed_total += e.seq - last - 1;
      last = e.seq;
      ++read;
    }
    // Lost events may hold the newest numbers (a lane's events lost after the last one
    // read): the follower pages on past them, and they count as missed once. (Paging
    // on from the last event read, this loop once never ended under TSan.)
    ASSERT_GE(next_after, last);
    missed_total += next_after - last;
    last = next_after;
    (void)missed;
    if (done && last + 1 == ring.next_seq()) break;
  }
  w1.join();
  w2.join();
  EXPECT_EQ(read + missed_total, 2 * kPerThread);
}

// Numbers of lost events may be the newest: a follower pages past them with
// next_after, counts them missed once, and reaches next_seq(). Paging on from its last
// event instead, it was told of the same lost events on every read and never caught
// up (memtrace timeline's reader then failed: X-Devmem-More 1 but no progress).
TEST(TraceRingTest, AFollowerPagesPastLostEventsThatAreTheNewest) {
  TraceRing ring(64);
  for (uint64_t i = 1; i <= 5; ++i) ring.on_event(Synthetic(i));
  ring.CountDroppedForTesting(3);  // lost after the lane's last event
  uint64_t missed = 0, next_after = 0;
  EXPECT_EQ(Seqs(ring.since(0, SIZE_MAX, &missed, &next_after)),
            (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(missed, 3u);
  EXPECT_EQ(next_after, 8u);
  EXPECT_EQ(ring.next_seq(), 9u);
  EXPECT_TRUE(ring.since(next_after, SIZE_MAX, &missed, &next_after).empty());
  EXPECT_EQ(missed, 0u);
  EXPECT_EQ(next_after, 8u);
  // A page that ends at its limit goes on from its last event: the lost numbers after
  // it are the next page's to count.
  EXPECT_EQ(Seqs(ring.since(0, 2, &missed, &next_after)), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(next_after, 2u);
  EXPECT_EQ(Seqs(ring.since(4, 1, &missed, &next_after)), (std::vector<uint64_t>{5}));
  EXPECT_EQ(missed, 0u);
  EXPECT_EQ(next_after, 5u);
  // Past the newest: the ring's newest number, so that a follower ahead resynchronises.
  EXPECT_TRUE(ring.since(1000, SIZE_MAX, &missed, &next_after).empty());
  EXPECT_EQ(next_after, 8u);
  ring.on_event(Synthetic(6));
  EXPECT_EQ(Seqs(ring.since(8, SIZE_MAX, &missed, &next_after)), (std::vector<uint64_t>{9}));
  EXPECT_EQ(missed, 0u);
  EXPECT_EQ(next_after, 9u);
}

// Per-thread lanes, read when every writer is done (quiescent): every event comes back
// numbered 1..N without a gap, in time order, each thread's events in its own order.
TEST(TraceRingTest, PerThreadLanesMergeByTimeWhenQuiescent) {
  constexpr int kThreads = 4;
  constexpr uint64_t kPerThread = 3000;
  TraceRing ring(size_t{1} << 15);
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (uint64_t i = 1; i <= kPerThread; ++i) ring.on_event(Synthetic(t * 1'000'000 + i));
    });
  }
  for (std::thread& t : threads) t.join();
  uint64_t missed = 1;
  const std::vector<TraceEvent> events = ring.since(0, SIZE_MAX, &missed);
  EXPECT_EQ(missed, 0u);
  ASSERT_EQ(events.size(), kThreads * kPerThread);
  std::vector<uint64_t> last(kThreads, 0);
  for (size_t i = 0; i < events.size(); ++i) {
    ASSERT_EQ(events[i].seq, i + 1);
    if (i > 0) {
      ASSERT_GE(events[i].time_ns, events[i - 1].time_ns) << "seq " << events[i].seq;
    }
    const uint64_t t = events[i].addr / 1'000'000, n = events[i].addr % 1'000'000;
    ASSERT_LT(t, uint64_t{kThreads});
    ASSERT_EQ(n, last[t] + 1) << "thread " << t << "'s events out of their order";
    last[t] = n;
  }
  EXPECT_EQ(ring.next_seq(), kThreads * kPerThread + 1);
}

// Events ordered by a lock and carrying its order word (as the device lock orders an
// allocator's events, AllocEvent::pool_order) are numbered in that order, although each
// thread writes its own lane.
TEST(TraceRingTest, EventsOrderedByALockAcrossThreadsKeepThatOrder) {
  TraceRing ring(4096);
  std::mutex mu;
  std::condition_variable cv;
  uint64_t turn = 1;  // the next event; odd ones are thread 0's, even ones thread 1's
  uint64_t lock_order = 0;
  constexpr uint64_t kEvents = 1000;
  auto player = [&](uint64_t parity) {
    for (;;) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return turn > kEvents || turn % 2 == parity; });
      if (turn > kEvents) return;
      AllocEvent e = Synthetic(turn);
      e.pool_order = &lock_order;  // guarded by mu, as the pool's by the device lock
      ring.on_event(e);
      ++turn;
      cv.notify_all();
    }
  };
  std::thread a(player, 1), b(player, 0);
  a.join();
  b.join();
  const std::vector<TraceEvent> events = ring.since(0);
  ASSERT_EQ(events.size(), kEvents);
  for (uint64_t i = 0; i < kEvents; ++i) {
    ASSERT_EQ(events[i].seq, i + 1);
    ASSERT_EQ(events[i].addr, i + 1) << "the lock's order is lost at seq " << i + 1;
  }
  EXPECT_NE(events[0].thread, events[1].thread);
}

// `threads` threads record `per_thread` events each (thread t's event i is Synthetic(t *
// 1000 + i)) and keep their lanes, and chunks, open while the ring is read once from the
// start: what that read returned, and *missed what it counted as missed.
std::vector<TraceEvent> ReadWhileAllThreadsHoldTheirLanes(TraceRing& ring, int threads,
                                                          uint64_t per_thread,
                                                          uint64_t* missed) {
  std::latch wrote(threads), done(1);
  std::vector<std::thread> writers;
  for (int t = 0; t < threads; ++t) {
    writers.emplace_back([&, t] {
      for (uint64_t i = 1; i <= per_thread; ++i) ring.on_event(Synthetic(t * 1000 + i));
      wrote.count_down();
      done.wait();  // every thread keeps its lane (and chunk) open until all wrote
    });
  }
  wrote.wait();
  std::vector<TraceEvent> events = ring.since(0, SIZE_MAX, missed);
  done.count_down();
  for (std::thread& t : writers) t.join();
  return events;
}

// More writing threads at once than the ring has chunks: those without a chunk drop
// their events, and every event is still either read or counted as missed.
TEST(TraceRingTest, ConcurrentThreadsBeyondTheChunksCountWhatTheyDrop) {
  TraceRing ring(8);  // 2 slots a chunk (a quarter of 8), 5 chunks
  constexpr int kThreads = 6;
  constexpr uint64_t kPerThread = 200;
  uint64_t missed = 0;
  const std::vector<TraceEvent> events =
      ReadWhileAllThreadsHoldTheirLanes(ring, kThreads, kPerThread, &missed);
  EXPECT_EQ(events.size() + missed, kThreads * kPerThread);
  EXPECT_EQ(ring.next_seq(), kThreads * kPerThread + 1);
  EXPECT_LE(events.size(), ring.capacity());
  for (const TraceEvent& e : events) EXPECT_EQ(e.size, e.addr * 3);
}

// Rings of 16,384 events or more have at least 256 chunks (trace.h, kChunkEvents:
// capacity / 256 events a chunk, up to 512), so 256 threads recording at once each hold
// one and none drops an event: at 2^14 (64 a chunk), 2^15 (128, where a quarter-capacity
// rule up to 512 would leave 65 chunks) and 2^17 (512, the default).
TEST(TraceRingTest, LargeRingsHaveAChunkForEachOf256ThreadsRecordingAtOnce) {
  for (const size_t capacity : {size_t{1} << 14, size_t{1} << 15, size_t{1} << 17}) {
    SCOPED_TRACE(capacity);
    TraceRing ring(capacity);
    constexpr int kThreads = 256;
    constexpr uint64_t kPerThread = 3;
    uint64_t missed = 99;
    const std::vector<TraceEvent> events =
        ReadWhileAllThreadsHoldTheirLanes(ring, kThreads, kPerThread, &missed);
    EXPECT_EQ(missed, 0u);
    EXPECT_EQ(events.size(), kThreads * kPerThread);
  }
}

// The slots' layout (trace.cc, "Layout"): each chunk starts a page and is followed by a
// page that nothing touches, even after two threads lapped the ring (one chunk's writer
// must never have a backed neighbour another lane writes: that cost two threads 1.2-1.9x
// per event beside each other with contiguous chunks). mincore() tells which pages have
// memory behind them: the chunks' pages do (made at construction), the gaps never.
TEST(TraceRingLayoutTest, EachChunkStartsAPageAndIsFollowedByAnUntouchedOne) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (const size_t capacity : {size_t{100}, size_t{4096}, size_t{1} << 17}) {
    SCOPED_TRACE(capacity);
    TraceRing ring(capacity);
    std::vector<std::thread> writers;
    for (int t = 0; t < 2; ++t) {
      writers.emplace_back([&ring, capacity, t] {
        for (uint64_t i = 0; i < 2 * capacity; ++i) ring.on_event(Synthetic(2 * i + t));
      });
    }
    for (std::thread& w : writers) w.join();
    const uint32_t chunks = ring.ChunksForTesting();
    const size_t chunk_bytes = size_t{ring.ChunkEventsForTesting()} * sizeof(TraceRing::Slot);
    const size_t chunk_pages = (chunk_bytes + page - 1) / page;
    for (uint32_t p = 0; p < chunks; ++p) {
      const auto first = reinterpret_cast<uintptr_t>(ring.ChunkSlotsForTesting(p));
      ASSERT_EQ(first % page, 0u) << "chunk " << p;
      if (p + 1 < chunks) {
        const auto next = reinterpret_cast<uintptr_t>(ring.ChunkSlotsForTesting(p + 1));
        ASSERT_GE(next, first + (chunk_pages + 1) * page) << "chunk " << p;
      }
      // The chunk's pages and the one after it: resident, resident, ..., not resident.
      std::vector<unsigned char> resident(chunk_pages + 1);
      ASSERT_EQ(mincore(reinterpret_cast<void*>(first), (chunk_pages + 1) * page,
                        resident.data()),
                0)
          << "chunk " << p << ": " << std::strerror(errno);
      for (size_t i = 0; i < chunk_pages; ++i) {
        EXPECT_TRUE(resident[i] & 1) << "chunk " << p << " page " << i;
      }
      EXPECT_FALSE(resident[chunk_pages] & 1) << "the gap after chunk " << p;
    }
  }
}

// The address space this process has mapped, in KiB (/proc/self/status, VmSize).
int64_t MappedKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoll(line.substr(7));
  }
  ADD_FAILURE() << "no VmSize in /proc/self/status";
  return 0;
}

// A construction that fails after the slots are mapped (registering for the threads'
// exits allocates, and may throw) unmaps them: eight failed rings of 2^17 events would
// otherwise keep 8 x 9.3 MiB of address space (and the chunks' pages, touched when made).
TEST(TraceRingLayoutTest, AConstructionThatFailsAfterMappingUnmapsTheSlots) {
  { TraceRing warm(size_t{1} << 17); }  // the registry's and the heap's first growth
  const int64_t before = MappedKiB();
  for (int i = 0; i < 8; ++i) {
    trace_internal::FailNextRingRegistrationForTesting();
    EXPECT_THROW(TraceRing ring(size_t{1} << 17), std::bad_alloc);
  }
  EXPECT_LT(MappedKiB() - before, 16 * 1024) << "KiB mapped by 8 failed constructions";
  TraceRing ring(size_t{1} << 17);  // the hook fails only the next construction
  ring.on_event(Synthetic(1));
  EXPECT_EQ(ring.since(0).size(), 1u);
}

// A thread that exits gives its lane back: a thousand short-lived threads, one after
// another, neither run out of chunks nor lose the newest events.
TEST(TraceRingTest, PerThreadLanesAreReusedAcrossThreadExits) {
  TraceRing ring(256);
  constexpr uint64_t kThreads = 1000, kPerThread = 5;
  for (uint64_t t = 0; t < kThreads; ++t) {
    std::thread([&] {
      for (uint64_t i = 1; i <= kPerThread; ++i) ring.on_event(Synthetic(t * kPerThread + i));
    }).join();
  }
  uint64_t missed = 0;
  const std::vector<TraceEvent> events = ring.since(0, SIZE_MAX, &missed);
  EXPECT_EQ(events.size() + missed, kThreads * kPerThread);
  ASSERT_EQ(events.size(), ring.capacity());  // the newest 256, none dropped
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].addr, kThreads * kPerThread - ring.capacity() + 1 + i);
  }
}

// A thread that exits parks its chunk, and a claim may recycle it: the ring keeps its
// capacity of the newest events however many threads exited and left their lanes to
// no one (each such lane kept a chunk out of the ring before).
TEST(TraceRingTest, AnExitedThreadsChunkIsRecycled) {
  TraceRing ring(256);  // 64 slots a chunk, 5 chunks
  constexpr int kExited = 3;
  constexpr uint64_t kParked = 10, kMain = 1000;
  std::latch all_have_lanes(kExited);
  std::vector<std::thread> threads;
  for (int t = 0; t < kExited; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 1; i <= kParked; ++i) ring.on_event(Synthetic(t * 100 + i));
      all_have_lanes.arrive_and_wait();  // three lanes, each with its chunk
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(ring.since(0).size(), kExited * kParked);  // read before any recycling
  // This thread takes one of the three lanes up; the other two stay parked.
  for (uint64_t i = 1; i <= kMain; ++i) ring.on_event(Synthetic(1000 + i));
  uint64_t missed = 0;
  const std::vector<TraceEvent> events = ring.since(kExited * kParked, SIZE_MAX, &missed);
  EXPECT_EQ(events.size() + missed, kMain);
  ASSERT_EQ(events.size(), ring.capacity()) << "the newest events held";
  for (size_t i = 0; i < events.size(); ++i) {
    ASSERT_EQ(events[i].addr, 1000 + kMain - ring.capacity() + 1 + i);
  }
}

// Unread events in a parked chunk that a claim recycles are counted as missed: every
// event is read or counted when quiescent.
TEST(TraceRingTest, UnreadEventsOfARecycledParkedChunkCountAsMissed) {
  TraceRing ring(256);
  constexpr uint64_t kParked = 10, kMain = 2000;
  ring.on_event(Synthetic(1));  // this thread's own lane first: the exited one's stays parked
  std::thread([&] {
    for (uint64_t i = 1; i <= kParked; ++i) ring.on_event(Synthetic(100 + i));
  }).join();
  for (uint64_t i = 1; i <= kMain; ++i) ring.on_event(Synthetic(1000 + i));
  uint64_t missed = 0;
  const std::vector<TraceEvent> events = ring.since(0, SIZE_MAX, &missed);
  EXPECT_EQ(events.size() + missed, 1 + kParked + kMain);
  EXPECT_EQ(ring.next_seq(), 1 + kParked + kMain + 1);
  ASSERT_EQ(events.size(), ring.capacity());
  EXPECT_EQ(events.back().addr, 1000 + kMain);
}

// Two threads record: one writes a little and stays (its lane held), the other laps the
// ring ten times. Each lane a thread holds keeps at least its share of the chunks (C /
// the lanes held: trace.h, "What the ring keeps"), so the quiet thread's events are all
// still read, beside the busy one's newest; one ring of the process's newest events
// had overwritten them. Once the quiet thread exits, its chunks go to the busy one.
TEST(TraceRingTest, AQuietThreadKeepsItsShareWhileABusyOneLapsTheRing) {
  TraceRing ring(1024);  // 64 slots a chunk, 17 chunks: a share of 8 for each of two lanes
  // The quiet lane: 3 chunks and 8 events of a 4th; the busy one's newest chunk holds 8
  // events too, so that what the chunks keep (976) fits the readers' copy (1024).
  constexpr uint64_t kQuiet = 200, kBusy = 10 * 1024 + 8, kQuietBase = 1'000'000;
  std::latch wrote(1), go_on(1);
  std::thread quiet([&] {
    for (uint64_t i = 1; i <= kQuiet; ++i) ring.on_event(Synthetic(kQuietBase + i));
    wrote.count_down();
    go_on.wait();  // holds its lane while the other writes
  });
  wrote.wait();
  for (uint64_t i = 1; i <= kBusy; ++i) ring.on_event(Synthetic(i));
  uint64_t missed = 0, next_after = 0;
  std::vector<TraceEvent> events = ring.since(0, SIZE_MAX, &missed, &next_after);
  EXPECT_EQ(events.size() + missed, kQuiet + kBusy);
  EXPECT_EQ(next_after, kQuiet + kBusy);
  std::vector<uint64_t> quiet_read, busy_read;
  for (const TraceEvent& e : events) {
    (e.addr > kQuietBase ? quiet_read : busy_read).push_back(e.addr);
    ASSERT_EQ(e.size, e.addr * 3);
  }
  ASSERT_EQ(quiet_read.size(), kQuiet) << "the quiet thread's events were overwritten";
  for (uint64_t i = 0; i < kQuiet; ++i) EXPECT_EQ(quiet_read[i], kQuietBase + 1 + i);
  // The busy one: its newest, contiguous, in the rest of the ring (13 chunks, the last
  // one with 8 events).
  ASSERT_EQ(busy_read.size(), 12 * 64 + 8u);
  for (size_t i = 0; i < busy_read.size(); ++i) {
    ASSERT_EQ(busy_read[i], kBusy - busy_read.size() + 1 + i);
  }
  // The quiet thread exits: its lane is parked and counts in no share, and the busy
  // lane takes its chunks (the oldest first) as it needs them.
  go_on.count_down();
  quiet.join();
  constexpr uint64_t kMore = 2048;
  for (uint64_t i = 1; i <= kMore; ++i) ring.on_event(Synthetic(kBusy + i));
  events = ring.since(next_after, SIZE_MAX, &missed, &next_after);
  EXPECT_EQ(events.size() + missed, kMore);
  ASSERT_EQ(events.size(), ring.capacity()) << "the busy lane holds every chunk now";
  EXPECT_EQ(events.back().addr, kBusy + kMore);
  // Every event, read or not, was counted once: the quiet lane's taken chunks were
  // read before they were taken.
  EXPECT_EQ(ring.next_seq(), kQuiet + kBusy + kMore + 1);
}

// A busy thread laps the ring alone, then a second thread records one event for every
// seven of the busy one's. The slow lane, below its share, takes the chunk closed first
// of its own and the busy lane's (trace.h, "What the ring keeps"), so the ring still
// holds about the newest events of the process: every one of the newest 3/4 of the
// capacity is read, of both threads. (A lane that only ever reused its own chunks
// kept the slow thread's newest chunk alone.) The events carry a lock's order word (as
// the device lock's events do), so that their stamps follow the order they were
// recorded in.
TEST(TraceRingTest, ThreadsWritingAtDifferentRatesKeepAboutTheNewestEventsOverall) {
  TraceRing ring(1024);  // 64 slots a chunk, 17 chunks: a share of 8 for each of two lanes
  constexpr uint64_t kAlone = 2048, kRounds = 1024, kFast = 7, kSlowTag = 1'000'000'000;
  std::mutex mu;
  std::condition_variable cv;
  int turn = 0;         // 0: the busy (this) thread's, 1: the slow one's, 2: the end
  uint64_t order = 0;   // the lock's order word
  uint64_t total = 0;   // events so far, both threads: the order they were recorded in
  auto record = [&](uint64_t tag) {  // under mu
    AllocEvent e = Synthetic(tag + ++total);
    e.pool_order = &order;
    ring.on_event(e);
  };
  {
    std::lock_guard<std::mutex> lock(mu);
    for (uint64_t i = 0; i < kAlone; ++i) record(0);
  }
  std::thread slow([&] {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return turn != 0; });
      if (turn == 2) return;
      record(kSlowTag);
      turn = 0;
      cv.notify_all();
    }
  });
  std::vector<bool> read;
  {
    std::unique_lock<std::mutex> lock(mu);
    for (uint64_t r = 0; r < kRounds; ++r) {
      turn = 1;
      cv.notify_all();
      cv.wait(lock, [&] { return turn == 0; });
      for (uint64_t i = 0; i < kFast; ++i) record(0);
    }
    read.assign(total + 1, false);
    uint64_t missed = 0;
    const std::vector<TraceEvent> events = ring.since(0, SIZE_MAX, &missed);
    EXPECT_EQ(events.size() + missed, total);
    for (const TraceEvent& e : events) read[e.addr % kSlowTag] = true;
    turn = 2;
    cv.notify_all();
  }
  slow.join();
  for (uint64_t n = total - ring.capacity() * 3 / 4 + 1; n <= total; ++n) {
    ASSERT_TRUE(read[n]) << "event " << n << " of " << total << " ("
                         << (n > kAlone && (n - kAlone) % (kFast + 1) == 1 ? "slow" : "busy")
                         << " thread) was not kept";
  }
}

// A thread that recorded into a ring destroyed before the thread exits: its exit gives
// the lane back to no one and touches nothing of the freed ring (an ASan build reports
// the use after free otherwise), nor a ring made since, perhaps at the same address,
// which still hands out and reads its own lanes (runtime/thread_lanes.h).
TEST(TraceRingTest, AThreadThatOutlivesItsRingLeavesItAlone) {
  auto ring = std::make_unique<TraceRing>(64);
  std::latch recorded(1), destroyed(1);
  std::thread t([&] {
    ring->on_event(Synthetic(1));
    recorded.count_down();
    destroyed.wait();
  });
  recorded.wait();
  ring.reset();
  ring = std::make_unique<TraceRing>(64);
  destroyed.count_down();
  t.join();
  for (uint64_t i = 0; i < 2; ++i) {  // two threads, one after the other: one lane reused
    std::thread([&] { ring->on_event(Synthetic(10 + i)); }).join();
  }
  uint64_t missed = 0;
  const std::vector<TraceEvent> events = ring->since(0, SIZE_MAX, &missed);
  EXPECT_EQ(missed, 0u);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].addr, 10u);
  EXPECT_EQ(events[1].addr, 11u);
}

// Holds the trace's coarse tick still for a test's scope (trace_clock.h).
struct HeldTicker {
  HeldTicker() { TraceClock::HoldTickerForTest(true); }
  ~HeldTicker() { TraceClock::HoldTickerForTest(false); }
};

// One block handed back and forth between two threads within one coarse tick: each
// thread frees the block the other allocated, then allocates it again from its own
// cache (cache hits: no lock, no exact clock). The trace reads in the order the
// threads handed the block on (a free after its alloc on the other thread), which a
// merge of the two lanes by a plain coarse tick cannot give: their events tie, and
// each lane's own count puts one thread's events all before the other's.
TEST(TraceRingTest, ABlockHandedBetweenThreadsWithinOneTickReadsInCausalOrder) {
  Config config;
  config.backend = BackendKind::kSim;
  config.sim_capacity = 64 * kMiB;
  CachingAllocator alloc(MakeSimBackend(config, 32), config);
  TraceRing ring(4096);
  alloc.set_observer(&ring);
  const SiteId site = InternSite(std::source_location::current(), SiteKind::kAlloc);
  HeldTicker held;
  constexpr int kSteps = 40;
  std::mutex mu;
  std::condition_variable cv;
  int step = 0;  // thread step % 2 takes step `step`
  void* block = nullptr;
  std::vector<uint32_t> step_thread(kSteps);
  auto player = [&](int parity) {
    for (;;) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return step >= kSteps || step % 2 == parity; });
      if (step >= kSteps) return;
      if (block != nullptr) alloc.free(block);  // the other thread's allocation
      block = alloc.allocate(4096, {}, site);
      step_thread[step] = TraceThreadNumber();
      ++step;
      cv.notify_all();
    }
  };
  std::thread a(player, 0), b(player, 1);
  a.join();
  b.join();
  alloc.free(block);
  alloc.set_observer(nullptr);

  const std::vector<TraceEvent> events = ring.since(0);
  std::vector<const TraceEvent*> user;  // the allocs and frees, in the trace's order
  for (const TraceEvent& e : events) {
    if (e.action == AllocAction::kAlloc || e.action == AllocAction::kFree) user.push_back(&e);
  }
  ASSERT_EQ(user.size(), size_t{2 * kSteps});  // step 0: alloc; 1..: free, alloc; free
  for (int s = 0; s < kSteps; ++s) {
    const TraceEvent& alloc_event = *user[s == 0 ? 0 : 2 * s];
    ASSERT_EQ(alloc_event.action, AllocAction::kAlloc) << "step " << s;
    ASSERT_EQ(alloc_event.thread, step_thread[s]) << "step " << s << "'s alloc";
    const TraceEvent& free_event = *user[2 * s + 1];
    ASSERT_EQ(free_event.action, AllocAction::kFree) << "step " << s + 1;
    ASSERT_EQ(free_event.addr, alloc_event.addr);
    if (s + 1 < kSteps) {
      ASSERT_EQ(free_event.thread, step_thread[s + 1]) << "step " << s + 1 << "'s free";
    }
  }
  // memtrace timeline reads it (a double alloc would be an error naming the line).
  std::string text = TraceHeaderToJson(events) + "\n";
  for (const TraceEvent& e : events) text += TraceEventToJson(e) + "\n";
  absl::StatusOr<Timeline> t = BuildTimeline(text, "handed.jsonl", TimelineOptions{});
  ASSERT_TRUE(t.ok()) << t.status();
}

TEST(TraceJsonTest, EventRoundTrip) {
  TraceEvent e;
  e.seq = 42;
  e.time_ns = 123456789;
  e.action = AllocAction::kSegmentUnmap;
  e.device = DeviceId{DeviceType::kCuda, 1};
  e.stream = Stream{0x7f0000001234};
  e.addr = uintptr_t{0xffff800000000000};  // above INT64_MAX: must stay unsigned
  e.size = 20 * kMiB;
  e.requested = 7;
  e.site = 9;
  e.thread = 3;
  const std::string line = TraceEventToJson(e);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_NE(line.find("\"action\":\"segment_unmap\""), std::string::npos) << line;
  EXPECT_NE(line.find("\"device\":\"cuda:1\""), std::string::npos) << line;
  absl::StatusOr<TraceEvent> back = TraceEventFromJson(line);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->seq, e.seq);
  EXPECT_EQ(back->time_ns, e.time_ns);
  EXPECT_EQ(back->action, e.action);
  EXPECT_EQ(back->device, e.device);
  EXPECT_EQ(back->stream, e.stream);
  EXPECT_EQ(back->addr, e.addr);
  EXPECT_EQ(back->size, e.size);
  EXPECT_EQ(back->requested, e.requested);
  EXPECT_EQ(back->site, e.site);
  EXPECT_EQ(back->thread, e.thread);
}

TEST(TraceJsonTest, FileRoundTripWithSiteTable) {
  TraceRing ring(16);
  const SiteId site = InternSite(std::source_location::current(), SiteKind::kAlloc, "file-rt");
  for (uint64_t i = 1; i <= 5; ++i) {
    AllocEvent e = Synthetic(i);
    e.site = site;
    ring.on_event(e);
  }
  const std::vector<TraceEvent> events = ring.since(0);
  const std::string path = ::testing::TempDir() + "/devmem_trace_rt.jsonl";
  ASSERT_TRUE(WriteTraceFile(path, events).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  SiteMap sites;
  absl::StatusOr<std::vector<TraceEvent>> back = TraceFromJsonl(text.str(), &sites);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ((*back)[i].seq, events[i].seq);
    EXPECT_EQ((*back)[i].time_ns, events[i].time_ns);
    EXPECT_EQ((*back)[i].addr, events[i].addr);
    EXPECT_EQ((*back)[i].site, site);
  }
  ASSERT_EQ(sites.count(site), 1u);
  EXPECT_EQ(sites[site].tag, "file-rt");
  EXPECT_EQ(sites[site].line, GetSite(site).line);
  EXPECT_EQ(sites[site].file, GetSite(site).file);
  std::remove(path.c_str());

  EXPECT_FALSE(WriteTraceFile("/nonexistent-dir/x/trace.jsonl", events).ok());
}

TEST(TraceJsonTest, BadLinesNameTheFieldAndTheLine) {
  const std::string good = TraceEventToJson(TraceEvent{});
  auto message = [](std::string_view text) {
    absl::StatusOr<std::vector<TraceEvent>> r = TraceFromJsonl(text);
    EXPECT_FALSE(r.ok());
    return std::string(r.status().message());
  };
  std::string m = message(good + "\n{\"seq\": 1}\n");
  EXPECT_NE(m.find("trace line 2"), std::string::npos) << m;
  EXPECT_NE(m.find("time_ns"), std::string::npos) << m;
  m = message(R"({"schema": "devmem.trace/2"})");
  EXPECT_NE(m.find("devmem.trace/2"), std::string::npos) << m;
  EXPECT_NE(m.find("devmem.trace/1"), std::string::npos) << m;
  std::string bad_action = good;
  bad_action.replace(bad_action.find("\"alloc\""), 7, "\"explode\"");
  m = message(bad_action);
  EXPECT_NE(m.find("expected an action"), std::string::npos) << m;
  EXPECT_NE(m.find("explode"), std::string::npos) << m;
  m = message(good.substr(0, good.size() / 2));
  EXPECT_NE(m.find("not valid JSON"), std::string::npos) << m;
  absl::StatusOr<TraceEvent> e = TraceEventFromJson(R"({"seq": "one"})");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("seq: expected a non-negative integer, got string"),
            std::string::npos)
      << e.status();
}

}  // namespace
}  // namespace devmem
