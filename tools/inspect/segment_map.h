// tools/inspect/segment_map.h: a text picture of a device's segments for `memtrace oom`: one
// character per fixed-size cell, '#' allocated, '.' free (cached), 'p' pending (freed,
// waiting on other streams), ' ' not covered by any block; a cell shows the state that
// holds most of its bytes (ties: allocated, then pending, then free). The cell size is
// the same for every segment of the device, so lengths compare; it is chosen so the
// largest segment takes at most `columns` x `max_lines` cells, and long segments wrap
// every `columns` cells.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/snapshot/snapshot_reader.h"

namespace devmem::memtrace {

// A power of two, at least 512 bytes (the allocator's rounding), such that the largest
// segment of `device` fits in columns * max_lines cells.
uint64_t ChooseCellBytes(const SnapDevice& device, int columns = 64, int max_lines = 4);

// Bytes of a segment's blocks in each state. The reader guarantees the blocks lie in
// the segment without overlapping, so the three add up to at most the segment's size.
struct SegmentBytes {
  uint64_t allocated = 0, free = 0, pending = 0;
};
SegmentBytes SegmentStateBytes(const SnapDevice& device, const SnapSegment& segment);

// The map of one segment: ceil(size / cell) characters, split into lines of `columns`.
std::vector<std::string> SegmentMap(const SnapDevice& device, const SnapSegment& segment,
                                    uint64_t cell_bytes, int columns = 64);

}  // namespace devmem::memtrace
