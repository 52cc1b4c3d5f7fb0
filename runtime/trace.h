// runtime/trace.h: a bounded trace of allocator events (DESIGN.md "Trace").
//
// A TraceRing is an AllocatorObserver: attach it to allocators with set_observer and
// every alloc, free, free_completed, segment_alloc/free/map/unmap and oom lands here
// with the time, the thread and the site. It keeps about `capacity` events, the newest
// of each writing thread (below, "What the ring keeps"); each event read has a sequence
// number (starting at 1, never reused), so a reader asks for "everything after N" and
// learns how many it missed.
//
// Cost: on_event runs on every allocation and free, under the device lock or, for
// thread-cache hits, on the allocating thread without it (allocator/observer.h); the
// runtime records by default (trace_entries), so devmem-bench reports
// tracing_overhead_ratio on the shipped path (target <= 1.15). So a writer touches
// nothing another thread writes: each thread writes into a chunk of slots it owns (a
// "lane"); an event is seven stores and one store of the chunk's count (release stores,
// plain moves on x86), inline in the caller (Record), with no call on the cache-hit
// path (an event under the device lock calls RecordLocked), and a full chunk's successor
// is, once the lane holds its share, the lane's own oldest chunk (no shared write, and
// its lines stay in the thread's core's caches).
//
// What the ring keeps. The C = ceil(capacity / K) + 1 chunks of K slots (kChunkEvents) start
// in a pool; a lane takes chunks from it while it has some. After that, a lane whose
// chunk is full, of the L lanes that threads hold (a lane of an exited thread is
// parked: it counts in none of the shares), takes
//   - while it holds fewer than its share, C / L chunks: the chunk whose last event is
//     the oldest among the oldest chunks of itself, of parked lanes and of lanes that
//     hold more than their share;
//   - once it holds its share: its own oldest chunk.
// So the ring holds, of each thread that records, at least its newest C / L chunks
// (minus the one it is filling) or all it wrote since, whichever is less: a thread
// that writes little keeps its history while a busy one laps the ring, which one ring
// of the newest N events of the process did not (the busy thread overwrote it); and
// chunks beyond the shares go to the lanes by age, the oldest chunk first, so that
// threads writing at different rates get about the newest N events overall. A parked
// lane's chunks, and a quiet lane's beyond its share, stay readable until a lane below
// its share takes them (the oldest first). The price: a thread that stopped recording
// but lives keeps up to its share of old events out of the other lanes' reach (with
// two threads that both write, each keeps at least floor(C / 2) chunks less the
// one it fills: at the default, 127 chunks of 512 events, just under half the ring). (The previous
// policy, each claim the next chunk round-robin from one pool, kept the newest N of
// the process, but every claim wrote one shared counter, and a chunk one thread had
// written was next claimed by another, its lines moving between the cores. Removing
// both did not end threads2_speedup's bimodal runs on the development VM, which
// trace_entries:0 does: the rest was the chunks' layout, trace.cc "Layout".)
//
// Time and order (a hybrid logical clock). An event's stamp, in TraceClock ticks
// (runtime/trace_clock.h; converted to nanoseconds when read), is under the device
// lock (AllocEvent::pool_order given) the largest of the exact tick and the last
// stamps below + 1; on the cache-hit path one tick past the largest of the tick the
// ticker thread published (one load; a TSC read there was ~9 ns on the AMD EPYC
// development VM, a quarter of a pair) and the last stamps below (max + 1: one add
// fewer than raising each by one). The last stamps:
//   - the lane's (each thread's events in its own order);
//   - the block's (AllocEvent::block_order, Block::trace_order: set by
//     its alloc, read by its free on whichever thread, which the program ordered after
//     the alloc by handing the pointer over);
//   - the device pool's (AllocEvent::pool_order: every event under the
//     device lock, raised past the last event of every block a thread cache gives back,
//     so that what the pool does with an address after a cache-hit free, coalesce,
//     split, reuse, unmap, reads after that free).
// So an event causally after another (same thread; the same block's alloc and free;
// through the device lock) always has a larger stamp, and the merge by stamp is a
// valid order: memtrace timeline never reads a free before its alloc or an alloc of a
// live address. Stamps of unrelated threads' events may tie; the merge puts those in
// lane order. A time read is the stamp's nanoseconds: events under the device lock
// are within the clock's error (tens of ns) of when they happened; a cache hit's is at
// most the ticker's period (1 ms) plus its scheduling delay early, and never earlier
// than the lane's last locked event; a time runs ahead only by the +1 ticks of a
// causal chain faster than the clock ticks (a tick is under a nanosecond: never seen). (The previous design
// read the TSC per event: times exact, ~3-4 ns of a pair more; a published tick
// alone saved that but tied causally related events of two threads.)
//
// Numbers and order: events get their sequence numbers when read (since, next_seq):
// the reader takes what every lane published since the last read, merges the lanes by
// stamp (each lane's own order kept) and numbers the result after the numbers already
// given; events overwritten before any read took them are numbered too, as a gap, and
// counted as missed. So when no writer is in flight (quiescent) the numbers follow the
// events' stamps exactly, and every event is read or counted as missed; an event whose
// writer is still writing while a read runs gets its number at the next read, after
// events that happened later (as the old single ring did for a preempted writer, it
// may then be out of time order by the length of that preemption).
//
// Threads that exit park their lane and its chunks: closed, so that other lanes may take
// them (above), and taken up by the next thread that records, which goes on filling
// the last one if no one took it.
//
// Memory: C chunks of K 64-byte slots, each rounded up to whole pages (capacity rounded
// up to whole chunks, plus one; a ring under 256 events backs a page per chunk), C chunk
// headers of 64 bytes, the numbered events the readers page through once read (capacity
// x 64 bytes), and a list of C + 2 claims per lane (24 bytes each). The slots are one
// anonymous mapping in which each chunk is followed by one page never touched (address
// space only: C pages, 1 MiB at the default with 4 KiB pages; trace.cc, "Layout").
//
// What a slot keeps is exactly what was recorded (tests/runtime_trace_test.cc,
// ExtremeFieldValuesReadBackExactly): every field at its full width, but the device
// index, which keeps 16 bits (0 .. 65535: every device there is, allocator/types.h).
// docs/configuration.md ("Trace ring size") has the measurement behind the default.
//
// Thread-safety: on_event may be called concurrently from any threads (each thread
// writes its own lane); since/next_seq may be called from any thread at any time
// (readers serialize among themselves on a mutex writers never take) and never block
// writers. A reader that races a writer recycling a chunk counts the chunk's unread
// events as missed rather than returning torn ones.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "allocator/mutex.h"
#include "allocator/observer.h"
#include "runtime/trace_clock.h"

namespace devmem {

struct TraceEvent {
  uint64_t seq = 0;      // 1, 2, 3, ... in the order events happened (see above)
  int64_t time_ns = 0;   // monotonic clock (NowNs() epoch) when the event happened
  AllocAction action = AllocAction::kAlloc;
  DeviceId device;
  Stream stream;
  uintptr_t addr = 0;
  size_t size = 0;
  size_t requested = 0;
  SiteId site = kUnknownSite;
  uint32_t thread = 0;   // a small per-process thread number (1, 2, ...)
};

// A small per-process thread number: 1 for the first thread that records an event (in
// a TraceRing or a flight record, runtime/flight_recorder.h: one numbering for both).
uint32_t TraceThreadNumber();

class TraceRing : public AllocatorObserver {
 public:
  // Events per chunk, at most: K is 64 (a quarter of the capacity under 256 events)
  // and, above 16,384 events, capacity / 256 up to this (trace.cc, ChunkEventsFor), so
  // that a ring of 16,384 events or more has at least 256 chunks (room for 256 threads
  // recording at once). Why large chunks: a claim costs ~50 ns on the development VM
  // (the recycled chunk's header, claim entry and first slots were last touched a lap
  // of the ring ago), ~0.8 ns an event at 64 events a chunk, and more beside a second
  // writing thread in the VM's slow minutes (two threads calling Record directly on a
  // 2^17 ring there: 1.2-1.7x the ns per event of one at K = 64, 1.0x at K = 4096; at
  // 512, 0.7 ns an event less alone than at 64, and 1.25-1.5x with the chunks
  // contiguous, about 1.0x with an untouched page between chunks: trace.cc, "Layout").
  static constexpr size_t kChunkEvents = 512;

  // 0 < capacity <= 2^40: the number of events kept (InvalidArgumentError otherwise). The
  // chunks are allocated and zeroed here.
  explicit TraceRing(size_t capacity);
  ~TraceRing() override;

  void on_event(const AllocEvent& event) override;

  // Events with seq > after, oldest first, at most `limit`. *missed (if given) is the
  // number of events after `after` that were overwritten before this read.
  // *next_after (if given) is the `after` to pass next: the last number this read
  // returned or counted missed (at most next_seq() - 1, so that a reader ahead of the
  // ring resynchronises). A follower must page with it, not with the last event's seq:
  // numbers of lost events may be the newest (a lane's events lost after the last one
  // read), and a follower that resumed from its last event would count them missed
  // again on every read and never reach next_seq().
  std::vector<TraceEvent> since(uint64_t after, size_t limit = SIZE_MAX,
                                uint64_t* missed = nullptr,
                                uint64_t* next_after = nullptr) const;
  // The sequence number the next event will get (after numbering what was published).
  uint64_t next_seq() const;
  size_t capacity() const;

  // As if this thread's lane had dropped `n` events for want of a free chunk (which
  // only a race of more writing threads than chunks produces): for tests of how
  // readers number and page past lost events.
  void CountDroppedForTesting(uint64_t n);
  // The layout, for tests of it: the chunks (C), the slots per chunk (K) and chunk p's
  // first slot (p < C).
  uint32_t ChunksForTesting() const { return num_chunks_; }
  uint32_t ChunkEventsForTesting() const { return chunk_events_; }
  const void* ChunkSlotsForTesting(uint32_t p) const { return ChunkSlots(p); }

  // on_event without the virtual dispatch, for observers that forward to a ring.
  // Inline (below): the runtime's observer records every event through it.
  [[gnu::always_inline]] inline void Record(const AllocEvent& event);

  struct Lane;   // one writer's chunk and its claims (trace.cc)
  struct Chunk;  // a chunk's header: which claim holds it, how many slots are written
  // One event: [0] tick, [1] action | device type << 8 | device index << 16 (16 bits)
  // | thread << 32, [2] stream, [3] addr, [4] size, [5] requested, [6] site; [7] unused.
  struct alignas(64) Slot {
    std::atomic<uint64_t> words[8] = {};
  };
  // What Record touches of its lane, first in every Lane (trace.cc); only the thread
  // that holds the lane reads or writes it.
  struct LaneHead {
    Slot* slots = nullptr;                  // the open chunk's first slot
    std::atomic<uint32_t>* count = nullptr;  // the open chunk's published count
    uint32_t used = 0;                      // slots written in the open chunk
    uint32_t limit = 0;                     // its slots (K); 0 while the lane has none
    uint64_t thread_bits = 0;               // the holder's thread number << 32
    uint64_t last = 0;                      // the stamp of the lane's last event
  };

 private:
  friend struct LaneCache;
  // The calling thread's lane, taken on its first event (cold: a mutex).
  [[gnu::noinline]] LaneHead* ThisThreadLane();
  // Record's cold half: the lane's chunk is full (or it has none): claims the next,
  // then records the event, or drops it when no chunk is free.
  [[gnu::noinline]] void RecordSlow(LaneHead* head, const AllocEvent& event, uint64_t stamp);
  // An event under the device lock (pool_order given): the exact tick, raised past
  // the lane's, the block's and the pool's last stamps; then as Record.
  [[gnu::noinline]] void RecordLocked(LaneHead* lane, const AllocEvent& event);
  static void WriteSlot(Slot* slot, const AllocEvent& event, uint64_t stamp,
                        uint64_t thread_bits);
  // The event's stamp is `stamp`: it becomes the lane's and the event's order words'.
  static void Commit(LaneHead* lane, const AllocEvent& event, uint64_t stamp) {
    lane->last = stamp;
    if (event.block_order != nullptr) *event.block_order = stamp;
    if (event.pool_order != nullptr) *event.pool_order = stamp;
  }
  Lane* AcquireLane();
  void ReleaseLane(Lane* lane);  // at thread exit: parks its chunk, frees the lane
  static void DropChunk(Lane* lane);  // the lane has no chunk from now on
  // Gives `lane` a fresh chunk (closing its full one) by the policy of "What the ring
  // keeps" above; false when every chunk it may take is held open by another lane (the
  // event is then dropped and counted as missed).
  bool Claim(Lane* lane);
  // A lane's oldest chunk as read by another claim (ok = false: it holds none closed).
  struct Front {
    bool ok = false;
    uint64_t entry = 0;      // its claim entry (Lane::front)
    uint32_t chunk = 0;
    uint64_t gen = 0;        // its claim's gen (closed)
    uint64_t closed_at = 0;  // the stamp of its last event
  };
  Front FrontOf(const Lane* lane) const;
  // Makes chunk p `lane`'s open chunk if its gen is still `closed`.
  bool Take(Lane* lane, uint32_t p, uint64_t closed);
  bool TakeFront(Lane* lane, Lane* from, const Front& f);  // f = FrontOf(from)
  // The front closed first among `lane`'s own, parked lanes' and those of lanes that
  // hold more than `share` chunks.
  bool TakeOldest(Lane* lane, uint64_t share);
  // Numbers what the lanes published since the last call (see above).
  void Collect() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);

  const size_t capacity_;
  const uint32_t chunk_events_;  // K: slots per chunk
  const uint32_t num_chunks_;    // C
  const uint64_t uid_;           // this ring's identity for the threads' lane caches
  std::unique_ptr<Chunk[]> chunks_;  // C headers
  // The slots' mapping (trace.cc, "Layout"): chunk p's K slots are
  // [ChunkSlots(p), ChunkSlots(p) + K), then untouched address space up to the next.
  // Unmapped by its destructor, so also when the ring's constructor throws after
  // mapping it (the slots, trivially destructible, end with it).
  struct SlotMapping {
    Slot* slots = nullptr;
    size_t bytes = 0;  // the mapping's length
    SlotMapping() = default;
    SlotMapping(const SlotMapping&) = delete;
    SlotMapping& operator=(const SlotMapping&) = delete;
    ~SlotMapping();
  };
  SlotMapping slots_;
  size_t chunk_stride_ = 0;  // slots from one chunk's first slot to the next's
  Slot* ChunkSlots(uint32_t p) const { return slots_.slots + size_t{p} * chunk_stride_; }
  TraceClock clock_;
  // Every claim loads fresh_ and active_lanes_: a line of their own, written only while
  // the pool lasts and when a thread takes or gives back a lane, so that a claim of a
  // lane at its share reads no line another thread writes in steady state.
  // Chunks handed out of the pool (never claimed before); only loaded once it reaches C.
  alignas(64) std::atomic<uint32_t> fresh_{0};
  std::atomic<uint32_t> active_lanes_{0};      // lanes a thread holds: shares are C / this
  std::atomic<Lane*> lane_list_{nullptr};      // every lane, newest first (Lane::next_lane)

  // Taken by readers too (Collect): not on the line above.
  alignas(64) mutable Mutex lanes_mu_;
  std::vector<std::unique_ptr<Lane>> lanes_ ABSL_GUARDED_BY(lanes_mu_);
  std::vector<Lane*> free_lanes_ ABSL_GUARDED_BY(lanes_mu_);

  // The readers' side: numbered events, newest capacity_ of them (allocated on the
  // first read), and per lane how far it was read.
  struct Numbered;
  struct Cursor;
  mutable Mutex read_mu_;
  mutable uint64_t next_ ABSL_GUARDED_BY(read_mu_) = 1;  // the seq the next event gets
  mutable uint64_t kept_ ABSL_GUARDED_BY(read_mu_) = 0;  // events put into numbered_, ever
  mutable std::vector<Numbered> numbered_ ABSL_GUARDED_BY(read_mu_);
  mutable std::vector<Cursor> cursors_ ABSL_GUARDED_BY(read_mu_);
};

// The hot path's lookup (trace.cc): the last ring this thread recorded into (its uid)
// and its lane there, in one struct (one thread-pointer computation for both).
// constinit and trivially destructible: no TLS wrapper call.
namespace trace_internal {
struct TlsLane {
  uint64_t uid = 0;
  TraceRing::LaneHead* lane = nullptr;
};
extern constinit thread_local TlsLane tls_lane;
}  // namespace trace_internal

inline void TraceRing::WriteSlot(Slot* slot, const AllocEvent& event, uint64_t stamp,
                                 uint64_t thread_bits) {
  // The device index keeps 16 bits: exact for every device there is (0 .. 1023,
  // allocator/types.h).
  const uint64_t packed = static_cast<uint64_t>(event.action) |
                          static_cast<uint64_t>(event.device.type) << 8 |
                          uint64_t{static_cast<uint16_t>(event.device.index)} << 16 |
                          thread_bits;
  // Release stores (plain moves on x86): a reader that copies a word of this claim
  // and then checks the chunk's gen sees the claim's gen (trace.cc, Collect), without
  // a fence TSan cannot model.
  slot->words[0].store(stamp, std::memory_order_release);
  slot->words[1].store(packed, std::memory_order_release);
  slot->words[2].store(event.stream.handle, std::memory_order_release);
  slot->words[3].store(event.addr, std::memory_order_release);
  slot->words[4].store(event.size, std::memory_order_release);
  slot->words[5].store(event.requested, std::memory_order_release);
  slot->words[6].store(event.site, std::memory_order_release);
}

inline void TraceRing::Record(const AllocEvent& event) {
  // One thread-pointer-relative struct for both words of the lookup.
  const trace_internal::TlsLane& tls = trace_internal::tls_lane;
  LaneHead* const lane = tls.uid == uid_ ? tls.lane : ThisThreadLane();
  // Under the device lock (pool_order given) the exact tick and the pool's order:
  // out of line, on a path that costs hundreds of ns anyway.
  if (event.pool_order != nullptr) [[unlikely]] {
    RecordLocked(lane, event);
    return;
  }
  // The cache-hit path's stamp (see above): one tick past the largest of the
  // ticker's tick, the lane's last stamp and the block's. Everything the stores
  // below need is loaded before them (the block's word could alias the lane's).
  uint64_t* const block = event.block_order;
  uint64_t latest = std::max(static_cast<uint64_t>(TraceClock::Coarse()), lane->last);
  if (block != nullptr) latest = std::max(latest, *block);
  const uint64_t stamp = latest + 1;
  const uint32_t used = lane->used;
  if (used == lane->limit) [[unlikely]] {
    RecordSlow(lane, event, stamp);
    return;
  }
  Slot* const slot = lane->slots + used;
  std::atomic<uint32_t>* const count = lane->count;
  const uint64_t thread_bits = lane->thread_bits;
  lane->last = stamp;
  lane->used = used + 1;
  if (block != nullptr) *block = stamp;
  WriteSlot(slot, event, stamp, thread_bits);
  count->store(used + 1, std::memory_order_release);
}

}  // namespace devmem
