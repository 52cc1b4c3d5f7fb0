// runtime/flight_record_format.h: the byte layout of a flight record file, shared by its
// writer (runtime/flight_recorder.cc) and its reader (runtime/flight_record_reader.cc).
// docs/formats.md ("Flight record") describes the same layout for people.
//
// The file is a fixed-size array of 64-byte records in four regions, every offset a
// function of the counts in the header (so a reader recomputes them and never follows
// an offset it read):
//
//   [0, 4096)                 header
//   names                     site_slots x name_slot_bytes: the site table, by site id
//   device 0 .. device D-1    each: a 4096-byte page (identity, segment stats, clock),
//                             then lane_slots lanes, each: a 4096-byte page (its peak),
//                             site_slots x 64 (its live bytes per site), ring_slots x 64
//
// Lanes (version 2). A thread records into a lane of its own in every region (one
// writer per lane, so no lock and no read-modify-write on the hot path); the lane
// holds that thread's events (its ring, numbered 1, 2, ... per lane) and its *share*
// of each site's live bytes and counts: a free on another thread than the allocation
// is a negative share there. The reader sums the lanes. The last lane is shared by the
// threads that come when the others are taken (they write it under a mutex).
//
// Checkpoints (version 3). A lane's live-site entries are its shares as of its last
// checkpoint, not of its last event: the writer keeps the shares in its own memory and
// copies the ones that changed into their entries every CheckpointEvents(ring_slots)
// events of the lane (and when the recorder is destroyed), each entry's seq the lane's
// event the checkpoint came after. The events since are in the ring: a lane's summary
// of a site is its entry plus the lane's complete alloc and free events of that site
// (the entry's: the site, or the rest's) numbered past the entry's seq. That the ring
// still holds all of those is the writer's invariant: at most K = CheckpointEvents
// events pass between two checkpoints and the ring keeps at least 2 K (or K is 1), so
// every event past an entry's seq is at most 2 K - 1 events old, even when a death tears
// the entry's newer copy during a checkpoint (the older copy's seq is then at most 2 K
// events back). Per event that is no entry written at all, where version 2 rewrote one
// (a seqlock of five stores and a check).
//
// Integers are little-endian (the header's byte-order word says so), 8-byte aligned.
//
// Torn writes. Every record that changes is written so that a reader can tell a
// complete record from one a writer was killed in the middle of:
// - ring slots are seqlocks: `seq` is set to kBusy | s, the words are written,
//   then `seq` = s; a slot whose seq has kBusy was being written (torn);
// - live-site entries, the lane's peak and the segment stats are double-buffered: each
//   has two copies, each a seqlock of its own (seq = kBusy, data, seq = the
//   event's number); the writer overwrites the older copy, so a copy torn by death
//   leaves the other one intact, and the reader takes the complete copy with the
//   larger seq;
// - name slots: state 1 while written, 2 once complete.
// So a death tears at most one record per lane (and one segment-stats copy).
// Each record also carries a check word (FlightCheck over its words), so that bytes
// changed after the fact (disk corruption, a damaged copy) are detected rather than
// read as values. The check is of a few rotates and one multiply: the writer pays it
// on every event.
#pragma once

#include <cstddef>
#include <cstdint>

namespace devmem::flight {

inline constexpr char kMagic[8] = {'D', 'M', 'F', 'L', 'I', 'G', 'H', 'T'};
// 1: one writer per region (no lanes); 2: live-site entries current after every event
// (a version 2 record reads by version 3's rule: its entries never lag).
inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kOldestReadVersion = 2;
inline constexpr uint64_t kByteOrder = 0x0102030405060708ull;
inline constexpr uint64_t kBusy = uint64_t{1} << 63;
inline constexpr size_t kHeaderBytes = 4096;
inline constexpr size_t kDevicePageBytes = 4096;
inline constexpr size_t kLanePageBytes = 4096;
inline constexpr size_t kRecordBytes = 64;  // ring slots and live-site entries
// Bounds a reader accepts (a writer uses at most these).
inline constexpr uint32_t kMaxDeviceSlots = 64;
inline constexpr uint32_t kMaxRingSlots = 1u << 24;  // per lane
inline constexpr uint32_t kMaxLaneSlots = 64;
inline constexpr uint32_t kMaxSiteSlots = 1u << 16;
inline constexpr uint32_t kMinNameSlotBytes = 64;
inline constexpr uint32_t kMaxNameSlotBytes = 4096;
inline constexpr size_t kNameSlotHeaderBytes = 32;

// Header field offsets (bytes from the start of the file).
namespace header {
inline constexpr size_t kMagic = 0;           // char[8]
inline constexpr size_t kVersion = 8;         // u32
inline constexpr size_t kHeaderBytes = 12;    // u32, = 4096
inline constexpr size_t kFileBytes = 16;      // u64
inline constexpr size_t kDeviceSlots = 24;    // u32
inline constexpr size_t kRingSlots = 28;      // u32, a power of two: slots per lane
inline constexpr size_t kSiteSlots = 32;      // u32
inline constexpr size_t kNameSlotBytes = 36;  // u32, a multiple of 8
inline constexpr size_t kPid = 40;            // u32
inline constexpr size_t kFlags = 44;          // u32, bit 0: ticks are TSC ticks
inline constexpr size_t kStartUnixNs = 48;    // i64
inline constexpr size_t kStartMonoNs = 56;    // i64
inline constexpr size_t kTick0 = 64;          // i64: clock anchor (tick, monotonic ns)
inline constexpr size_t kNs0 = 72;            // i64
inline constexpr size_t kByteOrder = 80;      // u64 = kByteOrder
inline constexpr size_t kLaneSlots = 88;      // u32 (version 2)
inline constexpr size_t kReserved = 92;       // u32, 0
inline constexpr size_t kCheck = 96;          // u64: FlightCheckBytes over [0, 96)
inline constexpr size_t kEnd = 104;
}  // namespace header

inline constexpr uint32_t kFlagTsc = 1;

// Device page offsets (from the start of the device's region).
namespace device {
inline constexpr size_t kIdent = 0;      // u64: 0 unused, else kIdentUsed | type << 16 | index
inline constexpr size_t kIdentCheck = 8; // u64: FlightCheck(kSeedIdent, ident, d)
// [64, 256) unused (version 1: the claim counter and the allocation stats, which are
// the lanes' sums now).
inline constexpr size_t kCold = 256;     // 2 x 64: ColdStats copies
inline constexpr size_t kClock = 384;    // 2 x 64: clock point copies
inline constexpr uint64_t kIdentUsed = uint64_t{1} << 63;
}  // namespace device

// Word indices inside the 64-byte records.
namespace ring {  // word 0 seq, 1 tick, 2 packed, 3 stream, 4 addr, 5 size, 6 requested,
                  // 7 site (low 32) | check (high 32). packed: action | device type << 8
                  // | device index << 16 (16 bits) | thread << 32.
inline constexpr int kWords = 8;
}  // namespace ring
namespace lane {  // the lane page: 2 x 64 peak copies at 0 and 64, each: seq (the lane's
                  // event that set it), peak (the lane's own live bytes at their
                  // highest), 5 unused (0), check = FlightCheck(kSeedPeak ^ copy, seq, peak)
inline constexpr size_t kPeak = 0;
}
namespace cold {  // seq (the region's segment-event number: these events all come
                  // under the device lock), reserved, peak_reserved, segments (low 32) | ooms (high 32),
                  // mapped, device_allocs, device_frees, check
inline constexpr int kWords = 8;
}
namespace clock {  // seq (the calibration's number), tick, ns, 4 unused words, check
inline constexpr int kWords = 8;
}
// Live-site entry of a lane (one per site id): copy c at words [4c, 4c + 4): seq (the
// lane's event that wrote it), bytes (the lane's share, signed), count (signed, low 32)
// | check (high 32), allocs (allocations of the site recorded in this lane, ever). The
// check of ring slots and live-site entries is FlightCheck32 (the high half of
// FlightCheck) (site entries: of seq, bytes, count, allocs; seed kSeedSite ^ i << 8 ^
// c); of the stats, peak and clock copies all 64 bits. The seed of a ring slot's check
// is kSeedRing ^ site.
namespace site {
inline constexpr int kCopyWords = 4;
}

// Seeds, so that one kind of record cannot pass for another.
inline constexpr uint64_t kSeedRing = 0x72696e67ull;
inline constexpr uint64_t kSeedSite = 0x73697465ull;
inline constexpr uint64_t kSeedPeak = 0x7065616bull;
inline constexpr uint64_t kSeedCold = 0x636f6c64ull;
inline constexpr uint64_t kSeedClock = 0x636c6bull;
inline constexpr uint64_t kSeedIdent = 0x6964ull;
inline constexpr uint64_t kSeedName = 0x6e616d65ull;

inline constexpr uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// The check of up to 8 words: each rotated by its position, xor-ed, then mixed by one
// multiply. Cheap (independent operations) and position-sensitive; detects any change
// of one word and almost any of several.
// FlightCheck's last step, for a writer that xors the rotated words in as it stores
// them (word i rotated by 7 i), so that no word has to stay live until the check.
inline constexpr uint64_t FlightCheckMix(uint64_t h) {
  h *= 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 31);
}
inline constexpr uint64_t FlightCheck(uint64_t seed, uint64_t w0, uint64_t w1 = 0,
                                      uint64_t w2 = 0, uint64_t w3 = 0, uint64_t w4 = 0,
                                      uint64_t w5 = 0, uint64_t w6 = 0) {
  return FlightCheckMix((seed ^ w0) ^ Rotl(w1, 7) ^ Rotl(w2, 14) ^ Rotl(w3, 21) ^
                        Rotl(w4, 28) ^ Rotl(w5, 35) ^ Rotl(w6, 42));
}
inline constexpr uint32_t FlightCheck32(uint64_t h) { return static_cast<uint32_t>(h >> 32); }

// FNV-1a over bytes, for the header and the name slots (cold paths).
inline uint64_t FlightCheckBytes(uint64_t seed, const unsigned char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

// The writer's events between two checkpoints of a lane (see "Checkpoints").
inline constexpr uint32_t CheckpointEvents(uint32_t ring_slots) {
  constexpr uint32_t kMost = 256;
  const uint32_t half = ring_slots / 2;
  return half == 0 ? 1 : half < kMost ? half : kMost;
}

// Region offsets from the header's counts.
struct Layout {
  uint32_t device_slots = 0, ring_slots = 0, site_slots = 0, name_slot_bytes = 0;
  uint32_t lane_slots = 1;

  static constexpr size_t RoundPage(size_t n) { return (n + 4095) / 4096 * 4096; }
  size_t names_offset() const { return kHeaderBytes; }
  size_t devices_offset() const {
    return RoundPage(names_offset() + size_t{site_slots} * name_slot_bytes);
  }
  size_t lane_bytes() const {
    return kLanePageBytes + (size_t{site_slots} + ring_slots) * kRecordBytes;
  }
  size_t device_bytes() const { return kDevicePageBytes + size_t{lane_slots} * lane_bytes(); }
  size_t device_offset(uint32_t d) const { return devices_offset() + d * device_bytes(); }
  size_t lane_offset(uint32_t d, uint32_t l) const {
    return device_offset(d) + kDevicePageBytes + size_t{l} * lane_bytes();
  }
  size_t sites_offset(uint32_t d, uint32_t l) const {
    return lane_offset(d, l) + kLanePageBytes;
  }
  size_t ring_offset(uint32_t d, uint32_t l) const {
    return sites_offset(d, l) + size_t{site_slots} * kRecordBytes;
  }
  size_t file_bytes() const { return devices_offset() + size_t{device_slots} * device_bytes(); }
};

}  // namespace devmem::flight
