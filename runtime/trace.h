// runtime/trace.h: a bounded ring of allocator events (DESIGN.md "Trace").
//
// A TraceRing is an AllocatorObserver: attach it to allocators with set_observer and
// every alloc, free, free_completed, segment_alloc/free/map/unmap and oom lands here
// with the time, the thread and the site. When the ring is full the oldest events are
// overwritten; each event has a sequence number (starting at 1, never reused), so a
// reader asks for "everything after N" and learns how many it missed.
//
// Cost: on_event runs under the allocating device's lock (allocator/observer.h) and must
// be short: devmem-bench reports tracing_overhead_ratio (cache-hit pair time with trace
// on over off), target <= 1.25. So the ring takes no lock: a writer claims a sequence
// number with one atomic increment and fills a cache-line slot published seqlock-style
// (runtime/trace.cc has the protocol); the time is the raw TraceClock tick
// (runtime/trace_clock.h), converted to nanoseconds when read.
//
// Thread-safety: on_event may be called concurrently from several devices' threads;
// readers (since) may run at any time and never block writers. A reader that races a
// writer lapping the ring counts the event as missed rather than returning a torn one.
// Lock-free: no lock order to respect.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "allocator/observer.h"
#include "runtime/trace_clock.h"

namespace devmem {

struct TraceEvent {
  uint64_t seq = 0;      // 1, 2, 3, ... in the order events happened on their device
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
  // capacity > 0: the number of events kept (InvalidArgumentError otherwise). The slots
  // (64 bytes each) are allocated and zeroed here.
  explicit TraceRing(size_t capacity);
  ~TraceRing() override;

  void on_event(const AllocEvent& event) override;

  // Events with seq > after, oldest first, at most `limit`. *missed (if given) is the
  // number of events after `after` that were overwritten before this read.
  std::vector<TraceEvent> since(uint64_t after, size_t limit = SIZE_MAX,
                                uint64_t* missed = nullptr) const;
  // The sequence number the next event will get.
  uint64_t next_seq() const;
  size_t capacity() const;

  // on_event without the virtual dispatch, for observers that forward to a ring.
  void Record(const AllocEvent& event);

 private:
  // One event: `seq` publishes the slot (0: never written; kBusy | s: being written
  // with event s; s: holds event s), the words hold the event's fields packed (see
  // trace.cc). Relaxed atomics, so that a reader racing a writer is defined behaviour
  // (and ThreadSanitizer-clean); a reader checks `seq` before and after.
  struct alignas(64) Slot {
    std::atomic<uint64_t> seq{0};
    std::atomic<uint64_t> words[7] = {};
  };
  Slot& slot_for(uint64_t seq) const;
  void WaitForSlot(const Slot& slot, uint64_t previous) const;

  const size_t capacity_;
  const size_t mask_;  // capacity_ - 1 when it is a power of two, else 0
  std::unique_ptr<Slot[]> slots_;
  TraceClock clock_;
  alignas(64) std::atomic<uint64_t> next_{1};  // the seq the next event gets
};

}  // namespace devmem
