// tests/flight_recorder_test.cc: the flight record (runtime/flight_recorder.h and
// runtime/flight_record_reader.h): what a real allocator's events leave in the file
// (live bytes per site, stats, events, names, against the allocator's own figures),
// records torn by a death and damaged ones (skipped and listed, never read as values),
// truncated and malformed files (errors naming the file and the offset or field), two
// threads on one allocator and on two, and the file's safety rules. The record left by
// a SIGKILL at a random moment is tests/postmortem_test.py's (memtrace postmortem).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <latch>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "allocator/site.h"
#include "runtime/flight_record_format.h"
#include "runtime/flight_record_reader.h"
#include "runtime/flight_recorder.h"
#include "runtime/trace_clock.h"
#include "test_util.h"
#include "text_assertions.h"

namespace devmem {
namespace {

namespace fs = std::filesystem;

// A temporary directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/devmem-flight-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Recomputes the header's check over the bytes before it, as a crafted file would, so
// that a changed header field reaches the reader's checks of that field.
void FixHeaderCheck(std::string& bytes) {
  const uint64_t check = flight::FlightCheckBytes(
      0, reinterpret_cast<const unsigned char*>(bytes.data()), flight::header::kCheck);
  std::memcpy(&bytes[flight::header::kCheck], &check, 8);
}

// `bytes` with the 4-byte header field at `offset` set to `value`, its check fixed up.
std::string WithHeaderField(std::string bytes, size_t offset, uint32_t value) {
  std::memcpy(&bytes[offset], &value, 4);
  FixHeaderCheck(bytes);
  return bytes;
}

// Small regions, so that a test's file is a few hundred KiB. Site ids are the
// process's (allocator/site.h): run with the whole binary, the tests before this one
// have interned many, and ids past the last slot share it ("the rest"), so the site
// region leaves room for 64 more than are interned when the test starts (each test
// here interns fewer).
FlightRecorder::Options SmallOptions() {
  FlightRecorder::Options o;
  o.device_slots = 2;
  o.lane_slots = 4;
  o.ring_slots = 256;
  o.site_slots = static_cast<uint32_t>(SiteCount()) + 64;
  o.name_slot_bytes = 128;
  return o;
}

flight::Layout LayoutOf(const FlightRecorder::Options& o) {
  return flight::Layout{o.device_slots, o.ring_slots, o.site_slots, o.name_slot_bytes,
                        o.lane_slots};
}

std::map<SiteId, int64_t> LiveBySite(const FlightRecord::Device& d) {
  std::map<SiteId, int64_t> out;
  for (const FlightRecord::SiteLive& s : d.sites) out[s.site] = s.bytes;
  return out;
}

std::map<SiteId, int64_t> AllocatorLiveBySite(const CachingAllocator& a) {
  std::map<SiteId, int64_t> out;
  const std::vector<SiteStats> stats = a.site_stats();
  for (size_t id = 0; id < stats.size(); ++id) {
    if (stats[id].live_bytes != 0) out[static_cast<SiteId>(id)] = stats[id].live_bytes;
  }
  return out;
}

// "" when every address's events go alloc, free, alloc, ... (what memtrace timeline
// requires of a trace), else the first that does not.
std::string OrderProblem(const std::vector<TraceEvent>& events) {
  std::set<uintptr_t> live;
  for (const TraceEvent& e : events) {
    if (e.action == AllocAction::kAlloc && !live.insert(e.addr).second) {
      return absl::StrCat("alloc of ", e.addr, " (seq ", e.seq, "), which is already live");
    }
    if (e.action == AllocAction::kFree && live.erase(e.addr) == 0) {
      return absl::StrCat("free of ", e.addr, " (seq ", e.seq, "), which is not live");
    }
  }
  return "";
}

// Holds the trace clock's coarse tick still for a test's scope (trace_clock.h), so that
// events of several threads fall within one tick deterministically.
struct HeldTicker {
  HeldTicker() { TraceClock::HoldTickerForTest(true); }
  ~HeldTicker() { TraceClock::HoldTickerForTest(false); }
};

TEST(FlightRecorderTest, TheFileHoldsWhatTheAllocatorHolds) {
  TempDir dir;
  const std::string path = dir / "run.flight";
  auto recorder = FlightRecorder::Create(path, SmallOptions());
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  auto t = testutil::MakeSimAllocator("expandable_segments:true");
  FlightDevice* d = (*recorder)->AddAllocator(t->device());
  ASSERT_NE(d, nullptr);
  t->set_observer(d);
  const SiteId a = InternNamedSite("model.py", 10, "forward", SiteKind::kAlloc, "attn");
  const SiteId b = InternNamedSite("model.py", 20, "backward", SiteKind::kClone);
  std::vector<void*> keep;
  for (int i = 0; i < 10; ++i) keep.push_back(t->allocate(4096 * (i + 1), {}, a));
  for (int i = 0; i < 5; ++i) keep.push_back(t->allocate(3 << 20, {}, b));
  t->free(keep[0]);
  t->free(keep[11]);
  void* big = t->allocate(64 << 20, {}, b);
  t->free(big);
  t->empty_cache();  // unmaps: reserved bytes fall

  absl::StatusOr<FlightRecord> r = ReadFlightRecord(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->consistent());
  EXPECT_EQ(r->torn, 0u);
  EXPECT_TRUE(r->problems.empty());
  EXPECT_EQ(r->pid, static_cast<uint32_t>(getpid()));
  ASSERT_EQ(r->devices.size(), 1u);
  const FlightRecord::Device& dev = r->devices[0];
  EXPECT_EQ(dev.device, t->device());
  EXPECT_EQ(LiveBySite(dev), AllocatorLiveBySite(*t));
  const DeviceStats stats = t->stats();
  EXPECT_EQ(dev.allocated, stats.allocated_bytes[0].current);
  EXPECT_EQ(dev.peak_allocated, stats.allocated_bytes[0].peak);
  EXPECT_EQ(dev.allocations, stats.allocation[0].current);
  EXPECT_EQ(dev.reserved, stats.reserved_bytes[0].current);
  EXPECT_EQ(dev.peak_reserved, stats.reserved_bytes[0].peak);
  EXPECT_EQ(dev.device_allocs, stats.num_device_alloc);
  EXPECT_EQ(dev.device_frees, stats.num_device_free);
  EXPECT_EQ(dev.alloc_count, 16);
  EXPECT_EQ(dev.free_count, 3);
  // Every event, in order, each the allocator's (seq 1, 2, ... with no gap), in the one
  // lane of the one thread.
  ASSERT_EQ(dev.events.size(), dev.claimed);
  for (size_t i = 0; i < dev.events.size(); ++i) EXPECT_EQ(dev.events[i].seq, i + 1);
  ASSERT_EQ(dev.lanes.size(), 1u);
  EXPECT_EQ(dev.lanes[0].last_seq, dev.claimed);
  EXPECT_EQ(dev.lanes[0].claimed, dev.claimed);
  EXPECT_EQ(dev.events.front().action, AllocAction::kSegmentMap);
  for (size_t i = 1; i < dev.events.size(); ++i) {
    EXPECT_LE(dev.events[i - 1].time_ns, dev.events[i].time_ns);
  }
  // The names, from the file (not this process's table).
  ASSERT_TRUE(r->sites.count(a));
  EXPECT_EQ(r->sites.at(a).file, "model.py");
  EXPECT_EQ(r->sites.at(a).line, 10u);
  EXPECT_EQ(r->sites.at(a).function, "forward");
  EXPECT_EQ(r->sites.at(a).tag, "attn");
  EXPECT_EQ(r->sites.at(b).kind, SiteKind::kClone);
  // The trace form reads back as a trace.
  absl::StatusOr<std::vector<TraceEvent>> trace = TraceFromJsonl(FlightRecordToTraceJsonl(*r));
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->size(), dev.events.size());
  for (void* p : keep) {
    if (p != keep[0] && p != keep[11]) t->free(p);
  }
  t->set_observer(nullptr);
}

TEST(FlightRecorderTest, TheRingKeepsTheNewestEvents) {
  TempDir dir;
  const std::string path = dir / "ring.flight";
  auto recorder = FlightRecorder::Create(path, SmallOptions());
  ASSERT_TRUE(recorder.ok());
  FlightDevice* d = (*recorder)->AddAllocator(DeviceId{DeviceType::kSim, 3});
  for (uint64_t i = 1; i <= 1000; ++i) {
    d->Record(AllocEvent{AllocAction::kAlloc, DeviceId{DeviceType::kSim, 3}, Stream{1},
                         i * 512, 512, 500, 7});
  }
  absl::StatusOr<FlightRecord> r = ReadFlightRecord(path);
  ASSERT_TRUE(r.ok()) << r.status();
  const FlightRecord::Device& dev = r->devices.at(0);
  ASSERT_EQ(dev.events.size(), 256u);
  EXPECT_EQ(dev.events.front().seq, 745u);
  EXPECT_EQ(dev.events.back().seq, 1000u);
  for (const TraceEvent& e : dev.events) {
    EXPECT_EQ(e.addr, e.seq * 512);
    EXPECT_EQ(e.requested, 500u);
    EXPECT_EQ(e.site, 7u);
    EXPECT_EQ(e.device, (DeviceId{DeviceType::kSim, 3}));
  }
  EXPECT_EQ(LiveBySite(dev), (std::map<SiteId, int64_t>{{7, 512000}}));
  EXPECT_EQ(dev.sites.at(0).count, 1000);
}

// Two threads on one allocator (its device lock orders them) and one on another
// allocator (its own region): every event and every byte is accounted.
TEST(FlightRecorderTest, ThreadsOnOneAndOnTwoAllocators) {
  TempDir dir;
  const std::string path = dir / "threads.flight";
  FlightRecorder::Options o = SmallOptions();
  o.ring_slots = 1 << 14;
  auto recorder = FlightRecorder::Create(path, o);
  ASSERT_TRUE(recorder.ok());
  auto one = testutil::MakeSimAllocator("");
  auto two = testutil::MakeSimAllocator("");
  one->set_observer((*recorder)->AddAllocator(one->device()));
  two->set_observer((*recorder)->AddAllocator(two->device()));
  std::vector<void*> kept[3];
  // Each thread holds its lane until all three are done (a thread that exits gives
  // its lane back, and the next one would continue it).
  std::latch done(3);
  auto work = [&kept, &done](CachingAllocator* a, uint32_t line, int n) {
    const SiteId s = InternNamedSite("threads.cc", line, "work", SiteKind::kAlloc);
    std::vector<void*>& live = kept[line - 1];
    std::mt19937 rng(line);
    for (int i = 0; i < n; ++i) {
      if (!live.empty() && rng() % 3 == 0) {
        a->free(live.back());
        live.pop_back();
      } else {
        live.push_back(a->allocate(512 * (1 + rng() % 64), {}, s));
      }
    }
    done.arrive_and_wait();
  };
  std::thread t1(work, &*one, 1, 2000), t2(work, &*one, 2, 2000), t3(work, &*two, 3, 2000);
  t1.join();
  t2.join();
  t3.join();
  absl::StatusOr<FlightRecord> r = ReadFlightRecord(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->consistent());
  EXPECT_EQ(r->torn, 0u);
  ASSERT_EQ(r->devices.size(), 2u);
  EXPECT_EQ(LiveBySite(r->devices[0]), AllocatorLiveBySite(*one));
  EXPECT_EQ(LiveBySite(r->devices[1]), AllocatorLiveBySite(*two));
  EXPECT_EQ(r->devices[0].events.size(), r->devices[0].claimed);
  // Two threads on one allocator: a lane each (their hits came without the device
  // lock, concurrently), merged into one valid order.
  ASSERT_EQ(r->devices[0].lanes.size(), 2u);
  EXPECT_EQ(r->devices[0].lanes[0].claimed + r->devices[0].lanes[1].claimed,
            r->devices[0].claimed);
  EXPECT_EQ(OrderProblem(r->devices[0].events), "");
  EXPECT_EQ(OrderProblem(r->devices[1].events), "");
  EXPECT_EQ(r->devices[0].allocated, one->stats().allocated_bytes[0].current);
  EXPECT_EQ(r->devices[0].allocations, one->stats().allocation[0].current);
  EXPECT_EQ(r->devices[1].allocated, two->stats().allocated_bytes[0].current);
  for (void* p : kept[0]) one->free(p);
  for (void* p : kept[1]) one->free(p);
  for (void* p : kept[2]) two->free(p);
  one->set_observer(nullptr);
  two->set_observer(nullptr);
}

// A lane's live-site entries are its shares as of its last checkpoint (every
// flight::CheckpointEvents(ring_slots) events); the reader adds the ring's events past
// each entry's seq. Read after every event of many sites, more than the ring holds and
// the checkpoints list, with frees of earlier allocations, the file always reads the
// live bytes, counts and allocations of that moment: the ring still held every event
// the entries lacked. (A reader that took the entries alone read the state of the last
// checkpoint.)
TEST(FlightRecorderTest, EveryEventsFileReadsTheLiveSetOfThatMoment) {
  TempDir dir;
  const std::string path = dir / "checkpoints.flight";
  FlightRecorder::Options o = SmallOptions();
  o.ring_slots = 8;  // checkpoints every 4 events
  ASSERT_EQ(flight::CheckpointEvents(o.ring_slots), 4u);
  auto recorder = FlightRecorder::Create(path, o);
  ASSERT_TRUE(recorder.ok());
  const DeviceId dev{DeviceType::kSim, 0};
  FlightDevice* d = (*recorder)->AddAllocator(dev);
  std::mt19937 rng(16);
  std::vector<std::pair<uintptr_t, SiteId>> live;  // (addr, site) of live blocks
  std::map<SiteId, int64_t> bytes, count, allocs;
  uintptr_t next = 4096;
  for (int n = 0; n < 300; ++n) {
    if (!live.empty() && rng() % 3 == 0) {
      const size_t k = rng() % live.size();
      const auto [addr, site] = live[k];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      d->Record(AllocEvent{AllocAction::kFree, dev, Stream{}, addr, 512 * (addr % 7 + 1), 1,
                           site});
      bytes[site] -= static_cast<int64_t>(512 * (addr % 7 + 1));
      if (bytes[site] == 0) bytes.erase(site);
      count[site] -= 1;
    } else {
      const SiteId site = 1 + static_cast<SiteId>(rng() % 12);
      const uintptr_t addr = next;
      next += 4096 + 4096 * (rng() % 7);
      live.emplace_back(addr, site);
      d->Record(AllocEvent{AllocAction::kAlloc, dev, Stream{}, addr, 512 * (addr % 7 + 1), 1,
                           site});
      bytes[site] += static_cast<int64_t>(512 * (addr % 7 + 1));
      count[site] += 1;
      allocs[site] += 1;
    }
    if (n % 5 == 0) {  // a segment event now and then: it takes a ring slot too
      d->Record(AllocEvent{AllocAction::kSegmentAlloc, dev, Stream{}, 1u << 30, 1u << 20, 0,
                           0});
      d->Record(AllocEvent{AllocAction::kSegmentFree, dev, Stream{}, 1u << 30, 1u << 20, 0,
                           0});
    }
    absl::StatusOr<FlightRecord> r = ReadFlightRecord(path);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->consistent()) << n;
    const FlightRecord::Device& rd = r->devices.at(0);
    ASSERT_EQ(LiveBySite(rd), bytes) << "after event " << n;
    for (const FlightRecord::SiteLive& s : rd.sites) {
      ASSERT_EQ(s.count, count[s.site]) << "site " << s.site << " after event " << n;
      ASSERT_EQ(s.allocs, static_cast<uint64_t>(allocs[s.site])) << "site " << s.site;
    }
  }
}

// What a death in the middle of a write leaves, made by hand from a file with two
// checkpoints of site 5 (after events 2 and 4: rings of 4 slots checkpoint every 2
// events): a live-site copy whose seq is busy (the death came inside checkpoint 4), or a
// ring slot whose seq is busy (inside event 4, before its checkpoint). Each is skipped
// and counted as torn, the record stays consistent, and the site reads the older copy
// plus the ring's complete events past it.
TEST(FlightRecorderTest, TornWritesAreSkippedAndTheOlderCopyRead) {
  TempDir dir;
  const std::string path = dir / "torn.flight";
  FlightRecorder::Options o = SmallOptions();
  o.ring_slots = 4;
  auto recorder = FlightRecorder::Create(path, o);
  ASSERT_TRUE(recorder.ok());
  FlightDevice* d = (*recorder)->AddAllocator(DeviceId{DeviceType::kSim, 0});
  const DeviceId dev{DeviceType::kSim, 0};
  d->Record(AllocEvent{AllocAction::kAlloc, dev, Stream{}, 4096, 1024, 1000, 5});
  d->Record(AllocEvent{AllocAction::kAlloc, dev, Stream{}, 8192, 2048, 2000, 5});
  d->Record(AllocEvent{AllocAction::kAlloc, dev, Stream{}, 16384, 4096, 4000, 5});
  d->Record(AllocEvent{AllocAction::kAlloc, dev, Stream{}, 32768, 512, 500, 5});
  recorder->reset();  // unmapped: the file is what a dead process leaves

  const std::string clean = ReadAll(path);
  const flight::Layout layout = LayoutOf(o);
  // Lane 0 (this thread's): site 5's copy 0 is checkpoint 2's, copy 1 checkpoint 4's.
  const size_t entry = layout.sites_offset(0, 0) + 5 * flight::kRecordBytes;
  const size_t slot4 = layout.ring_offset(0, 0) + 3 * flight::kRecordBytes;
  {
    absl::StatusOr<FlightRecord> r = ParseFlightRecord(clean, path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(LiveBySite(r->devices.at(0)), (std::map<SiteId, int64_t>{{5, 7680}}));
  }
  // Inside checkpoint 4: copy 1 busy. Copy 0 (after event 2) plus events 3 and 4.
  {
    std::string bytes = clean;
    bytes[entry + 32 + 7] = static_cast<char>(bytes[entry + 32 + 7] | 0x80);
    absl::StatusOr<FlightRecord> r = ParseFlightRecord(bytes, path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->consistent());
    EXPECT_EQ(r->torn, 1u);
    EXPECT_EQ(r->damaged, 0u);
    ASSERT_EQ(r->problems.size(), 1u);
    EXPECT_TRUE(r->problems[0].torn);
    EXPECT_CONTAINS(r->problems[0].what, "live-site entry 5: one copy was being written");
    const FlightRecord::Device& rd = r->devices.at(0);
    EXPECT_EQ(rd.events.size(), 4u);
    EXPECT_EQ(LiveBySite(rd), (std::map<SiteId, int64_t>{{5, 7680}}));
    EXPECT_EQ(rd.sites.at(0).count, 4);
    EXPECT_EQ(rd.sites.at(0).allocs, 4u);
  }
  // Inside event 4: its slot busy, and checkpoint 4 not made (copy 1 as never written).
  // Copy 0 plus event 3: event 4 is the one in flight.
  {
    std::string bytes = clean;
    bytes[slot4 + 7] = static_cast<char>(bytes[slot4 + 7] | 0x80);
    std::fill(bytes.begin() + static_cast<std::ptrdiff_t>(entry + 32),
              bytes.begin() + static_cast<std::ptrdiff_t>(entry + 64), '\0');
    absl::StatusOr<FlightRecord> r = ParseFlightRecord(bytes, path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->consistent());
    EXPECT_EQ(r->torn, 1u);
    EXPECT_EQ(r->damaged, 0u);
    const FlightRecord::Device& rd = r->devices.at(0);
    ASSERT_EQ(rd.events.size(), 3u);
    EXPECT_EQ(rd.events.back().seq, 3u);
    EXPECT_EQ(LiveBySite(rd), (std::map<SiteId, int64_t>{{5, 7168}}));  // before event 4
    EXPECT_EQ(rd.sites.at(0).count, 3);
    EXPECT_EQ(rd.sites.at(0).allocs, 3u);
    ASSERT_EQ(rd.lanes.size(), 1u);
    EXPECT_EQ(rd.lanes[0].torn, 1u);
    EXPECT_EQ(rd.lanes[0].claimed, 4u);  // the torn event was numbered
    EXPECT_EQ(rd.lanes[0].last_seq, 3u);
  }
}

// Bytes changed after the fact are detected by the records' checks: a damaged event is
// skipped and listed with its offset, and the record is not consistent.
TEST(FlightRecorderTest, DamagedRecordsAreListedWithTheirOffset) {
  TempDir dir;
  const std::string path = dir / "damaged.flight";
  const FlightRecorder::Options o = SmallOptions();
  auto recorder = FlightRecorder::Create(path, o);
  ASSERT_TRUE(recorder.ok());
  FlightDevice* d = (*recorder)->AddAllocator(DeviceId{DeviceType::kSim, 0});
  const DeviceId dev{DeviceType::kSim, 0};
  for (int i = 1; i <= 3; ++i) {
    d->Record(AllocEvent{AllocAction::kAlloc, dev, Stream{}, 4096u * i, 512, 512, 9});
  }
  recorder->reset();
  const std::string clean = ReadAll(path);
  const flight::Layout layout = LayoutOf(o);
  const size_t slot = layout.ring_offset(0, 0) + 2 * flight::kRecordBytes;  // event 3
  // Every word of the event: a flipped bit anywhere is found.
  for (size_t word = 1; word < 8; ++word) {
    std::string bytes = clean;
    bytes[slot + 8 * word + 2] ^= 0x10;
    absl::StatusOr<FlightRecord> r = ParseFlightRecord(bytes, path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->consistent()) << "word " << word;
    EXPECT_EQ(r->damaged, 1u) << "word " << word;
    ASSERT_EQ(r->problems.size(), 1u);
    EXPECT_EQ(r->problems[0].offset, slot);
    EXPECT_CONTAINS(r->problems[0].what, "ring slot 2 is damaged");
    EXPECT_EQ(r->devices.at(0).events.size(), 2u);  // events 1 and 2 only
  }
  // A live-site entry (its one copy, the destructor's checkpoint): not read as a
  // value, and the ring's events are not added to it either.
  {
    std::string bytes = clean;
    const size_t entry = layout.sites_offset(0, 0) + 9 * flight::kRecordBytes;
    bytes[entry + 8] ^= 1;
    absl::StatusOr<FlightRecord> r = ParseFlightRecord(bytes, path);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->damaged, 1u);
    EXPECT_TRUE(r->devices.at(0).sites.empty());
    EXPECT_CONTAINS(r->problems[0].what, "lane 0's live-site entry 9 (copy 0) is damaged");
    EXPECT_EQ(r->problems[0].offset, entry);
  }
  // A name.
  {
    std::string bytes = clean;
    bytes[flight::kHeaderBytes + 9 * o.name_slot_bytes + flight::kNameSlotHeaderBytes] ^= 1;
    absl::StatusOr<FlightRecord> r = ParseFlightRecord(bytes, path);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->damaged, 1u);
    EXPECT_EQ(r->sites.count(9), 0u);
    EXPECT_CONTAINS(r->problems[0].what, "the name of site 9 is damaged");
  }
}

// A block handed from one thread to another and back within one tick of the clock
// (frees and allocs of one address on two lanes, the ticker held): its order word
// (AllocEvent::block_order, what Block::trace_order is in an allocator) carries each
// event's stamp to the next, so the merge by (stamp, lane) reads each free before the
// other lane's alloc of the address. With the coarse tick alone, a merge by (time,
// lane) read lane 0's second alloc of X before lane 1's free of it.
TEST(FlightRecorderTest, ABlockHandedBetweenThreadsWithinATickReadsInOrder) {
  constexpr uintptr_t kX = 0x1000, kY = 0x2000;
  TempDir dir;
  const std::string path = dir / "handoff.flight";
  const FlightRecorder::Options o = SmallOptions();
  auto recorder = FlightRecorder::Create(path, o);
  ASSERT_TRUE(recorder.ok());
  const DeviceId dev{DeviceType::kSim, 0};
  FlightDevice* d = (*recorder)->AddAllocator(dev);
  const HeldTicker held;
  uint64_t x_order = 0, y_order = 0;  // the blocks' order words
  auto ev = [&](AllocAction a, uintptr_t addr) {
    AllocEvent e{a, dev, Stream{}, addr, 512, 512, 3};
    e.block_order = addr == kX ? &x_order : &y_order;
    return e;
  };
  // What happened: A (lane 0) allocs Y; B (lane 1) allocs X, frees X; A allocs X, frees
  // X; B allocs X, frees X; A allocs X.
  std::latch a_started(1), b_done1(1), a_done(1), b_done2(1);
  std::thread a([&] {
    d->Record(ev(AllocAction::kAlloc, kY));
    a_started.count_down();
    b_done1.wait();
    d->Record(ev(AllocAction::kAlloc, kX));
    d->Record(ev(AllocAction::kFree, kX));
    a_done.count_down();
    b_done2.wait();
    d->Record(ev(AllocAction::kAlloc, kX));
  });
  std::thread b([&] {
    a_started.wait();
    d->Record(ev(AllocAction::kAlloc, kX));
    d->Record(ev(AllocAction::kFree, kX));
    b_done1.count_down();
    a_done.wait();
    d->Record(ev(AllocAction::kAlloc, kX));
    d->Record(ev(AllocAction::kFree, kX));
    b_done2.count_down();
  });
  a.join();
  b.join();
  recorder->reset();
  absl::StatusOr<FlightRecord> r = ReadFlightRecord(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->consistent());
  const FlightRecord::Device& rd = r->devices.at(0);
  ASSERT_EQ(rd.events.size(), 8u);
  ASSERT_EQ(rd.lanes.size(), 2u);
  EXPECT_EQ(OrderProblem(rd.events), "");
  // The trace form (what timeline and export read) keeps the order.
  EXPECT_EQ(OrderProblem(FlightRecordEvents(*r)), "");
  EXPECT_EQ(LiveBySite(rd), (std::map<SiteId, int64_t>{{3, 1024}}));  // X and Y
  EXPECT_EQ(rd.alloc_count, 5);
  EXPECT_EQ(rd.free_count, 3);
}

// A block allocated on one thread and freed on another within one tick of the clock
// (the ticker held), the alloc's own event kept in the ring: the free reads after the
// alloc and the block is not live at the end (timeline and export read the same). The
// block's order word carries the alloc's stamp to the free. A reader that decided ties
// by the addresses took the free of an address it had not seen first (it fits), then
// the alloc, and showed the block live for ever.
TEST(FlightRecorderTest, AnAllocAndItsFreeOnTwoLanesWithinATickReadInOrder) {
  constexpr uintptr_t kX = 0x1000;
  TempDir dir;
  const std::string path = dir / "tie.flight";
  auto recorder = FlightRecorder::Create(path, SmallOptions());
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  const DeviceId dev{DeviceType::kSim, 0};
  FlightDevice* d = (*recorder)->AddAllocator(dev);
  const HeldTicker held;
  uint64_t x_order = 0;  // the block's order word (Block::trace_order)
  auto ev = [&](AllocAction a) {
    AllocEvent e{a, dev, Stream{}, kX, 512, 512, 3};
    e.block_order = &x_order;
    return e;
  };
  std::latch allocated(1), freed(1);  // a holds its lane until b recorded: two lanes
  std::thread a([&] {
    d->Record(ev(AllocAction::kAlloc));
    allocated.count_down();
    freed.wait();
  });
  std::thread b([&] {
    allocated.wait();
    d->Record(ev(AllocAction::kFree));
    freed.count_down();
  });
  a.join();
  b.join();
  recorder->reset();
  absl::StatusOr<FlightRecord> r = ReadFlightRecord(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->consistent());
  const FlightRecord::Device& rd = r->devices.at(0);
  ASSERT_EQ(rd.events.size(), 2u);
  EXPECT_EQ(rd.event_lanes, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(rd.events[0].action, AllocAction::kAlloc);
  EXPECT_EQ(rd.events[1].action, AllocAction::kFree);
  EXPECT_EQ(OrderProblem(rd.events), "");
  const std::vector<TraceEvent> trace = FlightRecordEvents(*r);
  ASSERT_EQ(trace.size(), 2u);
  EXPECT_EQ(trace[0].action, AllocAction::kAlloc);
  EXPECT_EQ(trace[1].action, AllocAction::kFree);
  EXPECT_EQ(LiveBySite(rd), (std::map<SiteId, int64_t>{}));
  EXPECT_EQ(rd.allocated, 0);
  // The stamps read as the monotonic clock's ns (TSC ticks mapped through the clock
  // point the recorder wrote when destroyed): not after now, and not before the start
  // by more than a held coarse tick's lag (a unit mix-up is off by the TSC's GHz).
  EXPECT_TRUE(r->clock_calibrated);
  for (const TraceEvent& e : rd.events) {
    EXPECT_GT(e.time_ns, r->start_mono_ns - 1'000'000'000);
    EXPECT_LE(e.time_ns, NowNs());
  }
}

// More threads than lanes: the ones past the last but one share the last lane (under
// its mutex); every event is kept and the sums are right. Then a thread that exits
// gives its lane back, and the next thread goes on in it where it stopped.
TEST(FlightRecorderTest, ThreadsPastTheLanesShareTheLastAndExitedLanesAreReused) {
  TempDir dir;
  const std::string path = dir / "lanes.flight";
  FlightRecorder::Options o = SmallOptions();
  o.lane_slots = 2;
  auto recorder = FlightRecorder::Create(path, o);
  ASSERT_TRUE(recorder.ok());
  const DeviceId dev{DeviceType::kSim, 0};
  FlightDevice* d = (*recorder)->AddAllocator(dev);
  // Three threads that all hold their lanes at once (none exits before all recorded).
  std::latch all_recorded(3);
  auto work = [&](uintptr_t base) {
    for (uintptr_t i = 0; i < 10; ++i) {
      d->Record(AllocEvent{AllocAction::kAlloc, dev, Stream{}, base + 512 * i, 512, 512, 4});
    }
    for (uintptr_t i = 0; i < 4; ++i) {
      d->Record(AllocEvent{AllocAction::kFree, dev, Stream{}, base + 512 * i, 512, 512, 4});
    }
    all_recorded.arrive_and_wait();
  };
  {
    std::thread t1(work, 0x100000), t2(work, 0x200000), t3(work, 0x300000);
    t1.join();
    t2.join();
    t3.join();
  }
  // Then one more thread: it takes a lane an exited thread gave back.
  std::thread([&] {
    d->Record(AllocEvent{AllocAction::kAlloc, dev, Stream{}, 0x400000, 1024, 1000, 4});
  }).join();
  absl::StatusOr<FlightRecord> r = ReadFlightRecord(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->consistent());
  const FlightRecord::Device& rd = r->devices.at(0);
  ASSERT_EQ(rd.lanes.size(), 2u);
  EXPECT_EQ(rd.claimed, 3u * 14 + 1);
  EXPECT_EQ(rd.events.size(), rd.claimed);
  EXPECT_EQ(rd.lanes[0].claimed + rd.lanes[1].claimed, rd.claimed);
  // One lane holds one thread's 14 events (+1 if the last thread took it), the shared
  // one two threads' 28 (+1 likewise): the 4th thread continued a lane's numbers.
  std::map<uint32_t, std::set<uint32_t>> threads;  // lane -> thread numbers
  for (size_t i = 0; i < rd.events.size(); ++i) threads[rd.event_lanes[i]].insert(rd.events[i].thread);
  EXPECT_EQ(threads[1].size() + threads[0].size(), 4u);
  EXPECT_GE(threads[1].size(), 2u);  // the shared lane
  for (const FlightRecord::Lane& l : rd.lanes) EXPECT_EQ(l.last_seq, l.claimed);
  EXPECT_EQ(LiveBySite(rd), (std::map<SiteId, int64_t>{{4, 3 * 6 * 512 + 1024}}));
  EXPECT_EQ(rd.allocations, 3 * 6 + 1);
  EXPECT_EQ(rd.alloc_count, 31);
  EXPECT_EQ(rd.free_count, 12);
  EXPECT_EQ(OrderProblem(rd.events), "");
}

// A thread that recorded into a recorder destroyed before the thread exits: its exit
// gives the lane back to no one and touches nothing of the freed recorder (an ASan build
// reports the use after free otherwise); a recorder made since hands out its lanes from
// the first, as if that thread had never been (runtime/thread_lanes.h).
TEST(FlightRecorderTest, AThreadThatOutlivesItsRecorderLeavesItAlone) {
  TempDir dir;
  const DeviceId dev{DeviceType::kSim, 0};
  auto first = FlightRecorder::Create(dir / "first.flight", SmallOptions());
  ASSERT_TRUE(first.ok()) << first.status();
  std::unique_ptr<FlightRecorder> recorder = std::move(*first);
  FlightDevice* d = recorder->AddAllocator(dev);
  std::latch recorded(1), destroyed(1);
  std::thread t([&] {
    d->Record(AllocEvent{AllocAction::kAlloc, dev, Stream{}, 0x1000, 512, 512, 4});
    recorded.count_down();
    destroyed.wait();
  });
  recorded.wait();
  recorder.reset();
  const std::string path = dir / "second.flight";
  auto second = FlightRecorder::Create(path, SmallOptions());
  ASSERT_TRUE(second.ok()) << second.status();
  recorder = std::move(*second);
  d = recorder->AddAllocator(dev);
  destroyed.count_down();
  t.join();
  for (uintptr_t i = 0; i < 2; ++i) {  // one after the other: both in lane 0
    std::thread([&] {
      d->Record(AllocEvent{AllocAction::kAlloc, dev, Stream{}, 0x2000 + 512 * i, 512, 512, 4});
    }).join();
  }
  absl::StatusOr<FlightRecord> r = ReadFlightRecord(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->consistent());
  const FlightRecord::Device& rd = r->devices.at(0);
  ASSERT_EQ(rd.events.size(), 2u);
  EXPECT_EQ(rd.event_lanes, (std::vector<uint32_t>{0, 0}));
  EXPECT_EQ(LiveBySite(rd), (std::map<SiteId, int64_t>{{4, 1024}}));
}

TEST(FlightRecorderTest, TruncatedAndMalformedFilesAreErrorsNamingFileAndOffset) {
  TempDir dir;
  const std::string path = dir / "t.flight";
  const FlightRecorder::Options o = SmallOptions();
  auto recorder = FlightRecorder::Create(path, o);
  ASSERT_TRUE(recorder.ok());
  (*recorder)->AddAllocator(DeviceId{DeviceType::kSim, 0});
  recorder->reset();
  const std::string clean = ReadAll(path);
  const flight::Layout layout = LayoutOf(o);
  ASSERT_EQ(clean.size(), layout.file_bytes());
  struct Case {
    std::string name;
    std::string bytes;
    std::string expected;
  };
  auto with = [&](size_t at, char x) {
    std::string b = clean;
    b[at] ^= x;
    return b;
  };
  const std::vector<Case> cases = {
      {"empty", "", "offset 0: truncated: 0 bytes, shorter than a flight record's header"},
      {"half header", clean.substr(0, 50), "offset 50: truncated: 50 bytes"},
      {"cut in the ring", clean.substr(0, layout.ring_offset(0, 1) + 100),
       absl::StrCat("offset ", layout.ring_offset(0, 1) + 100, ": truncated: ",
                    layout.ring_offset(0, 1) + 100, " bytes of the ", clean.size(),
                    " the header declares (region 0 lane 1's ring slot 1 is missing)")},
      {"not a record", "{\"schema\": \"devmem.trace/1\"}\n" + std::string(100, ' '),
       "offset 0: not a flight record"},
      {"version", with(flight::header::kVersion, 8),
       "offset 8: field version: 11 is not supported (this reader reads versions 2 to 3)"},
      // A record of version 1 (before lanes): not read, and said so with both versions.
      {"old version", with(flight::header::kVersion, 2),
       "offset 8: field version: 1 is not supported (this reader reads versions 2 to 3: a "
       "record of an older devmem; read it with that devmem's memtrace)"},
      {"header damaged", with(flight::header::kPid, 1),
       "offset 96: field header_check: does not match"},
  };
  for (const Case& c : cases) {
    WriteAll(path, c.bytes);
    absl::StatusOr<FlightRecord> r = ReadFlightRecord(path);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_CONTAINS(r.status().message(), path + ": " + c.expected) << c.name;
  }
  // A header whose counts are out of range (its check fixed up, as a crafted file
  // would): refused by field, never used to compute offsets.
  absl::StatusOr<FlightRecord> r = ParseFlightRecord(
      WithHeaderField(clean, flight::header::kRingSlots, 100), path);  // not a power of two
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "offset 28: field ring_slots: 100 is out of range");
  r = ParseFlightRecord(WithHeaderField(clean, flight::header::kLaneSlots, 65), path);
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), path + ": offset 88: field lane_slots: 65 is out of range");
  // Version 2 (entries current after every event, the same layout) is read by version
  // 3's rule.
  r = ParseFlightRecord(WithHeaderField(clean, flight::header::kVersion, 2), path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version, 2u);
  EXPECT_FALSE(ReadFlightRecord(dir / "missing.flight").ok());
}

// Ticks and clock anchors are read from the file: a crafted or damaged anchor (its
// header check fixed up) gives times clamped to the int64 range, never a signed
// overflow (which wrapped to times on the wrong side of the anchor, and is undefined
// behaviour: UBSan stops there). Both of the reader's paths: without a clock point,
// and through a clock point (the calibrated rate).
TEST(FlightRecorderTest, AbsurdClockAnchorsGiveClampedTimesNotOverflow) {
  TempDir dir;
  const std::string path = dir / "clock.flight";
  const FlightRecorder::Options o = SmallOptions();
  auto recorder = FlightRecorder::Create(path, o);
  ASSERT_TRUE(recorder.ok());
  auto t = testutil::MakeSimAllocator();
  FlightDevice* d = (*recorder)->AddAllocator(t->device());
  t->set_observer(d);
  t->free(t->allocate(4096));
  t->set_observer(nullptr);
  recorder->reset();
  const std::string clean = ReadAll(path);
  const flight::Layout layout = LayoutOf(o);
  auto put = [](std::string& b, size_t at, uint64_t v) { std::memcpy(&b[at], &v, 8); };
  const uint32_t tsc = flight::kFlagTsc;
  const size_t clk = layout.device_offset(0) + flight::device::kClock;

  // Ticks far above an anchor at the bottom of the range, no clock point (the writer's
  // own, if it wrote any, gone).
  std::string low = clean;
  std::memcpy(&low[flight::header::kFlags], &tsc, 4);
  put(low, flight::header::kTick0, static_cast<uint64_t>(INT64_MIN + 1));
  put(low, flight::header::kNs0, 0);
  std::memset(&low[clk], 0, 2 * flight::kRecordBytes);
  FixHeaderCheck(low);
  absl::StatusOr<FlightRecord> r = ParseFlightRecord(low, path);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->devices.size(), 1u);
  ASSERT_FALSE(r->devices[0].events.empty());
  for (const TraceEvent& e : r->devices[0].events) EXPECT_EQ(e.time_ns, INT64_MAX) << e.seq;
  EXPECT_EQ(r->devices[0].last_event_ns, INT64_MAX);

  // The ns anchor at the bottom and a clock point at the top: the rate's numerator
  // (ns1 - ns0) alone overflows int64.
  std::string rate = clean;
  std::memcpy(&rate[flight::header::kFlags], &tsc, 4);
  put(rate, flight::header::kTick0, 0);
  put(rate, flight::header::kNs0, static_cast<uint64_t>(INT64_MIN + 1));
  FixHeaderCheck(rate);
  std::memset(&rate[clk], 0, 2 * flight::kRecordBytes);  // the writer's own points gone
  const uint64_t seq = 1, tick = 1'000'000, ns = static_cast<uint64_t>(INT64_MAX - 1);
  put(rate, clk, seq);
  put(rate, clk + 8, tick);
  put(rate, clk + 16, ns);
  put(rate, clk + 56, flight::FlightCheck(flight::kSeedClock, seq, tick, ns));
  r = ParseFlightRecord(rate, path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->clock_calibrated);
  ASSERT_FALSE(r->devices.at(0).events.empty());
  for (const TraceEvent& e : r->devices[0].events) EXPECT_EQ(e.time_ns, INT64_MAX) << e.seq;
}

TEST(FlightRecorderTest, TheFileIsCreatedSafely) {
  TempDir dir;
  const std::string path = dir / "safe.flight";
  {
    auto r = FlightRecorder::Create(path, SmallOptions());
    ASSERT_TRUE(r.ok()) << r.status();
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    // A second recorder on a live record is refused (the first holds the lock).
    auto second = FlightRecorder::Create(path, SmallOptions());
    ASSERT_FALSE(second.ok());
    EXPECT_CONTAINS(second.status().message(), "flight record of another running process");
  }
  // An existing file of this user is reused: truncated (nothing of the old record
  // survives) and made 0600.
  WriteAll(path, std::string(1 << 20, 'x'));
  chmod(path.c_str(), 0644);
  {
    auto r = FlightRecorder::Create(path, SmallOptions());
    ASSERT_TRUE(r.ok()) << r.status();
    struct stat st {};
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(static_cast<size_t>(st.st_size), LayoutOf(SmallOptions()).file_bytes());
    // A run of the old bytes, not one 'x': a byte of the new header (a pid, a clock
    // reading) may well be 0x78.
    EXPECT_EQ(ReadAll(path).find(std::string(64, 'x')), std::string::npos);
  }
  // A symlink is never written through; nor a second hard link, nor a directory.
  const std::string target = dir / "target";
  WriteAll(target, "precious");
  const std::string link = dir / "link.flight";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  auto via_link = FlightRecorder::Create(link, SmallOptions());
  ASSERT_FALSE(via_link.ok());
  EXPECT_CONTAINS(via_link.status().message(), "is a symbolic link");
  const std::string hard = dir / "hard.flight";
  ASSERT_EQ(::link(target.c_str(), hard.c_str()), 0);
  auto via_hard = FlightRecorder::Create(hard, SmallOptions());
  ASSERT_FALSE(via_hard.ok());
  EXPECT_CONTAINS(via_hard.status().message(), "hard links");
  EXPECT_EQ(ReadAll(target), "precious");
  auto on_dir = FlightRecorder::Create(dir / "", SmallOptions());
  EXPECT_FALSE(on_dir.ok());
  auto missing_dir = FlightRecorder::Create(dir / "no/such/dir.flight", SmallOptions());
  ASSERT_FALSE(missing_dir.ok());
  EXPECT_CONTAINS(missing_dir.status().message(), "no/such/dir.flight");
}

TEST(FlightRecorderTest, RegionsRunOutWithAWarningNotACrash) {
  TempDir dir;
  auto recorder = FlightRecorder::Create(dir / "full.flight", SmallOptions());
  ASSERT_TRUE(recorder.ok());
  EXPECT_NE((*recorder)->AddAllocator(DeviceId{DeviceType::kSim, 0}), nullptr);
  EXPECT_NE((*recorder)->AddAllocator(DeviceId{DeviceType::kSim, 1}), nullptr);
  EXPECT_EQ((*recorder)->AddAllocator(DeviceId{DeviceType::kSim, 2}), nullptr);
}

}  // namespace
}  // namespace devmem
