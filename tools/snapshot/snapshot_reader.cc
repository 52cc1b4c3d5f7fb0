// tools/snapshot/snapshot_reader.cc: memtrace's view of a snapshot, flattened from what
// the runtime's reader read (why a flat view: tools/snapshot/snapshot_reader.h).
#include "tools/snapshot/snapshot_reader.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "allocator/site.h"
#include "allocator/stack_sampler.h"

namespace devmem::memtrace {
namespace {

// Files at least this large get progress lines (when stderr is a terminal).
constexpr size_t kProgressBytes = size_t{64} << 20;

bool ProgressWanted(size_t bytes) { return bytes >= kProgressBytes && isatty(STDERR_FILENO); }

BlockKind KindOf(BlockState state) {
  switch (state) {
    case BlockState::kAllocated: return BlockKind::kAllocated;
    case BlockState::kPending: return BlockKind::kPending;
    case BlockState::kFree:
    case BlockState::kThreadCached:  // never in a file: the reader reads three states
      break;
  }
  return BlockKind::kFree;
}

// "[2, 3]": a tensor annotation's shape as memtrace prints it.
std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

SnapDevice FlattenDevice(AllocatorSnapshot&& d, const BufferAnnotations* annotations) {
  SnapDevice out;
  out.device = d.device.ToString();
  out.time_ns = d.time_ns;
  out.name = std::move(d.info.name);
  out.backend = std::move(d.info.backend);
  out.free_bytes = d.mem_info.free_bytes;
  out.total_bytes = d.mem_info.total_bytes;
  out.allocated_bytes = d.stats.allocated_bytes[0].current;  // pool 0: "all"
  out.reserved_bytes = d.stats.reserved_bytes[0].current;
  out.pending_bytes = d.stats.pending_bytes[0].current;
  out.num_ooms = d.stats.num_ooms;
  size_t blocks = 0;
  for (const SegmentInfo& s : d.segments) blocks += s.blocks.size();
  out.blocks.reserve(blocks);
  out.segments.reserve(d.segments.size());
  for (const SegmentInfo& s : d.segments) {
    SnapSegment& seg = out.segments.emplace_back();
    seg.addr = s.addr;
    seg.size = s.size;
    seg.stream = s.stream.handle;
    seg.small_pool = s.small_pool;
    seg.expandable = s.expandable;
    seg.first_block = out.blocks.size();
    seg.num_blocks = s.blocks.size();
    for (const BlockInfo& b : s.blocks) {
      SnapBlock& sb = out.blocks.emplace_back();
      sb.addr = b.addr;
      sb.size = b.size;
      sb.requested = b.requested;
      sb.stream = b.stream.handle;
      sb.site = b.site;
      sb.state = KindOf(b.state);
      sb.stack = b.stack;
      // The reader keeps an age as an allocation time (0: the file gave none).
      sb.has_age = b.alloc_time_ns != 0;
      if (sb.has_age) sb.age_ns = d.time_ns - b.alloc_time_ns;
      if (annotations != nullptr && b.state == BlockState::kAllocated) {
        if (auto it = annotations->find(b.addr); it != annotations->end()) {
          sb.tensor = static_cast<int32_t>(out.tensors.size());
          out.tensors.push_back(
              TensorInfo{it->second.refcount, it->second.dtype, ShapeText(it->second.shape)});
        }
      }
    }
  }
  out.stack_sample_bytes = d.stack_sample_bytes;
  out.stacks.reserve(d.sampled_stacks.size());
  for (SampledStack& g : d.sampled_stacks) {
    out.stacks.push_back(SnapStack{g.stack, g.site, g.samples, g.sampled_bytes,
                                   g.estimated_bytes, std::move(g.frames)});
  }
  out.arena_buffers.reserve(d.arena_buffers.size());
  for (ArenaBufferInfo& b : d.arena_buffers) {
    out.arena_buffers.push_back(
        SnapArenaBuffer{b.addr, b.size, b.chunk, b.site, std::move(b.arena), b.escaped});
  }
  return out;
}

SnapSite FlattenSite(SiteId id, const SiteInfo& info) {
  SnapSite s;
  s.id = id;
  s.file = info.file;
  s.function = info.function;
  s.tag = info.tag;
  s.kind = std::string(SiteKindName(info.kind));
  s.line = info.line;
  s.copy = IsCopyKind(info.kind);
  s.outer_file = info.outer_file;
  s.outer_function = info.outer_function;
  s.outer_line = info.outer_line;
  s.where = info.ToString();
  return s;
}

}  // namespace

const SnapSite& Snapshot::Site(uint32_t id) const {
  static const SnapSite* const kUnknown = [] {
    auto* s = new SnapSite;
    s->file = "<unknown>";
    s->kind = "alloc";
    s->where = "<unknown> (alloc)";
    return s;
  }();
  auto it = sites.find(id);
  return it == sites.end() ? *kUnknown : it->second;
}

Snapshot FlattenSnapshot(SnapshotFile&& file) {
  Snapshot snap;
  snap.schema = std::move(file.schema);
  snap.time_ns = file.snap.time_ns;
  snap.unix_time_ns = file.snap.unix_time_ns;
  snap.devices.reserve(file.snap.devices.size());
  for (size_t i = 0; i < file.snap.devices.size(); ++i) {
    const BufferAnnotations* annotations =
        i < file.snap.annotations.size() ? &file.snap.annotations[i] : nullptr;
    snap.devices.push_back(FlattenDevice(std::move(file.snap.devices[i]), annotations));
  }
  for (const auto& [id, info] : file.sites) snap.sites.emplace(id, FlattenSite(id, info));
  snap.oom = std::move(file.oom);
  return snap;
}

absl::StatusOr<Snapshot> ParseSnapshot(std::string_view text, const std::string& name) {
  const bool progress = ProgressWanted(text.size());
  if (progress) {
    std::fprintf(stderr, "memtrace: parsing %s (%zu MiB)...\r", name.c_str(), text.size() >> 20);
  }
  absl::StatusOr<SnapshotFile> file = ParseSnapshotJson(text, name);
  if (progress) std::fprintf(stderr, "\x1b[2K");
  if (!file.ok()) return file.status();
  return FlattenSnapshot(*std::move(file));
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError("cannot read " + path + ": " + std::strerror(errno));
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0) return absl::InvalidArgumentError("cannot read " + path + ": not a file");
  std::string text(static_cast<size_t>(size), '\0');
  if (ProgressWanted(text.size())) {
    std::fprintf(stderr, "memtrace: reading %s (%zu MiB)...\r", path.c_str(), text.size() >> 20);
  }
  in.read(text.data(), size);
  if (in.gcount() != size) {
    return absl::DataLossError("cannot read " + path + ": short read");
  }
  return text;
}

absl::StatusOr<Snapshot> ReadSnapshotFile(const std::string& path) {
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  const bool progress = !ec && ProgressWanted(static_cast<size_t>(bytes));
  if (progress) {
    std::fprintf(stderr, "memtrace: reading %s (%zu MiB)...\r", path.c_str(),
                 static_cast<size_t>(bytes >> 20));
  }
  absl::StatusOr<SnapshotFile> file = ReadSnapshotJsonFile(path);
  if (progress) std::fprintf(stderr, "\x1b[2K");
  if (!file.ok()) return file.status();
  return FlattenSnapshot(*std::move(file));
}

}  // namespace devmem::memtrace
