// tools/fuzz/fuzz_snapshot.cc: libFuzzer target for the snapshot reader as memtrace uses it
// (ParseSnapshot, tools/snapshot/snapshot_reader.h: the runtime's ParseSnapshotJson, then
// memtrace's flat view) and for what `oom`, `buffers` and `diff` compute from what it
// accepts: errors, never crashes, and the invariants those views
// rely on hold (a violation traps, so the fuzzer reports it):
//   - oom: a device's cell size keeps every segment map within columns x 4 cells, and
//     a segment's allocated + free + pending bytes fit in the segment (blocks do not
//     overlap: overlapping ones were double-counted);
//   - buffers: the groups' bytes and counts add up to the totals, the list is largest
//     first;
//   - diff: a snapshot against itself changes nothing; against an empty one, every
//     live byte shrank.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tools/inspect/segment_map.h"
#include "tools/inspect/site_usage.h"
#include "tools/snapshot/snapshot_reader.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void Views(const devmem::memtrace::Snapshot& snap) {
  using namespace devmem::memtrace;
  constexpr int kColumns = 64, kLines = 4;
  for (const SnapDevice& d : snap.devices) {
    const uint64_t cell = ChooseCellBytes(d, kColumns, kLines);
    size_t shown = 0;
    for (const SnapSegment& s : d.segments) {
      const SegmentBytes b = SegmentStateBytes(d, s);
      Check(b.allocated <= s.size && b.free <= s.size - b.allocated &&
            b.pending <= s.size - b.allocated - b.free);
      if (++shown > 64) continue;  // memtrace oom draws at most 64 segments
      size_t cells = 0;
      for (const std::string& line : SegmentMap(d, s, cell, kColumns)) cells += line.size();
      Check(cells <= static_cast<size_t>(kColumns) * kLines);
    }
  }
  BufferTotals grouped, listed;
  uint64_t bytes = 0, count = 0;
  for (const SiteGroup& g : GroupBySite(snap, {}, &grouped)) {
    bytes += g.bytes;
    count += g.count;
  }
  Check(bytes == grouped.matched_bytes && count == grouped.matched);
  const std::vector<BufferRef> list = ListBuffers(snap, {}, &listed);
  Check(list.size() == listed.matched && listed.matched_bytes == grouped.matched_bytes);
  for (size_t i = 1; i < list.size(); ++i) Check(list[i - 1].block->size >= list[i].block->size);
  DiffTotals same;
  Check(DiffSites(snap, snap, {}, &same).empty() && same.grew_bytes == 0 &&
        same.shrank_bytes == 0);
  DiffTotals gone;
  DiffSites(snap, Snapshot{}, {}, &gone);
  Check(gone.grew_bytes == 0 && gone.shrank_bytes == grouped.matched_bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<devmem::memtrace::Snapshot> snap = devmem::memtrace::ParseSnapshot(text, "fuzz");
  if (snap.ok()) Views(*snap);
  return 0;
}
