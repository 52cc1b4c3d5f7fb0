// tools/bench/perf_counter.h: user-space instructions retired by this thread, through
// perf_event_open (Linux), for a figure that does not depend on machine load.
//
//   InstructionCounter counter;
//   if (counter.ok()) { counter.start(); work(); uint64_t n = counter.stop(); }
//   else puts(counter.why().c_str());   // e.g. no hardware counters in a VM
//
// Ownership: owns the perf file descriptor. Not thread-safe: it counts the thread that
// constructed it, and only that thread may call start/stop.
#pragma once

#include <cstdint>
#include <string>

namespace devmem::devbench {

class InstructionCounter {
 public:
  InstructionCounter();
  ~InstructionCounter();
  InstructionCounter(const InstructionCounter&) = delete;
  InstructionCounter& operator=(const InstructionCounter&) = delete;

  // False when the counter could not be opened (not Linux, perf_event_paranoid too
  // high, no hardware counters); why() says which.
  bool ok() const { return fd_ >= 0; }
  const std::string& why() const { return why_; }

  void start();
  // Instructions retired in user space since start().
  uint64_t stop();

 private:
  int fd_ = -1;
  std::string why_;
};

}  // namespace devmem::devbench
