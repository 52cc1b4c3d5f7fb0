// tests/device_pool_invariants_test.cc: DevicePool (allocator/device_pool.h) from the
// inside, for what the public API cannot reach:
//   * validate() notices each invariant it promises to check, shown by corrupting one
//     thing at a time through DevicePoolTestPeer (a friend of DevicePool);
//   * a refused expandable reservation is not asked for again on every miss, only after
//     empty_cache(), counted through a backend that wraps the sim.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "allocator/backend.h"
#include "allocator/backend_factory.h"
#include "allocator/device_pool.h"
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
    for (auto& [stream, queue] : pool_.pending_) {
      for (auto& pe : queue) {
        if (pe.block == from) pe.block = to;
      }
    }
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

// A backend that is the sim, except that reserve_address is refused (ResourceExhausted)
// and counted.
class RefusingVmBackend : public Backend {
 public:
  explicit RefusingVmBackend(std::unique_ptr<Backend> sim) : sim_(std::move(sim)) {}
  int reserve_calls() const { return reserve_calls_; }

  DeviceId device() const override { return sim_->device(); }
  Capabilities caps() const override { return sim_->caps(); }
  DeviceInfo info() const override { return sim_->info(); }
  absl::StatusOr<void*> allocate_segment(size_t bytes) override {
    return sim_->allocate_segment(bytes);
  }
  void free_segment(void* p, size_t bytes) override { sim_->free_segment(p, bytes); }
  MemInfo mem_info() override { return sim_->mem_info(); }
  absl::StatusOr<Stream> create_stream() override { return sim_->create_stream(); }
  void destroy_stream(Stream s) override { sim_->destroy_stream(s); }
  absl::Status launch_host_fn(Stream s, std::function<void()> fn) override {
    return sim_->launch_host_fn(s, std::move(fn));
  }
  Event record_event(Stream s) override { return sim_->record_event(s); }
  bool event_done(Event e) override { return sim_->event_done(e); }
  void synchronize_event(Event e) override { sim_->synchronize_event(e); }
  void release_event(Event e) override { sim_->release_event(e); }
  void synchronize_stream(Stream s) override { sim_->synchronize_stream(s); }
  size_t granularity() const override { return sim_->granularity(); }
  absl::StatusOr<void*> reserve_address(size_t) override {
    ++reserve_calls_;
    return absl::ResourceExhaustedError("RefusingVmBackend: no address space");
  }
  void release_address(void* p, size_t bytes) override { sim_->release_address(p, bytes); }
  absl::Status map(void* p, size_t bytes) override { return sim_->map(p, bytes); }
  void unmap(void* p, size_t bytes) override { sim_->unmap(p, bytes); }

 private:
  std::unique_ptr<Backend> sim_;
  int reserve_calls_ = 0;  // the test is single-threaded
};

TEST(DevicePoolExpandableTest, ARefusedReservationIsRememberedUntilEmptyCache) {
  const Config config = MakeSimConfig("expandable_segments:true", 256 * kMiB);
  auto owned = std::make_unique<RefusingVmBackend>(MakeSimBackend(config, 0));
  RefusingVmBackend* backend = owned.get();
  DevicePool pool(std::move(owned), config);
  // Every allocation misses (each is larger than anything cached): regular segments
  // serve them, and the large pool's reservation is asked for once.
  std::vector<void*> live;
  for (size_t mib = 12; mib < 24; mib += 2) {
    live.push_back(pool.allocate(mib * kMiB, Stream{}, kUnknownSite));
  }
  EXPECT_EQ(pool.stats().cache_misses, 6);
  EXPECT_EQ(backend->reserve_calls(), 1);
  void* small = pool.allocate(4096, Stream{}, kUnknownSite);  // the small pool: its own
  EXPECT_EQ(backend->reserve_calls(), 2);
  for (void* p : live) pool.free(p);
  pool.free(small);
  pool.empty_cache();  // address space given back: worth asking again
  pool.free(pool.allocate(3 * kMiB, Stream{}, kUnknownSite));
  EXPECT_EQ(backend->reserve_calls(), 3);
  EXPECT_TRUE(pool.validate().ok()) << pool.validate();
}

}  // namespace
}  // namespace internal
}  // namespace devmem
