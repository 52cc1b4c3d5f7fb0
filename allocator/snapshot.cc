// allocator/snapshot.cc: names of block states, the clocks used for block ages, traces,
// snapshot times and lock holds, and the sampled stacks of a snapshot's blocks.
// Thread-safe.
#include "allocator/snapshot.h"

#include <sys/resource.h>
#include <time.h>

#include <vector>

#include "absl/container/flat_hash_map.h"

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

void AttachSampledStacks(const void* owner, AllocatorSnapshot* snap) {
  snap->stack_sample_bytes = stack_sampler::MeanBytes();
  snap->local_stacks = true;
  std::vector<stack_sampler::LiveSample> samples = stack_sampler::LiveSamples(owner);
  if (samples.empty()) return;
  absl::flat_hash_map<uintptr_t, const stack_sampler::LiveSample*> by_addr;
  by_addr.reserve(samples.size());
  for (const stack_sampler::LiveSample& s : samples) by_addr.emplace(s.addr, &s);
  std::vector<stack_sampler::LiveSample> kept;
  kept.reserve(samples.size());
  for (SegmentInfo& seg : snap->segments) {
    for (BlockInfo& b : seg.blocks) {
      if (b.state != BlockState::kAllocated) continue;
      auto it = by_addr.find(b.addr);
      if (it == by_addr.end()) continue;
      b.stack = it->second->stack;
      kept.push_back(*it->second);
    }
  }
  snap->sampled_stacks = stack_sampler::GroupSamples(kept);
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

int64_t ThreadCpuNowNs() { return ReadClock(CLOCK_THREAD_CPUTIME_ID); }

int64_t ThreadFaults() {
#ifdef RUSAGE_THREAD
  rusage ru{};
  if (getrusage(RUSAGE_THREAD, &ru) != 0) return 0;
  return int64_t{ru.ru_minflt} + int64_t{ru.ru_majflt};
#else
  return 0;
#endif
}

}  // namespace devmem
