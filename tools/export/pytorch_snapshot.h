// tools/export/pytorch_snapshot.h: devmem's snapshots, OOM dumps and traces in PyTorch's
// memory snapshot format (what torch.cuda.memory._snapshot() returns and
// torch.cuda.memory._dump_snapshot() pickles; pytorch.org/memory_viz and
// torch.cuda._memory_viz read it), for `memtrace export --to pytorch-snapshot`.
// docs/formats.md ("PyTorch snapshot export") lists every field written and where it
// comes from.
//
// The format describes each device's state at one moment (`segments`, each with the
// `blocks` tiling it) and the events that led there (`device_traces`, one list per
// device index); memory_viz replays the events backwards from the state, so the two
// must agree. With a snapshot or OOM dump the state is the file's and its events are
// those it carries up to its time; with a trace alone the state is rebuilt by replaying
// the trace (segments, maps and unmaps, live blocks), and what the trace window does
// not hold (a block allocated before the oldest event) is not invented, except that a
// live block in no known segment gets a segment of its own extent, so the state stays
// well-formed.
//
// Sites become frames: [{filename, line, name}] with the site's file, line and
// function (the kind appended unless it is "alloc"), then a frame naming the tag
// ({filename: "devmem tag", line: 0, name: TAG}) when the site has one; the unknown site
// has no frames. A block with a sampled stack (the state's sampled_stacks) has that
// stack's frames after its site's, as {filename: "??", line: 0, name: FRAME}.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/types.h"
#include "runtime/json.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"

namespace devmem::memtrace {

struct PyTorchExportInput {
  // The allocator state at the end: a snapshot's or OOM dump's. Absent for a trace.
  std::optional<RuntimeSnapshot> state;
  SiteMap sites;                  // the file's site table
  std::vector<TraceEvent> trace;  // in the order they happened
  // An OOM dump's report: its failed request becomes an "oom" entry where the dump
  // carries no trace event for it, and its driver_free is the entry's device_free.
  struct Oom {
    DeviceId device;
    Stream stream;
    SiteId site = kUnknownSite;
    uint64_t requested_bytes = 0;
    uint64_t driver_free = 0;
  };
  std::optional<Oom> oom;
};

struct PyTorchExportOptions {
  std::optional<DeviceId> device;  // only this device (else every device present)
};

struct PyTorchExportSummary {
  std::vector<std::string> devices;  // devmem's names, in PyTorch device index order
  size_t segments = 0;
  size_t blocks = 0;
  size_t trace_entries = 0;
  bool state_from_trace = false;  // the segments were rebuilt from the trace
};

// The pickle. InvalidArgument when `options.device` is not in the input, or when two
// devices of the input have the same index (PyTorch numbers devices by index alone:
// "cpu and sim:0 are both device 0 ...; choose one with --device").
absl::StatusOr<std::string> PyTorchSnapshotPickle(const PyTorchExportInput& input,
                                                  const PyTorchExportOptions& options,
                                                  PyTorchExportSummary* summary = nullptr);

}  // namespace devmem::memtrace
