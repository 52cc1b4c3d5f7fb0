// allocator/block_states.h: the user-visible state changes of a DevicePool's blocks,
// each in one method that updates the containers and PoolAccounting together
// (internal).
//
// Every block state change and the one place that makes it:
//   free -> allocated          BlockStates::allocate (split first: FreeIndex::split)
//   allocated -> free/pending  BlockStates::free (pending: events queued, EventQueues)
//   pending -> free            BlockStates::complete_events
//   free + free -> free        FreeIndex::coalesce (merge), FreeIndex::split
//   mapped / unmapped bytes    ExpandableSegments (link_mapped, unmap_range)
//   segment allocated/freed    the segment sources (regular_segments.h, ...)
// Each of them reports to PoolAccounting in the same method, through the accounting
// method named for the change, so the statistics, site counters and trace cannot drift
// from the containers.
//
// Owns: the allocated table (address -> block, what free() looks up), the use clock
// (ticks once per allocation; Segment::last_used, garbage collection's age) and the
// free sequence (ticks once per block made free; Block::free_seq). Uses
// FreeIndex, EventQueues and PoolAccounting; does not own blocks or segments.
// Invariants (validate_block, validate_count): the allocated table holds exactly the
// allocated blocks; an allocated block's requested bytes are in (0, size]; a pending
// block waits for at least one event; free blocks are in their set and not adjacent.
//
// The hot path (allocate, free) is defined here so that it inlines into DevicePool.
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "allocator/backend.h"
#include "allocator/block.h"
#include "allocator/block_map.h"
#include "allocator/event_queues.h"
#include "allocator/free_index.h"
#include "allocator/poll_work.h"
#include "allocator/pool_accounting.h"

namespace devmem::internal {

// What validate_block counts besides the statistics.
struct BlockTally {
  size_t free_blocks = 0;
  size_t allocated_blocks = 0;         // in the allocated table
  size_t cache_owned_allocated = 0;    // handed out by a thread cache
  size_t thread_cached_blocks = 0;
  int64_t pending_events = 0;  // summed over pending blocks
  size_t deferred_blocks = 0;  // pending, their events deferred (a capture under way)
};

class BlockStates {
 public:
  using AllocatedTable = absl::flat_hash_map<uintptr_t, Block*>;

  BlockStates(FreeIndex& free, EventQueues& events, PoolAccounting& acct)
      : free_(free), events_(events), acct_(acct) {}
  BlockStates(const BlockStates&) = delete;
  BlockStates& operator=(const BlockStates&) = delete;

  // What may need host memory before an allocation changes anything: a slot in the
  // allocated table, the site's counters, a spare Block for the split (may throw
  // std::bad_alloc; changes nothing observable). The free sets' own nodes are the
  // exception: a btree insert that cannot allocate is not rolled back.
  void prepare_allocation(SiteId site) {
    allocated_.reserve(allocated_.size() + 1);
    acct_.reserve_site(site);
    free_.reserve_spare();
  }

  // free -> allocated: `b` (free, out of any set, >= size) is split to `size` when the
  // split rule says so and handed out for `requested` bytes from `site`.
  void allocate(Block* b, size_t size, size_t requested, SiteId site, size_t max_split_size) {
    const Block* const next = b->next;
    free_.split(b, size, max_split_size);
    if (b->next != next) b->next->free_seq = b->free_seq;  // the remainder was free as long
    b->state = BlockState::kAllocated;
    b->requested = requested;
    b->site = site;
    b->alloc_time_ns = CoarseNowNs();
    ++b->segment->busy_blocks;
    if (Reservation* r = b->segment->reservation) r->use->add(static_cast<int64_t>(b->size));
    allocated_.emplace(b->addr, b);
    ++use_clock_;
    acct_.block_allocated(b);
  }

  // allocated -> free (coalesced into its free set), or pending when other streams
  // used it. False, changing nothing, when `addr` is not a live allocation.
  // Transactional: a block used on other streams needs an event recorded on each and a
  // queue entry for each; if a record (or the memory for an entry) throws, the events
  // recorded so far are released and the block stays allocated, its stats and site
  // counts untouched, so the caller may free it again.
  bool free(uintptr_t addr) {
    auto it = allocated_.find(addr);
    if (it == allocated_.end()) return false;
    Block* b = it->second;
    // A block of a stream being retired waits for its retirement even unused elsewhere.
    const size_t queued = b->stream_uses.empty() && !events_.own_stream_retiring(b)
                              ? 0
                              : events_.enqueue(b);
    // Past this point nothing throws.
    allocated_.erase(it);
    acct_.block_freed_by_user(b);
    if (queued == 0) {  // no uses, or only on streams retired since (their work is done)
      make_free(b);
      return true;
    }
    // Used on other streams: the block may be reused only once each of those streams
    // has reached this point; the events recorded above (and retirements) say when.
    b->pending_events += static_cast<int>(queued);
    b->stream_uses.clear();
    b->state = BlockState::kPending;
    acct_.block_pending(b);
    return true;
  }

  // allocated -> pending without events yet: freed while a graph capture may be under
  // way, with record_stream uses (an event recorded in a capture cannot be queried, so
  // none is recorded now; record_deferred_events records them later). False, changing
  // nothing, when `addr` is not a live allocation; may throw std::bad_alloc, changing
  // nothing.
  bool free_deferring_events(uintptr_t addr) {
    auto it = allocated_.find(addr);
    if (it == allocated_.end()) return false;
    Block* b = it->second;
    deferred_.reserve(deferred_.size() + 1);
    allocated_.erase(it);
    acct_.block_freed_by_user(b);
    b->state = BlockState::kPending;
    b->events_deferred = true;
    acct_.block_pending(b);
    deferred_.push_back(b);
    publish_deferred();
    return true;
  }
  bool has_deferred() const { return !deferred_.empty(); }
  // Records the events of the deferred blocks for which `ready(b)` (none of its streams
  // captures any more) and queues them: they are then pending as any cross-stream free.
  // A record that throws leaves that block deferred and propagates.
  template <typename Ready>
  void record_deferred_events(Ready&& ready) {
    for (size_t i = 0; i < deferred_.size();) {
      Block* b = deferred_[i];
      if (!ready(b)) {
        ++i;
        continue;
      }
      // 0 only when every stream it waited for was retired meanwhile.
      const size_t queued = events_.enqueue(b);
      deferred_[i] = deferred_.back();
      deferred_.pop_back();
      publish_deferred();
      b->events_deferred = false;
      b->pending_events += static_cast<int>(queued);
      b->stream_uses.clear();
      if (queued == 0) {
        acct_.block_free_completed(b);
        make_free(b);
      }
    }
  }

  // pending -> free for every block whose events completed (with `wait`: synchronizes
  // every queued event first, so none stays pending), polling at most `budget` events.
  void complete_events(bool wait, size_t budget) {
    events_.poll(wait, budget, [this](Block* b) {
      if (b->retired_cache) [[unlikely]] {
        b->retired_cache = false;
        acct_.block_retire_completed(b);
      } else {
        acct_.block_free_completed(b);
      }
      make_free(b);
    });
  }

  // --- stream retirement (allocator/stream_retire.h, device_pool_retire.cc) -----------
  // free -> pending: a free block of a stream being retired leaves its free set and
  // waits for the retirement's event, so that no other stream given the handle gets
  // it first. Room for the wait was made (StreamRetirements::begin); never throws.
  void retire_free_block(Block* b) {
    free_.erase(b);
    b->state = BlockState::kPending;
    b->retired_cache = true;
    b->pending_events = 1;
    ++b->segment->busy_blocks;
    if (Reservation* r = b->segment->reservation) r->use->add(static_cast<int64_t>(b->size));
    acct_.block_retiring(b);
    events_.retirements().add_wait(b->stream, b);
  }
  // A pending block of a stream being retired also waits for the retirement's event
  // (its own events are on other streams: it would be free before the stream's work).
  void retire_pending_block(Block* b) {
    ++b->pending_events;
    events_.retirements().add_wait(b->stream, b);
  }

  // The allocated block starting at `addr`, or nullptr.
  Block* allocated(uintptr_t addr) const {
    auto it = allocated_.find(addr);
    return it == allocated_.end() ? nullptr : it->second;
  }
  const AllocatedTable& allocated_table() const { return allocated_; }
  uint64_t now() const { return use_clock_; }
  // The free sequence number: ticks each time a block becomes free (Block::free_seq).
  uint64_t free_seq() const { return free_seq_; }

  // --- thread caches (allocator/thread_cache.h, device_pool_tcache.cc) ----------------
  // The map of cache-owned blocks, for validate_block (set once by DevicePool).
  void set_cache_map(const BlockMap* map) { cache_map_ = map; }
  // Where has_deferred() is published (PollWork::kDeferredEvents, allocator/poll_work.h),
  // at each change of the deferred list; null: nowhere. Set once, before use.
  void set_poll_work(PollWork* work) {
    poll_work_ = work;
    publish_deferred();
  }
  // allocated (in the table) -> thread-cached: the user freed it into a thread cache.
  void allocated_to_thread_cache(Block* b) {
    allocated_.erase(b->addr);
    acct_.block_freed_by_user(b);
    acct_.block_inactive(b);
    acct_.block_to_thread_cache(b);
    b->state = BlockState::kThreadCached;
  }
  // A cache-owned allocated block leaves the caches: into the allocated table, to be
  // freed by free() next (may throw std::bad_alloc, changing nothing).
  void cache_owned_to_table(Block* b) { allocated_.emplace(b->addr, b); }
  // thread-cached -> free (coalesced into its free set). The block is free in stream
  // order since the user freed it into the cache, which happened after its last
  // free_seq (taken before it was last allocated) and at the latest now: it gets a new
  // one, as make_free gives, so that a deferred recycle whose event was recorded in
  // between (expandable_segments.h) does not count it free since before the event.
  void thread_cached_to_free(Block* b) {
    acct_.block_from_thread_cache(b);
    b->tc_next = nullptr;
    b->free_seq = ++free_seq_;
    become_free(b);
  }

  // This part's share of validate(): `b`, a block of a segment, against the allocated
  // table and its state's rules; adds it to the recount and the tally.
  absl::Status validate_block(const Block* b, StatRecount* rc, BlockTally* tally) const;
  // ... and the allocated table holds no other blocks than the `allocated_blocks`, nor
  // the deferred list other than the `deferred_blocks`.
  absl::Status validate_count(size_t allocated_blocks, size_t deferred_blocks = 0) const;

 private:
  // A user-freed or completed block (out of any set) becomes free and coalesces.
  void make_free(Block* b) {
    acct_.block_inactive(b);
    b->stream_uses.clear();
    b->free_seq = ++free_seq_;  // see become_free
    become_free(b);
  }
  // What every way back into the free sets shares (make_free, thread_cached_to_free):
  // the user's fields reset, the segment's and the stream's use counts, the coalesce.
  // The caller has given `b` a new free_seq: coalesce keeps b's, so the merged block
  // is as recent as its newest part (a block whose free_seq were older than the user's
  // free could be unmapped by a recycle while work queued after its event uses it).
  void become_free(Block* b) {
    Segment* s = b->segment;
    b->state = BlockState::kFree;
    b->requested = 0;
    b->site = kUnknownSite;
    b->alloc_time_ns = 0;
    --s->busy_blocks;
    if (Reservation* r = s->reservation) r->use->add(-static_cast<int64_t>(b->size));
    free_.coalesce(b);
    if (s->busy_blocks == 0) s->last_used = use_clock_;
  }

  FreeIndex& free_;
  EventQueues& events_;
  PoolAccounting& acct_;
  AllocatedTable allocated_;
  uint64_t use_clock_ = 0;
  uint64_t free_seq_ = 0;
  const BlockMap* cache_map_ = nullptr;
  void publish_deferred() {
    if (poll_work_ != nullptr) poll_work_->set(PollWork::kDeferredEvents, !deferred_.empty());
  }

  // Pending blocks whose events wait for the end of a capture (free_deferring_events).
  std::vector<Block*> deferred_;
  PollWork* poll_work_ = nullptr;
};

}  // namespace devmem::internal
