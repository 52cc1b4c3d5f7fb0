// tests/device_pool_invariants_test.cc: DevicePool (allocator/device_pool.h) from the
// inside, for what the public API cannot reach:
//   * validate() notices each invariant it promises to check, shown by corrupting one
//     thing at a time through DevicePoolTestPeer (a friend of DevicePool and of its
//     parts);
//   * a refused expandable reservation is not asked for again on every miss, only after
//     empty_cache(), counted through a HookedBackend around the sim.
//   * process_events() with nothing queued returns without the device lock (shown with
//     the lock held by the test), and with work queued still polls it all; the
//     poll-work flag it reads follows every source (allocator/poll_work.h).
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "allocator/backend.h"
#include "allocator/backend_factory.h"
#include "allocator/device_pool.h"
#include "tests/hooked_backend.h"
#include "tests/test_util.h"

namespace devmem {
namespace internal {

// Reaches into a DevicePool. Each method corrupts one invariant and nothing else.
class DevicePoolTestPeer {
 public:
  explicit DevicePoolTestPeer(DevicePool& pool) : pool_(pool) {}

  Block* BlockAt(const void* p) {
    MutexLock lock(&pool_.mu_);
    return pool_.block_containing(reinterpret_cast<uintptr_t>(p));
  }
  // Gives a free block a recorded stream, as a free that forgot to clear them would.
  void AddStreamUse(Block* b, Stream s) {
    MutexLock lock(&pool_.mu_);
    b->stream_uses.push_back(s);
  }
  // Points the queued events that name `from` at `to`.
  void RetargetQueuedEvents(const Block* from, Block* to) {
    MutexLock lock(&pool_.mu_);
    for (auto& [stream, queue] : pool_.events_.queues_) {
      for (auto& pe : queue) {
        if (pe.block == from) pe.block = to;
      }
    }
  }
  // Shifts a free set's bytes counter by `delta`.
  void ShiftFreeBytes(bool small, int64_t delta) {
    MutexLock lock(&pool_.mu_);
    pool_.free_.summary_[small].bytes += delta;
  }
  // Records `largest` as a free set's largest block size (held by one block), as
  // current (not stale); with largest == 0, marks it stale, which is always consistent.
  void SetLargestFree(bool small, size_t largest) {
    MutexLock lock(&pool_.mu_);
    FreeIndex::Summary& s = pool_.free_.summary_[small];
    s.largest = largest;
    s.at_largest = 1;
    s.stale = largest == 0;
  }
  // Holds the device lock, as another thread in the pool would, until UnlockDevice().
  void LockDevice() ABSL_NO_THREAD_SAFETY_ANALYSIS { pool_.mu_.lock(); }
  void UnlockDevice() ABSL_NO_THREAD_SAFETY_ANALYSIS { pool_.mu_.unlock(); }
  // Publishes `source` as having work, or none, whatever it holds.
  void SetPollWork(PollWork::Source source, bool has_work) {
    MutexLock lock(&pool_.mu_);
    pool_.poll_work_.set(source, has_work);
  }
  // Moves one waited-for event from `from` to `to` (both pending): totals still agree.
  void MovePendingCount(Block* from, Block* to) {
    MutexLock lock(&pool_.mu_);
    --from->pending_events;
    ++to->pending_events;
  }

 private:
  DevicePool& pool_;
};

namespace {

using testutil::MakeSimConfig;
using testutil::StreamBlocker;

std::unique_ptr<DevicePool> MakePool(std::string_view conf) {
  const Config config = MakeSimConfig(conf, 256 * kMiB);
  return std::make_unique<DevicePool>(MakeSimBackend(config, 0), config);
}

void ExpectViolation(const DevicePool& pool, std::string_view needle) {
  const absl::Status s = pool.validate();
  EXPECT_FALSE(s.ok()) << "validate() did not notice: " << needle;
  EXPECT_NE(std::string(s.message()).find(needle), std::string::npos) << s;
}

TEST(DevicePoolValidateTest, FreeBlockWithRecordedStreamsIsAViolation) {
  auto pool = MakePool("");
  void* p = pool->allocate(4096, Stream{}, kUnknownSite);
  pool->free(p);
  ASSERT_TRUE(pool->validate().ok()) << pool->validate();
  DevicePoolTestPeer peer(*pool);
  Block* b = peer.BlockAt(p);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(b->state, BlockState::kFree);
  peer.AddStreamUse(b, Stream{7});
  ExpectViolation(*pool, "recorded streams");
  b->stream_uses.clear();  // so the destructor sees a consistent pool
  EXPECT_TRUE(pool->validate().ok());
}

// Two blocks pending on blocked streams (a on two, b on one); the queues are then
// corrupted in ways that keep every total (queued == counter == sum of pending_events)
// equal, so only the per-event and per-block checks can notice.
TEST(DevicePoolValidateTest, QueuedEventsMustNamePendingBlocksOneForOne) {
  auto pool = MakePool("");
  absl::StatusOr<Stream> s1 = pool->backend().create_stream();
  absl::StatusOr<Stream> s2 = pool->backend().create_stream();
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto block1 = std::make_unique<StreamBlocker>(pool->backend(), *s1);
  auto block2 = std::make_unique<StreamBlocker>(pool->backend(), *s2);
  void* a = pool->allocate(4096, Stream{}, kUnknownSite);
  void* b = pool->allocate(4096, Stream{}, kUnknownSite);
  void* keep = pool->allocate(4096, Stream{}, kUnknownSite);
  pool->record_stream(a, *s1);
  pool->record_stream(a, *s2);
  pool->record_stream(b, *s1);
  pool->free(a);
  pool->free(b);
  ASSERT_TRUE(pool->validate().ok()) << pool->validate();
  DevicePoolTestPeer peer(*pool);
  Block* ba = peer.BlockAt(a);
  Block* bb = peer.BlockAt(b);
  Block* bk = peer.BlockAt(keep);
  ASSERT_EQ(ba->state, BlockState::kPending);
  ASSERT_EQ(bb->state, BlockState::kPending);

  peer.MovePendingCount(ba, bb);  // a waits for 1 with 2 queued, b for 2 with 1
  // Which of the two is reported depends on hash order.
  ExpectViolation(*pool, " are queued");
  peer.MovePendingCount(bb, ba);
  ASSERT_TRUE(pool->validate().ok()) << pool->validate();

  peer.RetargetQueuedEvents(bb, bk);  // b's event names the live block `keep`
  ExpectViolation(*pool, "which is allocated, not pending");
  peer.RetargetQueuedEvents(bk, bb);
  ASSERT_TRUE(pool->validate().ok()) << pool->validate();

  block1->Release();
  block2->Release();
  pool->backend().synchronize_stream(*s1);
  pool->backend().synchronize_stream(*s2);
  pool->process_events();
  pool->free(keep);
  EXPECT_TRUE(pool->validate().ok()) << pool->validate();
}

// The poll-work flag (allocator/poll_work.h) must say "work" exactly when a source
// has some: a clear bit with an event queued would leave the event to the allocation
// path (process_events() would skip it), a set bit with none would take the lock for
// nothing.
TEST(DevicePoolValidateTest, PollWorkFlagMustMatchItsSources) {
  auto pool = MakePool("");
  absl::StatusOr<Stream> s1 = pool->backend().create_stream();
  ASSERT_TRUE(s1.ok());
  auto blocker = std::make_unique<StreamBlocker>(pool->backend(), *s1);
  void* a = pool->allocate(4096, Stream{}, kUnknownSite);
  pool->record_stream(a, *s1);
  pool->free(a);  // pending on s1: one event queued
  ASSERT_TRUE(pool->has_poll_work());
  ASSERT_TRUE(pool->validate().ok()) << pool->validate();
  DevicePoolTestPeer peer(*pool);
  peer.SetPollWork(PollWork::kQueuedEvents, false);
  EXPECT_FALSE(pool->has_poll_work());
  ExpectViolation(*pool, "says there are no queued cross-stream events, but there are");
  peer.SetPollWork(PollWork::kQueuedEvents, true);
  ASSERT_TRUE(pool->validate().ok()) << pool->validate();

  blocker->Release();
  pool->backend().synchronize_stream(*s1);
  pool->process_events();
  ASSERT_FALSE(pool->has_poll_work());
  ASSERT_TRUE(pool->validate().ok()) << pool->validate();
  peer.SetPollWork(PollWork::kRetirements, true);  // no stream is being released
  ExpectViolation(*pool, "says there are stream retirements under way, but there are none");
  peer.SetPollWork(PollWork::kRetirements, false);
  EXPECT_TRUE(pool->validate().ok()) << pool->validate();
}

// With nothing queued, process_events() returns without taking the device lock: here
// the test holds it, and the call still returns. Before the poll-work flag, every call
// took the lock (the runtime's poller: every 5 ms per device, idle or not), so this
// call blocked until the lock was released: the bounded wait below then ran out.
TEST(DevicePoolPollTest, NothingQueuedMeansNoDeviceLock) {
  auto pool = MakePool("");
  absl::StatusOr<Stream> s1 = pool->backend().create_stream();
  ASSERT_TRUE(s1.ok());
  // A cross-stream free whose event completed and was polled: queues empty again.
  void* a = pool->allocate(4096, Stream{}, kUnknownSite);
  pool->record_stream(a, *s1);
  pool->free(a);
  pool->backend().synchronize_stream(*s1);
  pool->process_events();
  ASSERT_FALSE(pool->has_poll_work());
  const PollStats before = pool->poll_stats();

  DevicePoolTestPeer peer(*pool);
  peer.LockDevice();
  std::future<void> poll = std::async(std::launch::async, [&] { pool->process_events(); });
  // Not a timing assertion: the call either returns (now) or waits for the lock, which
  // only this thread can release; the wait is bounded so that a failure ends the test.
  const bool returned = poll.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  peer.UnlockDevice();
  poll.get();
  EXPECT_TRUE(returned) << "process_events() waited for the device lock with nothing queued";
  EXPECT_EQ(pool->poll_stats().calls, before.calls + 1);
  EXPECT_EQ(pool->poll_stats().locked, before.locked);
  EXPECT_TRUE(pool->validate().ok()) << pool->validate();
}

// Work still reaches the poll: a cross-stream free (the flag is set by the free and
// stays set while the event is not done) and a stream retirement are polled by
// process_events() alone, and the flag clears once they are done.
TEST(DevicePoolPollTest, QueuedWorkIsPolledAndThenTheFlagClears) {
  auto pool = MakePool("");
  absl::StatusOr<Stream> s1 = pool->backend().create_stream();
  absl::StatusOr<Stream> s2 = pool->backend().create_stream();
  ASSERT_TRUE(s1.ok() && s2.ok());
  auto blocker = std::make_unique<StreamBlocker>(pool->backend(), *s1);
  void* a = pool->allocate(4096, Stream{}, kUnknownSite);
  pool->record_stream(a, *s1);
  EXPECT_FALSE(pool->has_poll_work());  // a recorded use queues nothing until the free
  pool->free(a);
  EXPECT_TRUE(pool->has_poll_work());
  const PollStats before = pool->poll_stats();
  pool->process_events();  // s1 is blocked: the event is queried, not done
  EXPECT_EQ(pool->poll_stats().locked, before.locked + 1);
  EXPECT_TRUE(pool->has_poll_work());
  EXPECT_EQ(pool->stats().pending_bytes[kAggregatePool].current, 4096);
  ASSERT_TRUE(pool->validate().ok()) << pool->validate();
  blocker->Release();
  pool->backend().synchronize_stream(*s1);
  pool->process_events();
  EXPECT_EQ(pool->stats().pending_bytes[kAggregatePool].current, 0);
  EXPECT_FALSE(pool->has_poll_work());
  ASSERT_TRUE(pool->validate().ok()) << pool->validate();

  // A retirement: its block waits for the stream's event, polled the same way.
  auto blocker2 = std::make_unique<StreamBlocker>(pool->backend(), *s2);
  void* b = pool->allocate(4096, *s2, kUnknownSite);
  pool->free(b);
  pool->release_stream(*s2);
  EXPECT_TRUE(pool->has_poll_work());
  pool->process_events();
  EXPECT_TRUE(pool->has_poll_work());
  ASSERT_TRUE(pool->validate().ok()) << pool->validate();
  blocker2->Release();
  pool->backend().synchronize_stream(*s2);
  pool->process_events();
  EXPECT_FALSE(pool->has_poll_work());
  EXPECT_EQ(pool->stats().pending_bytes[kAggregatePool].current, 0);
  EXPECT_TRUE(pool->validate().ok()) << pool->validate();
}

// The pools-with-work counter (for the runtime's poller) counts this pool while it has
// work, and takes it back when the work is done and when the pool detaches.
TEST(DevicePoolPollTest, CounterFollowsTheFlag) {
  auto pool = MakePool("");
  absl::StatusOr<Stream> s1 = pool->backend().create_stream();
  ASSERT_TRUE(s1.ok());
  std::atomic<int64_t> counter{0};
  pool->set_poll_counter(&counter);
  EXPECT_EQ(counter.load(), 0);
  auto blocker = std::make_unique<StreamBlocker>(pool->backend(), *s1);
  void* a = pool->allocate(4096, Stream{}, kUnknownSite);
  void* b = pool->allocate(4096, Stream{}, kUnknownSite);
  pool->record_stream(a, *s1);
  pool->record_stream(b, *s1);
  pool->free(a);
  EXPECT_EQ(counter.load(), 1);
  pool->free(b);
  EXPECT_EQ(counter.load(), 1);  // one pool, counted once
  pool->set_poll_counter(nullptr);
  EXPECT_EQ(counter.load(), 0);
  pool->set_poll_counter(&counter);  // attached with work: counted at once
  EXPECT_EQ(counter.load(), 1);
  blocker->Release();
  pool->backend().synchronize_stream(*s1);
  pool->process_events();
  EXPECT_EQ(counter.load(), 0);
  EXPECT_TRUE(pool->validate().ok()) << pool->validate();
}

// The free sets' summary (bytes, largest block) that metrics and OOM reports read is
// checked against a recount over the sets.
TEST(DevicePoolValidateTest, FreeSetSummaryMustMatchItsBlocks) {
  auto pool = MakePool("");
  void* a = pool->allocate(4096, Stream{}, kUnknownSite);
  void* b = pool->allocate(8192, Stream{}, kUnknownSite);
  void* c = pool->allocate(4096, Stream{}, kUnknownSite);
  pool->free(b);  // a hole, plus the segment's tail
  ASSERT_TRUE(pool->validate().ok()) << pool->validate();
  DevicePoolTestPeer peer(*pool);

  peer.ShiftFreeBytes(/*small=*/true, 512);
  ExpectViolation(*pool, "small free set's bytes counter");
  peer.ShiftFreeBytes(/*small=*/true, -512);
  ASSERT_TRUE(pool->validate().ok()) << pool->validate();

  const DeviceStats st = pool->stats();
  const size_t tail = 2 * kMiB - 16384;
  ASSERT_EQ(st.largest_free_block[kSmallPool], static_cast<int64_t>(tail));
  peer.SetLargestFree(/*small=*/true, 8192);  // the hole, not the tail
  ExpectViolation(*pool, "small free set's largest block is recorded as 8192 bytes");
  peer.SetLargestFree(/*small=*/true, 0);  // stale: recomputed on the next read
  EXPECT_TRUE(pool->validate().ok()) << pool->validate();
  EXPECT_EQ(pool->stats().largest_free_block[kSmallPool], static_cast<int64_t>(tail));
  EXPECT_TRUE(pool->validate().ok()) << pool->validate();
  for (void* p : {a, c}) pool->free(p);
  EXPECT_TRUE(pool->validate().ok()) << pool->validate();
}

TEST(DevicePoolExpandableTest, ARefusedReservationIsRememberedUntilEmptyCache) {
  const Config config = MakeSimConfig("expandable_segments:true", 256 * kMiB);
  // The sim, except that reserve_address is refused and counted.
  auto owned = std::make_unique<testutil::HookedBackend>(MakeSimBackend(config, 0));
  int reserve_calls = 0;  // the test is single-threaded
  testutil::HookGuard reserve_hook =
      owned->reserve_address_instead.Set([&](size_t) -> absl::StatusOr<void*> {
        ++reserve_calls;
        return absl::ResourceExhaustedError("test: no address space");
      });
  DevicePool pool(std::move(owned), config);
  // Every allocation misses (each is larger than anything cached): regular segments
  // serve them, and the large pool's reservation is asked for once.
  std::vector<void*> live;
  for (size_t mib = 12; mib < 24; mib += 2) {
    live.push_back(pool.allocate(mib * kMiB, Stream{}, kUnknownSite));
  }
  EXPECT_EQ(pool.stats().cache_misses, 6);
  EXPECT_EQ(reserve_calls, 1);
  void* small = pool.allocate(4096, Stream{}, kUnknownSite);  // the small pool: its own
  EXPECT_EQ(reserve_calls, 2);
  for (void* p : live) pool.free(p);
  pool.free(small);
  pool.empty_cache();  // address space given back: worth asking again
  pool.free(pool.allocate(3 * kMiB, Stream{}, kUnknownSite));
  EXPECT_EQ(reserve_calls, 3);
  EXPECT_TRUE(pool.validate().ok()) << pool.validate();
}

}  // namespace
}  // namespace internal
}  // namespace devmem
