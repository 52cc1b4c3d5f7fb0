// tools/bench/steady_maps.h: how often the policy goes back to the device once warm,
// when two streams alternate between one and two active threads.
//
// On a GPU each expandable-segment map or unmap is a cuMemMap/cuMemUnmap/
// cuMemSetAccess costing tens of microseconds, plus a stream synchronization; a single
// stream doing the same work is served with none once warm. Target: 0.
#pragma once

#include <cstdint>

#include "allocator/config.h"

namespace devmem::devbench {

struct SteadyMapsFigures {
  int64_t maps = 0;    // segment allocations (maps) during the timed passes
  int64_t unmaps = 0;  // segment frees (unmaps) during the timed passes
  int64_t in_one_thread_passes = 0;   // maps + unmaps in the passes with thread 1 alone
  int64_t in_two_thread_passes = 0;   // and in those with both threads
  int64_t one_stream_maps = 0;  // the same passes, one stream only: the reference
};

// On an allocator of SimConfig(base) with two streams: after a warm-up of both phases
// until a round of them maps nothing (WarmUp, at most kMaxWarmUpPasses rounds),
// kRepetitions passes alternating between thread 1 alone (stream 1) and threads 1 and 2
// at once (streams 1 and 2), each thread its own size stream, 512 B .. 64 MiB.
SteadyMapsFigures MeasureSteadyMaps2Streams(const Config& base);

}  // namespace devmem::devbench
