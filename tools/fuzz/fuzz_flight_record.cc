// tools/fuzz/fuzz_flight_record.cc: libFuzzer target for the flight-record reader
// (runtime/flight_record_reader.h). A file is any bytes a dead process, a full disk or
// a damaged copy left behind: every input must give a record or an error, never a
// crash; and what the reader accepts must be usable by its consumers: the merged
// events are numbered 1, 2, ... and the trace text (FlightRecordToTraceJsonl, what
// `memtrace timeline` and `export` read) reads back with the trace reader, to as
// many events.
//
// Each input is parsed twice: as it is, and with its header check recomputed, so that
// mutations of the header's counts, flags and clock anchor get past the header check
// and reach the layout checks and the regions (the body's records carry checks of
// their own: mutated ones are read as damaged, which is a path the reader must take
// too).
//
// Seeds (tools/fuzz/corpus/flight_record/, made by tests/data/flight/make_fuzz_seeds.py
// from tests/data/flight/generate.py's record: format version 2, one region of two
// lanes, 64 ring slots, 16 site slots, 64-byte names): one whole (whole.flight), one
// cut inside a lane's ring (truncated), one with a ring slot and a name changed and a
// live-site copy marked busy (corrupted), and the whole one with the TSC flag and a
// clock anchor at the bottom of the int64 range, its header check fixed (tsc_clock: the
// reader's tick-to-ns path, where this fuzzer's UBSan build found signed overflows;
// tests/flight_recorder_test.cc pins them).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/flight_record_format.h"
#include "runtime/flight_record_reader.h"
#include "runtime/json.h"

namespace {

void Check(const std::string& bytes) {
  absl::StatusOr<devmem::FlightRecord> r = devmem::ParseFlightRecord(bytes, "fuzz.flight");
  if (!r.ok()) {
    if (r.status().message().rfind("fuzz.flight: ", 0) != 0) __builtin_trap();  // names it
    return;
  }
  if (r->torn + r->damaged < r->problems.size()) __builtin_trap();
  const std::vector<devmem::TraceEvent> events = devmem::FlightRecordEvents(*r);
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].seq != i + 1) __builtin_trap();
  }
  devmem::SiteMap sites;
  absl::StatusOr<std::vector<devmem::TraceEvent>> again =
      devmem::TraceFromJsonl(devmem::FlightRecordToTraceJsonl(*r), &sites);
  if (!again.ok() || again->size() != events.size()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace flight = devmem::flight;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  Check(bytes);
  if (bytes.size() >= flight::header::kEnd) {
    const uint64_t check = flight::FlightCheckBytes(
        0, reinterpret_cast<const unsigned char*>(bytes.data()), flight::header::kCheck);
    std::memcpy(bytes.data() + flight::header::kCheck, &check, sizeof(check));
    Check(bytes);
  }
  return 0;
}
