// tools/bench/pass_overlap.h: whether a timed pass of two threads ran them at the same
// time (threads2.h says why it is checked); header-only, so that tests check the rule.
//
// Each worker reports its pass as a wall-clock interval and the thread CPU time it
// spent in it. Time off the CPU (wall minus CPU) is time the thread waited: preempted,
// or sharing one CPU with the other worker. So the time both were on a CPU at once is
// at least the intersection of their intervals less each one's time off the CPU, and
// Overlap() is that bound over the pass (first start to last end): 1 when both ran
// the whole pass at once, 0 when they ran one after the other or shared one CPU.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace devmem::devbench {

inline constexpr double kMinOverlap = 0.9;  // of a pass, both workers on a CPU

// What one worker measured in one pass.
struct WorkerPass {
  std::chrono::steady_clock::time_point begin, end;
  int64_t cpu_ns = 0;  // its thread CPU time between the two
  double wall_ns() const { return std::chrono::duration<double, std::nano>(end - begin).count(); }
  // Never negative: the CPU clock may read a little over the wall clock's interval.
  double off_cpu_ns() const { return std::max(0.0, wall_ns() - static_cast<double>(cpu_ns)); }
};

// The fraction of a two-thread pass during which both workers were on a CPU, bounded
// from below (see above); 0 for an empty pass.
inline double Overlap(const WorkerPass& x, const WorkerPass& y) {
  using Ns = std::chrono::duration<double, std::nano>;
  const double span = Ns(std::max(x.end, y.end) - std::min(x.begin, y.begin)).count();
  const double both = Ns(std::min(x.end, y.end) - std::max(x.begin, y.begin)).count();
  if (span <= 0) return 0;
  return std::max(0.0, both - x.off_cpu_ns() - y.off_cpu_ns()) / span;
}

// Whether a two-thread pass counts (ran both workers at once for kMinOverlap of it).
inline bool RanTogether(const WorkerPass& x, const WorkerPass& y) {
  return Overlap(x, y) >= kMinOverlap;
}
// Whether a one-thread pass counts: its worker was on a CPU for kMinOverlap of it (a
// preempted one-thread pass would understate one thread and inflate the speedup).
inline bool RanUnpreempted(const WorkerPass& w) {
  return static_cast<double>(w.cpu_ns) >= kMinOverlap * w.wall_ns();
}

}  // namespace devmem::devbench
