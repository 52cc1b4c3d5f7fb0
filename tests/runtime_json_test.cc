// tests/runtime_json_test.cc: the snapshot and buffers formats (runtime/json.h):
// SnapshotToJson -> SnapshotFromJson gives back exactly what was written (stats,
// segments, blocks in every state, ages, sites, trace), readers refuse other schemas
// and name what they expected on malformed input, and LiveBuffersToJson filters and
// orders as documented.
#include <gtest/gtest.h>

#include <source_location>
#include <string>
#include <vector>

#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/snapshot.h"
#include "nlohmann/json.hpp"
#include "runtime/json.h"

namespace devmem {
namespace {

void ExpectStatsEq(const DeviceStats& a, const DeviceStats& b) {
  EXPECT_EQ(a.allocation, b.allocation);
  EXPECT_EQ(a.segment, b.segment);
  EXPECT_EQ(a.active, b.active);
  EXPECT_EQ(a.inactive_split, b.inactive_split);
  EXPECT_EQ(a.allocated_bytes, b.allocated_bytes);
  EXPECT_EQ(a.reserved_bytes, b.reserved_bytes);
  EXPECT_EQ(a.active_bytes, b.active_bytes);
  EXPECT_EQ(a.inactive_split_bytes, b.inactive_split_bytes);
  EXPECT_EQ(a.requested_bytes, b.requested_bytes);
  EXPECT_EQ(a.pending_bytes, b.pending_bytes);
  EXPECT_EQ(a.oversize_allocations, b.oversize_allocations);
  EXPECT_EQ(a.oversize_segments, b.oversize_segments);
  EXPECT_EQ(a.num_alloc_retries, b.num_alloc_retries);
  EXPECT_EQ(a.num_ooms, b.num_ooms);
  EXPECT_EQ(a.num_device_alloc, b.num_device_alloc);
  EXPECT_EQ(a.num_device_free, b.num_device_free);
  EXPECT_EQ(a.num_sync_all_streams, b.num_sync_all_streams);
  EXPECT_EQ(a.cache_hits, b.cache_hits);
  EXPECT_EQ(a.cache_misses, b.cache_misses);
  EXPECT_EQ(a.num_frees, b.num_frees);
  EXPECT_EQ(a.max_split_size, b.max_split_size);
}

void ExpectSnapshotsEq(const RuntimeSnapshot& a, const RuntimeSnapshot& b) {
  EXPECT_EQ(a.time_ns, b.time_ns);
  EXPECT_EQ(a.unix_time_ns, b.unix_time_ns);
  ASSERT_EQ(a.devices.size(), b.devices.size());
  for (size_t d = 0; d < a.devices.size(); ++d) {
    const AllocatorSnapshot& x = a.devices[d];
    const AllocatorSnapshot& y = b.devices[d];
    EXPECT_EQ(x.device, y.device);
    EXPECT_EQ(x.time_ns, y.time_ns);
    EXPECT_EQ(x.info.name, y.info.name);
    EXPECT_EQ(x.info.uuid, y.info.uuid);
    EXPECT_EQ(x.info.backend, y.info.backend);
    EXPECT_EQ(x.mem_info.free_bytes, y.mem_info.free_bytes);
    EXPECT_EQ(x.mem_info.total_bytes, y.mem_info.total_bytes);
    ExpectStatsEq(x.stats, y.stats);
    ASSERT_EQ(x.arena_buffers.size(), y.arena_buffers.size());
    for (size_t k = 0; k < x.arena_buffers.size(); ++k) {
      EXPECT_EQ(x.arena_buffers[k].addr, y.arena_buffers[k].addr);
      EXPECT_EQ(x.arena_buffers[k].size, y.arena_buffers[k].size);
      EXPECT_EQ(x.arena_buffers[k].site, y.arena_buffers[k].site);
      EXPECT_EQ(x.arena_buffers[k].arena, y.arena_buffers[k].arena);
      EXPECT_EQ(x.arena_buffers[k].chunk, y.arena_buffers[k].chunk);
      EXPECT_EQ(x.arena_buffers[k].escaped, y.arena_buffers[k].escaped);
    }
    ASSERT_EQ(x.segments.size(), y.segments.size());
    for (size_t s = 0; s < x.segments.size(); ++s) {
      const SegmentInfo& p = x.segments[s];
      const SegmentInfo& q = y.segments[s];
      EXPECT_EQ(p.addr, q.addr);
      EXPECT_EQ(p.size, q.size);
      EXPECT_EQ(p.stream, q.stream);
      EXPECT_EQ(p.small_pool, q.small_pool);
      EXPECT_EQ(p.expandable, q.expandable);
      ASSERT_EQ(p.blocks.size(), q.blocks.size());
      for (size_t k = 0; k < p.blocks.size(); ++k) {
        SCOPED_TRACE(testing::Message() << "device " << d << " segment " << s << " block " << k);
        EXPECT_EQ(p.blocks[k].addr, q.blocks[k].addr);
        EXPECT_EQ(p.blocks[k].size, q.blocks[k].size);
        EXPECT_EQ(p.blocks[k].requested, q.blocks[k].requested);
        EXPECT_EQ(p.blocks[k].state, q.blocks[k].state);
        EXPECT_EQ(p.blocks[k].stream, q.blocks[k].stream);
        EXPECT_EQ(p.blocks[k].site, q.blocks[k].site);
        EXPECT_EQ(p.blocks[k].alloc_time_ns, q.blocks[k].alloc_time_ns);
      }
    }
  }
}

// Every statistic distinct and non-zero, so that a field read into the wrong place
// shows.
DeviceStats DistinctStats() {
  DeviceStats s;
  int64_t v = 1;
  auto fill = [&](Stat& st) {
    st.current = v++;
    st.peak = v++;
    st.allocated = v++;
    st.freed = v++;
  };
  for (StatArray* a : {&s.allocation, &s.segment, &s.active, &s.inactive_split,
                       &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                       &s.inactive_split_bytes, &s.requested_bytes, &s.pending_bytes}) {
    for (Stat& st : *a) fill(st);
  }
  fill(s.oversize_allocations);
  fill(s.oversize_segments);
  for (int64_t* c : {&s.num_alloc_retries, &s.num_ooms, &s.num_device_alloc,
                     &s.num_device_free, &s.num_sync_all_streams, &s.cache_hits,
                     &s.cache_misses, &s.num_frees}) {
    *c = v++;
  }
  s.max_split_size = INT64_MAX;
  for (int i = 0; i < kNumDriverCalls; ++i) {
    s.driver.calls[i] = v++;
    s.driver.ns[i] = v++ * 1000;
  }
  s.driver.handle_reserve_bytes = v++;
  return s;
}

// A hand-made device with a block in each state, a huge address and an expandable
// segment, plus a real allocator's snapshot.
RuntimeSnapshot MakeSnapshot(SiteId site_a, SiteId site_b, CachingAllocator& real) {
  RuntimeSnapshot snap;
  snap.time_ns = 5'000'000'000;
  snap.unix_time_ns = 1'700'000'000'000'000'000;
  AllocatorSnapshot d;
  d.device = DeviceId{DeviceType::kCuda, 2};
  d.info = DeviceInfo{"NVIDIA H200", "GPU-1234", "cuda"};
  d.mem_info = MemInfo{100 * kMiB, 141 * kGiB};
  d.stats = DistinctStats();
  d.time_ns = 4'000'000'000;
  SegmentInfo seg;
  seg.addr = uintptr_t{0xfffe000000000000};
  seg.size = 6 * kMiB;
  seg.stream = Stream{77};
  seg.small_pool = false;
  seg.expandable = true;
  seg.blocks.push_back(BlockInfo{seg.addr, 2 * kMiB, 2 * kMiB - 3, BlockState::kAllocated,
                                 Stream{77}, site_a, 3'000'000'000});
  seg.blocks.push_back(BlockInfo{seg.addr + 2 * kMiB, 2 * kMiB, 0, BlockState::kPending,
                                 Stream{77}, site_b, 3'500'000'000});
  seg.blocks.push_back(BlockInfo{seg.addr + 4 * kMiB, 2 * kMiB, 0, BlockState::kFree,
                                 Stream{77}, kUnknownSite, 0});
  d.segments.push_back(seg);
  snap.devices.push_back(d);
  snap.devices.push_back(real.snapshot());
  return snap;
}

class SnapshotJsonTest : public ::testing::Test {
 protected:
  SnapshotJsonTest() : alloc_(MakeSimBackend(SmallSim(), 32), SmallSim()) {
    site_a_ = InternSite(std::source_location::current(), SiteKind::kClone, "json-a");
    site_b_ = InternSite(std::source_location::current(), SiteKind::kAlloc);
    p_ = alloc_.allocate(1000, {}, site_a_);
    q_ = alloc_.allocate(3 * kMiB, {}, site_b_);
    void* r = alloc_.allocate(5000, {}, site_b_);
    alloc_.free(r);  // a free block inside a split segment
  }
  ~SnapshotJsonTest() override {
    alloc_.free(p_);
    alloc_.free(q_);
  }
  static Config SmallSim() {
    Config c;
    c.backend = BackendKind::kSim;
    c.sim_capacity = 64 * kMiB;
    return c;
  }
  CachingAllocator alloc_;
  SiteId site_a_ = 0, site_b_ = 0;
  void* p_ = nullptr;
  void* q_ = nullptr;
};

TEST_F(SnapshotJsonTest, RoundTripIsExactIncludingSites) {
  const RuntimeSnapshot snap = MakeSnapshot(site_a_, site_b_, alloc_);
  const std::string text = SnapshotToJson(snap);
  SiteMap sites;
  std::vector<TraceEvent> trace{TraceEvent{}};
  absl::StatusOr<RuntimeSnapshot> back = SnapshotFromJson(text, &sites, &trace);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSnapshotsEq(snap, *back);
  EXPECT_EQ(back->devices[0].stats.driver, snap.devices[0].stats.driver);
  EXPECT_TRUE(trace.empty());  // written without a trace
  // The site table holds every site the blocks name, as GetSite describes it.
  ASSERT_EQ(sites.size(), 2u);
  for (SiteId id : {site_a_, site_b_}) {
    ASSERT_EQ(sites.count(id), 1u) << id;
    const SiteInfo want = GetSite(id);
    EXPECT_EQ(sites[id].file, want.file);
    EXPECT_EQ(sites[id].line, want.line);
    EXPECT_EQ(sites[id].function, want.function);
    EXPECT_EQ(sites[id].tag, want.tag);
    EXPECT_EQ(sites[id].kind, want.kind);
  }
  EXPECT_EQ(sites[site_a_].tag, "json-a");
  EXPECT_EQ(sites[site_a_].kind, SiteKind::kClone);
}

// A snapshot written before export/import were counted (driver_calls and driver_ns
// without them) still reads, those two as 0 and every other kind as written.
TEST_F(SnapshotJsonTest, DriverCallsWithoutTheIpcKindsReadAsZero) {
  const RuntimeSnapshot snap = MakeSnapshot(site_a_, site_b_, alloc_);
  nlohmann::json j = nlohmann::json::parse(SnapshotToJson(snap));
  for (const char* kind : {"export", "import"}) {
    for (const char* table : {"driver_calls", "driver_ns"}) {
      ASSERT_EQ(j["devices"][0]["stats"][table].erase(kind), 1u) << table << "." << kind;
    }
  }
  SiteMap sites;
  absl::StatusOr<RuntimeSnapshot> back = SnapshotFromJson(j.dump(), &sites, nullptr);
  ASSERT_TRUE(back.ok()) << back.status();
  DriverCallStats want = snap.devices[0].stats.driver;
  for (DriverCall c : {DriverCall::kExport, DriverCall::kImport}) {
    want.calls[static_cast<int>(c)] = 0;
    want.ns[static_cast<int>(c)] = 0;
  }
  EXPECT_EQ(back->devices[0].stats.driver, want);
  // An older kind missing is still an error naming it.
  j["devices"][0]["stats"]["driver_calls"].erase("map");
  absl::StatusOr<RuntimeSnapshot> bad = SnapshotFromJson(j.dump(), &sites, nullptr);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("map"), std::string_view::npos) << bad.status();
}

TEST_F(SnapshotJsonTest, DocumentShape) {
  const RuntimeSnapshot snap = MakeSnapshot(site_a_, site_b_, alloc_);
  const nlohmann::json j = nlohmann::json::parse(SnapshotToJson(snap));
  EXPECT_EQ(j["schema"], "devmem.snapshot/1");
  const nlohmann::json& d = j["devices"][0];
  EXPECT_EQ(d["device"], "cuda:2");
  EXPECT_EQ(d["info"]["uuid"], "GPU-1234");
  EXPECT_EQ(d["mem_info"]["total_bytes"], 141 * kGiB);
  // Every DeviceStats field: 10 stat arrays, 2 stats, 9 counters, 3 private-pool
  // counters, and the driver's calls, their time and the handle reserve.
  EXPECT_EQ(d["stats"].size(), 27u);
  EXPECT_EQ(d["stats"]["driver_calls"].size(), static_cast<size_t>(kNumDriverCalls));
  EXPECT_EQ(d["stats"]["reserved_bytes"]["large"]["peak"],
            snap.devices[0].stats.reserved_bytes[kLargePool].peak);
  EXPECT_EQ(d["stats"]["max_split_size"], INT64_MAX);
  const nlohmann::json& seg = d["segments"][0];
  EXPECT_TRUE(seg["addr"].is_number_unsigned());
  EXPECT_EQ(seg["addr"].get<uint64_t>(), uint64_t{0xfffe000000000000});
  EXPECT_EQ(seg["pool"], "large");
  EXPECT_EQ(seg["expandable"], true);
  EXPECT_EQ(seg["blocks"][0]["state"], "allocated");
  EXPECT_EQ(seg["blocks"][0]["age_ns"], 1'000'000'000);  // device time - alloc time
  EXPECT_EQ(seg["blocks"][1]["state"], "pending");
  EXPECT_EQ(seg["blocks"][2]["state"], "free");
  EXPECT_FALSE(seg["blocks"][2].contains("age_ns"));
  // Live buffers: the allocated blocks only.
  ASSERT_EQ(d["live_buffers"].size(), 1u);
  EXPECT_EQ(d["live_buffers"][0]["requested"], 2 * kMiB - 3);
  EXPECT_EQ(j["devices"][1]["live_buffers"].size(), 2u);  // p_ and q_
  EXPECT_FALSE(j.contains("trace"));
}

TEST_F(SnapshotJsonTest, ArenaBuffersSayWhichArenaTheySitIn) {
  void* kept;
  void* open;
  ArenaScope outer(alloc_, "outer");
  {
    ArenaScope step(alloc_, "step");
    kept = alloc_.allocate(1000, {}, site_a_);
  }
  open = alloc_.allocate(3000, {}, site_b_);
  RuntimeSnapshot snap;
  snap.devices.push_back(alloc_.snapshot());
  const nlohmann::json j = nlohmann::json::parse(SnapshotToJson(snap));
  const nlohmann::json& ab = j["devices"][0]["arena_buffers"];
  ASSERT_EQ(ab.size(), 2u);
  std::map<std::string, nlohmann::json> by_arena;
  for (const auto& b : ab) by_arena[b["arena"].get<std::string>()] = b;
  EXPECT_EQ(by_arena["step"]["addr"].get<uint64_t>(), reinterpret_cast<uintptr_t>(kept));
  EXPECT_EQ(by_arena["step"]["escaped"], true);
  EXPECT_EQ(by_arena["outer"]["size"], 3072);
  EXPECT_EQ(by_arena["outer"]["escaped"], false);
  EXPECT_EQ(by_arena["outer"]["site"], site_b_);
  SiteMap sites;
  absl::StatusOr<RuntimeSnapshot> back = SnapshotFromJson(SnapshotToJson(snap), &sites, nullptr);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSnapshotsEq(snap, *back);
  alloc_.free(kept);
  alloc_.free(open);
}

TEST_F(SnapshotJsonTest, TraceTravelsWithTheSnapshot) {
  const RuntimeSnapshot snap = MakeSnapshot(site_a_, site_b_, alloc_);
  TraceEvent e;
  e.seq = 5;
  e.action = AllocAction::kFree;
  e.device = DeviceId{DeviceType::kSim, 32};
  e.addr = 4096;
  e.size = 512;
  e.site = site_a_;
  e.thread = 2;
  const std::vector<TraceEvent> trace{e};
  SiteMap sites;
  std::vector<TraceEvent> back_trace;
  absl::StatusOr<RuntimeSnapshot> back =
      SnapshotFromJson(SnapshotToJson(snap, &trace), &sites, &back_trace);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back_trace.size(), 1u);
  EXPECT_EQ(back_trace[0].seq, 5u);
  EXPECT_EQ(back_trace[0].action, AllocAction::kFree);
  EXPECT_EQ(back_trace[0].site, site_a_);
  EXPECT_EQ(back_trace[0].thread, 2u);
}

// SnapshotToJson writes its bulk (blocks, live buffers, events) straight into text, and
// the DOM writer stays for OOM dumps: byte for byte the same document, on a snapshot with
// every optional field (private pool, stacks, annotations, arena buffers, a trace, names
// that need escaping).
TEST_F(SnapshotJsonTest, StraightWriterIsTheDomWriter) {
  ArenaScope arena(alloc_, "arena \"quoted\"");
  void* in_arena = alloc_.allocate(2000, {}, site_b_);
  RuntimeSnapshot snap = MakeSnapshot(site_a_, site_b_, alloc_);
  AllocatorSnapshot& d = snap.devices[0];
  d.info.name = "NVIDIA \"H200\" \xc3\xa9\x01";
  d.segments[0].private_pool = PoolId{3, 9};
  d.segments[0].blocks[0].stack = 7;
  d.segments[0].blocks[0].alloc_time_ns = d.time_ns + 5;  // a negative age
  d.stack_sample_bytes = 4096;
  d.sampled_stacks.push_back(SampledStack{site_a_, 7, 1, 2 * kMiB, 2.5 * kMiB,
                                          {"main \"x\"", "f\\g"}});
  snap.annotations.resize(snap.devices.size());
  snap.annotations[0][d.segments[0].blocks[0].addr] = BufferAnnotation{2, "float32", {4, -1}};
  TraceEvent e;
  e.seq = 9;
  e.time_ns = -3;
  e.action = AllocAction::kAlloc;
  e.device = DeviceId{DeviceType::kSim, 1};
  e.addr = 4096;
  e.size = 512;
  e.requested = 500;
  e.site = site_b_;
  e.thread = 4;
  const std::vector<TraceEvent> trace{e, e};
  for (const std::vector<TraceEvent>* t : {static_cast<const std::vector<TraceEvent>*>(nullptr), &trace}) {
    const std::string text = SnapshotToJson(snap, t);
    nlohmann::ordered_json dom = nlohmann::ordered_json::parse(OomDumpToJson(snap, OomReport{}, t));
    dom.erase("oom");
    EXPECT_EQ(text, dom.dump());
    ASSERT_FALSE(snap.devices[1].arena_buffers.empty());
  }
  alloc_.free(in_arena);
}

// The straight writer's numbers (its own decimal formatting) as the DOM writes them, at
// every length and at the edges of its 8-digit parts.
TEST_F(SnapshotJsonTest, NumbersOfEveryLengthAsTheDomWritesThem) {
  const RuntimeSnapshot snap = MakeSnapshot(site_a_, site_b_, alloc_);
  std::vector<uint64_t> values = {0, UINT64_MAX, uint64_t{1} << 63};
  for (uint64_t p = 1; p <= UINT64_MAX / 10; p *= 10) {
    for (uint64_t v : {p - 1, p, p + 1, 9 * p, 2 * p - 1}) values.push_back(v);
  }
  std::vector<TraceEvent> trace;
  for (uint64_t v : values) {
    TraceEvent e;
    e.action = AllocAction::kAlloc;
    e.device = DeviceId{DeviceType::kSim, 0};
    e.seq = v;
    e.addr = v;
    e.time_ns = static_cast<int64_t>(v);  // negative ones too, INT64_MIN among them
    e.thread = v;
    trace.push_back(e);
  }
  const std::string text = SnapshotToJson(snap, &trace);
  nlohmann::ordered_json dom = nlohmann::ordered_json::parse(OomDumpToJson(snap, OomReport{}, &trace));
  dom.erase("oom");
  EXPECT_EQ(text, dom.dump());
}

// WriteSnapshotJson (what /debug/snapshot streams) hands over SnapshotToJson's text in
// pieces no longer than asked for, and stops at once when the sink says so.
TEST_F(SnapshotJsonTest, PiecesMakeTheSameTextAndStopWhenTheSinkSaysSo) {
  const RuntimeSnapshot snap = MakeSnapshot(site_a_, site_b_, alloc_);
  TraceEvent e;
  e.action = AllocAction::kFree;
  e.device = DeviceId{DeviceType::kSim, 0};
  e.site = site_a_;
  std::vector<TraceEvent> trace(300, e);  // ~40 KB of events
  for (size_t i = 0; i < trace.size(); ++i) trace[i].seq = i + 1;
  const std::string whole = SnapshotToJson(snap, &trace);
  for (size_t piece_bytes : {size_t{256}, size_t{1000}, kSnapshotPieceBytes}) {
    std::string joined;
    size_t pieces = 0;
    const bool ok = WriteSnapshotJson(snap, &trace, piece_bytes, [&](std::string_view piece) {
      EXPECT_FALSE(piece.empty());
      EXPECT_LE(piece.size(), piece_bytes);
      joined.append(piece);
      ++pieces;
      return true;
    });
    EXPECT_TRUE(ok);
    EXPECT_EQ(joined, whole) << "pieces of " << piece_bytes;
    EXPECT_GE(pieces, whole.size() / piece_bytes) << "pieces of " << piece_bytes;
  }
  size_t calls = 0;
  EXPECT_FALSE(WriteSnapshotJson(snap, &trace, 256, [&](std::string_view) { return ++calls < 2; }));
  EXPECT_EQ(calls, 2u);
}

TEST_F(SnapshotJsonTest, OtherSchemasAreRefusedByName) {
  std::string text = SnapshotToJson(MakeSnapshot(site_a_, site_b_, alloc_));
  auto with_schema = [&](std::string_view schema) {
    std::string t = text;
    const std::string from = "\"devmem.snapshot/1\"";
    t.replace(t.find(from), from.size(), std::string("\"") + std::string(schema) + "\"");
    return t;
  };
  absl::StatusOr<RuntimeSnapshot> r = SnapshotFromJson(with_schema("devmem.snapshot/2"));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_NE(r.status().message().find("\"devmem.snapshot/2\""), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("devmem.snapshot/1"), std::string::npos) << r.status();
  EXPECT_FALSE(SnapshotFromJson(with_schema("devmem.buffers/1")).ok());
  EXPECT_FALSE(SnapshotFromJson(with_schema("devmem.snapshot/10")).ok());
  // A minor version of the same major is read (it may only add fields).
  EXPECT_TRUE(SnapshotFromJson(with_schema("devmem.snapshot/1.4")).ok());
  r = SnapshotFromJson(R"({"devices": []})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("missing \"schema\""), std::string::npos) << r.status();
}

TEST_F(SnapshotJsonTest, MalformedInputNamesWhatWasExpected) {
  const std::string text = SnapshotToJson(MakeSnapshot(site_a_, site_b_, alloc_));
  auto message = [](const std::string& t) {
    absl::StatusOr<RuntimeSnapshot> r = SnapshotFromJson(t);
    EXPECT_FALSE(r.ok());
    return std::string(r.status().message());
  };
  // Truncated.
  std::string m = message(text.substr(0, text.size() / 2));
  EXPECT_NE(m.find("snapshot: not valid JSON"), std::string::npos) << m;
  m = message("");
  EXPECT_NE(m.find("snapshot: empty (expected a JSON snapshot object)"), std::string::npos) << m;
  m = message("[1, 2]");
  EXPECT_NE(m.find("expected a JSON object"), std::string::npos) << m;
  // Wrong types, named by path.
  nlohmann::json j = nlohmann::json::parse(text);
  nlohmann::json bad = j;
  bad["devices"][0]["segments"][0]["blocks"][1]["size"] = "big";
  m = message(bad.dump());
  EXPECT_NE(m.find("devices[0].segments[0].blocks[1].size: "
                   "expected a non-negative integer, got string"),
            std::string::npos)
      << m;
  bad = j;
  bad["devices"][0]["segments"][0]["blocks"][0]["state"] = "lost";
  m = message(bad.dump());
  EXPECT_NE(m.find("state: expected a block state (one of allocated, free, pending), got \"lost\""),
            std::string::npos)
      << m;
  bad = j;
  bad["devices"][1]["stats"]["reserved_bytes"].erase("small");
  m = message(bad.dump());
  EXPECT_NE(m.find("devices[1].stats.reserved_bytes.small: missing"), std::string::npos) << m;
  bad = j;
  bad["devices"][0]["device"] = "gpu:0";
  m = message(bad.dump());
  EXPECT_NE(m.find("devices[0].device: expected a device"), std::string::npos) << m;
  bad = j;
  bad["devices"][0]["segments"][0]["addr"] = -1;
  m = message(bad.dump());
  EXPECT_NE(m.find("devices[0].segments[0].addr: expected a non-negative integer"),
            std::string::npos)
      << m;
  bad = j;
  bad["sites"][0]["kind"] = 3;
  m = message(bad.dump());
  EXPECT_NE(m.find("sites[0].kind: expected a site kind, got integer"), std::string::npos) << m;
  bad = j;
  bad["devices"] = nlohmann::json::object();
  m = message(bad.dump());
  EXPECT_NE(m.find("devices: expected an array, got object"), std::string::npos) << m;
  // A number beyond any type: nlohmann throws out_of_range, which escaped the reader
  // and terminated the process (found by fuzz_runtime_json).
  m = message("{\"schema\": \"devmem.snapshot/1\", \"time_ns\": 1e50673152}");
  EXPECT_NE(m.find("snapshot: not valid JSON"), std::string::npos) << m;
  EXPECT_FALSE(TraceEventFromJson("{\"seq\": 1e999}").ok());
  EXPECT_FALSE(TraceFromJsonl("{\"seq\": 1}\n{\"seq\": -1e999}\n").ok());
}

// The reader checks what memtrace's views of a snapshot rely on (it is their reader
// too): blocks inside their segment, tiling it in address order, and "tensor"
// annotations naming allocated blocks. A file that breaks one is refused by path.
TEST_F(SnapshotJsonTest, RefusesBlocksOutsideTheirSegmentAndStrayAnnotations) {
  const nlohmann::json j =
      nlohmann::json::parse(SnapshotToJson(MakeSnapshot(site_a_, site_b_, alloc_)));
  auto message = [](const nlohmann::json& t) {
    absl::StatusOr<RuntimeSnapshot> r = SnapshotFromJson(t.dump());
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  const nlohmann::json blocks = j["devices"][0]["segments"][0]["blocks"];
  const uint64_t base = j["devices"][0]["segments"][0]["addr"];
  nlohmann::json bad = j;
  bad["devices"][0]["segments"][0]["blocks"][2]["size"] = 4 * kMiB;  // past the end
  EXPECT_EQ(message(bad).rfind("snapshot: devices[0].segments[0].blocks[2]: expected a block "
                               "inside its segment", 0),
            0u)
      << message(bad);
  bad = j;
  bad["devices"][0]["segments"][0]["blocks"][1]["addr"] = base + kMiB;  // inside block 0
  EXPECT_NE(message(bad).find("devices[0].segments[0].blocks[1]: overlaps the block before it"),
            std::string::npos)
      << message(bad);
  // An annotation on the allocated block is read; one on the free block is refused.
  bad = j;
  nlohmann::json& live = bad["devices"][0]["live_buffers"][0];
  live["tensor"] = {{"refcount", 2}, {"dtype", "float16"}, {"shape", {4, 8}}};
  absl::StatusOr<RuntimeSnapshot> read = SnapshotFromJson(bad.dump());
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->annotations.size(), 2u);
  const BufferAnnotation& a = read->annotations[0].at(static_cast<uintptr_t>(base));
  EXPECT_EQ(a.refcount, 2u);
  EXPECT_EQ(a.dtype, "float16");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{4, 8}));
  live["addr"] = blocks[2]["addr"];
  EXPECT_NE(message(bad).find("devices[0].live_buffers[0].addr: expected the address of an "
                              "allocated block"),
            std::string::npos)
      << message(bad);
}

TEST_F(SnapshotJsonTest, LiveBuffersAreFilteredAndLargestFirst) {
  const RuntimeSnapshot snap = MakeSnapshot(site_a_, site_b_, alloc_);
  auto parse = [](const std::string& s) { return nlohmann::json::parse(s); };
  nlohmann::json all = parse(LiveBuffersToJson(snap, BufferFilter{}));
  EXPECT_EQ(all["schema"], "devmem.buffers/1");
  ASSERT_EQ(all["buffers"].size(), 3u);  // one on cuda:2, p_ and q_ on sim:32
  EXPECT_EQ(all["matched"], 3u);
  EXPECT_GE(all["buffers"][0]["size"], all["buffers"][1]["size"]);
  EXPECT_GE(all["buffers"][1]["size"], all["buffers"][2]["size"]);

  BufferFilter on_sim;
  on_sim.device = DeviceId{DeviceType::kSim, 32};
  nlohmann::json sim = parse(LiveBuffersToJson(snap, on_sim));
  ASSERT_EQ(sim["buffers"].size(), 2u);
  EXPECT_EQ(sim["buffers"][0]["addr"].get<uint64_t>(), reinterpret_cast<uintptr_t>(q_));
  EXPECT_EQ(sim["buffers"][0]["device"], "sim:32");

  BufferFilter big;
  big.min_bytes = 2 * kMiB;
  big.limit = 1;
  nlohmann::json b = parse(LiveBuffersToJson(snap, big));
  EXPECT_EQ(b["matched"], 2u);
  EXPECT_EQ(b["returned"], 1u);
  ASSERT_EQ(b["buffers"].size(), 1u);
  EXPECT_EQ(b["buffers"][0]["size"], 3 * kMiB);  // q_

  BufferFilter tagged;
  tagged.site = "json-a";
  nlohmann::json t = parse(LiveBuffersToJson(snap, tagged));
  ASSERT_EQ(t["buffers"].size(), 2u);  // the cuda:2 block and p_
  for (const auto& buf : t["buffers"]) EXPECT_EQ(buf["site"], site_a_);
  EXPECT_NE(t["buffers"][0]["where"].get<std::string>().find("json-a @"), std::string::npos);
  BufferFilter nowhere;
  nowhere.site = "no-such-file.cc";
  EXPECT_EQ(parse(LiveBuffersToJson(snap, nowhere))["buffers"].size(), 0u);
}

}  // namespace
}  // namespace devmem
