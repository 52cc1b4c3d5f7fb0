// runtime/trace.cc: the lock-free event ring (see trace.h).
//
// Protocol. Event number s (s = 1, 2, ...) goes to slot (s - 1) % capacity. Its writer
//   1. claims s with one fetch_add on next_ (relaxed: events of one device are already
//      ordered by the device lock the caller holds);
//   2. waits until the slot holds event s - capacity (or nothing, for s <= capacity):
//      the previous writer of the slot must finish first, so two writers never mix
//      their words. This wait is one load in practice; it spins only when the whole
//      ring was lapped while an older writer was preempted mid-write;
//   3. stores kBusy | s in the slot's seq, a release fence, the seven data words
//      (relaxed), and finally s with release.
// A reader of event q loads the slot's seq (acquire); if it is q it reads the words
// (relaxed), issues an acquire fence and loads seq again: unchanged means the words are
// event q's (Boehm, "Can seqlocks get along with programming language memory
// models?", 2012). A larger seq means q was overwritten (missed); a smaller one means
// q's writer has not published yet, and the read stops there so that results stay in
// order without gaps that are not counted.
//
// Packing of the words: [0] clock tick, [1] action | device type << 8 | device index
// << 16 (16 bits) | thread << 32, [2] stream, [3] addr, [4] size, [5] requested,
// [6] site.
#include "runtime/trace.h"

#include <algorithm>
#include <thread>

#include "allocator/errors.h"

namespace devmem {
namespace {

constexpr uint64_t kBusy = uint64_t{1} << 63;

std::atomic<uint32_t> g_next_thread{1};
thread_local uint32_t tls_thread = 0;

}  // namespace

uint32_t TraceThreadNumber() {
  uint32_t t = tls_thread;
  if (t == 0) [[unlikely]] {
    t = g_next_thread.fetch_add(1, std::memory_order_relaxed);
    tls_thread = t;
  }
  return t;
}

TraceRing::TraceRing(size_t capacity)
    : capacity_(capacity),
      mask_(capacity != 0 && (capacity & (capacity - 1)) == 0 ? capacity - 1 : 0),
      slots_(capacity == 0 ? nullptr : new Slot[capacity]) {
  if (capacity == 0) {
    throw InvalidArgumentError("TraceRing: capacity must be at least 1 (got 0)");
  }
}

TraceRing::~TraceRing() = default;

size_t TraceRing::capacity() const { return capacity_; }

uint64_t TraceRing::next_seq() const { return next_.load(std::memory_order_acquire); }

TraceRing::Slot& TraceRing::slot_for(uint64_t seq) const {
  const uint64_t i = seq - 1;
  // A mask for power-of-two capacities (mask_ + 1 == capacity_), else a division.
  return slots_[mask_ + 1 == capacity_ ? (i & mask_) : (i % capacity_)];
}

void TraceRing::WaitForSlot(const Slot& slot, uint64_t previous) const {
  // Cold: an older writer of this slot is still writing (see the protocol above).
  while (slot.seq.load(std::memory_order_acquire) != previous) std::this_thread::yield();
}

void TraceRing::on_event(const AllocEvent& event) { Record(event); }

void TraceRing::Record(const AllocEvent& event) {
  const int64_t tick = clock_.Now();
  const uint64_t s = next_.fetch_add(1, std::memory_order_relaxed);
  Slot& slot = slot_for(s);
  const uint64_t previous = s > capacity_ ? s - capacity_ : 0;
  if (slot.seq.load(std::memory_order_acquire) != previous) [[unlikely]] {
    WaitForSlot(slot, previous);
  }
  slot.seq.store(kBusy | s, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const uint64_t packed = static_cast<uint64_t>(event.action) |
                          static_cast<uint64_t>(event.device.type) << 8 |
                          (static_cast<uint64_t>(event.device.index) & 0xffff) << 16 |
                          static_cast<uint64_t>(TraceThreadNumber()) << 32;
  slot.words[0].store(static_cast<uint64_t>(tick), std::memory_order_relaxed);
  slot.words[1].store(packed, std::memory_order_relaxed);
  slot.words[2].store(event.stream.handle, std::memory_order_relaxed);
  slot.words[3].store(event.addr, std::memory_order_relaxed);
  slot.words[4].store(event.size, std::memory_order_relaxed);
  slot.words[5].store(event.requested, std::memory_order_relaxed);
  slot.words[6].store(event.site, std::memory_order_relaxed);
  slot.seq.store(s, std::memory_order_release);
  // Each event writes a fresh cache line; a ring larger than the caches would make the
  // next event wait for that line's read-for-ownership. Ask for it now, while the
  // caller goes on with its work (measured: keeps tracing_overhead_ratio stable when
  // the shared L3 is busy).
  __builtin_prefetch(&slot_for(s + 1), /*rw=*/1, /*locality=*/3);
}

std::vector<TraceEvent> TraceRing::since(uint64_t after, size_t limit,
                                         uint64_t* missed) const {
  std::vector<TraceEvent> out;
  uint64_t lost = 0;
  const uint64_t end = next_.load(std::memory_order_acquire);  // first seq not claimed
  // Nothing has a seq above `after` yet (end >= 1 always). Checked before computing
  // after + 1, which wraps to 0 for after = 2^64 - 1 and would return the whole ring.
  if (after >= end - 1) {
    if (missed != nullptr) *missed = 0;
    return out;
  }
  // Events older than the last `capacity_` claimed are gone (or being overwritten).
  const uint64_t oldest_kept = end > capacity_ ? end - capacity_ : 1;
  uint64_t q = after + 1;
  if (q < oldest_kept) {
    lost += oldest_kept - q;
    q = oldest_kept;
  }
  const TraceClock::Mapping map = clock_.Map();
  if (end > q) out.reserve(std::min<uint64_t>(end - q, limit));
  for (; q < end && out.size() < limit; ++q) {
    const Slot& slot = slot_for(q);
    const uint64_t s1 = slot.seq.load(std::memory_order_acquire);
    const uint64_t holder = s1 & ~kBusy;
    // q's writer has not published yet (the slot holds an older event, or q itself
    // half-written): stop, so the caller's next since() resumes here.
    if (holder < q || s1 == (kBusy | q)) break;
    if (holder > q) {  // lapped: q was overwritten
      ++lost;
      continue;
    }
    uint64_t w[7];
    for (int i = 0; i < 7; ++i) w[i] = slot.words[i].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (slot.seq.load(std::memory_order_relaxed) != q) {  // overwritten while reading
      ++lost;
      continue;
    }
    TraceEvent e;
    e.seq = q;
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
  if (missed != nullptr) *missed = lost;
  return out;
}

}  // namespace devmem
