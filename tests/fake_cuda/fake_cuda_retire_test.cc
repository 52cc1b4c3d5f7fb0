// tests/fake_cuda/fake_cuda_retire_test.cc: CachingAllocator::release_stream on the
// fake CUDA runtime, whose destroyed stream handles come back for the next stream
// created while the old stream still runs its queued work (fake_cuda_streams_test.cc).
// Each case destroys a stream whose "kernel" (a host function waiting on a gate) still
// runs, gets the same handle back for a new stream, and checks that:
//   * no block the old stream's work may still use is handed to the new stream
//     (allocation on the handle is refused, naming it, until the old work completed):
//     free sets, thread caches, cache-owned blocks freed late, arena chunks;
//   * nothing synchronizes or records an event on the destroyed handle (the fake
//     aborts the process on either): empty_cache, the destructor, a cross-stream free
//     with a use on the destroyed stream;
//   * once the old work completed, the handle serves the new stream, and validate()
//     holds throughout.
// Without release_stream the first allocation on the new stream gets the old stream's
// block back, and empty_cache synchronizes the destroyed handle (the fake aborts).
// Regular and expandable segments.
#include <cuda_runtime_api.h>

#include <future>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "allocator/arena.h"
#include "allocator/backend.h"
#include "allocator/caching_allocator.h"
#include "allocator/errors.h"
#include "allocator/types.h"
#include "gtest/gtest.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/fake_cuda/fake_cuda_test_util.h"

namespace devmem {
namespace {

int64_t Pending(const CachingAllocator& a) {
  return a.stats().pending_bytes[kAggregatePool].current;
}
int64_t Reserved(const CachingAllocator& a) {
  return a.stats().reserved_bytes[kAggregatePool].current;
}

// A stream running a "kernel" that lasts until release(): what the old stream still
// does after cudaStreamDestroy returned.
class BusyStream {
 public:
  explicit BusyStream(Backend& backend) : backend_(backend) {
    absl::StatusOr<Stream> s = backend.create_stream();
    EXPECT_TRUE(s.ok()) << s.status();
    stream_ = s.ok() ? *s : Stream{};
    std::shared_future<void> gate = gate_.get_future().share();
    EXPECT_TRUE(backend.launch_host_fn(stream_, [gate] { gate.wait(); }).ok());
  }
  ~BusyStream() {
    if (!released_) release();
  }
  Stream stream() const { return stream_; }
  // Destroys the stream as a program does, with cudaStreamDestroy (which returns at
  // once; the kernel keeps running; Backend::destroy_stream would wait for it), after
  // recording `done_`, which completes once everything queued so far has run.
  void destroy() {
    done_ = backend_.record_event(stream_);
    EXPECT_EQ(cudaStreamDestroy(reinterpret_cast<cudaStream_t>(stream_.handle)),
              cudaSuccess);
  }
  // Lets the kernel finish and waits until the destroyed stream's work has run.
  void release() {
    released_ = true;
    gate_.set_value();
    if (done_.handle != 0) {
      backend_.synchronize_event(done_);
      backend_.release_event(done_);
    }
  }

 private:
  Backend& backend_;
  Stream stream_;
  std::promise<void> gate_;
  Event done_;
  bool released_ = false;
};

class FakeCudaRetireTest : public fake_cuda_test::CudaAllocatorTest {
 protected:
  void TearDown() override {
    alloc_.reset();
    EXPECT_EQ(fake_cuda_test::Live("events"), 0u);
    EXPECT_EQ(fake_cuda_test::Live("allocations"), 0u);
  }
  // allocate(bytes, stream) must be refused with an error naming the stream.
  void ExpectRefused(size_t bytes, Stream stream) {
    try {
      void* p = alloc_->allocate(bytes, stream);
      ADD_FAILURE() << "allocate on a released stream's handle returned " << p
                    << " while the old stream's work still runs";
      alloc_->free(p);
    } catch (const InvalidArgumentError& e) {
      EXPECT_TRUE(absl::StrContains(e.what(), absl::StrFormat("stream %#x", stream.handle)))
          << e.what();
      EXPECT_TRUE(absl::StrContains(e.what(), "release_stream")) << e.what();
    }
  }
};

// The use-after-free: a block freed on the old stream (stream-ordered: its kernel
// still uses it) must not serve the new stream that got the handle.
TEST_P(FakeCudaRetireTest, ANewStreamWithTheHandleDoesNotGetTheOldStreamsBlocks) {
  BusyStream old(alloc_->backend());
  void* large = alloc_->allocate(4 * kMiB, old.stream());
  void* small = alloc_->allocate(64 * kKiB, old.stream());
  alloc_->free(large);  // the kernel queued before still uses both
  alloc_->free(small);
  alloc_->release_stream(old.stream());
  old.destroy();
  const Stream fresh = NewStream();
  ASSERT_EQ(fresh, old.stream());  // the handle came back
  // Both cached blocks wait for the retirement event, pending.
  EXPECT_GE(Pending(*alloc_), static_cast<int64_t>(4 * kMiB + 64 * kKiB));
  ExpectRefused(4 * kMiB, fresh);
  ExpectRefused(64 * kKiB, fresh);
  alloc_->process_events();  // the event has not completed: still refused
  ExpectRefused(4 * kMiB, fresh);
  ExpectValid();

  old.release();
  alloc_->process_events();
  EXPECT_EQ(Pending(*alloc_), 0);
  // The old work is done: the new stream may have the memory now.
  void* again = alloc_->allocate(4 * kMiB, fresh);
  EXPECT_EQ(again, large);
  alloc_->free(again);
  ExpectValid();
  alloc_->empty_cache();  // synchronizes the new stream (live), not a dead one
  EXPECT_EQ(Reserved(*alloc_), 0);
  alloc_->backend().destroy_stream(fresh);
}

// Thread caches: a small block freed into this thread's cache on the old stream must
// not come back from a lock-free cache hit on the new stream, and a cache-owned block
// still allocated when the stream is released is freed through the pending path.
TEST_P(FakeCudaRetireTest, ThreadCachedAndCacheOwnedBlocksWaitForTheOldWork) {
  BusyStream old(alloc_->backend());
  // The second allocation is a cache hit: a cache-owned block.
  void* cached = alloc_->allocate(4 * kKiB, old.stream());
  alloc_->free(cached);  // adopted by this thread's cache
  void* owned = alloc_->allocate(4 * kKiB, old.stream());
  ASSERT_EQ(owned, cached);
  void* in_bin = alloc_->allocate(8 * kKiB, old.stream());
  alloc_->free(in_bin);  // into a bin of the old stream's slot
  alloc_->release_stream(old.stream());
  old.destroy();
  const Stream fresh = NewStream();
  ASSERT_EQ(fresh, old.stream());
  ExpectRefused(8 * kKiB, fresh);
  // Freed after the release: pending on the retirement, not into a cache bin.
  const int64_t pending = Pending(*alloc_);
  alloc_->free(owned);
  EXPECT_EQ(Pending(*alloc_), pending + static_cast<int64_t>(4 * kKiB));
  ExpectRefused(4 * kKiB, fresh);
  EXPECT_EQ(alloc_->stats().thread_cached_bytes[kAggregatePool].current, 0);
  ExpectValid();

  old.release();
  alloc_->process_events();
  EXPECT_EQ(Pending(*alloc_), 0);
  void* p = alloc_->allocate(4 * kKiB, fresh);
  alloc_->free(p);
  ExpectValid();
  alloc_->empty_cache();
  alloc_->backend().destroy_stream(fresh);
}

// Arenas: an empty chunk retained after a scope on the old stream would serve the next
// scope on the handle without a pool call; release_stream gives it back.
TEST_P(FakeCudaRetireTest, ARetainedArenaChunkDoesNotServeTheNewStream) {
  BusyStream old(alloc_->backend());
  void* buffer = nullptr;
  {
    ArenaScope scope(*alloc_, "step", ArenaOptions{kMiB, old.stream(), {}});
    buffer = alloc_->allocate(64 * kKiB, old.stream());
    alloc_->free(buffer);
  }
  ASSERT_GT(alloc_->arena_report().retained_bytes, 0);
  alloc_->release_stream(old.stream());
  EXPECT_EQ(alloc_->arena_report().retained_bytes, 0);
  old.destroy();
  const Stream fresh = NewStream();
  ASSERT_EQ(fresh, old.stream());
  {
    ArenaScope scope(*alloc_, "step", ArenaOptions{kMiB, fresh, {}});
    ExpectRefused(64 * kKiB, fresh);
  }
  ExpectValid();
  old.release();
  alloc_->process_events();
  {
    ArenaScope scope(*alloc_, "step", ArenaOptions{kMiB, fresh, {}});
    void* p = alloc_->allocate(64 * kKiB, fresh);
    EXPECT_NE(p, nullptr);
    alloc_->free(p);
  }
  alloc_->empty_cache();
  ExpectValid();
  alloc_->backend().destroy_stream(fresh);
}

// Nothing synchronizes the destroyed handle or records on it: a block of the stream
// still allocated at the release, freed and released by empty_cache while the old
// work runs (waits for the retirement event), a cross-stream free with a use on the
// destroyed stream, and memory cached on the retired handle at the allocator's end.
TEST_P(FakeCudaRetireTest, NoCallReachesTheDestroyedStream) {
  BusyStream old(alloc_->backend());
  void* mine = alloc_->allocate(2 * kMiB, old.stream());
  void* shared = alloc_->allocate(2 * kMiB);  // default stream, used on the old one
  alloc_->record_stream(shared, old.stream());
  alloc_->release_stream(old.stream());
  old.destroy();
  alloc_->free(mine);    // pending on the retirement event
  alloc_->free(shared);  // waits for the retirement event, not for a new one
  EXPECT_GE(Pending(*alloc_), static_cast<int64_t>(4 * kMiB));
  ExpectValid();
  // empty_cache waits for every pending free: here the retirement event, which the
  // kernel holds back, so let it finish first from another thread.
  std::thread finisher([&old] { old.release(); });
  alloc_->empty_cache();
  finisher.join();
  EXPECT_EQ(Pending(*alloc_), 0);
  EXPECT_EQ(Reserved(*alloc_), 0);
  // Cached on the retired handle, then the allocator goes (its destructor must not
  // synchronize the handle, which names no stream).
  const Stream fresh = NewStream();
  ASSERT_EQ(fresh, old.stream());
  void* p = alloc_->allocate(2 * kMiB, fresh);
  alloc_->free(p);
  alloc_->release_stream(fresh);
  alloc_->backend().destroy_stream(fresh);
  ExpectValid();
}

TEST_P(FakeCudaRetireTest, BadInputIsRefusedNamingTheStream) {
  try {
    alloc_->release_stream(Stream{});
    ADD_FAILURE() << "released the default stream";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(absl::StrContains(e.what(), "release_stream(stream 0x0)")) << e.what();
  }
  BusyStream old(alloc_->backend());
  void* p = alloc_->allocate(kMiB);
  alloc_->release_stream(old.stream());
  try {
    alloc_->release_stream(old.stream());
    ADD_FAILURE() << "released a stream twice while its work runs";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(absl::StrContains(e.what(), "released already")) << e.what();
  }
  // record_stream on a handle being retired is refused too, changing nothing.
  try {
    alloc_->record_stream(p, old.stream());
    ADD_FAILURE() << "record_stream on a released stream";
  } catch (const InvalidArgumentError& e) {
    EXPECT_TRUE(absl::StrContains(e.what(), "record_stream")) << e.what();
  }
  old.destroy();
  old.release();
  alloc_->free(p);  // no use was recorded: free at once, not waiting for the retirement
  EXPECT_EQ(Pending(*alloc_), 0);
  ExpectValid();
}

INSTANTIATE_TEST_SUITE_P(Segments, FakeCudaRetireTest, fake_cuda_test::SegmentKinds(),
                         fake_cuda_test::SegmentKindName);

}  // namespace
}  // namespace devmem
