// tools/snapshot/snapshot_reader.h: memtrace's reader of snapshot files and OOM dumps
// (devmem.snapshot/1, docs/formats.md), built for inspection at scale.
//
// runtime/json.h's SnapshotFromJson rebuilds a full RuntimeSnapshot through
// nlohmann::json, which is right for round trips but too slow and too large for a
// snapshot with 10^6 live buffers (the issue asks for <= 2 s). This reader parses with
// simdjson's DOM and keeps only what memtrace shows: per device its totals and a flat
// array of blocks (segments index into it), the site table, and the "oom" report when
// the file is a dump. Blocks come from the segments; "live_buffers" (redundant with
// them) is read only for its optional "tensor" annotations (refcount, dtype, shape:
// what the tensor layer knew), which are kept beside the blocks they name.
//
// Errors name the file and either the byte offset of a JSON syntax error (found by
// re-parsing with nlohmann, which reports positions; only on failure) or the path of
// the offending field and what was expected there, and refuse other schema majors with
// the message docs/formats.md gives.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace devmem::memtrace {

enum class BlockKind : uint8_t { kAllocated, kFree, kPending };

struct SnapBlock {
  uint64_t addr = 0;
  uint64_t size = 0;
  uint64_t requested = 0;
  uint64_t stream = 0;
  int64_t age_ns = 0;
  uint32_t site = 0;
  int32_t tensor = -1;  // index into SnapDevice::tensors; -1: the file does not say
  BlockKind state = BlockKind::kFree;
  bool has_age = false;
  uint32_t stack = 0;   // its sampled stack ("stack": SnapDevice::stacks); 0: not sampled
};

// One "sampled_stacks" group (docs/formats.md): the live samples of one (site, stack).
struct SnapStack {
  uint32_t stack = 0, site = 0;
  uint64_t samples = 0, sampled_bytes = 0;
  double estimated_bytes = 0;       // the estimate of the live bytes of (site, stack)
  std::vector<std::string> frames;  // symbolized by the writer, innermost first
};

// A live buffer's "tensor" annotation (kept apart: most blocks have none, and a
// 10^6-block snapshot should not pay two strings per block).
struct TensorInfo {
  uint64_t refcount = 0;
  std::string dtype;  // "float32"
  std::string shape;  // "[1024, 1024]"
};

struct SnapSegment {
  uint64_t addr = 0;
  uint64_t size = 0;
  uint64_t stream = 0;
  bool small_pool = false;
  bool expandable = false;
  size_t first_block = 0;  // index into SnapDevice::blocks
  size_t num_blocks = 0;
};

// A live buffer of a scoped arena ("arena_buffers": it sits inside the allocated
// chunk block at `chunk`).
struct SnapArenaBuffer {
  uint64_t addr = 0, size = 0, chunk = 0;
  uint32_t site = 0;
  std::string arena;
  bool escaped = false;  // its scope had closed
};

struct SnapDevice {
  std::string device;  // "sim:0"
  int64_t time_ns = 0;
  std::string name, backend;
  uint64_t free_bytes = 0, total_bytes = 0;  // what the driver reports
  int64_t allocated_bytes = 0, reserved_bytes = 0, pending_bytes = 0;  // stats "all" current
  int64_t num_ooms = 0;
  std::vector<SnapSegment> segments;
  std::vector<SnapBlock> blocks;  // every block of every segment, in segment order
  std::vector<TensorInfo> tensors;
  std::vector<SnapArenaBuffer> arena_buffers;  // optional in the file
  uint64_t stack_sample_bytes = 0;             // the sampling rate (0: off or unknown)
  std::vector<SnapStack> stacks;               // "sampled_stacks", optional in the file
};

struct SnapSite {
  uint32_t id = 0;
  std::string file, function, tag, kind;
  uint32_t line = 0;
  bool copy = false;  // kind is clone, contiguous or to_device
  // The outermost ScopedSite frame ("" / 0 when the site has none).
  std::string outer_file, outer_function;
  uint32_t outer_line = 0;
  std::string where;  // "optimizer @ train.cc:40 (clone)", as SiteInfo::ToString
};

struct OomTopSite {
  uint32_t site = 0;
  std::string where, kind;
  bool copy = false;
  uint64_t live_bytes = 0, live_count = 0;
};

// The "oom" object of an OOM dump (docs/formats.md "OOM dump").
struct OomInfo {
  std::string device;
  uint64_t stream = 0;
  uint32_t site = 0;
  uint64_t requested_bytes = 0, rounded_bytes = 0, segment_bytes = 0;
  uint64_t device_total = 0, driver_free = 0, memory_limit = 0;
  uint64_t allocated = 0, reserved = 0, pending = 0, reserved_unallocated = 0;
  uint64_t largest_free_block = 0, free_blocks = 0, segment_count = 0;
  double fragmentation = 0;
  std::vector<OomTopSite> top_sites;
  uint64_t copy_bytes = 0;
  double copy_share = 0;
  std::string cause, remedy, message;
};

struct Snapshot {
  std::string schema;
  int64_t time_ns = 0, unix_time_ns = 0;
  std::vector<SnapDevice> devices;
  std::map<uint32_t, SnapSite> sites;
  std::optional<OomInfo> oom;

  // The site for an id; unknown ids give "<unknown>" (like allocator/site.h's GetSite).
  const SnapSite& Site(uint32_t id) const;
};

inline constexpr const char* kReaderSchema = "devmem.snapshot/1";

// Parses snapshot text. `name` (the file or URL) starts every error message.
absl::StatusOr<Snapshot> ParseSnapshot(std::string_view text, const std::string& name);

// Reads and parses a file; the error names the file (unreadable, malformed, schema).
// Shows progress on stderr when the file is large and stderr is a terminal.
absl::StatusOr<Snapshot> ReadSnapshotFile(const std::string& path);

// Reads a whole file into a string (error names the file).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace devmem::memtrace
