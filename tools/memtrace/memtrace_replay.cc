// tools/memtrace/memtrace_replay.cc: `memtrace replay`: runs a trace (JSON Lines:
// docs/formats.md) through a fresh allocator on a simulated device with the given
// configuration and prints peak requested bytes, peak reserved bytes, their ratio,
// device (segment) allocations, OOMs, ns per operation and the estimated driver time
// (the sim's driver cost model, sim_driver_cost); --min-capacity adds the
// smallest device the trace fits on (FindMinCapacity in tools/replay/trace_replay.h says how,
// and why the answer is verified).
//
// Exit status: 0 the trace replayed with no OOM at this capacity; 1 it did not fit (the
// answer is "no": `ooms` > 0, `fits` false in --json), the figures printed all the same;
// 2 bad input. A trace of several devices replays merged on the one sim device: said
// on stderr, in the table and in --json (`devices`, `devices_merged`). Events whose
// action is not one of the format's are skipped, counted (`unknown_actions`) and said.
//
// --arenas replays the trace a second time with a scoped arena per inferred step
// (ArenaReplay, InferSteps in tools/replay/trace_replay.h) and prints its figures beside
// the plain replay's (`arenas` in --json; with --min-capacity its own smallest device).
// The exit status is then 1 when either replay had OOMs.
#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "allocator/config.h"
#include "allocator/driver_calls.h"
#include "nlohmann/json.hpp"
#include "tools/memtrace/memtrace_commands.h"
#include "tools/replay/trace_replay.h"

namespace devmem::memtrace {
namespace {

struct ArenaFlags {
  bool enabled = false;
  std::string chunk_size;  // empty: the default
  std::string step_swing;  // empty: the default
};

// The --arenas options as an ArenaReplay, or an error naming the flag and its value.
absl::StatusOr<ArenaReplay> ParseArenaFlags(const ArenaFlags& flags) {
  ArenaReplay arenas;
  arenas.enabled = flags.enabled;
  if (!flags.enabled && (!flags.chunk_size.empty() || !flags.step_swing.empty())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s needs --arenas", flags.chunk_size.empty() ? "--step-swing" : "--arena-chunk-size"));
  }
  if (!flags.chunk_size.empty()) {
    absl::StatusOr<size_t> parsed = ParseSize(flags.chunk_size);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--arena-chunk-size \"%s\": %s", flags.chunk_size, parsed.status().message()));
    }
    arenas.chunk_size = *parsed;
  }
  if (!flags.step_swing.empty()) {
    double swing = 0;
    if (!absl::SimpleAtod(flags.step_swing, &swing)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--step-swing \"%s\": not a number", flags.step_swing));
    }
    arenas.step_swing = swing;
  }
  if (absl::Status s = CheckArenaReplay(arenas); !s.ok()) {
    // The check names the field ("chunk_size 1000: why"); the user typed the flag.
    const bool chunk = absl::StartsWith(s.message(), "chunk_size");
    const std::string message(s.message());
    const std::string why = message.substr(message.find(": ") + 2);
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s \"%s\": %s", chunk ? "--arena-chunk-size" : "--step-swing",
        chunk ? flags.chunk_size : flags.step_swing, why));
  }
  return arenas;
}

// The arenas' figures as a JSON object (--json's `arenas`).
nlohmann::json ArenaJson(const ReplayResult& r, const ArenaReplay& arenas, const MinCapacity* m) {
  const ReplayResult::Arenas& a = r.arenas;
  nlohmann::json j = {
      {"steps", a.steps},
      {"step_swing", arenas.step_swing},
      {"chunk_size", arenas.chunk_size},
      {"peak_reserved_bytes", r.peak_reserved_bytes},
      {"reserved_over_requested", r.reserved_over_requested},
      {"device_allocs", r.device_allocs},
      {"device_frees", r.device_frees},
      {"ooms", r.ooms},
      {"fits", r.ooms == 0},
      {"bumps", a.bumps},
      {"bump_bytes", a.bump_bytes},
      {"free_list_ops_avoided", 2 * a.bumps},
      {"escaped_bytes", a.escaped_bytes},
      {"escaped_buffers", a.escaped_buffers},
      {"max_step_escaped_bytes", a.max_step_escaped_bytes},
      {"peak_chunks", a.peak_chunks},
      {"peak_chunk_bytes", a.peak_chunk_bytes},
      {"pool_chunk_allocs", a.pool_chunk_allocs},
      {"chunk_reuses", a.chunk_reuses},
      {"spills", a.spills},
      {"spill_bytes", a.spill_bytes},
  };
  if (m != nullptr) {
    j["min_capacity_bytes"] = m->bytes;
    j["min_capacity_over_peak_requested"] = m->over_peak_requested;
    j["min_capacity_monotonic"] = m->monotonic;
  }
  return j;
}

int RunReplay(const std::string& path, const std::string& conf, const std::string& capacity_text,
              bool min_capacity, bool json, const ArenaFlags& arena_flags) {
  absl::StatusOr<ArenaReplay> arenas = ParseArenaFlags(arena_flags);
  if (!arenas.ok()) {
    std::fprintf(stderr, "memtrace replay: %s\n", std::string(arenas.status().message()).c_str());
    return kExitBadInput;
  }
  absl::StatusOr<Config> config = CommandConfig(conf);
  if (!config.ok()) {
    std::fprintf(stderr, "memtrace replay: --conf: %s\n",
                 std::string(config.status().message()).c_str());
    return kExitBadInput;
  }
  uint64_t capacity = kUnboundedCapacity;
  if (!capacity_text.empty()) {
    absl::StatusOr<size_t> parsed = ParseSize(capacity_text);
    if (!parsed.ok() || *parsed == 0) {
      std::fprintf(stderr, "memtrace replay: --capacity \"%s\": %s\n", capacity_text.c_str(),
                   parsed.ok() ? "must be positive"
                               : std::string(parsed.status().message()).c_str());
      return kExitBadInput;
    }
    capacity = *parsed;
  }
  absl::StatusOr<Trace> trace = ReadTrace(path);
  if (!trace.ok()) {
    std::fprintf(stderr, "memtrace replay: %s\n", std::string(trace.status().message()).c_str());
    return kExitBadInput;
  }
  WarnUnmatchedFrees("replay", path, trace->unmatched_frees);
  if (trace->unknown_actions > 0) {
    std::fprintf(stderr,
                 "memtrace replay: %s: warning: skipped %llu event%s of unknown actions (the "
                 "first: \"%s\" at line %llu; docs/formats.md lists the actions)\n",
                 path.c_str(), static_cast<unsigned long long>(trace->unknown_actions),
                 trace->unknown_actions == 1 ? "" : "s", trace->first_unknown_action.c_str(),
                 static_cast<unsigned long long>(trace->first_unknown_line));
  }
  const bool merged = trace->devices.size() > 1;
  std::string device_list;
  for (const std::string& d : trace->devices) {
    device_list += (device_list.empty() ? "" : ", ") + (d.empty() ? "(none)" : d);
  }
  if (merged) {
    std::fprintf(stderr,
                 "memtrace replay: %s: warning: the trace has %zu devices (%s); they replay "
                 "merged on one sim device, sharing its pool and capacity\n",
                 path.c_str(), trace->devices.size(), device_list.c_str());
  }
  const ReplayResult r = Replay(*trace, *config, capacity);
  MinCapacity m;
  if (min_capacity) m = FindMinCapacity(*trace, *config);
  ReplayResult ra;
  MinCapacity ma;
  if (arenas->enabled) {
    ra = Replay(*trace, *config, capacity, nullptr, *arenas);
    if (min_capacity) ma = FindMinCapacity(*trace, *config, uint64_t{1} << 20, 256, *arenas);
  }
  const bool all_fit = r.ooms == 0 && ra.ooms == 0;
  if (json) {
    std::printf("{\"trace\": \"%s\", \"events\": %llu, \"ops\": %llu, \"unmatched_frees\": %llu, "
                "\"capacity_bytes\": %llu, \"peak_requested_bytes\": %llu, "
                "\"peak_reserved_bytes\": %llu, \"reserved_over_requested\": %.4f, "
                "\"device_allocs\": %lld, \"device_frees\": %lld, \"ooms\": %lld, "
                "\"alloc_retries\": %lld, \"ns_per_op\": %.1f, \"config\": \"%s\"",
                path.c_str(), static_cast<unsigned long long>(trace->lines),
                static_cast<unsigned long long>(r.ops),
                static_cast<unsigned long long>(trace->unmatched_frees),
                static_cast<unsigned long long>(r.capacity),
                static_cast<unsigned long long>(r.peak_requested_bytes),
                static_cast<unsigned long long>(r.peak_reserved_bytes), r.reserved_over_requested,
                static_cast<long long>(r.device_allocs), static_cast<long long>(r.device_frees),
                static_cast<long long>(r.ooms), static_cast<long long>(r.alloc_retries),
                r.ns_per_op, ToString(*config).c_str());
    if (min_capacity) {
      std::printf(", \"min_capacity_bytes\": %llu, \"min_capacity_over_peak_requested\": %.4f, "
                  "\"smallest_fitting_bytes\": %llu, \"min_capacity_monotonic\": %s, "
                  "\"min_capacity_step_bytes\": %llu, \"min_capacity_runs\": %d",
                  static_cast<unsigned long long>(m.bytes), m.over_peak_requested,
                  static_cast<unsigned long long>(m.smallest_fitting_bytes),
                  m.monotonic ? "true" : "false", static_cast<unsigned long long>(m.step),
                  m.runs);
    }
    // The driver cost model's estimate (sim_driver_cost) and the calls behind it.
    nlohmann::json calls = nlohmann::json::object();
    for (int i = 0; i < kNumDriverCalls; ++i) {
      calls[std::string(DriverCallName(static_cast<DriverCall>(i)))] = r.driver.calls[i];
    }
    std::printf(", \"driver_ns\": %lld, \"driver_calls\": %s",
                static_cast<long long>(r.driver.total_ns()), calls.dump().c_str());
    std::printf(", \"fits\": %s, \"devices\": %s, \"devices_merged\": %s, "
                "\"unknown_actions\": %llu",
                r.ooms == 0 ? "true" : "false", nlohmann::json(trace->devices).dump().c_str(),
                merged ? "true" : "false",
                static_cast<unsigned long long>(trace->unknown_actions));
    if (arenas->enabled) {
      std::printf(", \"arenas\": %s",
                  ArenaJson(ra, *arenas, min_capacity ? &ma : nullptr).dump().c_str());
    }
    std::printf("}\n");
    return all_fit ? kExitOk : kExitNo;
  }
  std::printf("trace              %s (%llu events, %llu replayed, %llu unmatched frees)\n",
              path.c_str(), static_cast<unsigned long long>(trace->lines),
              static_cast<unsigned long long>(r.ops),
              static_cast<unsigned long long>(trace->unmatched_frees));
  std::printf("device             sim, capacity %s%s%s%s\n",
              capacity == kUnboundedCapacity ? "unbounded" : FormatBytes(capacity).c_str(),
              merged ? " (merged from " : "", merged ? device_list.c_str() : "",
              merged ? ")" : "");
  std::printf("peak requested     %s\n", FormatBytes(r.peak_requested_bytes).c_str());
  std::printf("peak reserved      %s (%.3fx requested)\n",
              FormatBytes(r.peak_reserved_bytes).c_str(), r.reserved_over_requested);
  std::printf("device allocs      %lld (frees %lld)\n", static_cast<long long>(r.device_allocs),
              static_cast<long long>(r.device_frees));
  std::printf("OOMs               %lld (alloc retries %lld)%s\n", static_cast<long long>(r.ooms),
              static_cast<long long>(r.alloc_retries),
              r.ooms == 0 ? "" : ": does not fit at this capacity (exit status 1)");
  std::printf("ns per op          %.1f\n", r.ns_per_op);
  // Only the kinds this configuration called.
  std::string calls;
  for (int i = 0; i < kNumDriverCalls; ++i) {
    if (r.driver.calls[i] == 0) continue;
    calls += (calls.empty() ? "" : ", ") +
             std::string(DriverCallName(static_cast<DriverCall>(i))) + " " +
             std::to_string(r.driver.calls[i]);
  }
  std::printf("driver time (est.) %.3f ms (sim_driver_cost; calls: %s)\n",
              static_cast<double>(r.driver.total_ns()) / 1e6,
              calls.empty() ? "none" : calls.c_str());
  if (min_capacity) {
    std::printf("min capacity       %s (%.3fx peak requested): fits at every capacity "
                "from here up (step %s, %d replays)\n",
                FormatBytes(m.bytes).c_str(), m.over_peak_requested,
                FormatBytes(m.step).c_str(), m.runs);
    if (!m.monotonic) {
      std::printf("                   not monotonic: it also fits at %s, but some capacity "
                  "in between fails\n",
                  FormatBytes(m.smallest_fitting_bytes).c_str());
    }
  }
  if (arenas->enabled) {
    const ReplayResult::Arenas& a = ra.arenas;
    std::printf("\nwith arenas        a scope per step on stream 0, chunks up to %s; %lld steps "
                "(valleys between swings of %.3g x peak requested)\n",
                FormatBytes(arenas->chunk_size).c_str(), static_cast<long long>(a.steps),
                arenas->step_swing);
    std::printf("peak reserved      %s (%.3fx requested; without arenas %.3fx)\n",
                FormatBytes(ra.peak_reserved_bytes).c_str(), ra.reserved_over_requested,
                r.reserved_over_requested);
    std::printf("device allocs      %lld (frees %lld)\n", static_cast<long long>(ra.device_allocs),
                static_cast<long long>(ra.device_frees));
    std::printf("OOMs               %lld%s\n", static_cast<long long>(ra.ooms),
                ra.ooms == 0 ? "" : ": does not fit at this capacity (exit status 1)");
    std::printf("bumps              %lld (%s; %lld free-list operations avoided)\n",
                static_cast<long long>(a.bumps), FormatBytes(a.bump_bytes).c_str(),
                static_cast<long long>(2 * a.bumps));
    std::printf("escaped            %s in %lld buffers, summed over steps (the most from one "
                "step: %s)\n",
                FormatBytes(a.escaped_bytes).c_str(), static_cast<long long>(a.escaped_buffers),
                FormatBytes(a.max_step_escaped_bytes).c_str());
    std::printf("chunks             at most %lld held (%s) at a step's end; %lld from the pool, "
                "%lld reused\n",
                static_cast<long long>(a.peak_chunks), FormatBytes(a.peak_chunk_bytes).c_str(),
                static_cast<long long>(a.pool_chunk_allocs),
                static_cast<long long>(a.chunk_reuses));
    std::printf("spills             %lld (%s) to the pool's path by the waste bound "
                "(arena_max_waste)\n",
                static_cast<long long>(a.spills), FormatBytes(a.spill_bytes).c_str());
    if (min_capacity) {
      std::printf("min capacity       %s (%.3fx peak requested; without arenas %.3fx)%s\n",
                  FormatBytes(ma.bytes).c_str(), ma.over_peak_requested, m.over_peak_requested,
                  ma.monotonic ? "" : " (not monotonic)");
    }
  }
  return all_fit ? kExitOk : kExitNo;
}

}  // namespace

void AddReplayCommand(CLI::App& app, int* exit_code) {
  struct Options {
    std::string path, conf, capacity;
    bool json = false, min_capacity = false;
    ArenaFlags arenas;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* replay = app.add_subcommand(
      "replay", "Replay a JSON Lines trace through a fresh allocator on a simulated device");
  replay->add_option("trace", opts->path, "trace file (JSON Lines, see docs/formats.md)")
      ->required();
  replay->add_option("--conf", opts->conf, "DEVMEM_CONF-style configuration string");
  replay->add_option("--capacity", opts->capacity,
                     "device capacity, e.g. 8GiB (default: unbounded)");
  replay->add_flag("--min-capacity", opts->min_capacity,
                   "also find the smallest capacity with zero OOMs");
  replay->add_flag("--json", opts->json,
                   "print one JSON object (exit status 1 when the trace had OOMs: fits false)");
  replay->add_flag("--arenas", opts->arenas.enabled,
                   "also replay with a scoped arena per step (steps inferred from live bytes)");
  replay->add_option("--arena-chunk-size", opts->arenas.chunk_size,
                     "with --arenas: the largest arena chunk, e.g. 1MiB (default " +
                         FormatBytes(kDefaultArenaChunkSize) + ")");
  replay->add_option("--step-swing", opts->arenas.step_swing,
                     absl::StrFormat("with --arenas: a step ends at a valley between swings "
                                     "of this fraction of peak requested bytes (default %g)",
                                     kDefaultStepSwing));
  replay->callback([opts, exit_code] {
    *exit_code = RunReplay(opts->path, opts->conf, opts->capacity, opts->min_capacity,
                           opts->json, opts->arenas);
  });
}

}  // namespace devmem::memtrace
