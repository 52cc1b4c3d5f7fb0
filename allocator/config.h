// allocator/config.h: every knob of devmem, parsed from one string.
//
//   DEVMEM_CONF="backend:sim,sim_capacity:8GiB,max_split_size_mb:256"
//
// The grammar is the one PYTORCH_CUDA_ALLOC_CONF uses: comma-separated `key:value`
// pairs, whitespace around keys and values ignored, keys unique. Every key of Config
// can be set (the list, with units and ranges, is in docs/configuration.md and in
// ConfigKeys()). Parsing is all-or-nothing: on any error the caller's Config is left
// exactly as it was, and the error (absl::InvalidArgumentError) names the key and the
// value.
//
// Sizes accept a plain byte count or a number with a binary unit: B, KiB, MiB, GiB,
// TiB (also K, M, G, T, KB, MB, GB, TB, meaning the same powers of 1024).
// Booleans accept true/false/1/0/yes/no/on/off.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/driver_calls.h"

namespace devmem {

enum class BackendKind : uint8_t { kAuto, kCuda, kSim, kCpu };
std::string_view BackendKindName(BackendKind kind);

// expandable_segments: kAuto uses them where the backend has virtual memory management
// and nothing else needs to reach its memory (sim) or its mappings support peer access
// and IPC (allocator/segment_kind_policy.h: cuda with POSIX fd handles), regular
// segments elsewhere, silently; kOn asks for them and warns once per device when the
// backend cannot.
enum class ExpandableMode : uint8_t { kAuto, kOff, kOn };
std::string_view ExpandableModeName(ExpandableMode mode);  // "auto", "false", "true"

// The default of trace_entries: 2^17 events, 8 MiB of slots (docs/configuration.md,
// "Trace ring size": what that buys in seconds of history on the shipped traces).
inline constexpr size_t kDefaultTraceEntries = size_t{1} << 17;

struct Config {
  // --- which device ---------------------------------------------------------------
  BackendKind backend = BackendKind::kAuto;  // key backend: auto|cuda|sim|cpu

  // --- the simulated device (sim backend) -------------------------------------------
  size_t sim_capacity = size_t{16} << 30;  // key sim_capacity (size, 1 MiB .. 1 PiB)
  uint64_t sim_alloc_latency_ns = 0;       // key sim_alloc_latency_us (0 .. 10^6 us)
  uint64_t sim_free_latency_ns = 0;        // key sim_free_latency_us (0 .. 10^6 us)
  uint64_t sim_fail_nth = 0;        // key sim_fail_nth: fail the Nth segment alloc or map (0 = off)
  double sim_fail_probability = 0;  // key sim_fail_probability (0 .. 1)
  uint64_t sim_seed = 0;            // key sim_seed: seeds the failure injection
  int sim_devices = 64;             // key sim_devices: sim:0 .. sim:N-1 exist (1 .. 1024)
  // The sim driver cost model (allocator/driver_calls.h): estimated, never slept.
  // key sim_driver_cost (a100, none, or call=us/... overrides).
  SimDriverCosts sim_driver_cost = A100Costs();

  // --- caching policy ---------------------------------------------------------------
  // Blocks at least this large are "oversize": never split, and not used for requests
  // below it. SIZE_MAX means no limit. key max_split_size_mb (MiB, >= 20 or "none").
  size_t max_split_size = SIZE_MAX;
  // Fraction of the allowed memory above which cached, unused segments are released
  // before a new segment is allocated (0 = off). key garbage_collection_threshold
  // (0 .. 1, exclusive of 1).
  double garbage_collection_threshold = 0;
  // One growable virtual reservation per (stream, pool) instead of fixed segments.
  // key expandable_segments (auto or bool).
  ExpandableMode expandable_segments = ExpandableMode::kAuto;
  // Expandable segments only: when a request must map more memory and its stream's
  // mapped bytes would then exceed (1 + this) x the high-water mark of the stream's
  // bytes in use, whole free granules elsewhere in its reservation are
  // unmapped first (up to the bytes being mapped), so the footprint does not grow
  // because of fragmentation. +inf turns this off (granules are then unmapped only
  // under memory pressure, on trim and on empty_cache). key
  // expandable_recycle_threshold (number >= 0, or none).
  double expandable_recycle_threshold = 0.25;
  // Cap on reserved bytes as a fraction of device total. key
  // per_process_memory_fraction (0 .. 1, exclusive of 0).
  double per_process_memory_fraction = 1.0;

  // --- per-thread caches (allocator/thread_cache.h) -----------------------------------
  // Small requests are served from per-(thread, device) caches without the device
  // lock. key thread_cache (bool).
  bool thread_cache = true;
  // Largest request a thread cache serves. key thread_cache_max_size (size, 512 B ..
  // 1 MiB, a multiple of 512 B). 32 KiB, jemalloc's tcache_max: above it exact-size
  // bins are rarely hit again before a flush, and blocks cycling through them cost
  // more than the lock they save (docs/architecture.md, "Thread caches").
  size_t thread_cache_max_size = size_t{32} << 10;
  // Bytes each thread's cache may hold per device. key thread_cache_max_bytes (size,
  // 512 B .. 1 GiB).
  size_t thread_cache_max_bytes = size_t{4} << 20;
  // Blocks each thread's cache may hold per device. key thread_cache_max_blocks
  // (1 .. 65536).
  size_t thread_cache_max_blocks = 256;

  // --- scoped arenas (allocator/arena.h) ----------------------------------------------
  // The waste bound of every ArenaScope that does not set ArenaOptions::
  // max_waste_fraction: a request that needs a new chunk while no chunk of its scope is
  // empty takes the pool's path when the arenas' waste exceeds max(chunk_size, this x
  // their live bytes) (arena.h, "Waste"). 0 = off. key arena_max_waste (0 .. 10^6).
  double arena_max_waste = 0.1;

  // --- observability (runtime layer) -------------------------------------------------
  // key trace_entries: event trace size (0 = off, <= 10^8); on by default, so that a
  // running process can be looked into (memtrace timeline URL) without a restart. The
  // default's measurement: docs/configuration.md, "Trace ring size".
  size_t trace_entries = kDefaultTraceEntries;
  // key stack_sample_bytes: one sampled stack per this many bytes allocated on average
  // (0 = off; process-wide, allocator/stack_sampler.h).
  uint64_t stack_sample_bytes = uint64_t{256} << 20;  // kDefaultStackSampleBytes
  std::string http;               // key http: "ADDRESS:PORT" to serve on ("" = off)
  std::string http_token_file;    // key http_token_file: bearer token for /debug/*
  bool http_allow_remote = false; // key http_allow_remote (bool)
  // key http_allowed_hosts: extra names accepted in the Host header, space-separated
  // ("*" = any); loopback names and the bound address are always accepted.
  std::string http_allowed_hosts;
  bool http_metrics_token = false; // key http_metrics_token: /metrics needs the token too
  std::string oom_dump_dir;       // key oom_dump_dir: directory for OOM dumps
  // key flight_recorder: file holding the recent events and live set, kept current
  // through a shared mapping so it survives the process (runtime/flight_recorder.h)
  std::string flight_recorder;
  int site_top_k = 10;            // key site_top_k: sites labelled in metrics (1 .. 1000)

  friend bool operator==(const Config&, const Config&) = default;
};

// Parses `text` on top of `base` (the defaults unless given). All-or-nothing.
absl::StatusOr<Config> ParseConfig(std::string_view text, const Config& base = Config{});

// Applies `text` to `*config` in place; on error `*config` is unchanged.
absl::Status ApplyConfig(std::string_view text, Config* config);

// Reads DEVMEM_CONF (an unset or empty variable gives the defaults). The error message
// starts with "DEVMEM_CONF: ".
absl::StatusOr<Config> ConfigFromEnv();

// The canonical `key:value,...` form of every key; ParseConfig(ToString(c)) == c.
std::string ToString(const Config& config);

// Parses a size with an optional binary unit ("512", "2MiB", "8G"). The error names
// the text.
absl::StatusOr<size_t> ParseSize(std::string_view text);
// "1.5 GiB", "512 B": for messages and tables.
std::string FormatBytes(size_t bytes);

// Documentation of every key (name, type, default, meaning), for --help output and
// docs/configuration.md.
struct ConfigKeyDoc {
  std::string_view key;
  std::string_view type;
  std::string_view default_value;
  std::string_view meaning;
};
const std::vector<ConfigKeyDoc>& ConfigKeys();

}  // namespace devmem
