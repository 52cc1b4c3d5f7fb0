// tools/bench/threads2.h: threads2_speedup, the aggregate throughput of two threads
// allocating on one device at the same time over that of one thread.
//
// What the figure means, and so what is timed: two long-lived threads (each keeps its
// thread cache, trace lane and histogram shard from pass to pass, as a program's
// threads do), each running its own size stream through the shipped path
// (shipped_path.h) with its own window of live pointers; nothing is shared but the
// allocator. A pass runs both workers (or worker 0 alone) over their streams
// kThreadsRounds times (a few milliseconds) and is timed from the first worker's start
// to the last one's end.
//
// "At the same time" is checked, not assumed. On a VM an idle vCPU is halted by the
// hypervisor, and waking it can take longer than a whole pass of the other worker: the
// two then run one after the other and the "speedup" times a serial run (it read 0.97,
// 1.03 and 1.72 in three idle runs when passes of under a millisecond started on a
// condition variable). So each pass starts at a spin barrier (every active worker
// announces it is running, then spins until all are, then starts its clock), and each
// pass's overlap is measured (pass_overlap.h): the fraction of the pass during which
// both workers were on a CPU, bounded from below by the intersection of their
// wall-clock intervals less each one's time off the CPU (wall time minus its thread
// CPU time). A two-thread pass counts when its overlap is at least kMinOverlap; a
// one-thread pass when its worker was on a CPU for kMinOverlap of it (a preempted
// one-thread pass would inflate the speedup). Passes that do not count are said (the
// counts), never averaged in; without kMinCountedPasses of each kind there is no
// speedup figure, and `why` says so.
// "On a CPU" is the guest kernel's view: where the hypervisor deschedules a vCPU
// without steal-time accounting (as on the development VM), that time reads as CPU
// time. That, and what else the machine shares between its cores, is what the
// mimalloc run beside devmem's reads (ThreadsFigures::mimalloc).
//
// Thread-safety: call from one thread at a time; it starts and joins its two workers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "tools/bench/pass_overlap.h"  // kMinOverlap, Overlap

namespace devmem::devbench {

inline constexpr int kThreadsRounds = 4;         // a pass: each stream this many times
inline constexpr int kMinCountedPasses = 3;      // of each kind, for a figure at all
inline constexpr int kMaxThreadsPasses = 40;     // of each kind, counted or not

// One allocator's figures from one harness.
struct Scaling {
  // Passes run and passes that counted, of each kind.
  int one_thread_passes = 0;
  int one_thread_counted = 0;
  int two_thread_passes = 0;
  int two_thread_counted = 0;
  // The median overlap of the two-thread passes that counted, and of all of them.
  std::optional<double> overlap;
  double overlap_all = 0;
  // The median of the counted passes' start skew (the later worker's clock start after
  // the earlier one's), ns.
  double start_skew_ns = 0;
  // Absent unless kMinCountedPasses of each kind counted; then `why` says what ran.
  std::optional<double> speedup;  // two over one, medians of counted passes
  double one_thread_pairs_per_s = 0;
  double two_threads_pairs_per_s = 0;  // aggregate
  // Each worker's thread CPU time per pair, alone and beside the other (the mean of
  // the two), over counted passes: their ratio is what sharing the allocator (and the
  // machine: caches, memory, SMT siblings on a VM's host) costs a thread while both
  // run at once.
  double one_thread_cpu_ns_per_pair = 0;
  double two_threads_cpu_ns_per_pair = 0;
  std::string why;
};

// devmem's, and beside it mimalloc's (mi_malloc/mi_free, thread-local heaps: nothing
// shared) from the same harness, streams and passes, interleaved: what the machine
// gives two threads at that moment, to read devmem's figure against. Absent without
// mimalloc (host_allocators.h).
struct ThreadsFigures : Scaling {
  std::optional<Scaling> mimalloc;
  int64_t timed_segment_allocs = 0;
};

// Worker t runs `streams[t]` ((a, b)) on `alloc`'s default stream; one-thread passes
// run `a`. One-thread and two-thread passes alternate, devmem's and mimalloc's (so
// that drift in machine load hits all alike), until kRepetitions of each of devmem's
// counted, or kMaxThreadsPasses of each ran.
ThreadsFigures MeasureThreads2(CachingAllocator& alloc, const std::vector<size_t>& a,
                               const std::vector<size_t>& b);

}  // namespace devmem::devbench
