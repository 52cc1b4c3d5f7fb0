// tests/device_pool_invariants_test.cc: DevicePool (allocator/device_pool.h) from the
// inside, for what the public API cannot reach:
//   * validate() notices each invariant it promises to check, shown by corrupting one
//     thing at a time through DevicePoolTestPeer (a friend of DevicePool and of its
//     parts);
//   * a refused expandable reservation is not asked for again on every miss, only after
//     empty_cache(), counted through a HookedBackend around the sim.
#include <gtest/gtest.h>

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
  owned->reserve_address_instead = [&](size_t) -> absl::StatusOr<void*> {
    ++reserve_calls;
    return absl::ResourceExhaustedError("test: no address space");
  };
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
