// runtime/trace.cc: the per-thread event lanes and their merge (see trace.h).
//
// Writers. The ring's slots are cut into C chunks of K slots. A thread's first event
// takes it a lane (trace.h), and the lane a chunk; the thread fills its chunk's slots in
// order, each event seven release stores (plain moves on x86) and a release store of the
// chunk's count, and when the chunk is full claims another (Claim, which policy: trace.h "What the ring
// keeps"). A chunk's `gen` is its ownership and its claim at once: the claim's number
// (per chunk: 1 for its first claim, one more for each next, so never reused), with
// kOpen while its lane may still write it (until the lane's next claim) and kBusy
// while it is being claimed. Whoever takes a chunk (Take) compare-and-swaps its closed
// gen g to kBusy | g + 1, resets the count and stores g + 1 | kOpen; a lane
// closes its chunk (gen = g) when it claims the next one or parks. So a chunk has one
// writer per claim, open chunks are never taken (a lane never has its slots
// overwritten under it), and a reader or taker that compares a chunk's gen with the
// claim it expects cannot be fooled by reuse. A thread that exits parks its lane's
// chunk (closed, the lane still pointing at it), and the next thread that takes the
// lane up goes on filling it if its compare-and-swap of the gen back to open wins, or
// claims a new one if another lane took it meanwhile.
//
// Each lane lists its claims (chunk, gen, base = the lane's event count when claimed)
// in a ring of C + 2 entries, published by `nclaims` (release), with `nclaims_begin`
// stored before an entry is rewritten with release stores (the reader's loads acquire:
// no fence, which TSan does not model), so that a reader can tell an entry
// it read while it was overwritten (seqlock-style, Boehm 2012). The chunks a lane
// holds are those of its entries [front, nclaims), oldest first (its chain; the last
// one open while a thread holds the lane): a chunk leaves a chain only at its front,
// taken by the lane itself (reuse) or by another (a steal), and the one that took it
// advances `front`. A lane holds at most C chunks, so the entries of its chain are
// never rewritten (the + 2: the one whose chunk was just taken while `front` is not
// yet advanced, and the one being written).
//
// Claiming without a shared write: a lane takes chunks no lane had yet from the pool
// (`fresh_`, a fetch_add, only until the pool is used up: after that, a load); once
// it holds its share (C / the lanes threads hold) it reuses its own oldest chunk, so
// that its slot lines stay in its own core's caches and the lanes share no line that
// is written (round-robin claims from one pool wrote one counter per claim and handed
// a chunk one core had written, 4 KiB of lines, to the other). Below its share it takes the chunk that
// was closed first of all the lanes' oldest (its own when that is the oldest), walking
// the lanes without a lock (`lane_list_`): a parked lane's chunks, a quiet lane's
// beyond its share, or a slower lane's oldest.
//
// Readers (under read_mu_). Collect walks every lane's claims from where the last read
// stopped: for each claim whose chunk still has that gen it copies the slots not read
// yet up to the count (acquire; the slot words with acquire loads, the writer's were
// release), and checks the gen again (a changed gen means
// the chunk was recycled while copied: the copy is dropped). Events of a lane that no
// chunk holds any more (a gap in the bases, a recycled chunk, an entry overwritten,
// events dropped when no chunk was free) are counted as lost. The lanes' new events are
// merged by stamp, each lane's own order kept (a k-way merge, not a sort), with the
// lost ones as a gap of numbers where they were lost in their lane (before the lane's
// next event read), and the events go into `numbered_`, the readers' ring of the newest
// `capacity_` events (events only: the numbers of lost ones take no room there, so that
// what the chunks keep of a quiet lane is not pushed out by a busy lane's lost numbers)
// that since() pages through.
//
// Layout. Each chunk's slots start a page, and one page that nothing ever touches follows
// each chunk (the mapping is anonymous and lazily backed, so those pages take address
// space only; not huge pages, MADV_NOHUGEPAGE, where one fault would back the gaps
// too). Why: two lanes' chunks alternate in memory (during warm-up the lanes take
// the pool's chunks in turn, and each then reuses its own), and with the chunks
// contiguous, two threads recording into one ring each paid 1.2-1.9x the CPU per
// event beside the other that they paid alone, in the development VM's minutes in
// which a line costs 400-475 ns to move between its two vCPUs; with an untouched page
// between chunks, 0.98-1.01x, the same as two threads each recording into a ring of
// its own (a throwaway probe, two threads calling Record on a 2^17 ring, alternated:
// contiguous 1.09-1.22, page-aligned chunks without a gap 1.18-1.22, an untouched gap
// of 4, 16 or 64 KiB 0.98-1.01; a 4 KiB gap of pages zeroed at construction 1.42-1.44,
// 64 KiB of them 1.04-1.16). So what costs is not a shared line but a written
// neighbour: the likeliest cause, which this VM, with no PMU, cannot confirm, is a
// hardware prefetcher that follows one lane's write stream past the end of its chunk
// into the next page when that page is backed, taking lines the other lane's core
// then has to take back. A page without a physical page stops it.
//
// Packing of a slot's words: [0] stamp (trace.h), [1] action | device type << 8 | device
// index << 16 (16 bits) | thread << 32, [2] stream, [3] addr, [4] size, [5] requested,
// [6] site.
#include "runtime/trace.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <queue>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/errors.h"
#include "runtime/thread_lanes.h"
#include "runtime/trace_testing.h"

namespace devmem {
namespace {

constexpr uint64_t kBusy = uint64_t{1} << 63;  // a chunk's gen while it is being claimed
constexpr uint64_t kOpen = uint64_t{1} << 62;  // its lane may write it
constexpr uint64_t kGenMask = kOpen - 1;        // the claim's number
constexpr int kWords = 7;

std::atomic<uint32_t> g_next_thread{1};
thread_local uint32_t tls_thread = 0;

// Rings of 16,384 events or more have more than this many chunks (ChunkEventsFor,
// trace.h's kChunkEvents): room for as many threads recording at once before any
// drops events.
constexpr size_t kMinChunks = 256;

// The largest capacity a ring takes: 2^40 events, 64 TiB of slots (config.cc caps
// trace_entries at 10^8); its chunk count, capacity / 512 + 2, fits in 32 bits.
constexpr size_t kMaxCapacity = size_t{1} << 40;

// K (trace.h, kChunkEvents): 64 (a quarter of the capacity for rings under 256
// events), or, for rings over 16,384 events, capacity / kMinChunks up to kChunkEvents.
uint32_t ChunkEventsFor(size_t capacity) {
  const size_t small = std::clamp<size_t>(capacity / 4, 1, 64);
  return static_cast<uint32_t>(
      std::max(small, std::min(capacity / kMinChunks, TraceRing::kChunkEvents)));
}

}  // namespace

namespace trace_internal {
constinit thread_local TlsLane tls_lane;

namespace {
constinit thread_local bool fail_next_registration = false;  // trace_testing.h
}  // namespace
void FailNextRingRegistrationForTesting() { fail_next_registration = true; }
}  // namespace trace_internal
using trace_internal::tls_lane;

uint32_t TraceThreadNumber() {
  uint32_t t = tls_thread;
  if (t == 0) [[unlikely]] {
    t = g_next_thread.fetch_add(1, std::memory_order_relaxed);
    tls_thread = t;
  }
  return t;
}

// A line each: the open chunk's count is written on every event of its lane. (Two
// lanes' open chunks are often neighbours, one adjacent-line-prefetcher pair; 128
// bytes apart measured no different in threads2's slow runs, so they stay 64.)
struct alignas(64) TraceRing::Chunk {
  // 0: never claimed (in the pool); else its claim g (file comment), | kOpen while its
  // lane may write it, | kBusy while being claimed.
  std::atomic<uint64_t> gen{0};
  std::atomic<uint32_t> count{0};   // slots written and published in this claim
};

// The writer's hot state is the LaneHead (trace.h), first, so that Record's pointer to
// it is the lane's.
struct TraceRing::Lane : TraceRing::LaneHead {
  Lane(uint32_t lane_id, uint32_t history)
      : id(lane_id), history_size(history), history(new std::atomic<uint64_t>[3 * history]) {
    for (uint32_t i = 0; i < 3 * history; ++i) this->history[i].store(0, std::memory_order_relaxed);
  }
  const uint32_t id;
  const uint32_t history_size;  // C + 2: entries in `history`
  // The writer's own state (the thread that holds the lane; handed to the next holder
  // under lanes_mu_).
  // The head's slots, count, used and limit describe `chunk`.
  Chunk* chunk = nullptr;   // the open (or parked) chunk, or null
  uint64_t chunk_gen = 0;   // its claim's gen (without kOpen)
  uint32_t retry_in = 0;    // events to drop before trying to claim again
  uint64_t written = 0;     // events written into chunks before the open one, ever
  uint64_t claims = 0;      // entries written to `history`, ever
  uint64_t dropped_local = 0;
  Lane* next_lane = nullptr;  // the ring's lane list (lane_list_); set before published
  // Shared with the other lanes' claims: whether a thread holds the lane (else it is
  // parked and its chunks go to whoever needs them), under lanes_mu_ when written.
  std::atomic<bool> in_use{false};
  // Shared with readers.
  alignas(64) std::atomic<uint64_t> nclaims{0};        // entries published
  // Shared with the other lanes' claims: the entry of the oldest chunk the lane holds
  // (advanced by whoever takes that chunk, file comment).
  std::atomic<uint64_t> front{0};
  std::atomic<uint64_t> nclaims_begin{0};              // entries being written
  std::atomic<uint64_t> dropped{0};                    // events dropped (no free chunk)
  // At the last park (ReleaseLane): the events written in this lane's claims so far,
  // for a reader that finds the parked chunk recycled (trace.cc, Collect).
  std::atomic<uint64_t> parked_total{0};
  // Claim k at [3 (k mod C)]: chunk index, gen, base.
  std::unique_ptr<std::atomic<uint64_t>[]> history;
};

struct TraceRing::Numbered {
  uint64_t seq = 0;  // 0: none
  uint64_t words[kWords] = {};
};

struct TraceRing::Cursor {
  uint64_t taken = 0;         // the lane's events numbered or counted lost
  uint64_t claim = 0;         // the claim entry `taken` lies in
  uint64_t dropped_seen = 0;  // of lane.dropped
};

// A thread's lanes in every ring it recorded into, given back when it exits to the rings
// that still exist (runtime/thread_lanes.h).
struct LaneCache {
  using Owner = TraceRing;
  using Lane = TraceRing::Lane*;
  static void Release(TraceRing* ring, Lane lane) { ring->ReleaseLane(lane); }
  static void Forget() { tls_lane = {}; }
};
namespace {
using RingLanes = ThreadLanes<LaneCache>;
}  // namespace

TraceRing::TraceRing(size_t capacity)
    : capacity_(capacity),
      chunk_events_(ChunkEventsFor(capacity)),
      num_chunks_(static_cast<uint32_t>(
          capacity == 0 ? 0 : (capacity + chunk_events_ - 1) / chunk_events_ + 1)),
      uid_(RingLanes::NewUid()) {
  if (capacity == 0) {
    throw InvalidArgumentError("TraceRing: capacity must be at least 1 (got 0)");
  }
  // Above it the chunk count would not fit num_chunks_ (and its slots no machine maps).
  if (capacity > kMaxCapacity) {
    throw InvalidArgumentError(absl::StrCat("TraceRing: capacity ", capacity,
                                            " is over the most a ring holds, ",
                                            kMaxCapacity, " events"));
  }
  chunks_.reset(new Chunk[num_chunks_]);
  // The slots (Layout, above): a chunk's bytes rounded up to whole pages, then one page.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t chunk_bytes = size_t{chunk_events_} * sizeof(Slot);
  const size_t stride = (chunk_bytes + page - 1) / page * page + page;
  static_assert(alignof(Slot) <= 4096, "a page-aligned chunk aligns its slots");
  chunk_stride_ = stride / sizeof(Slot);
  const size_t bytes = size_t{num_chunks_} * stride;
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) throw std::bad_alloc();  // chunks_ is freed as a member
#ifdef MADV_NOHUGEPAGE
  madvise(base, bytes, MADV_NOHUGEPAGE);  // a hint: it only keeps the gaps empty
#endif
  slots_.slots = static_cast<Slot*>(base);  // owned from here: unmapped on any throw below
  slots_.bytes = bytes;
  // Each chunk's slots are made (zeroed, as the mapping already is); the gaps never are.
  for (uint32_t p = 0; p < num_chunks_; ++p) {
    Slot* const first = ChunkSlots(p);
    for (uint32_t i = 0; i < chunk_events_; ++i) new (first + i) Slot;
  }
  // Last, so that thread exits only ever meet a whole ring. It may throw (std::bad_alloc);
  // the members, the slots' mapping among them, then free what was made.
  if (std::exchange(trace_internal::fail_next_registration, false)) throw std::bad_alloc();
  RingLanes::Register(uid_, this);
}

TraceRing::~TraceRing() { RingLanes::Unregister(uid_); }  // then the members: slots_ unmaps

TraceRing::SlotMapping::~SlotMapping() {
  static_assert(std::is_trivially_destructible_v<Slot>, "the slots are unmapped, not destroyed");
  if (slots != nullptr) munmap(slots, bytes);
}

size_t TraceRing::capacity() const { return capacity_; }

TraceRing::LaneHead* TraceRing::ThisThreadLane() {
  if (tls_lane.uid == uid_) return tls_lane.lane;
  Lane* lane;
  if (Lane* const* held = RingLanes::Find(uid_)) {
    lane = *held;
  } else {
    lane = AcquireLane();
    RingLanes::Remember(uid_, lane);
  }
  tls_lane.uid = uid_;
  tls_lane.lane = lane;
  return lane;
}

TraceRing::Lane* TraceRing::AcquireLane() {
  MutexLock lock(&lanes_mu_);
  Lane* lane;
  if (!free_lanes_.empty()) {
    lane = free_lanes_.back();
    free_lanes_.pop_back();
  } else {
    lanes_.push_back(
        std::make_unique<Lane>(static_cast<uint32_t>(lanes_.size()), num_chunks_ + 2));
    lane = lanes_.back().get();
    lane->next_lane = lane_list_.load(std::memory_order_relaxed);
    lane_list_.store(lane, std::memory_order_release);
  }
  active_lanes_.fetch_add(1, std::memory_order_relaxed);
  lane->in_use.store(true, std::memory_order_relaxed);
  lane->thread_bits = uint64_t{TraceThreadNumber()} << 32;
  lane->retry_in = 0;
  if (lane->chunk != nullptr) {
    // Its parked chunk, unless another lane took it meanwhile (see ReleaseLane).
    uint64_t closed = lane->chunk_gen;
    if (lane->chunk->gen.compare_exchange_strong(closed, lane->chunk_gen | kOpen,
                                                 std::memory_order_acq_rel)) {
      return lane;
    }
    DropChunk(lane);
  }
  return lane;
}

void TraceRing::DropChunk(Lane* lane) {
  lane->written += lane->used;
  lane->used = 0;
  lane->limit = 0;
  lane->chunk = nullptr;
}

void TraceRing::ReleaseLane(Lane* lane) {
  // The lane parks its open chunk: closed, so that another lane may take it (a lane no
  // thread holds would otherwise keep a chunk out of the ring: one chunk of the newest
  // events less per exited thread), but still the lane's, so that the next thread that
  // takes the lane goes on filling it if no one took it meanwhile (short-lived threads
  // then do not each waste a chunk). Its other chunks stay in its chain until lanes
  // below their share take them (trace.h): it no longer counts among the lanes that
  // shares are of.
  if (lane->chunk != nullptr) {
    lane->parked_total.store(lane->written + lane->used, std::memory_order_relaxed);
    lane->chunk->gen.store(lane->chunk_gen, std::memory_order_release);
  }
  MutexLock lock(&lanes_mu_);
  lane->in_use.store(false, std::memory_order_relaxed);
  active_lanes_.fetch_sub(1, std::memory_order_relaxed);
  free_lanes_.push_back(lane);
}

bool TraceRing::Take(Lane* lane, uint32_t p, uint64_t closed) {
  Chunk& c = chunks_[p];
  uint64_t expected = closed;
  const uint64_t g = (closed & kGenMask) + 1;
  if (!c.gen.compare_exchange_strong(expected, kBusy | g, std::memory_order_acq_rel)) {
    return false;  // open in its lane, or taken by another since `closed` was read
  }
  // The slots' stores are release (WriteSlot), so a reader that copies one this claim
  // wrote then reads gen != the claim it copied (Collect): no fence here.
  c.count.store(0, std::memory_order_relaxed);
  c.gen.store(g | kOpen, std::memory_order_release);
  // The claim's history entry (seqlock-style, see the file comment).
  const uint64_t k = lane->claims++;
  std::atomic<uint64_t>* e = &lane->history[3 * (k % lane->history_size)];
  // The entry's stores are release, so that a reader that read one of them (acquire)
  // then reads nclaims_begin = k + 1 at least: the seqlock's check, without a fence.
  lane->nclaims_begin.store(k + 1, std::memory_order_relaxed);
  e[0].store(p, std::memory_order_release);
  e[1].store(g, std::memory_order_release);
  e[2].store(lane->written, std::memory_order_release);
  lane->nclaims.store(k + 1, std::memory_order_release);
  lane->chunk = &c;
  lane->chunk_gen = g;
  lane->slots = ChunkSlots(p);
  lane->count = &c.count;
  lane->limit = chunk_events_;
  return true;
}

TraceRing::Front TraceRing::FrontOf(const Lane* lane) const {
  Front f;
  const uint64_t k = lane->front.load(std::memory_order_acquire);
  if (k >= lane->nclaims.load(std::memory_order_acquire)) return f;  // holds none
  const std::atomic<uint64_t>* e = &lane->history[3 * (k % lane->history_size)];
  const uint64_t p = e[0].load(std::memory_order_acquire);
  const uint64_t g = e[1].load(std::memory_order_acquire);
  // Rewritten while read: the chain moved on meanwhile (the caller tries again).
  if (lane->nclaims_begin.load(std::memory_order_relaxed) > k + lane->history_size) return f;
  if (p >= num_chunks_) return f;
  const Chunk& c = chunks_[p];
  if (c.gen.load(std::memory_order_acquire) != g) return f;  // open, or taken since
  const uint32_t count = c.count.load(std::memory_order_acquire);
  f.ok = true;
  f.entry = k;
  f.chunk = static_cast<uint32_t>(p);
  f.gen = g;
  // Closed when its last event was written: that event's stamp (0 for an empty chunk).
  f.closed_at = count == 0 ? 0
                           : ChunkSlots(static_cast<uint32_t>(p))[count - 1].words[0].load(
                                 std::memory_order_relaxed);
  return f;
}

bool TraceRing::TakeFront(Lane* lane, Lane* from, const Front& f) {
  if (!f.ok || !Take(lane, f.chunk, f.gen)) return false;
  // The chunk was `from`'s front (its gen proves the claim): no one else can advance
  // `front` past this entry, whose chunk only this call took.
  from->front.store(f.entry + 1, std::memory_order_release);
  return true;
}

bool TraceRing::TakeOldest(Lane* lane, uint64_t share) {
  // A few tries: a front read here may be taken by another lane before this one's
  // compare-and-swap, and the list is walked again.
  for (int attempt = 0; attempt < 4; ++attempt) {
    Lane* best = nullptr;
    Front oldest;
    for (Lane* l = lane_list_.load(std::memory_order_acquire); l != nullptr; l = l->next_lane) {
      // Not from a lane a thread holds that has no more than its share (trace.h).
      if (l != lane && l->in_use.load(std::memory_order_relaxed) &&
          l->nclaims.load(std::memory_order_relaxed) -
                  l->front.load(std::memory_order_relaxed) <= share) {
        continue;
      }
      const Front f = FrontOf(l);
      if (f.ok && (!oldest.ok || f.closed_at < oldest.closed_at)) {
        oldest = f;
        best = l;
      }
    }
    if (best == nullptr) return false;  // every lane's oldest chunk is open
    if (TakeFront(lane, best, oldest)) return true;
  }
  return false;
}

bool TraceRing::Claim(Lane* lane) {
  if (lane->chunk != nullptr) lane->chunk->gen.store(lane->chunk_gen, std::memory_order_release);
  DropChunk(lane);
  // A chunk no lane had yet, while the pool has one (then only this load is left).
  if (fresh_.load(std::memory_order_relaxed) < num_chunks_) {
    const uint32_t p = fresh_.fetch_add(1, std::memory_order_relaxed);
    if (p < num_chunks_ && Take(lane, p, 0)) return true;
  }
  // Below its share (trace.h): the oldest chunk of all, its own when that is the oldest.
  const uint32_t active = std::max<uint32_t>(1, active_lanes_.load(std::memory_order_relaxed));
  const uint64_t share = num_chunks_ / active;
  const uint64_t held = lane->claims - lane->front.load(std::memory_order_relaxed);
  if (held < share && TakeOldest(lane, share)) return true;
  // At its share: its own oldest (the one just closed, if it holds no other).
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (TakeFront(lane, lane, FrontOf(lane))) return true;
  }
  // It holds none (more lanes write than there are chunks): anyone's oldest closed one.
  return TakeOldest(lane, 0);
}

void TraceRing::on_event(const AllocEvent& event) { Record(event); }

void TraceRing::CountDroppedForTesting(uint64_t n) {
  Lane* lane = static_cast<Lane*>(ThisThreadLane());
  lane->dropped_local += n;
  lane->dropped.store(lane->dropped_local, std::memory_order_relaxed);
}

void TraceRing::RecordSlow(LaneHead* head, const AllocEvent& event, uint64_t stamp) {
  Lane* lane = static_cast<Lane*>(head);
  // Once per chunk: the ticker again in a forked child. (Not the exact tick: a TSC read
  // here cost 30-150 ns on the loaded development VM, 1-2 ns an event.)
  Commit(lane, event, stamp);
  TraceClock::EnsureTicker();
  // Once per K events. After a failed claim, drop K events before trying again, so
  // that a starved thread does not pay a shared increment per event.
  const bool claimed = lane->retry_in == 0 && Claim(lane);
  if (!claimed) {
    lane->retry_in = lane->retry_in == 0 ? chunk_events_ : lane->retry_in - 1;
    lane->dropped.store(++lane->dropped_local, std::memory_order_relaxed);
    return;
  }
  WriteSlot(&lane->slots[0], event, stamp, lane->thread_bits);
  lane->count->store(++lane->used, std::memory_order_release);
}

void TraceRing::RecordLocked(LaneHead* lane, const AllocEvent& event) {
  // The exact tick (a TSC read), raised past the lane's last event and the event's
  // causal predecessors (trace.h).
  uint64_t stamp = std::max(static_cast<uint64_t>(clock_.Now()), lane->last + 1);
  if (event.block_order != nullptr) stamp = std::max(stamp, *event.block_order + 1);
  stamp = std::max(stamp, *event.pool_order + 1);
  if (lane->used == lane->limit) [[unlikely]] {
    RecordSlow(lane, event, stamp);
    return;
  }
  Commit(lane, event, stamp);
  WriteSlot(&lane->slots[lane->used], event, stamp, lane->thread_bits);
  lane->count->store(++lane->used, std::memory_order_release);
}

void TraceRing::Collect() const {
  std::vector<Lane*> lanes;
  {
    MutexLock lock(&lanes_mu_);
    lanes.reserve(lanes_.size());
    for (const auto& l : lanes_) lanes.push_back(l.get());
  }
  if (numbered_.empty()) numbered_.resize(capacity_);
  if (cursors_.size() < lanes.size()) cursors_.resize(lanes.size());
  // Per lane, in lane order: the events read, and a gap (seq = how many) where events
  // of the lane were lost, so that their numbers fall where they happened (a reader of
  // the trace sees the jump in seq there: memtrace timeline then implies the frees it
  // misses rather than reading a double alloc). A gap's key (words[0]) is the stamp of
  // the lane's next event read, or, with none, of its last one (0 with neither).
  std::vector<std::vector<Numbered>> fresh(lanes.size());
  for (size_t i = 0; i < lanes.size(); ++i) {
    const Lane& lane = *lanes[i];
    Cursor& cur = cursors_[lane.id];
    std::vector<Numbered>& out = fresh[i];
    uint64_t lost = 0;  // the lane's, not yet placed
    auto place_gap = [&](size_t at) {
      if (lost == 0) return;
      Numbered gap;
      gap.seq = lost;
      gap.words[0] = at < out.size() ? out[at].words[0] : out.empty() ? 0 : out.back().words[0];
      out.insert(out.begin() + static_cast<ptrdiff_t>(at), gap);
      lost = 0;
    };
    const uint64_t n = lane.nclaims.load(std::memory_order_acquire);
    const uint64_t h = lane.history_size;
    if (n > h && cur.claim < n - h) cur.claim = n - h;  // older entries are rewritten
    bool last_recycled = false;  // the claim n - 1's chunk is another claim's now
    for (uint64_t k = cur.claim; k < n; ++k) {
      const std::atomic<uint64_t>* e = &lane.history[3 * (k % h)];
      const uint64_t p = e[0].load(std::memory_order_acquire);
      const uint64_t g = e[1].load(std::memory_order_acquire);
      const uint64_t base = e[2].load(std::memory_order_acquire);
      // Rewritten while read: its events are counted by the next entry's base.
      if (lane.nclaims_begin.load(std::memory_order_relaxed) > k + h) continue;
      if (base > cur.taken) {  // claims whose chunks were lost in between
        lost += base - cur.taken;
        cur.taken = base;
      }
      const Chunk& c = chunks_[p];
      if ((c.gen.load(std::memory_order_acquire) & ~kOpen) == g) {
        const uint32_t count = c.count.load(std::memory_order_acquire);
        const size_t before = out.size();
        const Slot* slots = ChunkSlots(static_cast<uint32_t>(p));
        for (uint64_t j = cur.taken - base; j < count; ++j) {
          Numbered& ev = out.emplace_back();
          for (int w = 0; w < kWords; ++w) {
            ev.words[w] = slots[j].words[w].load(std::memory_order_acquire);
          }
        }
        // The loads above are acquire and the slots' stores release: a word a later
        // claim wrote makes this read see that claim's gen.
        if ((c.gen.load(std::memory_order_relaxed) & ~kOpen) == g) {
          cur.taken = std::max(cur.taken, base + count);
          if (out.size() > before) place_gap(before);  // before the first event after it
        } else {
          out.resize(before);  // recycled while copied
          last_recycled = k + 1 == n;
        }
      } else {
        last_recycled = k + 1 == n;
      }
      // Not whole: recycled, its events lost; the next entry's base counts them.
      if (k + 1 < n) cur.claim = k + 1;  // a later claim exists: this chunk is final
    }
    // A lane's last chunk is recycled only once the lane parked it (ReleaseLane): its
    // events up to the park are then lost, and no later entry's base counts them until
    // a thread takes the lane up. parked_total was stored before the chunk was closed
    // (and so before the claim that changed its gen, which this read saw); if the lane
    // claimed again meanwhile, the new entry's base counts them at the next read.
    if (last_recycled) {
      const uint64_t parked = lane.parked_total.load(std::memory_order_acquire);
      if (lane.nclaims.load(std::memory_order_acquire) == n && parked > cur.taken) {
        lost += parked - cur.taken;
        cur.taken = parked;
      }
    }
    // Events dropped for want of a chunk: where among the lane's events is not known;
    // after what was read of it.
    const uint64_t dropped = lane.dropped.load(std::memory_order_relaxed);
    lost += dropped - cur.dropped_seen;
    cur.dropped_seen = dropped;
    place_gap(out.size());
  }
  // The lanes' new events and gaps merged by stamp.
  using Head = std::pair<int64_t, size_t>;  // (stamp, lane), the smallest on top
  std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
  std::vector<size_t> at(fresh.size(), 0);
  for (size_t i = 0; i < fresh.size(); ++i) {
    if (!fresh[i].empty()) heads.emplace(static_cast<int64_t>(fresh[i][0].words[0]), i);
  }
  while (!heads.empty()) {
    const size_t i = heads.top().second;
    heads.pop();
    Numbered& ev = fresh[i][at[i]++];
    if (ev.seq != 0) {
      next_ += ev.seq;  // a gap: numbers no event will have (since() counts them missed)
    } else {
      ev.seq = next_++;
      numbered_[kept_++ % capacity_] = ev;
    }
    if (at[i] < fresh[i].size()) {
      heads.emplace(static_cast<int64_t>(fresh[i][at[i]].words[0]), i);
    }
  }
}

uint64_t TraceRing::next_seq() const {
  MutexLock lock(&read_mu_);
  Collect();
  return next_;
}

std::vector<TraceEvent> TraceRing::since(uint64_t after, size_t limit, uint64_t* missed,
                                         uint64_t* next_after) const {
  MutexLock lock(&read_mu_);
  Collect();
  std::vector<TraceEvent> out;
  uint64_t lost = 0;
  const uint64_t end = next_;  // the first number not given
  // Nothing has a seq above `after` yet (end >= 1 always). Checked before computing
  // after + 1, which wraps to 0 for after = 2^64 - 1 and would return the whole ring.
  if (after >= end - 1) {
    if (missed != nullptr) *missed = 0;
    if (next_after != nullptr) *next_after = end - 1;
    return out;
  }
  // numbered_ holds the newest min(kept_, capacity_) events in number order, event i
  // (counting from 0, ever) at i mod capacity_: the first of them numbered after `after`.
  uint64_t lo = kept_ > capacity_ ? kept_ - capacity_ : 0, hi = kept_;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (numbered_[mid % capacity_].seq <= after) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  uint64_t q = after + 1;  // the first number not yet returned or counted missed
  const TraceClock::Mapping map = clock_.Map();
  out.reserve(std::min<uint64_t>(kept_ - lo, limit));
  for (uint64_t i = lo; i < kept_ && out.size() < limit; ++i) {
    const Numbered& n = numbered_[i % capacity_];
    lost += n.seq - q;  // the numbers between: lost events, or overwritten ones
    q = n.seq + 1;
    const uint64_t* w = n.words;
    TraceEvent e;
    e.seq = n.seq;
    e.time_ns = map.ToNs(static_cast<int64_t>(w[0]));
    e.action = static_cast<AllocAction>(w[1] & 0xff);
    e.device.type = static_cast<DeviceType>((w[1] >> 8) & 0xff);
    e.device.index = static_cast<int>((w[1] >> 16) & 0xffff);
    e.thread = static_cast<uint32_t>(w[1] >> 32);
    e.stream.handle = static_cast<uintptr_t>(w[2]);
    e.addr = static_cast<uintptr_t>(w[3]);
    e.size = static_cast<size_t>(w[4]);
    e.requested = static_cast<size_t>(w[5]);
    e.site = static_cast<SiteId>(w[6]);
    out.push_back(e);
  }
  if (out.size() < limit) {  // the numbers after the newest kept event: lost ones
    lost += end - q;
    q = end;
  }
  if (missed != nullptr) *missed = lost;
  if (next_after != nullptr) *next_after = q - 1;  // every number below q was returned or missed
  return out;
}

}  // namespace devmem
