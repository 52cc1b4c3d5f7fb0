// tools/bench/flight_recorder.h: the flight recorder's cost, for devmem-bench
// (flight_recorder_overhead_ratio: the median ratio of alternated recorded and plain
// passes; target <= 1.15).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/config.h"

namespace devmem::devbench {

struct FlightFigures {
  double plain_ns = 0;     // median ns per cache-hit pair, no observer
  double recorded_ns = 0;  // the same with a flight recorder attached
  double ratio = 0;        // median over alternated pass pairs of recorded / plain
  double fastest_ratio = 0;  // the fastest recorded pass over the fastest plain one
  double minor_faults_per_pass = 0;  // of the recorded passes (getrusage)
  int64_t timed_segment_allocs = 0;  // must be 0: every timed pair hit the cache
};

// `sizes` through one sim allocator, `repetitions` passes each way, interleaved. The
// error is the recorder's (its temporary file could not be made).
absl::StatusOr<FlightFigures> MeasureFlightRecorder(const std::vector<size_t>& sizes,
                                                    const Config& base, int repetitions);

}  // namespace devmem::devbench
