// runtime/flight_record_reader.cc: the flight record's reader (see
// flight_record_reader.h; the layout: flight_record_format.h).
//
// The reader works on a copy of the file's bytes (never on a mapping: a file truncated
// while mapped would fault), so every record is read once, as it was when copied. For
// a live writer it is the seqlock reader: a record is taken when its seq word is not
// busy and its check matches, which it cannot by chance when the words are a mix of two
// writes (a mixed record is counted as torn). After a death nothing changes any more
// and the rule is the same.
#include "runtime/flight_record_reader.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <queue>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/flight_record_format.h"

namespace devmem {
namespace {

using namespace flight;  // NOLINT: the format's names are this file's vocabulary

class Bytes {
 public:
  Bytes(std::string_view b) : b_(b) {}  // NOLINT: implicit, a view
  uint64_t U64(size_t at) const {
    uint64_t v;
    std::memcpy(&v, b_.data() + at, 8);
    return v;
  }
  uint32_t U32(size_t at) const {
    uint32_t v;
    std::memcpy(&v, b_.data() + at, 4);
    return v;
  }
  const unsigned char* At(size_t at) const {
    return reinterpret_cast<const unsigned char*>(b_.data() + at);
  }
  size_t size() const { return b_.size(); }

 private:
  std::string_view b_;
};

bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

class Parser {
 public:
  Parser(std::string_view bytes, const std::string& name) : b_(bytes), name_(name) {}

  absl::StatusOr<FlightRecord> Run() {
    if (absl::Status s = Header(); !s.ok()) return s;
    Names();
    for (uint32_t d = 0; d < layout_.device_slots; ++d) Device(d);
    Clock();
    return std::move(r_);
  }

 private:
  absl::Status Error(size_t offset, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": offset ", offset, ": ", what));
  }
  void Problem(size_t offset, bool torn, std::string what) {
    (torn ? r_.torn : r_.damaged) += 1;
    // Listed up to a bound: a file damaged everywhere must not make a huge list.
    if (r_.problems.size() < 100) r_.problems.push_back({offset, torn, std::move(what)});
  }

  absl::Status Header() {
    if (b_.size() < header::kEnd) {
      return Error(b_.size(), absl::StrCat("truncated: ", b_.size(),
                                           " bytes, shorter than a flight record's header (",
                                           header::kEnd, " bytes)"));
    }
    if (std::memcmp(b_.At(header::kMagic), kMagic, sizeof(kMagic)) != 0) {
      return Error(0, "not a flight record (its first 8 bytes are not \"DMFLIGHT\")");
    }
    if (b_.U64(header::kByteOrder) != kByteOrder) {
      return Error(header::kByteOrder,
                   "field byte_order: written on a machine of the other byte order, or damaged");
    }
    r_.version = b_.U32(header::kVersion);
    if (r_.version < kOldestReadVersion || r_.version > kVersion) {
      // Version 1 (one writer per region, no lanes) is not read: its layout differs
      // past the header, and its files are of processes of an older devmem. Version 2
      // is read by version 3's rule (its entries never lag their events).
      return Error(header::kVersion,
                   absl::StrCat("field version: ", r_.version, " is not supported (this "
                                "reader reads versions ", kOldestReadVersion, " to ", kVersion,
                                r_.version < kVersion ? ": a record of an older devmem; read "
                                                        "it with that devmem's memtrace"
                                                      : "",
                                ")"));
    }
    const uint64_t check = FlightCheckBytes(0, b_.At(0), header::kCheck);
    if (b_.U64(header::kCheck) != check) {
      return Error(header::kCheck, "field header_check: does not match the header's bytes "
                                   "(the header is damaged)");
    }
    if (b_.U32(header::kHeaderBytes) != kHeaderBytes) {
      return Error(header::kHeaderBytes, absl::StrCat("field header_bytes: ",
                                                      b_.U32(header::kHeaderBytes),
                                                      ", expected ", kHeaderBytes));
    }
    layout_.device_slots = b_.U32(header::kDeviceSlots);
    layout_.ring_slots = b_.U32(header::kRingSlots);
    layout_.site_slots = b_.U32(header::kSiteSlots);
    layout_.name_slot_bytes = b_.U32(header::kNameSlotBytes);
    layout_.lane_slots = b_.U32(header::kLaneSlots);
    auto bad = [&](size_t at, const char* field, uint32_t v, const char* range) {
      return Error(at, absl::StrCat("field ", field, ": ", v, " is out of range (", range, ")"));
    };
    if (layout_.device_slots == 0 || layout_.device_slots > kMaxDeviceSlots) {
      return bad(header::kDeviceSlots, "device_slots", layout_.device_slots, "1 .. 64");
    }
    if (layout_.lane_slots == 0 || layout_.lane_slots > kMaxLaneSlots) {
      return bad(header::kLaneSlots, "lane_slots", layout_.lane_slots, "1 .. 64");
    }
    if (layout_.ring_slots == 0 || layout_.ring_slots > kMaxRingSlots ||
        (layout_.ring_slots & (layout_.ring_slots - 1)) != 0) {
      return bad(header::kRingSlots, "ring_slots", layout_.ring_slots,
                 "a power of two, 1 .. 2^24");
    }
    if (layout_.site_slots < 2 || layout_.site_slots > kMaxSiteSlots) {
      return bad(header::kSiteSlots, "site_slots", layout_.site_slots, "2 .. 65536");
    }
    if (layout_.name_slot_bytes < kMinNameSlotBytes ||
        layout_.name_slot_bytes > kMaxNameSlotBytes || layout_.name_slot_bytes % 8 != 0) {
      return bad(header::kNameSlotBytes, "name_slot_bytes", layout_.name_slot_bytes,
                 "a multiple of 8, 64 .. 4096");
    }
    const uint64_t declared = b_.U64(header::kFileBytes);
    if (declared != layout_.file_bytes()) {
      return Error(header::kFileBytes,
                   absl::StrCat("field file_bytes: ", declared, ", but the header's counts "
                                "make a file of ", layout_.file_bytes(), " bytes"));
    }
    if (b_.size() < declared) {
      return Error(b_.size(), absl::StrCat("truncated: ", b_.size(), " bytes of the ",
                                           declared, " the header declares (", Where(b_.size()),
                                           " is missing)"));
    }
    r_.pid = b_.U32(header::kPid);
    r_.start_unix_ns = static_cast<int64_t>(b_.U64(header::kStartUnixNs));
    r_.start_mono_ns = static_cast<int64_t>(b_.U64(header::kStartMonoNs));
    tsc_ = (b_.U32(header::kFlags) & kFlagTsc) != 0;
    tick0_ = static_cast<int64_t>(b_.U64(header::kTick0));
    ns0_ = static_cast<int64_t>(b_.U64(header::kNs0));
    return absl::OkStatus();
  }

  // Which region holds `offset`, for messages.
  std::string Where(size_t offset) const {
    if (offset < kHeaderBytes) return "the header";
    if (offset < layout_.devices_offset()) {
      return absl::StrCat("the name of site ", (offset - kHeaderBytes) / layout_.name_slot_bytes);
    }
    const size_t d = (offset - layout_.devices_offset()) / layout_.device_bytes();
    const size_t in = offset - layout_.device_offset(static_cast<uint32_t>(d));
    if (in < kDevicePageBytes) return absl::StrCat("region ", d, "'s stats page");
    const size_t l = (in - kDevicePageBytes) / layout_.lane_bytes();
    const size_t at = in - kDevicePageBytes - l * layout_.lane_bytes();
    if (at < kLanePageBytes) return absl::StrCat("region ", d, " lane ", l, "'s page");
    const size_t record = (at - kLanePageBytes) / kRecordBytes;
    if (record < layout_.site_slots) {
      return absl::StrCat("region ", d, " lane ", l, "'s live-site entry ", record);
    }
    return absl::StrCat("region ", d, " lane ", l, "'s ring slot ", record - layout_.site_slots);
  }

  void Names() {
    for (uint32_t id = 0; id < layout_.site_slots; ++id) {
      const size_t at = kHeaderBytes + size_t{id} * layout_.name_slot_bytes;
      const uint64_t state = b_.U64(at);
      if (state == 0) continue;
      if (state == 1) {
        Problem(at, true, absl::StrCat("the name of site ", id, " was being written"));
        continue;
      }
      const uint64_t w1 = b_.U64(at + 8), w2 = b_.U64(at + 16);
      const size_t file = w2 & 0xffff, function = (w2 >> 16) & 0xffff, tag = (w2 >> 32) & 0xffff;
      const auto kind = static_cast<uint32_t>((w2 >> 48) & 0xff);
      const size_t n = file + function + tag;
      bool ok = state == 2 && (w1 & 0xffffffff) == id && kind < kNumSiteKinds &&
                (w2 >> 56) == 0 && n <= layout_.name_slot_bytes - kNameSlotHeaderBytes;
      if (ok) {
        uint64_t h = FlightCheckBytes(kSeedName, b_.At(at + 8), 16);
        h ^= FlightCheckBytes(kSeedName, b_.At(at + kNameSlotHeaderBytes), n);
        ok = h == b_.U64(at + 24);
      }
      SiteInfo info;
      if (ok) {
        const char* text = reinterpret_cast<const char*>(b_.At(at + kNameSlotHeaderBytes));
        info.file.assign(text, file);
        info.function.assign(text + file, function);
        info.tag.assign(text + file + function, tag);
        info.line = static_cast<uint32_t>(w1 >> 32);
        info.kind = static_cast<SiteKind>(kind);
        ok = ValidUtf8(info.file) && ValidUtf8(info.function) && ValidUtf8(info.tag);
      }
      if (!ok) {
        Problem(at, false, absl::StrCat("the name of site ", id, " is damaged (its check "
                                        "does not match): skipped"));
        continue;
      }
      r_.sites[id] = std::move(info);
    }
  }

  // The complete copy with the larger seq of a double-buffered record at `at` (copies
  // `stride` bytes apart, `words` words each, word 0 the seq); `valid(copy words)` checks
  // one. Returns the copy index, or -1 (none written, or none complete).
  template <typename Valid>
  int PickCopy(size_t at, size_t stride, const char* what, Valid valid,
               bool* damaged_copy = nullptr) {
    int best = -1;
    uint64_t best_seq = 0;
    bool torn = false, damaged = false;
    for (int c = 0; c < 2; ++c) {
      const size_t copy = at + stride * static_cast<size_t>(c);
      const uint64_t seq = b_.U64(copy);
      if (seq == 0) continue;
      if (seq & kBusy) {
        torn = true;
        continue;
      }
      if (!valid(copy, c)) {
        damaged = true;
        Problem(copy, false, absl::StrCat(what, " (copy ", c, ") is damaged (its check does "
                                          "not match): skipped"));
        continue;
      }
      if (best < 0 || seq > best_seq) {
        best = c;
        best_seq = seq;
      }
    }
    if (torn) {
      Problem(at, true, absl::StrCat(what, ": one copy was being written (torn); ",
                                     best >= 0 ? "the other one is read" : "no other copy"));
      ++region_torn_;
    }
    if (damaged_copy != nullptr) *damaged_copy = damaged;
    return best;
  }

  // PickCopy for a stats page's double-buffered record (hot or cold: 64-byte copies of
  // seven words and their 64-bit check, seeded by `seed` ^ the copy's index).
  int PickStatsCopy(size_t at, uint64_t seed, const std::string& what) {
    return PickCopy(at, 64, what.c_str(), [&](size_t copy, int c) {
      return b_.U64(copy + 56) == FlightCheck(seed ^ static_cast<uint64_t>(c), b_.U64(copy),
                                              b_.U64(copy + 8), b_.U64(copy + 16),
                                              b_.U64(copy + 24), b_.U64(copy + 32),
                                              b_.U64(copy + 40), b_.U64(copy + 48));
    });
  }

  void Device(uint32_t d) {
    const size_t base = layout_.device_offset(d);
    const uint64_t ident = b_.U64(base + device::kIdent);
    if (ident == 0 && b_.U64(base + device::kIdentCheck) == 0) return;
    if ((ident & device::kIdentUsed) == 0 ||
        b_.U64(base + device::kIdentCheck) != FlightCheck(kSeedIdent, ident, d) ||
        ((ident >> 16) & 0xff) > static_cast<uint64_t>(DeviceType::kCuda)) {
      Problem(base, false, absl::StrCat("region ", d, "'s identity is damaged: the region is "
                                        "skipped"));
      return;
    }
    FlightRecord::Device dev;
    dev.slot = d;
    dev.device.type = static_cast<DeviceType>((ident >> 16) & 0xff);
    dev.device.index = static_cast<int>(ident & 0xffff);
    const std::string label = absl::StrCat("region ", d, " (", dev.device.ToString(), ")");
    // Segment stats (one writer at a time: the device lock).
    region_torn_ = 0;
    const size_t cold = base + device::kCold;
    const int c = PickStatsCopy(cold, kSeedCold, label + "'s segment stats");
    if (c >= 0) {
      const size_t at = cold + 64 * static_cast<size_t>(c);
      dev.reserved = static_cast<int64_t>(b_.U64(at + 8));
      dev.peak_reserved = static_cast<int64_t>(b_.U64(at + 16));
      dev.segments = static_cast<int32_t>(b_.U64(at + 24) & 0xffffffff);
      dev.ooms = static_cast<int64_t>(b_.U64(at + 24) >> 32);
      dev.mapped = static_cast<int64_t>(b_.U64(at + 32));
      dev.device_allocs = static_cast<int64_t>(b_.U64(at + 40));
      dev.device_frees = static_cast<int64_t>(b_.U64(at + 48));
    }
    const size_t clk = base + device::kClock;
    const int k = PickCopy(clk, 64, (label + "'s clock point").c_str(), [&](size_t at, int) {
      return b_.U64(at + 56) == FlightCheck(kSeedClock, b_.U64(at), b_.U64(at + 8),
                                            b_.U64(at + 16));
    });
    if (k >= 0) {
      const size_t at = clk + 64 * static_cast<size_t>(k);
      clock_points_.emplace_back(static_cast<int64_t>(b_.U64(at + 8)),
                                 static_cast<int64_t>(b_.U64(at + 16)));
    }
    dev.torn = region_torn_;
    // The lanes: each one's shares of the sites, its peak, its ring.
    std::map<SiteId, FlightRecord::SiteLive> sites;
    std::vector<std::vector<LaneEvent>> lane_events(layout_.lane_slots);
    for (uint32_t l = 0; l < layout_.lane_slots; ++l) {
      FlightRecord::Lane lane;
      lane.lane = l;
      region_torn_ = 0;
      ReadLane(d, l, absl::StrCat(label, " lane ", l), &lane, &sites, &lane_events[l]);
      lane.torn = region_torn_;
      dev.torn += lane.torn;
      dev.claimed += lane.claimed;
      dev.peak_allocated += lane.peak;
      if (lane.claimed > 0 || lane.torn > 0) dev.lanes.push_back(lane);
    }
    for (const auto& [id, live] : sites) {
      dev.allocated += live.bytes;
      dev.allocations += live.count;
      dev.alloc_count += static_cast<int64_t>(live.allocs);
      if (live.bytes != 0 || live.count != 0) dev.sites.push_back(live);
    }
    dev.free_count = dev.alloc_count - dev.allocations;
    // The events: the lanes merged (see Merge).
    std::vector<int64_t> ticks;
    Merge(lane_events, &dev, &ticks);
    int64_t last = tick0_;
    for (int64_t t : ticks) last = std::max(last, t);
    last_tick_.push_back(last);
    pending_ticks_.push_back(std::move(ticks));
    r_.devices.push_back(std::move(dev));
  }

  struct LaneEvent {
    TraceEvent e;
    int64_t tick = 0;
  };

  // Lane l of region d: adds its shares to `sites`, its complete events (by number) to
  // `events`, and its figures to `lane`.
  void ReadLane(uint32_t d, uint32_t l, const std::string& label, FlightRecord::Lane* lane,
            std::map<SiteId, FlightRecord::SiteLive>* sites, std::vector<LaneEvent>* events) {
    // Its peak.
    const size_t page = layout_.lane_offset(d, l) + lane::kPeak;
    const int p = PickCopy(page, 64, (label + "'s peak").c_str(), [&](size_t at, int c) {
      return b_.U64(at + 56) ==
             FlightCheck(kSeedPeak ^ static_cast<uint64_t>(c), b_.U64(at), b_.U64(at + 8));
    });
    if (p >= 0) lane->peak = static_cast<int64_t>(b_.U64(page + 64 * static_cast<size_t>(p) + 8));
    // Its shares of the sites as of their checkpoints (flight_record_format.h,
    // "Checkpoints"): entry i's values and seq. An entry with no complete copy of which
    // one is damaged is not summed at all (its events are not replayed into it either).
    struct Entry {
      uint64_t seq = 0;
      bool unknown = false;
    };
    std::map<uint32_t, Entry> entries;
    for (uint32_t i = 0; i < layout_.site_slots; ++i) {
      const size_t at = layout_.sites_offset(d, l) + size_t{i} * kRecordBytes;
      if (b_.U64(at) == 0 && b_.U64(at + 32) == 0) continue;  // never written
      bool damaged = false;
      const int s = PickCopy(at, 32, absl::StrCat(label, "'s live-site entry ", i).c_str(),
                             [&](size_t copy, int cc) {
                               const uint64_t w2 = b_.U64(copy + 16);
                               return (w2 >> 32) ==
                                      FlightCheck32(FlightCheck(
                                          kSeedSite ^ (uint64_t{i} << 8) ^
                                              static_cast<uint64_t>(cc),
                                          b_.U64(copy), b_.U64(copy + 8), w2 & 0xffffffff,
                                          b_.U64(copy + 24)));
                             },
                             &damaged);
      if (s < 0) {
        if (damaged) entries[i].unknown = true;
        continue;
      }
      const size_t copy = at + 32 * static_cast<size_t>(s);
      entries[i].seq = b_.U64(copy);
      FlightRecord::SiteLive& live = (*sites)[i];
      live.site = i;
      // Sums of shares of a damaged or crafted file may wrap: unsigned, never signed
      // overflow.
      live.bytes = static_cast<int64_t>(static_cast<uint64_t>(live.bytes) + b_.U64(copy + 8));
      live.count += static_cast<int32_t>(b_.U64(copy + 16) & 0xffffffff);
      live.allocs += b_.U64(copy + 24);
    }
    // Its ring.
    for (uint32_t i = 0; i < layout_.ring_slots; ++i) {
      const size_t at = layout_.ring_offset(d, l) + size_t{i} * kRecordBytes;
      const uint64_t seq = b_.U64(at);
      if (seq == 0) {
        // Never written: all zero (anything else was changed after the fact).
        bool zero = true;
        for (size_t j = 1; j < 8; ++j) zero = zero && b_.U64(at + 8 * j) == 0;
        if (!zero) {
          Problem(at, false, absl::StrCat(label, "'s ring slot ", i, " is damaged (not "
                                          "written, yet not zero): skipped"));
        }
        continue;
      }
      if (seq & kBusy) {
        ++region_torn_;
        lane->claimed = std::max(lane->claimed, seq & ~kBusy);
        Problem(at, true, absl::StrCat(label, "'s ring slot ", i, " was being written (event ",
                                       seq & ~kBusy, "): skipped"));
        continue;
      }
      uint64_t w[8];
      for (int j = 0; j < 8; ++j) w[j] = b_.U64(at + 8 * static_cast<size_t>(j));
      const auto site = static_cast<SiteId>(w[7] & 0xffffffff);
      const bool ok =
          (w[7] >> 32) == FlightCheck32(FlightCheck(kSeedRing ^ site, w[0], w[1], w[2], w[3],
                                                    w[4], w[5], w[6])) &&
          ((seq - 1) & (layout_.ring_slots - 1)) == i && (w[2] & 0xff) < kNumAllocActions &&
          ((w[2] >> 8) & 0xff) <= static_cast<uint64_t>(DeviceType::kCuda);
      if (!ok) {
        Problem(at, false, absl::StrCat(label, "'s ring slot ", i, " is damaged (its check "
                                        "does not match): skipped"));
        continue;
      }
      lane->claimed = std::max(lane->claimed, seq);
      LaneEvent le;
      TraceEvent& e = le.e;
      e.seq = seq;
      e.action = static_cast<AllocAction>(w[2] & 0xff);
      e.device.type = static_cast<DeviceType>((w[2] >> 8) & 0xff);
      e.device.index = static_cast<int>((w[2] >> 16) & 0xffff);
      e.thread = static_cast<uint32_t>(w[2] >> 32);
      e.stream.handle = static_cast<uintptr_t>(w[3]);
      e.addr = static_cast<uintptr_t>(w[4]);
      e.size = static_cast<size_t>(w[5]);
      e.requested = static_cast<size_t>(w[6]);
      e.site = site;
      le.tick = static_cast<int64_t>(w[1]);
      events->push_back(le);
    }
    std::sort(events->begin(), events->end(),
              [](const LaneEvent& a, const LaneEvent& b) { return a.e.seq < b.e.seq; });
    if (!events->empty()) lane->last_seq = events->back().e.seq;
    // The events past each entry's checkpoint, added to its share (the writer keeps
    // them all in the ring: flight_record_format.h, "Checkpoints").
    for (const LaneEvent& le : *events) {
      const TraceEvent& e = le.e;
      if (e.action != AllocAction::kAlloc && e.action != AllocAction::kFree) continue;
      const uint32_t i = std::min<uint32_t>(e.site, layout_.site_slots - 1);
      const auto found = entries.find(i);
      if (found != entries.end() && (found->second.unknown || e.seq <= found->second.seq)) {
        continue;
      }
      FlightRecord::SiteLive& live = (*sites)[i];
      live.site = i;
      const bool alloc = e.action == AllocAction::kAlloc;
      const uint64_t size = e.size;
      live.bytes = static_cast<int64_t>(static_cast<uint64_t>(live.bytes) +
                                        (alloc ? size : uint64_t{0} - size));
      live.count += alloc ? 1 : -1;
      live.allocs += alloc ? 1 : 0;
    }
  }

  // The lanes' events as one sequence: by stamp, each lane's own order kept (a lane's
  // stamps rise), ties in lane order (a k-way merge). The writer's stamps are causal
  // (flight_recorder.h, "Order"): an event that had to come after another, the free of
  // a block after its alloc on another thread, has the larger stamp, so ties are
  // events no thread ordered and any order of them is valid. (A damaged or crafted
  // file's stamps may be in any order: the merge still takes every event once.)
  static void Merge(std::vector<std::vector<LaneEvent>>& lanes, FlightRecord::Device* dev,
                    std::vector<int64_t>* ticks) {
    size_t total = 0;
    for (const auto& l : lanes) total += l.size();
    using Head = std::pair<int64_t, size_t>;  // (stamp, lane), the smallest on top
    std::priority_queue<Head, std::vector<Head>, std::greater<Head>> heads;
    std::vector<size_t> next(lanes.size(), 0);
    for (size_t l = 0; l < lanes.size(); ++l) {
      if (!lanes[l].empty()) heads.emplace(lanes[l][0].tick, l);
    }
    dev->events.reserve(total);
    dev->event_lanes.reserve(total);
    ticks->reserve(total);
    while (!heads.empty()) {
      const size_t l = heads.top().second;
      heads.pop();
      const LaneEvent& le = lanes[l][next[l]++];
      dev->events.push_back(le.e);
      dev->event_lanes.push_back(static_cast<uint32_t>(l));
      ticks->push_back(le.tick);
      if (next[l] < lanes[l].size()) {
        heads.emplace(lanes[l][next[l]].tick, l);
      }
    }
  }

  // Maps ticks to nanoseconds once every clock point is known (the best: the one
  // farthest from the anchor), then fills in the events' times.
  void Clock() {
    if (tsc_) {
      for (const auto& [tick, ns] : clock_points_) {
        if (tick > tick0_ && ns > ns0_ && (ns1_ == 0 || ns > ns1_)) {
          tick1_ = tick;
          ns1_ = ns;
        }
      }
      // Under 10 us between the two points, the rate would be mostly jitter.
      r_.clock_calibrated = Wide(ns1_) - ns0_ >= 10'000;
    }
    for (size_t d = 0; d < r_.devices.size(); ++d) {
      FlightRecord::Device& dev = r_.devices[d];
      for (size_t i = 0; i < dev.events.size(); ++i) {
        dev.events[i].time_ns = ToNs(pending_ticks_[d][i]);
      }
      dev.last_event_ns = ToNs(last_tick_[d]);
    }
  }

  // Ticks, the anchor and the clock points are the file's, so any 64-bit values: the
  // mapping is computed in 128 bits and clamped to int64, so that a damaged or crafted
  // file gives absurd times, never a signed overflow. Differences of two int64 fit in
  // 65 bits, and a quotient past 2^64 is clamped before ns0 is added.
  static __int128 Wide(int64_t v) { return v; }
  static int64_t Clamp(__int128 v) {
    if (v > INT64_MAX) return INT64_MAX;
    if (v < INT64_MIN) return INT64_MIN;
    return static_cast<int64_t>(v);
  }
  int64_t ToNs(int64_t tick) const {
    if (!tsc_) return tick;
    const __int128 dtick = Wide(tick) - tick0_;
    if (!r_.clock_calibrated || tick1_ <= tick0_) return Clamp(ns0_ + dtick);
    const __int128 dt = Wide(tick1_) - tick0_, dns = Wide(ns1_) - ns0_;  // dt > 0
    __int128 product;
    if (__builtin_mul_overflow(dtick, dns, &product)) {
      // |product| > 2^127 with dt < 2^65: more than 2^62 ns (146 years) from the anchor.
      return (dtick < 0) != (dns < 0) ? INT64_MIN : INT64_MAX;
    }
    const __int128 scaled = product / dt;
    constexpr __int128 kLimit = static_cast<__int128>(1) << 64;
    if (scaled > kLimit) return INT64_MAX;
    if (scaled < -kLimit) return INT64_MIN;
    return Clamp(ns0_ + scaled);
  }

  Bytes b_;
  const std::string& name_;
  Layout layout_;
  FlightRecord r_;
  bool tsc_ = false;
  int64_t tick0_ = 0, ns0_ = 0, tick1_ = 0, ns1_ = 0;
  uint64_t region_torn_ = 0;
  std::vector<std::pair<int64_t, int64_t>> clock_points_;
  std::vector<std::vector<int64_t>> pending_ticks_;  // per device, as its events
  std::vector<int64_t> last_tick_;                   // per device: its newest event's
};

}  // namespace

bool LooksLikeFlightRecord(std::string_view bytes) {
  return bytes.size() >= sizeof(kMagic) && std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0;
}

bool IsFlightRecordFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[sizeof(kMagic)] = {};
  in.read(head, sizeof(head));
  return in.gcount() == sizeof(head) && LooksLikeFlightRecord(std::string_view(head, sizeof(head)));
}

absl::StatusOr<FlightRecord> ParseFlightRecord(std::string_view bytes, const std::string& name) {
  return Parser(bytes, name).Run();
}

absl::StatusOr<FlightRecord> ReadFlightRecord(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::string bytes;
  try {
    // In one read of the size the file has now; a file that grows meanwhile is read up
    // to that size (the header says how much a record needs).
    in.seekg(0, std::ios::end);
    const std::streamoff size = in.tellg();
    in.seekg(0, std::ios::beg);
    if (size < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot tell its size"));
    bytes.resize(static_cast<size_t>(size));
    in.read(bytes.data(), size);
    bytes.resize(static_cast<size_t>(in.gcount()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(path, ": too large to read into memory"));
  }
  if (in.bad()) return absl::InvalidArgumentError(absl::StrCat(path, ": read error"));
  return ParseFlightRecord(bytes, path);
}

std::vector<TraceEvent> FlightRecordEvents(const FlightRecord& record) {
  std::vector<std::tuple<int64_t, uint32_t, uint64_t, const TraceEvent*>> all;
  for (const FlightRecord::Device& d : record.devices) {
    // The device's own position breaks ties: its order was decided by its merge.
    for (size_t i = 0; i < d.events.size(); ++i) {
      all.emplace_back(d.events[i].time_ns, d.slot, i, &d.events[i]);
    }
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a), std::get<2>(a)) <
           std::tie(std::get<0>(b), std::get<1>(b), std::get<2>(b));
  });
  std::vector<TraceEvent> out;
  out.reserve(all.size());
  for (const auto& t : all) {
    out.push_back(*std::get<3>(t));
    out.back().seq = out.size();
  }
  return out;
}

std::string FlightRecordToTraceJsonl(const FlightRecord& record) {
  const std::vector<TraceEvent> events = FlightRecordEvents(record);
  std::string out = TraceHeaderFromSites(record.sites);
  out += '\n';
  for (const TraceEvent& e : events) {
    out += TraceEventToJson(e);
    out += '\n';
  }
  return out;
}

}  // namespace devmem
