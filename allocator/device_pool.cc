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

namespace devmem::internal {
DevicePool::DevicePool(std::unique_ptr<Backend> backend, const Config& config)
    : backend_(std::move(backend)),
      device_(backend_->device()),
      config_(config),
      device_total_(backend_->mem_info().total_bytes),
      use_expandable_(config.expandable_segments != ExpandableMode::kOff &&
                      backend_->caps().virtual_memory && backend_->granularity() > 0),
      recycle_threshold_(config.expandable_recycle_threshold),
      granularity_(backend_->caps().virtual_memory ? backend_->granularity() : 0),
      memory_fraction_(config.per_process_memory_fraction),
      acct_(device_, config.max_split_size),
      free_(acct_) {
  if (config.expandable_segments == ExpandableMode::kOn && !use_expandable_) {
    std::fprintf(stderr,
                 "devmem: %s: expandable_segments:true needs virtual memory management, "
                 "which this backend (%s) does not offer; using regular segments\n",
                 device_.ToString().c_str(), backend_->info().backend.c_str());
  }
}

DevicePool::~DevicePool() {
  MutexLock lock(&mu_);
  process_events_locked(/*wait=*/true);
  if (!allocated_.empty()) {
    size_t bytes = 0;
    for (const auto& [addr, b] : allocated_) bytes += b->size;
    std::fprintf(stderr,
                 "devmem: %s: allocator destroyed with %zu blocks (%zu bytes) still "
                 "allocated; their memory is released anyway\n",
                 device_.ToString().c_str(), allocated_.size(), bytes);
  }
  // As everywhere memory goes back to the device: wait for work queued on the
  // segments' streams first (once per stream).
  std::vector<uintptr_t> synced;
  for (const auto& [addr, s] : segments_) {
    if (std::find(synced.begin(), synced.end(), s->stream.handle) == synced.end()) {
      backend_->synchronize_stream(s->stream);
      synced.push_back(s->stream.handle);
    }
  }
  for (auto& [addr, s] : segments_) {
    if (s->expandable()) {
      backend_->unmap(reinterpret_cast<void*>(s->addr), s->size);
    } else {
      backend_->free_segment(reinterpret_cast<void*>(s->addr), s->size);
    }
    for (Block* b = s->head; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    delete s;
  }
  segments_.clear();
  for (auto& [key, r] : expandable_) {
    backend_->release_address(reinterpret_cast<void*>(r->addr), r->va_size);
    delete r;
  }
  expandable_.clear();
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
  OomReport report;
  AllocatorObserver* observer;
  {
    MutexLock lock(&mu_);
    // What may need host memory comes before the first change: a slot in allocated_,
    // the site's counters, and a spare Block for the split, so that a std::bad_alloc
    // leaves the pool as it was (the free sets' own nodes are the exception: a btree
    // insert that cannot allocate is not rolled back).
    allocated_.reserve(allocated_.size() + 1);
    acct_.reserve_site(site);
    free_.reserve_spare();
    if (!events_.empty()) process_events_locked(/*wait=*/false);
    Block* b = free_.take_best_fit(size, stream, config_.max_split_size);
    if (b != nullptr) {
      acct_.count_cache_hit();
    } else {
      b = new_segment_with_retry(requested, size, stream, site, &report);
    }
    if (b != nullptr) {
      free_.split(b, size, config_.max_split_size);
      b->state = BlockState::kAllocated;
      b->requested = requested;
      b->site = site;
      b->alloc_time_ns = CoarseNowNs();
      ++b->segment->busy_blocks;
      allocated_.emplace(b->addr, b);
      ++use_clock_;
      acct_.block_allocated(b);
      return reinterpret_cast<void*>(b->addr);
    }
    acct_.out_of_memory(stream, size, requested, site);
    observer = acct_.observer();
  }
  // Outside the lock: the observer may write a dump file.
  if (observer != nullptr) observer->on_oom(report);
  throw OutOfMemoryError(std::move(report));
}

Block* DevicePool::new_segment_with_retry(size_t requested, size_t size, Stream stream,
                                          SiteId site, OomReport* report) {
  const bool small = IsSmall(size);
  size_t segment_size = 0;
  SegmentSizeFor(size, &segment_size);  // cannot fail: checked by allocate()
  if (config_.garbage_collection_threshold > 0) garbage_collect(segment_size);
  for (const RetryStage stage : kRetryOrder) {
    size_t grow_size = segment_size;
    switch (stage) {
      case RetryStage::kGrow:
        break;
      case RetryStage::kReleaseForSegment:
        // Give back cached segments nobody uses (no waiting), enough for this one,
        // after freeing the arenas' empty retained chunks, which pin segments.
        take_back_arena_chunks();
        if (release_unused(segment_size) == 0) continue;
        break;
      case RetryStage::kWaitAndReleaseAll:
        // Wait for every pending cross-stream free, release every unused segment, and
        // try once more. Waiting may have made a cached block on this stream fit.
        acct_.count_alloc_retry();
        if (!events_.empty()) {
          acct_.count_sync_all_streams();
          process_events_locked(/*wait=*/true);
          if (Block* b = free_.take_best_fit(size, stream, config_.max_split_size)) {
            acct_.count_cache_hit();
            return b;
          }
        }
        release_unused(SIZE_MAX);
        break;
      case RetryStage::kExactSegment:
        // Last resort for the large pool: a segment of just the request (rounded to
        // 2 MiB) when the standard 20 MiB one does not fit in what the device has
        // left. Kept last because small segments fragment the device; it is only ever
        // worth an OOM.
        grow_size = ExactSegmentSize(size, segment_size);
        if (grow_size == 0) continue;
        break;
    }
    Block* b = stage == RetryStage::kExactSegment
                   ? try_new_segment(size, grow_size, small, stream)
                   : try_grow(size, grow_size, small, stream);
    if (b != nullptr) {
      acct_.count_cache_miss();
      return b;
    }
  }
  // With expandable segments the last attempt was a map of the request's granules.
  fill_oom_report(requested, size, use_expandable_ ? round_to_granule(size) : segment_size,
                  stream, site, report);
  return nullptr;
}

size_t DevicePool::memory_limit() const {
  return MemoryLimit(memory_fraction_, device_total_);
}

Block* DevicePool::try_grow(size_t size, size_t segment_size, bool small, Stream stream) {
  if (use_expandable_) {
    if (Reservation* r = reservation(stream, small)) {
      bool va_full = false;
      Block* b = try_expand(r, size, &va_full);
      if (b != nullptr || !va_full) return b;
      // No unmapped gap of the reserved range can hold it (a request larger than the
      // device total, or a small-pool range that filled): fall back to a regular
      // segment.
    }
  }
  return try_new_segment(size, segment_size, small, stream);
}

Block* DevicePool::try_new_segment(size_t size, size_t segment_size, bool small,
                                   Stream stream) {
  const size_t reserved = static_cast<size_t>(acct_.stats().reserved_bytes[kAggregatePool].current);
  const size_t limit = memory_limit();
  if (segment_size > limit || reserved > limit - segment_size) return nullptr;
  absl::StatusOr<void*> p = backend_->allocate_segment(segment_size);
  if (!p.ok()) {
    if (absl::IsResourceExhausted(p.status())) return nullptr;
    // A driver failure that is not about memory: nothing was changed, say what broke.
    throw std::runtime_error(absl::StrFormat("devmem: %s: segment allocation of %u bytes "
                                             "failed: %s",
                                             device_.ToString(), segment_size,
                                             p.status().ToString()));
  }
  auto* s = new Segment;
  s->addr = reinterpret_cast<uintptr_t>(*p);
  s->size = segment_size;
  s->stream = stream;
  s->small_pool = small;
  s->oversize = IsOversizeRequest(size, config_.max_split_size);
  Block* b = free_.new_block();
  b->addr = s->addr;
  b->size = segment_size;
  b->segment = s;
  b->stream = stream;
  b->state = BlockState::kFree;
  s->head = b;
  s->tail = b;
  segments_.emplace(s->addr, s);
  acct_.segment_allocated(s);
  return b;
}

// --- free ---------------------------------------------------------------------------

void DevicePool::free(void* ptr) {
  if (ptr == nullptr) return;
  const auto addr = reinterpret_cast<uintptr_t>(ptr);
  MutexLock lock(&mu_);
  auto it = allocated_.find(addr);
  if (it == allocated_.end()) {
    throw InvalidArgumentError(describe_bad_pointer("free", ptr));
  }
  Block* b = it->second;
  // Transactional: what can throw comes first, before anything changes. A block used
  // on other streams needs an event recorded on each and a queue entry for each; if a
  // record (or the memory for an entry) throws, the events recorded so far are
  // released and the block stays allocated, its stats and site counts untouched, so
  // the caller may free it again. Past this point nothing throws.
  const size_t queued = b->stream_uses.empty() ? 0 : events_.enqueue(*backend_, b);
  allocated_.erase(it);
  acct_.block_freed_by_user(b);
  if (b->stream_uses.empty()) {
    release_block(b);
    return;
  }
  // Used on other streams: the block may be reused only once each of those streams
  // has reached this point; the events recorded above say when.
  b->pending_events += static_cast<int>(queued);
  b->stream_uses.clear();
  b->state = BlockState::kPending;
  acct_.block_pending(b);
}

void DevicePool::release_block(Block* b) {
  Segment* s = b->segment;
  acct_.block_inactive(b);
  b->state = BlockState::kFree;
  b->requested = 0;
  b->site = kUnknownSite;
  b->alloc_time_ns = 0;
  b->stream_uses.clear();
  --s->busy_blocks;
  free_.coalesce(b);
  if (s->busy_blocks == 0) s->last_used = use_clock_;
}

void DevicePool::record_stream(void* ptr, Stream stream) {
  MutexLock lock(&mu_);
  auto it = allocated_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocated_.end()) {
    throw InvalidArgumentError(describe_bad_pointer("record_stream", ptr));
  }
  Block* b = it->second;
  if (stream == b->stream) return;  // stream order already protects it
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) ==
      b->stream_uses.end()) {
    b->stream_uses.push_back(stream);
  }
}

void DevicePool::process_events() {
  MutexLock lock(&mu_);
  if (!events_.empty()) process_events_locked(/*wait=*/false);
}

void DevicePool::process_events_locked(bool wait) {
  events_.poll(*backend_, wait, [this](Block* b) {
    acct_.block_free_completed(b);
    release_block(b);
  });
}

// --- releasing segments ---------------------------------------------------------------

void DevicePool::release_segment(Segment* s) {
  Block* b = s->head;  // the single free block
  free_.erase(b);
  acct_.segment_released(s);
  // The block is free in stream order only: work queued on its stream before the
  // free may still use it. cudaFree synchronizes by itself, unmapping does not, and
  // the sim backend does neither; so wait here, as the Backend contract asks.
  backend_->synchronize_stream(s->stream);
  if (s->expandable()) {
    backend_->unmap(reinterpret_cast<void*>(s->addr), s->size);
    s->reservation->mapped -= s->size;
    --s->reservation->runs;
  } else {
    backend_->free_segment(reinterpret_cast<void*>(s->addr), s->size);
  }
  segments_.erase(s->addr);
  free_.delete_block(b);
  delete s;
}

std::vector<Segment*> DevicePool::unused_segments_largest_first() const {
  std::vector<Segment*> unused;
  for (const auto& [addr, s] : segments_) {
    if (segment_unused(s)) unused.push_back(s);
  }
  std::stable_sort(unused.begin(), unused.end(),
                   [](const Segment* a, const Segment* b) { return a->size > b->size; });
  return unused;
}

size_t DevicePool::release_unused(size_t bytes) {
  size_t released = 0;
  for (Segment* s : unused_segments_largest_first()) {
    if (released >= bytes) break;
    released += s->size;
    release_segment(s);
  }
  if (released < bytes) released += recycle(bytes - released);
  return released;
}

void DevicePool::garbage_collect(size_t incoming) {
  const size_t allowed = std::min(memory_limit(), device_total_);
  const size_t threshold = GcThresholdBytes(config_.garbage_collection_threshold, allowed);
  auto reserved = [&] {
    return static_cast<size_t>(acct_.stats().reserved_bytes[kAggregatePool].current);
  };
  if (reserved() + incoming <= threshold) return;
  std::vector<Segment*> unused;
  for (const auto& [addr, s] : segments_) {
    if (segment_unused(s)) unused.push_back(s);
  }
  // Oldest first: the segments the program has gone longest without needing.
  std::stable_sort(unused.begin(), unused.end(), [](const Segment* a, const Segment* b) {
    return a->last_used < b->last_used;
  });
  for (Segment* s : unused) {
    if (reserved() + incoming <= threshold) break;
    release_segment(s);
  }
  if (reserved() + incoming > threshold) recycle(reserved() + incoming - threshold);
}

void DevicePool::empty_cache() {
  MutexLock lock(&mu_);
  if (!events_.empty()) process_events_locked(/*wait=*/true);
  release_unused(SIZE_MAX);
  release_empty_reservations();
  reservation_failed_.clear();  // address space was given back: worth asking again
}

void DevicePool::trim(size_t keep_bytes) {
  MutexLock lock(&mu_);
  if (!events_.empty()) process_events_locked(/*wait=*/false);
  // Compared as size_t: keep_bytes may be anything up to SIZE_MAX ("keep everything"),
  // which an int64_t would read as -1. cached_bytes() is never negative.
  size_t cached = static_cast<size_t>(acct_.stats().cached_bytes());
  for (Segment* s : unused_segments_largest_first()) {
    if (cached <= keep_bytes) break;
    cached -= s->size;  // s is unused, so its bytes are part of `cached`
    release_segment(s);
  }
  if (cached > keep_bytes) recycle(cached - keep_bytes);
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

// --- introspection --------------------------------------------------------------------

DeviceStats DevicePool::stats() const {
  MutexLock lock(&mu_);
  return acct_.stats();
}

void DevicePool::reset_peak_stats() {
  MutexLock lock(&mu_);
  acct_.reset_peak();
}

void DevicePool::reset_accumulated_stats() {
  MutexLock lock(&mu_);
  acct_.reset_accumulated();
}

std::vector<SiteStats> DevicePool::site_stats() const {
  MutexLock lock(&mu_);
  return acct_.site_stats();
}

std::vector<SiteUsage> DevicePool::top_sites(size_t k) const {
  MutexLock lock(&mu_);
  return acct_.top_sites(k);
}

AllocatorSnapshot DevicePool::snapshot() const {
  AllocatorSnapshot snap;
  snap.device = device_;
  snap.info = backend_->info();
  MutexLock lock(&mu_);
  snap.mem_info = backend_->mem_info();
  snap.stats = acct_.stats();
  snap.time_ns = CoarseNowNs();
  snap.segments.reserve(segments_.size());
  for (const auto& [addr, s] : segments_) {
    SegmentInfo& si = snap.segments.emplace_back();
    si.addr = s->addr;
    si.size = s->size;
    si.stream = s->stream;
    si.small_pool = s->small_pool;
    si.expandable = s->expandable();
    for (const Block* b = s->head; b != nullptr; b = b->next) {
      si.blocks.push_back(BlockInfo{b->addr, b->size, b->requested, b->state, b->stream,
                                    b->site, b->alloc_time_ns});
    }
  }
  return snap;
}

std::optional<BlockInfo> DevicePool::find_allocation(const void* ptr) const {
  MutexLock lock(&mu_);
  auto it = allocated_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocated_.end()) return std::nullopt;
  const Block* b = it->second;
  return BlockInfo{b->addr, b->size, b->requested, b->state, b->stream, b->site,
                   b->alloc_time_ns};
}

void DevicePool::set_observer(AllocatorObserver* observer) {
  MutexLock lock(&mu_);
  acct_.set_observer(observer);
}

Block* DevicePool::block_containing(uintptr_t addr) const {
  auto it = segments_.upper_bound(addr);
  if (it == segments_.begin()) return nullptr;
  --it;
  const Segment* s = it->second;
  if (addr >= s->addr + s->size) return nullptr;
  for (Block* b = s->head; b != nullptr; b = b->next) {
    if (addr >= b->addr && addr < b->addr + b->size) return b;
  }
  return nullptr;
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

void DevicePool::fill_oom_report(size_t requested, size_t size, size_t segment_size,
                                 Stream stream, SiteId site, OomReport* r) {
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
  size_t total_free = 0;
  for (const FreeIndex::FreeSet* set : {&free_.set(true), &free_.set(false)}) {
    for (const Block* b : *set) {
      total_free += b->size;
      r->largest_free_block = std::max(r->largest_free_block, b->size);
      ++r->free_blocks;
    }
  }
  r->fragmentation =
      total_free == 0 ? 0.0
                      : 1.0 - static_cast<double>(r->largest_free_block) /
                                  static_cast<double>(total_free);
  r->segment_count = segments_.size();
  r->top_sites = acct_.top_sites(10);
  r->copy_bytes = acct_.copy_bytes();
  if (arena_hook_ != nullptr) arena_hook_->describe(r);
  ChooseRemedy(r, config_.max_split_size, use_expandable_,
               backend_->caps().virtual_memory && granularity_ > 0);
}

}  // namespace devmem::internal
