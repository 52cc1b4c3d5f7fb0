// allocator/device_pool_introspection.cc: DevicePool's read-only views: statistics,
// snapshots, allocation lookups, the messages for bad pointers and the OOM report.
// Each takes the device lock (or runs under it, for the *_report and describe_*
// helpers) and changes nothing but the statistics' peaks and totals when asked.
#include <algorithm>
#include <vector>
#include <string>

#include "absl/strings/str_format.h"
#include "allocator/arena_internal.h"
#include "allocator/device_pool.h"
#include "allocator/snapshot_walk.h"

namespace devmem::internal {

DeviceStats DevicePool::stats() const {
  MutexLock lock(&mu_);
  quiesce_for_read_locked();  // fold the thread caches' hits
  DeviceStats stats = acct_.stats();
  free_.summarize(&stats);
  private_stats_locked(&stats);
  stats.driver = backend_->driver_calls();  // a leaf lock of the backend's, if any
  return stats;
}

void DevicePool::reset_peak_stats() {
  MutexLock lock(&mu_);
  quiesce_for_read_locked();  // fold the thread caches' hits
  // The recycle trigger keeps its own high-water marks (StreamUse): resetting the
  // user's peak does not change how much is recycled.
  acct_.reset_peak();
}

void DevicePool::reset_accumulated_stats() {
  MutexLock lock(&mu_);
  quiesce_for_read_locked();  // fold the thread caches' hits
  acct_.reset_accumulated();
}

std::vector<SiteStats> DevicePool::site_stats() const {
  MutexLock lock(&mu_);
  quiesce_for_read_locked();  // fold the thread caches' hits
  return acct_.site_stats();
}

std::vector<SiteUsage> DevicePool::top_sites(size_t k) const {
  MutexLock lock(&mu_);
  quiesce_for_read_locked();  // fold the thread caches' hits
  return acct_.top_sites(k);
}

AllocatorSnapshot DevicePool::snapshot() const { return snapshot_impl(/*drain=*/true); }

AllocatorSnapshot DevicePool::segments_for_validation() const {
  return snapshot_impl(/*drain=*/false);
}

// The device lock is held only for a flat copy of the blocks' fields into arrays
// allocated (and their pages touched) before the lock is taken, sized by a brief first
// look under the lock. Blocks made between the two looks grow the arrays under the lock
// (correct, slower; the slack makes it rare). The segments' own vectors are built after
// the release. Why: the copy of 10^5 blocks held the lock ~35 ms growing a vector block
// by block and faulting its pages in; allocation stalls behind it (target <= 1 ms,
// scripts/bench_snapshot.sh).
//
// What remains under the lock is the walk of the segments' block lists, one dependent
// load per block: SnapshotWalk (allocator/snapshot_walk.h) cuts the lists at Blocks
// picked from the slabs in the first look (evenly spaced, their lines prefetched in
// between) and walks the pieces round-robin, many loads in flight at once.
AllocatorSnapshot DevicePool::snapshot_impl(bool drain) const {
  AllocatorSnapshot snap;
  snap.device = device_;
  snap.info = backend_->info();
  // A driver call, made before taking the lock (backends are thread-safe).
  snap.mem_info = backend_->mem_info();
  size_t segment_hint = 0;
  size_t block_hint = 0;
  std::unique_ptr<SnapshotWalk> kept;
  {
    MutexLock lock(&kept_walk_mu_);
    kept = std::move(kept_walk_);
  }
  if (kept == nullptr) kept = std::make_unique<SnapshotWalk>();
  SnapshotWalk& walk = *kept;
  {
    MutexLock lock(&mu_);
    segment_hint = segments_.size();
    // Allocated and pending blocks, and free ones; thread-cached blocks are within the
    // slack (a cache holds few), and draining them only merges blocks.
    block_hint = static_cast<size_t>(acct_.stats().active[kAggregatePool].current) +
                 free_.size();
    walk.pick_entries(free_);  // the slabs and pointers into them, no Block read: ~1 us
  }
  const size_t segment_room = segment_hint + segment_hint / 8 + 16;
  walk.reserve(block_hint + block_hint / 16 + segment_hint + 256, segment_room);
  walk.prefetch();  // the Blocks' lines, before the hold that reads them
  snap.segments.resize(segment_room);  // touched now, not first under the lock
  snap.segments.clear();
  {
    MutexLock lock(&mu_);
    const int64_t locked_ns = NowNs();
    const int64_t locked_cpu_ns = ThreadCpuNowNs();
    const int64_t locked_faults = ThreadFaults();
    if (drain) {
      drain_for_read_locked();  // no thread-cached block in a snapshot (snapshot.h)
    } else {
      quiesce_for_read_locked();  // the caches' hits folded; their blocks stay cached
    }
    snap.stats = acct_.stats();
    free_.summarize(&snap.stats);
    private_stats_locked(&snap.stats);
    snap.stats.driver = backend_->driver_calls();
    snap.time_ns = CoarseNowNs();
    for (const auto& [addr, s] : segments_) {
      SegmentInfo& info = snap.segments.emplace_back();
      info.addr = s->addr;
      info.size = s->size;
      info.stream = s->stream;
      info.small_pool = s->small_pool;
      info.expandable = s->expandable();
      if (s->private_pool != nullptr) info.private_pool = s->private_pool->id;
      walk.add_segment(s);
    }
    walk.walk();
    note_snapshot_lock_hold(NowNs() - locked_ns, ThreadCpuNowNs() - locked_cpu_ns,
                            ThreadFaults() - locked_faults);
  }
  std::vector<std::vector<BlockInfo>> blocks = walk.take();
  for (size_t i = 0; i < snap.segments.size(); ++i) {
    snap.segments[i].blocks = std::move(blocks[i]);
  }
  {
    MutexLock lock(&kept_walk_mu_);
    kept_walk_ = std::move(kept);  // empty again (take()); a concurrent one's, if any, goes
  }
  return snap;
}

SnapshotLockStats DevicePool::snapshot_lock_stats() const {
  SnapshotLockStats s;
  s.snapshots = snapshot_count_.load(std::memory_order_relaxed);
  s.last_ns = snapshot_lock_last_ns_.load(std::memory_order_relaxed);
  s.max_ns = snapshot_lock_max_ns_.load(std::memory_order_relaxed);
  s.last_cpu_ns = snapshot_lock_last_cpu_ns_.load(std::memory_order_relaxed);
  s.max_cpu_ns = snapshot_lock_max_cpu_ns_.load(std::memory_order_relaxed);
  s.last_faults = snapshot_lock_last_faults_.load(std::memory_order_relaxed);
  s.max_faults = snapshot_lock_max_faults_.load(std::memory_order_relaxed);
  return s;
}

namespace {
void StoreMax(std::atomic<int64_t>& max, int64_t v) {
  int64_t m = max.load(std::memory_order_relaxed);
  while (v > m && !max.compare_exchange_weak(m, v, std::memory_order_relaxed)) {
  }
}
}  // namespace

void DevicePool::note_snapshot_lock_hold(int64_t ns, int64_t cpu_ns, int64_t faults) const {
  snapshot_count_.fetch_add(1, std::memory_order_relaxed);
  snapshot_lock_last_ns_.store(ns, std::memory_order_relaxed);
  snapshot_lock_last_cpu_ns_.store(cpu_ns, std::memory_order_relaxed);
  snapshot_lock_last_faults_.store(faults, std::memory_order_relaxed);
  StoreMax(snapshot_lock_max_ns_, ns);
  StoreMax(snapshot_lock_max_cpu_ns_, cpu_ns);
  StoreMax(snapshot_lock_max_faults_, faults);
}

std::optional<BlockInfo> DevicePool::find_allocation(const void* ptr) const {
  MutexLock lock(&mu_);
  const Block* b = find_allocated_locked(reinterpret_cast<uintptr_t>(ptr));
  if (b == nullptr) return std::nullopt;
  return BlockInfo{b->addr, b->size, b->requested, b->state, b->stream, b->site,
                   b->alloc_time_ns};
}

void DevicePool::set_observer(AllocatorObserver* observer) {
  MutexLock lock(&mu_);
  acct_.set_observer(observer);
}

std::string DevicePool::describe_bad_pointer(const char* op, const void* ptr) const {
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  const std::string where = absl::StrFormat("devmem: %s(%p) on %s: ", op, ptr,
                                            device_.ToString());
  const Block* b = block_containing(addr);
  // One past the end of a live allocation (an end pointer passed by mistake): say so,
  // rather than calling it a double free of whatever starts there. No live allocation
  // starts at `addr` here, or free() would have found it.
  const Block* before = addr == 0 ? nullptr : block_containing(addr - 1);
  if (before != nullptr && before->state == BlockState::kAllocated &&
      before->addr + before->size == addr) {
    // A free or pending block may start there: then a double free of it reads the same,
    // and the message names both.
    return where + absl::StrFormat(
                       "not the start of a live allocation: one past the end of the "
                       "allocated block %p of %u bytes (an end pointer?)%s",
                       reinterpret_cast<void*>(before->addr), before->size,
                       b == nullptr || b->addr != addr
                           ? ""
                           : absl::StrFormat("; a %s block starts there, so if allocate() "
                                             "returned this pointer it is a double free",
                                             BlockStateName(b->state)));
  }
  if (b == nullptr) {
    return where + "not a pointer allocated by this allocator (no segment holds it)";
  }
  if (b->addr == addr) {
    return where + (b->state == BlockState::kPending
                        ? "the block was already freed and waits for other streams "
                          "(double free?)"
                        : "the block was already freed and is cached (double free?)");
  }
  if (b->state == BlockState::kAllocated) {
    return where + absl::StrFormat(
                       "interior pointer, %u bytes into the allocated block %p of %u "
                       "bytes; pass the pointer that allocate() returned",
                       addr - b->addr, reinterpret_cast<void*>(b->addr), b->size);
  }
  return where + absl::StrFormat("points into a %s block at %p (%u bytes), not into a "
                                 "live allocation",
                                 BlockStateName(b->state), reinterpret_cast<void*>(b->addr),
                                 b->size);
}

OomReport DevicePool::oom_report(size_t requested, size_t size, Stream stream,
                                 SiteId site) {
  OomReport report;
  OomReport* r = &report;
  size_t segment_size = 0;
  SegmentSizeFor(size, &segment_size);  // cannot fail: checked by allocate()
  // With expandable segments the last attempt was a map of the request's granules.
  if (expandable_ != nullptr) segment_size = RoundToGranule(size, expandable_->granularity());
  const MemInfo mi = backend_->mem_info();
  r->device = device_;
  r->stream = stream;
  r->site = site;
  r->requested_bytes = requested;
  r->rounded_bytes = size;
  r->segment_bytes = segment_size;
  r->device_total = mi.total_bytes;
  r->driver_free = mi.free_bytes;
  r->memory_limit = std::min(memory_limit(), mi.total_bytes);
  r->allocated = static_cast<size_t>(acct_.stats().allocated_bytes[kAggregatePool].current);
  r->reserved = static_cast<size_t>(acct_.stats().reserved_bytes[kAggregatePool].current);
  r->pending = static_cast<size_t>(acct_.stats().pending_bytes[kAggregatePool].current);
  r->reserved_unallocated = r->reserved - r->allocated;
  // From the free sets' counters, not a walk over their blocks.
  const size_t total_free =
      static_cast<size_t>(free_.free_bytes(true) + free_.free_bytes(false));
  r->largest_free_block = std::max(free_.largest_free(true), free_.largest_free(false));
  r->free_blocks = free_.size();
  r->fragmentation =
      total_free == 0 ? 0.0
                      : 1.0 - static_cast<double>(r->largest_free_block) /
                                  static_cast<double>(total_free);
  r->segment_count = segments_.size();
  {
    DeviceStats priv;
    private_stats_locked(&priv);
    r->private_pool_bytes = static_cast<size_t>(priv.private_reserved_bytes);
  }
  r->top_sites = acct_.top_sites(10);
  r->copy_bytes = acct_.copy_bytes();
  if (arena_hook_ != nullptr) arena_hook_->describe(r);
  ChooseRemedy(r, config_.max_split_size, expandable_ != nullptr,
               backend_->caps().virtual_memory && backend_->granularity() > 0);
  return report;
}

}  // namespace devmem::internal
