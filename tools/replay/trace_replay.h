// tools/replay/trace_replay.h: replays an allocation trace through a fresh allocator on a
// simulated device, to answer "what would this workload cost under another
// configuration?" and "what is the smallest device it fits on?" without a GPU.
//
// Example:
//   absl::StatusOr<Trace> trace = ReadTrace("tests/data/traces/real/resnet18_train.jsonl.gz");
//   Config config = *ParseConfig("expandable_segments:true");
//   ReplayResult r = Replay(*trace, config, /*capacity=*/8 * kGiB);
//   MinCapacity m = FindMinCapacity(*trace, config);
//
// Input: JSON Lines, one event an object (the trace format of docs/formats.md):
// {"action": "alloc", "addr": A, "size": S, "stream": T, "time_ns": N} and
// {"action": "free", "addr": A, ...}. `device` and `addr` identify an allocation while
// it lives (addresses are reused after a free, and two devices may hand out the same
// address); `stream` and `device` are optional (default 0 and ""). The other actions of
// the format (segment_alloc, oom, ...: kTraceActions) are not replayed; an action
// outside the format is counted (unknown_actions, with the first one and its line) and
// skipped, and memtrace warns about it. A free of an address that is not live is
// counted (unmatched_frees) and skipped: traces often start after some allocations
// were made (memtrace warns with the count); an alloc of a live address is an error.
// memtrace timeline follows the same rule (docs/formats.md).
//
// Devices: the whole trace replays on ONE sim device. A trace of several devices is
// merged (their allocations share the one device's pool, which is not what the
// devices saw); `devices` lists them so that memtrace can say so.
//
// Determinism: the sim backend places segments deterministically and the allocator's
// policy depends only on the sequence of calls, so the same trace, configuration and
// capacity give the same figures every run (ns_per_op aside).
//
// Arenas (ArenaReplay): the replay can open a scoped arena (allocator/arena.h) per step
// on the replaying thread, as a training loop with an ArenaScope per step would, to
// show what arenas do to a workload's footprint. Traces carry no step boundaries (the
// real PyTorch traces record allocations and frees only), so InferSteps finds them by
// a documented rule: a step ends at each valley of live requested bytes between a
// fall and a rise of at least `step_swing` x the trace's peak requested bytes.
//
// Thread-safety: functions are reentrant; each Replay builds its own allocator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/arena.h"
#include "allocator/config.h"
#include "allocator/driver_calls.h"

namespace devmem {

// The capacity "unbounded" means: 1 TiB of simulated device (address space only).
inline constexpr uint64_t kUnboundedCapacity = uint64_t{1} << 40;

// A trace parsed once into a compact form: allocations get dense ids in order, frees
// refer to them, streams are renumbered densely in order of appearance.
struct Trace {
  struct Op {
    uint64_t size;       // bytes for alloc; 0 for free
    uint32_t id;         // dense allocation id
    uint16_t stream;     // dense stream index
    bool alloc;
  };
  std::vector<Op> ops;
  uint32_t allocations = 0;
  uint64_t unmatched_frees = 0;   // frees of addresses that were not live
  uint64_t lines = 0;             // events read (every action)
  uint64_t peak_requested = 0;    // max over time of the live requested bytes
  uint16_t streams = 0;
  // The distinct `device` values of alloc/free events, in order of appearance ("" for
  // events without one). More than one: the replay merged them.
  std::vector<std::string> devices;
  // Events whose action is not one of the format's (kTraceActions): skipped, counted.
  uint64_t unknown_actions = 0;
  std::string first_unknown_action;  // the first such action (printable, truncated)
  uint64_t first_unknown_line = 0;   // and its line in the file
};

// Every action of the trace format (docs/formats.md); only alloc and free are replayed.
inline constexpr std::string_view kTraceActions[] = {
    "alloc",         "free",          "free_completed", "segment_alloc", "segment_free",
    "segment_map",   "segment_unmap", "oom",            "arena_open",    "arena_close"};

// Reads a JSON Lines trace. Errors name the file and the line (and what was expected):
// unreadable file, malformed JSON, a missing or mistyped field, an alloc of an address
// that is already live, absurd sizes (> 2^50 bytes), more than 65535 streams.
absl::StatusOr<Trace> ReadTrace(const std::string& path);
// The same from text in memory; `name` is used in error messages.
absl::StatusOr<Trace> ParseTrace(std::string_view text, const std::string& name);

// The default step rule's swing (InferSteps): a quarter of the peak. On the shipped
// traces it finds exactly the recorded steps of both real PyTorch traces (3 each), of
// training_loop.jsonl (96 batches) and transformer.jsonl (3); 0.1 also splits the real
// traces' steps at valleys inside them (10 and 9 scopes) while it finds all 9 steps of
// training_varseq.jsonl (0.25: 6 scopes). docs/architecture.md, "Replay with arenas".
inline constexpr double kDefaultStepSwing = 0.25;

// A replay with a scoped arena per step (memtrace replay --arenas).
struct ArenaReplay {
  bool enabled = false;
  // ArenaOptions::chunk_size of each step's scope: a multiple of 512 in
  // [kMinArenaChunkSize, kMaxArenaChunkSize].
  size_t chunk_size = kDefaultArenaChunkSize;
  double step_swing = kDefaultStepSwing;  // InferSteps' swing, in (0, 1]
};

// The op indices at which a step ends (the step includes that op), ascending. The
// rule, on L = live requested bytes after each op and h = swing x peak requested:
// the live bytes must first fall by at least h from their highest point since the
// last step end; from there the lowest point is tracked, and once L rises at least h
// above it, the first op that reached that lowest point ends a step (a "valley"
// between two swings of at least h: the zigzag rule). The first step starts at op 0,
// the last one ends with the trace; a trace with no such valley is one step. Linear in
// the ops; deterministic.
std::vector<size_t> InferSteps(const Trace& trace, double swing);

// OK, or InvalidArgumentError naming the bad field and its value ("chunk_size 1000:
// ...", "step_swing 0: ..."). Replay throws it as InvalidArgumentError.
absl::Status CheckArenaReplay(const ArenaReplay& arenas);

struct ReplayResult {
  uint64_t capacity = 0;             // the sim device's capacity for this run
  uint64_t peak_requested_bytes = 0; // of the trace (what the program asked for)
  uint64_t peak_reserved_bytes = 0;  // what the allocator held from the device
  double reserved_over_requested = 0;
  int64_t device_allocs = 0;         // segment allocations and maps
  int64_t device_frees = 0;
  int64_t ooms = 0;                  // allocations that failed for good
  int64_t alloc_retries = 0;
  uint64_t ops = 0;
  double ns_per_op = 0;              // wall clock (the one figure that varies)
  // The sim's driver calls by kind and the driver cost model's estimate of their time
  // (allocator/driver_calls.h, sim_driver_cost): what this configuration would spend
  // in the driver on a GPU. Deterministic, like the memory figures.
  DriverCallStats driver;
  // With ArenaReplay::enabled (all zero otherwise). Peak reserved bytes above are then
  // those with arenas on (the chunks are pool blocks).
  struct Arenas {
    int64_t steps = 0;             // scopes opened (one per step)
    int64_t bumps = 0;             // allocations served by the arenas: each one avoided a
                                   // pool allocation and a free (two free-list operations)
    int64_t bump_bytes = 0;
    int64_t escaped_bytes = 0;     // summed over steps: bytes still live when their step's
                                   // scope closed (buffers that outlive their step)
    int64_t escaped_buffers = 0;
    int64_t max_step_escaped_bytes = 0;  // the most one step left behind
    int64_t peak_chunks = 0;       // most chunks the arenas held at a step's end
    int64_t peak_chunk_bytes = 0;  // most bytes of chunks at a step's end
    int64_t pool_chunk_allocs = 0; // chunks taken from the pool
    int64_t chunk_reuses = 0;      // chunks reused without a pool call
    int64_t spills = 0;            // requests the waste bound (arena_max_waste) sent to
    int64_t spill_bytes = 0;       // the pool's path, and their bytes
  } arenas;
};

class CachingAllocator;
// Called after each op with the op's index and the replaying allocator (memtrace
// timeline reads reserved bytes over time through it; reading stats() costs a lock
// and a copy, so observers read only when they need to).
using ReplayObserver = std::function<void(size_t op_index, const CachingAllocator& alloc)>;

// Replays `trace` on a fresh sim device of `capacity` bytes with `config`'s policy.
// With `arenas.enabled`, each step of InferSteps(trace, arenas.step_swing) runs inside
// an ArenaScope named "replay step" on trace stream 0 (the default stream): that
// stream's requests of at most chunk_size / 4 are bumps; other streams and larger
// requests take the normal path, as in a program (allocator/arena.h). Throws
// InvalidArgumentError for a bad chunk_size or swing (naming it).
ReplayResult Replay(const Trace& trace, const Config& config, uint64_t capacity,
                    const ReplayObserver& observe = nullptr, const ArenaReplay& arenas = {});

struct MinCapacity {
  // The smallest capacity C on the grid such that the trace replays with zero OOMs at
  // every grid capacity from C up to the unbounded replay's peak reserved bytes: the
  // device size above which the workload is known to fit.
  uint64_t bytes = 0;
  double over_peak_requested = 0;
  // The smallest capacity bisection found that fits. Below `bytes` when fitting is
  // not monotonic in the capacity (then some capacity in between fails).
  uint64_t smallest_fitting_bytes = 0;
  bool monotonic = true;  // no failure was seen above a fitting capacity
  uint64_t step = 0;      // the grid step used
  int runs = 0;           // replays it took
};

// Finds the smallest device the trace fits on. Fitting need not be monotonic in the
// capacity for this policy: a smaller device reaches the staged retry earlier, which
// flushes the cache and can leave less fragmentation later (ResNet-18's trace fits at
// 392-410 MiB, fails at 412 MiB and fits again from 414 MiB). So:
//   1. replay unbounded: its peak reserved bytes `hi` fits (the allocator makes the
//      same decisions at any capacity it never reaches), and nothing fits below the
//      trace's peak requested bytes `lo`;
//   2. bisect [lo, hi] for smallest_fitting_bytes (exact when fitting is monotonic);
//   3. scan down from `hi` in steps of `step` until the first failure: `bytes` is the
//      last capacity that fit. step = max(resolution, (hi - lo) / max_scan), so the
//      scan takes at most max_scan replays.
// With `arenas.enabled`, every replay of the search runs with arenas (Replay).
MinCapacity FindMinCapacity(const Trace& trace, const Config& config,
                            uint64_t resolution = uint64_t{1} << 20, int max_scan = 256,
                            const ArenaReplay& arenas = {});

}  // namespace devmem
