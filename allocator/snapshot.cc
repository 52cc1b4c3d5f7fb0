// allocator/snapshot.cc: names of block states, and the clocks used for block ages,
// traces and snapshot times. Thread-safe.
#include "allocator/snapshot.h"

#include <time.h>

namespace devmem {

std::string_view BlockStateName(BlockState state) {
  switch (state) {
    case BlockState::kAllocated: return "allocated";
    case BlockState::kFree: return "free";
    case BlockState::kPending: return "pending";
    case BlockState::kThreadCached: return "thread_cached";
  }
  return "unknown";
}

namespace {
int64_t ReadClock(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}
}  // namespace

// CLOCK_MONOTONIC_COARSE is read from the vDSO without a syscall and costs a few ns;
// its resolution (a scheduler tick, 1-4 ms) is plenty for block ages. Same epoch as
// CLOCK_MONOTONIC, so the two may be compared (to within a tick).
int64_t CoarseNowNs() { return ReadClock(CLOCK_MONOTONIC_COARSE); }

int64_t NowNs() { return ReadClock(CLOCK_MONOTONIC); }

}  // namespace devmem
