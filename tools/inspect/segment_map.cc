// tools/inspect/segment_map.cc: text maps of segments (see tools/inspect/segment_map.h). The work is
// O(blocks + cells) per segment: each block adds its overlap to the cells it touches.
#include "tools/inspect/segment_map.h"

#include <algorithm>
#include <array>

namespace devmem::memtrace {

uint64_t ChooseCellBytes(const SnapDevice& device, int columns, int max_lines) {
  uint64_t largest = 0;
  for (const SnapSegment& s : device.segments) largest = std::max(largest, s.size);
  const uint64_t cells = static_cast<uint64_t>(std::max(1, columns) * std::max(1, max_lines));
  // Ceiling division written so that it cannot overflow: a segment of nearly 2^64
  // bytes (a hostile or corrupt dump) must still get a cell size that bounds the map.
  auto cells_for = [&](uint64_t cell) { return largest / cell + (largest % cell != 0); };
  uint64_t cell = 512;
  while (cell < (uint64_t{1} << 63) && cells_for(cell) > cells) cell <<= 1;
  return cell;
}

SegmentBytes SegmentStateBytes(const SnapDevice& device, const SnapSegment& segment) {
  SegmentBytes out;
  for (size_t i = 0; i < segment.num_blocks; ++i) {
    const SnapBlock& b = device.blocks[segment.first_block + i];
    (b.state == BlockKind::kAllocated ? out.allocated
     : b.state == BlockKind::kPending ? out.pending
                                      : out.free) += b.size;
  }
  return out;
}

std::vector<std::string> SegmentMap(const SnapDevice& device, const SnapSegment& segment,
                                    uint64_t cell_bytes, int columns) {
  const uint64_t n = segment.size == 0 ? 0 : (segment.size - 1) / cell_bytes + 1;
  // Bytes per cell in each state: allocated, pending, free (the tie-break order).
  std::vector<std::array<uint64_t, 3>> cells(n, {0, 0, 0});
  for (size_t i = 0; i < segment.num_blocks; ++i) {
    const SnapBlock& b = device.blocks[segment.first_block + i];
    const int state = b.state == BlockKind::kAllocated ? 0 : b.state == BlockKind::kPending ? 1 : 2;
    // The reader guarantees the block lies inside the segment.
    uint64_t begin = b.addr - segment.addr;
    const uint64_t end = begin + b.size;
    while (begin < end) {
      const uint64_t c = begin / cell_bytes;
      // (c + 1) * cell_bytes can be 2^64 in the last cell of a huge segment: compare
      // the distance to the cell's start instead.
      const uint64_t cell_start = c * cell_bytes;
      const uint64_t cell_end = end - cell_start > cell_bytes ? cell_start + cell_bytes : end;
      cells[c][state] += cell_end - begin;
      begin = cell_end;
    }
  }
  std::vector<std::string> lines;
  std::string line;
  for (uint64_t c = 0; c < n; ++c) {
    const auto& v = cells[c];
    char ch = ' ';
    if (v[0] + v[1] + v[2] > 0) {
      ch = v[0] >= v[1] && v[0] >= v[2] ? '#' : v[1] >= v[2] ? 'p' : '.';
    }
    line += ch;
    if (line.size() == static_cast<size_t>(columns)) {
      lines.push_back(std::move(line));
      line.clear();
    }
  }
  if (!line.empty()) lines.push_back(std::move(line));
  return lines;
}

}  // namespace devmem::memtrace
