// allocator/device_pool.cc: the caching policy of one device (see device_pool.h and the
// policy summary in caching_allocator.h).
#include "allocator/device_pool.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_format.h"
#include "allocator/arena_internal.h"
#include "allocator/errors.h"
#include "allocator/release_fence.h"
#include "allocator/segment_kind_policy.h"

namespace devmem::internal {
namespace {

std::unique_ptr<ExpandableSegments> MakeExpandable(Backend& backend, const Config& config,
                                                   size_t device_total, SegmentTable& table,
                                                   FreeIndex& free, PoolAccounting& acct,
                                                   DriverInFlight& in_flight) {
  const SegmentKindDecision kind = DecideSegmentKind(
      config.expandable_segments,
      backend.caps().virtual_memory && backend.granularity() > 0, backend.sharing());
  if (kind.kind != SegmentKind::kExpandable) return nullptr;
  return std::make_unique<ExpandableSegments>(backend, device_total, backend.granularity(),
                                              config.expandable_recycle_threshold, table,
                                              free, acct, in_flight);
}

}  // namespace

DevicePool::DevicePool(std::unique_ptr<Backend> backend, const Config& config)
    : backend_(std::move(backend)),
      device_(backend_->device()),
      config_(config),
      device_total_(backend_->mem_info().total_bytes),
      memory_fraction_(config.per_process_memory_fraction),
      events_(*backend_),
      acct_(device_, config.max_split_size),
      free_(acct_),
      blocks_(free_, events_, acct_),
      regular_(*backend_, config.max_split_size, segments_, free_, acct_, in_flight_),
      expandable_(MakeExpandable(*backend_, config, device_total_, segments_, free_, acct_,
                                 in_flight_)),
      reclaimer_(segments_, regular_, expandable_.get(), &mu_) {
  blocks_.set_cache_map(&block_map_);  // thread caches (device_pool_tcache.cc)
  // Released streams (device_pool_retire.cc): memory waits for their retirement events.
  regular_.set_retirements(&events_.retirements());
  if (expandable_ != nullptr) expandable_->set_retirements(&events_.retirements());
  // The events a release waits for and proactive recycling's come from the device's
  // pool (event_pool.h), not one cudaEventCreate/Destroy each.
  regular_.set_event_pool(&events_.pool());
  if (expandable_ != nullptr) expandable_->set_event_pool(&events_.pool());
  // Each part that queues work for poll_locked says whether it has any, so that
  // process_events() can skip the lock when none has (allocator/poll_work.h).
  events_.set_poll_work(&poll_work_);
  blocks_.set_poll_work(&poll_work_);
  if (expandable_ != nullptr) expandable_->set_poll_work(&poll_work_);
  if (config.expandable_segments == ExpandableMode::kOn && expandable_ == nullptr) {
    std::fprintf(stderr,
                 "devmem: %s: expandable_segments:true needs virtual memory management, "
                 "which this backend (%s) does not offer; using regular segments\n",
                 device_.ToString().c_str(), backend_->info().backend.c_str());
  }
}

DevicePool::~DevicePool() {
  detach_thread_caches();  // before the blocks go (device_pool_tcache.cc)
  MutexLock lock(&mu_);
  // A destructor must not throw: a driver error here poisons the pool, and a poisoned
  // pool makes no driver call at all (each would fail the same way): what it holds
  // on the device goes with the process.
  try {
    if (!poisoned()) process_events_locked(/*wait=*/true);
  } catch (const DriverError& e) {
    poison("~CachingAllocator", e.what());
  }
  // Allocated blocks: those in the allocated table and those thread caches handed out.
  size_t leaked = 0;
  size_t bytes = 0;
  for (const auto& [addr, s] : segments_) {
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      if (b->state == BlockState::kAllocated) {
        ++leaked;
        bytes += b->size;
      }
    }
  }
  if (leaked != 0) {
    std::fprintf(stderr,
                 "devmem: %s: allocator destroyed with %zu blocks (%zu bytes) still "
                 "allocated; their memory is released anyway\n",
                 device_.ToString().c_str(), leaked, bytes);
  }
  // As everywhere memory goes back to the device: wait for work queued on the
  // segments' streams first (once per stream).
  std::vector<uintptr_t> synced;
  std::vector<Segment*> all;
  all.reserve(segments_.size());
  for (const auto& [addr, s] : segments_) {
    all.push_back(s);
    if (poisoned()) continue;
    if (std::find(synced.begin(), synced.end(), s->stream.handle) == synced.end()) {
      try {
        // Never a released (destroyed) stream: its retirement completed above.
        events_.retirements().synchronize_for_release(s->stream);
      } catch (const DriverError& e) {
        poison("~CachingAllocator", e.what());
      }
      synced.push_back(s->stream.handle);
    }
  }
  // Each source gives its segments back (a poisoned pool only forgets them);
  // ExpandableSegments' destructor then releases the address ranges.
  if (poisoned() && !all.empty()) {
    std::fprintf(stderr,
                 "devmem: %s: allocator destroyed after a driver error; its %zu "
                 "segments are not given back to the broken device\n",
                 device_.ToString().c_str(), all.size());
  }
  for (Segment* s : all) {
    SegmentSource& source =
        s->expandable() ? static_cast<SegmentSource&>(*expandable_) : regular_;
    if (!poisoned()) {
      try {
        source.destroy(s);
        continue;
      } catch (const DriverError& e) {
        poison("~CachingAllocator", e.what());  // this segment, and the rest, forgotten
      }
    }
    source.destroy(s, /*give_back_memory=*/false);
  }
  // Nor are the address ranges (ExpandableSegments' destructor would release them).
  if (poisoned() && expandable_ != nullptr) expandable_->forget_driver_state();
}

// --- allocation ---------------------------------------------------------------------

void* DevicePool::allocate(size_t requested, Stream stream, SiteId site) {
  if (requested == 0) return nullptr;
  size_t size;
  size_t segment_size;
  if (!RoundSize(requested, &size) || !SegmentSizeFor(size, &segment_size)) {
    throw InvalidArgumentError(absl::StrFormat(
        "devmem: allocate(%u bytes) on %s: the size overflows when rounded up to "
        "the allocator's granule",
        requested, device_.ToString()));
  }
  std::optional<OomReport> report;  // built on the failure path only
  std::vector<SiteStats> site_live;  // with it: every site's exact live bytes
  AllocatorObserver* observer;
  {
    MutexLock lock(&mu_);
    fold_own_cache_locked();  // this thread's cache hits first: exact peaks
    // The bounded poll first: completed recycles unmap with the lock released, which
    // another thread may use to take what prepare_allocation sets aside.
    poll_locked(kAllocationEventPollBudget);
    // What may need host memory comes before the allocation's first change, so that a
    // std::bad_alloc leaves the pool as it was (polling changed only what completed).
    blocks_.prepare_allocation(site);
    // A released stream's handle serves allocations again only once the old stream's
    // work completed (device_pool_retire.cc).
    if (!events_.retirements().empty()) [[unlikely]] claim_stream_locked(stream, "allocate");
    // While a private pool is allocated to, the streams its filter takes use only its
    // memory (device_pool_private.cc).
    PrivatePool* const pool =
        privates_.any_underway() ? privates_.route(stream) : nullptr;
    Block* b = pool != nullptr
                   ? free_.take_best_fit_private(*pool, size, stream, config_.max_split_size)
                   : free_.take_best_fit(size, stream, config_.max_split_size);
    if (b != nullptr) {
      acct_.count_cache_hit();
    } else {
      b = pool != nullptr ? grow_during_capture_locked(size, stream, pool)
                          : new_segment_with_retry(size, stream);
      // The lock may have been released around driver calls (grows, reclaims), and
      // another thread may have used the spare Block or the table slot: make sure of
      // them again. `b` is free and out of any set; on failure it goes back to its set.
      if (b != nullptr) {
        try {
          blocks_.prepare_allocation(site);
        } catch (...) {
          free_.insert(b);
          throw;
        }
      }
    }
    if (b != nullptr) {
      blocks_.allocate(b, size, requested, site, config_.max_split_size);
      return reinterpret_cast<void*>(b->addr);
    }
    report.emplace(oom_report(requested, size, stream, site));
    site_live = acct_.site_stats();  // exact: bounds the sampled stacks' estimates
    acct_.out_of_memory(stream, size, requested, site);
    observer = acct_.observer();
  }
  // Outside the lock: symbolizing the sampled stacks reads the binary's symbol table,
  // and the observer may write a dump file.
  AttachTopStacks(sample_owner_, site_live, &*report);
  if (observer != nullptr) observer->on_oom(*report);
  throw OutOfMemoryError(std::move(*report));
}

Block* DevicePool::new_segment_with_retry(size_t size, Stream stream) {
  // No stage below but growing is allowed during a capture (device_pool_private.cc).
  if (capturing_locked(stream)) return grow_during_capture_locked(size, stream, nullptr);
  // From here on the lock may be released for driver calls (grows, releases, unmaps):
  // no capture begins until this is done (begin_allocate_to_pool).
  const DriverInFlight::Operation op(in_flight_);
  const bool small = IsSmall(size);
  size_t segment_size = 0;
  SegmentSizeFor(size, &segment_size);  // cannot fail: checked by allocate()
  if (config_.garbage_collection_threshold > 0) {
    const size_t allowed = std::min(memory_limit(), device_total_);
    const size_t threshold = GcThresholdBytes(config_.garbage_collection_threshold, allowed);
    if (const size_t over = GcReclaimBytes(threshold, reserved_bytes(), segment_size);
        over > 0) {
      reclaimer_.reclaim(over, Urgency::kGarbageCollect);
    }
  }
  for (const RetryStage stage : kRetryOrder) {
    size_t grow_size = segment_size;
    switch (stage) {
      case RetryStage::kGrow:
        break;
      case RetryStage::kReleaseForSegment:
        // First every thread's cache (an OOM must not happen while one holds enough),
        // then cached segments nobody uses (no waiting), enough for this one.
        if (drain_thread_caches_locked() > 0) {
          if (Block* b = free_.take_best_fit(size, stream, config_.max_split_size)) {
            acct_.count_cache_hit();
            return b;
          }
        }
        // The arenas' empty retained chunks pin segments: free them first.
        take_back_arena_chunks();
        if (reclaimer_.reclaim(segment_size, Urgency::kRetryRelease) == 0) continue;
        break;
      case RetryStage::kWaitAndReleaseAll:
        // Wait for every pending cross-stream free, release every unused segment, and
        // try once more. Waiting may have made a cached block on this stream fit.
        acct_.count_alloc_retry();
        if (!events_.empty()) {
          acct_.count_sync_all_streams();
          wait_for_events_locked();
          if (Block* b = free_.take_best_fit(size, stream, config_.max_split_size)) {
            acct_.count_cache_hit();
            return b;
          }
        }
        release_private_pools_locked();  // released graphs' pools hold memory too
        reclaimer_.reclaim(SIZE_MAX, Urgency::kRetryWaitAll);
        // Memory other threads are giving back with the lock released must not make
        // this allocation fail, so it is waited for here, last: each step above that
        // released the lock (the fence wait for the cross-stream frees, this stage's
        // own releases) let another thread's trim, empty_cache or retry start one (a
        // wait before them missed those: the grow then saw the bytes still in flight
        // against the limit and reported an OOM). Once this returns none of those is
        // in flight, and the grow below checks the limit in the same lock hold (and
        // waits for later ones, should it fail while they are in flight).
        if (Block* b = wait_for_give_backs_locked(size, stream)) return b;
        break;
      case RetryStage::kExactSegment:
        // Last resort for the large pool: a segment of just the request (rounded to
        // 2 MiB) when the standard 20 MiB one does not fit in what the device has
        // left. Kept last because small segments fragment the device; it is only ever
        // worth an OOM.
        grow_size = ExactSegmentSize(size, segment_size);
        if (grow_size == 0) continue;
        // Stage 2's grow may have released the lock (a driver call that failed).
        if (Block* b = wait_for_give_backs_locked(size, stream)) return b;
        break;
    }
    // The grow, and for the stages that waited: again while it fails and memory is
    // still coming back, i.e. others began giving some back after that wait (in flight,
    // it counts against the limit, so it may be what the grow lacks) or some came back
    // while the grow's driver call ran with the lock released. Each wait is only for the
    // give-backs begun before it (DriverInFlight's generations): a stream of other
    // threads' trims and releases holds this thread off only while its grow fails for
    // want of their memory. It ends with a block, or with a grow that failed while
    // nothing was in flight or came back (the OOM); the rounds are not capped
    // (driver_in_flight.h says why).
    const bool waits =
        stage == RetryStage::kWaitAndReleaseAll || stage == RetryStage::kExactSegment;
    for (;;) {
      const uint64_t ended = in_flight_.give_backs_ended();
      Block* b = stage == RetryStage::kExactSegment
                     ? regular_.grow(grow_request(size, grow_size, small, stream)).block
                     : try_grow(size, grow_size, small, stream);
      if (b != nullptr) {
        acct_.count_cache_miss();
        return b;
      }
      if (!waits) break;
      if (in_flight_.give_back_bytes() > 0) {
        if (Block* c = wait_for_give_backs_locked(size, stream)) return c;
      } else if (in_flight_.give_backs_ended() == ended) {
        break;
      } else if (Block* c = free_.take_best_fit(size, stream, config_.max_split_size)) {
        acct_.count_cache_hit();  // freed by another thread while the grow ran
        return c;
      }
    }
  }
  return nullptr;
}

Block* DevicePool::wait_for_give_backs_locked(size_t size, Stream stream) {
  if (in_flight_.give_back_bytes() == 0) return nullptr;
  in_flight_.wait_for_give_backs(&mu_);
  // The lock was released: another thread's free may have made a cached block fit.
  Block* b = free_.take_best_fit(size, stream, config_.max_split_size);
  if (b != nullptr) acct_.count_cache_hit();
  return b;
}

size_t DevicePool::memory_limit() const {
  return MemoryLimit(memory_fraction_, device_total_);
}

GrowRequest DevicePool::grow_request(size_t size, size_t segment_size, bool small,
                                     Stream stream) const {
  GrowRequest req{size, segment_size, small, stream, memory_limit(), blocks_.now(),
                  blocks_.free_seq()};
  req.lock = &mu_;
  return req;
}

Block* DevicePool::try_grow(size_t size, size_t segment_size, bool small, Stream stream) {
  const GrowRequest req = grow_request(size, segment_size, small, stream);
  if (expandable_ != nullptr) {
    const Grown g = expandable_->grow(req);
    if (g.block != nullptr || !g.no_room) return g.block;
    // No reservation, or no unmapped gap of it can hold the request (one larger than
    // the device total, or a small-pool range that filled): fall back to a regular
    // segment, asked for as things are now (the lock may have been released).
    return regular_.grow(grow_request(size, segment_size, small, stream)).block;
  }
  return regular_.grow(req).block;
}

// --- free ---------------------------------------------------------------------------

void DevicePool::free(void* ptr) {
  if (ptr == nullptr) return;
  MutexLock lock(&mu_);
  free_locked(ptr);
}

void DevicePool::free_locked(void* ptr) {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  if (const Block* b = blocks_.allocated(addr);
      b != nullptr && !b->stream_uses.empty() && defer_events_locked(b)) [[unlikely]] {
    blocks_.free_deferring_events(addr);
    return;
  }
  if (!blocks_.free(addr)) {
    throw InvalidArgumentError(describe_bad_pointer("free", ptr));
  }
}

void DevicePool::record_stream(void* ptr, Stream stream) {
  MutexLock lock(&mu_);
  Block* b = find_allocated_locked(reinterpret_cast<uintptr_t>(ptr));
  if (b == nullptr) {
    throw InvalidArgumentError(describe_bad_pointer("record_stream", ptr));
  }
  if (stream == b->stream) return;  // stream order already protects it
  claim_stream_locked(stream, "record_stream");  // not a stream being released
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) ==
      b->stream_uses.end()) {
    b->stream_uses.push_back(stream);
  }
}

void DevicePool::process_events() {
  poll_calls_.fetch_add(1, std::memory_order_relaxed);
  // Nothing queued: nothing for poll_locked to do, so no lock. A source that queues
  // work concurrently publishes it under the lock; this call then acts as one that took
  // the lock just before it did, and the next call sees it (poll_work.h argues the
  // ordering).
  if (!poll_work_.any()) return;
  poll_locked_.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(&mu_);
  poll_locked(kPollAllEvents);
}

void DevicePool::set_poll_counter(std::atomic<int64_t>* counter) {
  MutexLock lock(&mu_);
  poll_work_.attach(counter);
}

// --- giving memory back (the Reclaimer decides what goes) ------------------------------

void DevicePool::empty_cache() {
  MutexLock lock(&mu_);
  drain_thread_caches_locked();
  // During a capture nothing may be waited for or given back (it would break the
  // capture): the thread caches are all that empty_cache does then.
  if (privates_.any_underway()) return;
  const DriverInFlight::Operation op(in_flight_);  // as new_segment_with_retry
  if (blocks_.has_deferred()) record_deferred_events_locked();
  if (!events_.empty()) wait_for_events_locked();
  release_private_pools_locked();
  reclaimer_.reclaim(SIZE_MAX, Urgency::kEmptyCache);
  // The events kept for reuse are cached driver objects too (the releases above just
  // recycled their fences' into the pool): none is left behind.
  events_.pool().release_kept();
}

void DevicePool::wait_for_events_locked() {
  // One event of the pool's own per stream with queued events, recorded now, under
  // the lock: it completes after every event queued on that stream before it (a
  // stream runs its work in order), so waiting for it is waiting for them. Recorded
  // under the lock because a stream is named to the driver only while release_stream
  // is kept out (release_fence.h); the queued events themselves are not waited for
  // with the lock released, since a poll on another thread may recycle them meanwhile
  // (and the pool record them again for another free).
  //
  // With the lock released: other threads allocate, free, poll and complete events
  // (which may complete some of the blocks this call waits for: fine, the poll below
  // finds fewer); a capture cannot begin (the caller's Operation), so the poll below
  // is still allowed to query. Nothing this call prepared is used after it: the poll
  // walks the queues as they are then.
  std::vector<Stream> streams;
  const bool all_live = events_.queued_streams(&streams);
  ReleaseFence fence(*backend_, &events_.pool(), &events_.retirements());
  fence.record(streams);  // may throw (a DriverError): the destructor gives them back
  {
    ScopedUnlock unlocked(&mu_);
    fence.wait();
  }
  fence.finish();
  // Queries only (each event queued before the fence has completed). A block waiting
  // for a retirement's event, or for an event on a stream released since its free,
  // cannot be fenced (the stream may be destroyed): those are waited for here, under
  // the lock, as before (a stream released while such frees are in flight is rare, and
  // the wait is for that stream's work only). The same for a stream released while
  // the lock was released (retiring now): its blocks queued before also wait for its
  // retirement event, recorded after the fence, which only a wait completes here (as
  // it would have, had release_stream come first).
  process_events_locked(/*wait=*/!all_live || events_.retirements().retiring() != 0);
}

void DevicePool::trim(size_t keep_bytes) {
  MutexLock lock(&mu_);
  drain_thread_caches_locked();
  if (privates_.any_underway()) return;  // as empty_cache
  const DriverInFlight::Operation op(in_flight_);
  if (!events_.empty()) process_events_locked(/*wait=*/false);
  // Compared as size_t: keep_bytes may be anything up to SIZE_MAX ("keep everything"),
  // which an int64_t would read as -1. cached_bytes() is never negative.
  const size_t cached = static_cast<size_t>(acct_.stats().cached_bytes());
  if (cached > keep_bytes) reclaimer_.reclaim(cached - keep_bytes, Urgency::kTrim);
}

absl::Status DevicePool::set_memory_fraction(double fraction) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "per_process_memory_fraction %g is not in (0, 1]", fraction));
  }
  MutexLock lock(&mu_);
  memory_fraction_ = fraction;
  return absl::OkStatus();
}

}  // namespace devmem::internal
