// tests/memtrace_inspect_test.cc: memtrace's inspection library (tools/snapshot/snapshot_reader,
// site_usage, segment_map, inspect_format, http_get): the simdjson reader agrees with
// the runtime's writer, refuses what docs/formats.md says to refuse with the path or
// byte offset, and the grouping, diff, segment maps and HTTP framing are right. The
// commands themselves are tested as a user runs them by memtrace_inspect_cli_test.sh.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "allocator/site.h"
#include "nlohmann/json.hpp"
#include "allocator/snapshot.h"
#include "runtime/json.h"
#include "tools/http/http_get.h"
#include "tools/http/live_trace.h"
#include "tools/inspect/inspect_format.h"
#include "tools/inspect/segment_map.h"
#include "tools/inspect/site_usage.h"
#include "tools/snapshot/snapshot_reader.h"

namespace devmem::memtrace {
namespace {

constexpr uint64_t kMiB = 1 << 20;

BlockInfo Block(uintptr_t addr, size_t size, BlockState state, SiteId site, int64_t alloc_ns) {
  BlockInfo b;
  b.addr = addr;
  b.size = size;
  b.requested = state == BlockState::kAllocated ? size : 0;
  b.state = state;
  b.site = state == BlockState::kFree ? kUnknownSite : site;
  b.alloc_time_ns = state == BlockState::kFree ? 0 : alloc_ns;
  return b;
}

// A runtime snapshot written by the runtime's own writer: one device, two segments.
std::string RuntimeWrittenSnapshot(SiteId* alloc_site, SiteId* clone_site) {
  *alloc_site = InternNamedSite("model/inspect_test.cc", 11, "void f()", SiteKind::kAlloc, "acts");
  *clone_site = InternNamedSite("model/inspect_test.cc", 22, "void g()", SiteKind::kClone);
  AllocatorSnapshot d;
  d.device = DeviceId{DeviceType::kSim, 0};
  d.info = {"sim device", "SIM-1", "sim"};
  d.mem_info = {100 * kMiB, 128 * kMiB};
  d.time_ns = 5'000'000'000;
  d.stats.allocated_bytes[kAggregatePool].current = 7 * kMiB;
  d.stats.reserved_bytes[kAggregatePool].current = 12 * kMiB;
  SegmentInfo s1;
  s1.addr = 0x100000000;
  s1.size = 10 * kMiB;
  s1.blocks = {Block(0x100000000, 4 * kMiB, BlockState::kAllocated, *alloc_site, 4'000'000'000),
               Block(0x100400000, 2 * kMiB, BlockState::kAllocated, *clone_site, 4'500'000'000),
               Block(0x100600000, 4 * kMiB, BlockState::kFree, 0, 0)};
  SegmentInfo s2;
  s2.addr = 0x200000000;
  s2.size = 2 * kMiB;
  s2.small_pool = true;
  s2.blocks = {Block(0x200000000, 1 * kMiB, BlockState::kAllocated, *clone_site, 4'900'000'000),
               Block(0x200100000, 1 * kMiB, BlockState::kPending, *alloc_site, 4'800'000'000)};
  d.segments = {s1, s2};
  RuntimeSnapshot snap;
  snap.time_ns = 5'000'000'001;
  snap.unix_time_ns = 1'700'000'000'000'000'000;
  snap.devices.push_back(d);
  return SnapshotToJson(snap);
}

TEST(SnapshotReaderTest, ReadsWhatTheRuntimeWrites) {
  SiteId alloc_site, clone_site;
  const std::string json = RuntimeWrittenSnapshot(&alloc_site, &clone_site);
  absl::StatusOr<Snapshot> snap = ParseSnapshot(json, "mem.json");
  ASSERT_TRUE(snap.ok()) << snap.status();
  EXPECT_EQ(snap->schema, "devmem.snapshot/1");
  ASSERT_EQ(snap->devices.size(), 1u);
  const SnapDevice& d = snap->devices[0];
  EXPECT_EQ(d.device, "sim:0");
  EXPECT_EQ(d.total_bytes, 128 * kMiB);
  EXPECT_EQ(d.allocated_bytes, static_cast<int64_t>(7 * kMiB));
  ASSERT_EQ(d.segments.size(), 2u);
  EXPECT_EQ(d.segments[1].first_block, 3u);
  EXPECT_TRUE(d.segments[1].small_pool);
  ASSERT_EQ(d.blocks.size(), 5u);
  EXPECT_EQ(d.blocks[0].age_ns, 1'000'000'000);
  EXPECT_TRUE(d.blocks[0].has_age);
  EXPECT_FALSE(d.blocks[2].has_age);
  EXPECT_EQ(d.blocks[4].state, BlockKind::kPending);
  // Site text as the allocator spells it, and the copy flag from the kind.
  EXPECT_EQ(snap->Site(alloc_site).where, GetSite(alloc_site).ToString());
  EXPECT_EQ(snap->Site(clone_site).where, GetSite(clone_site).ToString());
  EXPECT_TRUE(snap->Site(clone_site).copy);
  EXPECT_EQ(snap->Site(999999).where, "<unknown> (alloc)");
}

TEST(SnapshotReaderTest, KeepsTensorAnnotationsOfLiveBuffers) {
  SiteId a, c;
  nlohmann::json j = nlohmann::json::parse(RuntimeWrittenSnapshot(&a, &c));
  // Annotate the second live buffer (at 0x100400000) as the tensor layer does.
  nlohmann::json& live = j["devices"][0]["live_buffers"];
  ASSERT_EQ(live.size(), 3u);
  ASSERT_EQ(live[1]["addr"], 0x100400000u);
  live[1]["tensor"] = {{"refcount", 3}, {"dtype", "float16"}, {"shape", {2, 512, 1024}}};
  absl::StatusOr<Snapshot> snap = ParseSnapshot(j.dump(), "mem.json");
  ASSERT_TRUE(snap.ok()) << snap.status();
  const SnapDevice& d = snap->devices[0];
  ASSERT_EQ(d.tensors.size(), 1u);
  ASSERT_EQ(d.blocks[1].tensor, 0);
  EXPECT_EQ(d.tensors[0].refcount, 3u);
  EXPECT_EQ(d.tensors[0].dtype + d.tensors[0].shape, "float16[2, 512, 1024]");
  std::vector<SiteGroup> groups = GroupBySite(*snap, {}, nullptr);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].site, a);  // 4 MiB
  EXPECT_EQ(groups[1].min_refcount, 3);
  EXPECT_EQ(groups[1].shapes, "float16[2, 512, 1024]");
  EXPECT_EQ(groups[0].shapes, "");
}

TEST(SnapshotReaderTest, ReadsWhichArenaEachArenaBufferSitsIn) {
  SiteId a, c;
  nlohmann::json j = nlohmann::json::parse(RuntimeWrittenSnapshot(&a, &c));
  EXPECT_TRUE(j["devices"][0]["arena_buffers"].empty());
  j["devices"][0]["arena_buffers"] = {
      {{"addr", 0x100000200u}, {"size", 1024}, {"site", c}, {"arena", "step"},
       {"chunk", 0x100000000u}, {"escaped", true}}};
  absl::StatusOr<Snapshot> snap = ParseSnapshot(j.dump(), "mem.json");
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->devices[0].arena_buffers.size(), 1u);
  const SnapArenaBuffer& b = snap->devices[0].arena_buffers[0];
  EXPECT_EQ(b.arena, "step");
  EXPECT_EQ(b.addr, 0x100000200u);
  EXPECT_EQ(b.chunk, 0x100000000u);
  EXPECT_TRUE(b.escaped);
  EXPECT_EQ(b.site, c);
  // A mistyped field is named.
  j["devices"][0]["arena_buffers"][0]["escaped"] = "yes";
  absl::StatusOr<Snapshot> bad = ParseSnapshot(j.dump(), "mem.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("arena_buffers[0].escaped"), std::string::npos)
      << bad.status();
}

// The runtime's writer's sampled stacks (docs/formats.md): the block's "stack", the
// groups by (site, stack) with their frames; GroupByStack sums a stack's groups over
// its sites, largest estimate first, and --site filters them by site.
TEST(SnapshotReaderTest, ReadsSampledStacksAndGroupsThemByStack) {
  SiteId a, c;
  nlohmann::json j = nlohmann::json::parse(RuntimeWrittenSnapshot(&a, &c));
  EXPECT_TRUE(j["devices"][0]["sampled_stacks"].empty());
  // As the runtime writes them for blocks 0 (site a) and 1, 3 (site c): the writer's
  // own output, from an AllocatorSnapshot read back and written again.
  absl::StatusOr<RuntimeSnapshot> rs = SnapshotFromJson(j.dump());
  ASSERT_TRUE(rs.ok()) << rs.status();
  AllocatorSnapshot& d0 = rs->devices[0];
  d0.segments[0].blocks[0].stack = 7;
  d0.segments[0].blocks[1].stack = 9;
  d0.segments[1].blocks[0].stack = 7;
  d0.stack_sample_bytes = 512 * 1024;
  d0.sampled_stacks = {
      SampledStack{a, 7, 1, 4 * kMiB, 4.0 * kMiB, {"train_step()", "main"}},
      SampledStack{c, 9, 1, 2 * kMiB, 2.0 * kMiB, {"clone_helper()", "main"}},
      SampledStack{c, 7, 1, 1 * kMiB, 1.5 * kMiB, {"train_step()", "main"}}};
  absl::StatusOr<Snapshot> snap = ParseSnapshot(SnapshotToJson(*rs), "mem.json");
  ASSERT_TRUE(snap.ok()) << snap.status();
  const SnapDevice& d = snap->devices[0];
  EXPECT_EQ(d.stack_sample_bytes, 512u * 1024);
  ASSERT_EQ(d.stacks.size(), 3u);
  EXPECT_EQ(d.stacks[1].frames, (std::vector<std::string>{"clone_helper()", "main"}));
  EXPECT_EQ(d.stacks[2].estimated_bytes, 1.5 * kMiB);
  EXPECT_EQ(d.blocks[0].stack, 7u);
  EXPECT_EQ(d.blocks[1].stack, 9u);
  EXPECT_EQ(d.blocks[2].stack, 0u);  // free: never sampled
  EXPECT_EQ(d.blocks[3].stack, 7u);

  std::vector<StackGroup> groups = GroupByStack(*snap, {});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].stack, 7u);
  EXPECT_EQ(groups[0].estimated_bytes, 5.5 * kMiB);
  EXPECT_EQ(groups[0].samples, 2u);
  EXPECT_EQ(groups[0].sampled_bytes, 5 * kMiB);
  EXPECT_EQ(groups[0].sites, (std::vector<uint32_t>{a, c}));
  EXPECT_EQ((*groups[0].frames)[0], "train_step()");
  EXPECT_EQ(groups[1].stack, 9u);
  BufferQuery only_g;
  only_g.site = "void g()";  // the clone site's function
  groups = GroupByStack(*snap, only_g);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].stack, 9u);  // 2 MiB, then stack 7's 1.5 MiB from site c
  EXPECT_EQ(groups[1].estimated_bytes, 1.5 * kMiB);
  BufferQuery other_device;
  other_device.device = "sim:1";
  EXPECT_TRUE(GroupByStack(*snap, other_device).empty());

  // Mistyped fields are named.
  nlohmann::json w = nlohmann::json::parse(SnapshotToJson(*rs));
  w["devices"][0]["sampled_stacks"][1]["frames"][0] = 17;
  absl::StatusOr<Snapshot> bad = ParseSnapshot(w.dump(), "mem.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("sampled_stacks[1].frames[0]"), std::string::npos)
      << bad.status();
  w = nlohmann::json::parse(SnapshotToJson(*rs));
  w["devices"][0]["segments"][0]["blocks"][0]["stack"] = -1;
  bad = ParseSnapshot(w.dump(), "mem.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("blocks[0].stack"), std::string::npos) << bad.status();
}

TEST(SnapshotReaderTest, RefusesOtherMajorsAcceptsMinors) {
  SiteId a, c;
  std::string json = RuntimeWrittenSnapshot(&a, &c);
  std::string minor = json, major = json;
  minor.replace(minor.find("devmem.snapshot/1"), 17, "devmem.snapshot/1.4");
  major.replace(major.find("devmem.snapshot/1"), 17, "devmem.snapshot/2");
  EXPECT_TRUE(ParseSnapshot(minor, "m.json").ok());
  absl::StatusOr<Snapshot> s = ParseSnapshot(major, "m.json");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "m.json: schema \"devmem.snapshot/2\" is not supported (this reader reads "
            "\"devmem.snapshot/1\"; other major versions are refused)");
  s = ParseSnapshot("{\"schema\": \"devmem.snapshot/10\"}", "x");
  EXPECT_FALSE(s.ok());
}

TEST(SnapshotReaderTest, MalformedInputNamesPathOrOffset) {
  SiteId a, c;
  const std::string json = RuntimeWrittenSnapshot(&a, &c);
  auto message = [](std::string_view text) {
    absl::StatusOr<Snapshot> s = ParseSnapshot(text, "f.json");
    return s.ok() ? std::string("ok") : std::string(s.status().message());
  };
  EXPECT_EQ(message(json.substr(0, 40)).rfind("f.json: not valid JSON, at byte 40", 0), 0u)
      << message(json.substr(0, 40));
  EXPECT_EQ(message("  \n"), "f.json: empty (expected a JSON snapshot object)");
  EXPECT_EQ(message("[1, 2]"), "f.json: (top level): expected an object, got array");
  EXPECT_EQ(message("{}"), "f.json: missing \"schema\" (expected \"devmem.snapshot/1\")");
  std::string bad = json;
  bad.replace(bad.find("\"state\":\"free\""), 14, "\"state\":\"gone\"");
  EXPECT_EQ(message(bad), "f.json: devices[0].segments[0].blocks[2].state: expected a block "
                          "state (one of allocated, free, pending), got \"gone\"");
  bad = json;
  bad.replace(bad.find("\"total_bytes\":"), 14, "\"total_bytez\":");
  EXPECT_EQ(message(bad),
            "f.json: devices[0].mem_info.total_bytes: missing (expected a field \"total_bytes\")");
  bad = json;
  bad.replace(bad.find("\"size\":4194304"), 14, "\"size\":1e400");
  EXPECT_NE(message(bad), "ok");
  bad = json;
  bad.replace(bad.find("\"size\":4194304"), 14, "\"size\":99999999999999999999999");
  EXPECT_NE(message(bad), "ok");
  // Every prefix of a valid file is refused without a crash.
  for (size_t n = 0; n < json.size(); n += 7) EXPECT_NE(message(json.substr(0, n)), "ok");
}

Snapshot Parse(const std::string& json) {
  absl::StatusOr<Snapshot> s = ParseSnapshot(json, "t");
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Snapshot{};
}

TEST(SiteUsageTest, ListsAndGroupsLargestFirstWithFilters) {
  SiteId a, c;
  const Snapshot snap = Parse(RuntimeWrittenSnapshot(&a, &c));
  BufferTotals t;
  std::vector<BufferRef> list = ListBuffers(snap, {}, &t);
  ASSERT_EQ(list.size(), 3u);  // the pending block is not live
  EXPECT_EQ(list[0].block->size, 4 * kMiB);
  EXPECT_EQ(t.matched_bytes, 7 * kMiB);
  EXPECT_EQ(t.copy_bytes, 3 * kMiB);
  std::vector<SiteGroup> groups = GroupBySite(snap, {}, &t);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].bytes, 4 * kMiB);
  EXPECT_EQ(groups[0].copy_bytes, 0u);
  EXPECT_EQ(groups[1].count, 2u);
  EXPECT_EQ(groups[1].copy_bytes, 3 * kMiB);
  EXPECT_EQ(groups[1].oldest_age_ns, 500'000'000);
  EXPECT_DOUBLE_EQ(groups[1].device_share, 3.0 / 128.0);
  BufferQuery q;
  q.site = "inspect_test.cc:22";
  EXPECT_EQ(GroupBySite(snap, q, nullptr).size(), 1u);
  q.site = "acts";  // the tag
  EXPECT_EQ(GroupBySite(snap, q, nullptr).size(), 1u);
  q = {};
  q.min_bytes = 2 * kMiB;
  EXPECT_EQ(ListBuffers(snap, q, nullptr).size(), 2u);
  q = {};
  q.device = "cuda:0";
  EXPECT_TRUE(ListBuffers(snap, q, nullptr).empty());
}

TEST(SiteUsageTest, DiffMatchesSitesByTextAndSumsGrowth) {
  SiteId a, c;
  const std::string json = RuntimeWrittenSnapshot(&a, &c);
  const Snapshot before = Parse(json);
  // The same process later: the alloc site's 4 MiB buffer is gone.
  nlohmann::json later = nlohmann::json::parse(json);
  later["devices"][0]["segments"][0]["blocks"][0]["state"] = "free";
  const Snapshot after = Parse(later.dump());
  DiffTotals t;
  std::vector<SiteDelta> rows = DiffSites(before, after, {}, &t);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].delta_bytes(), -static_cast<int64_t>(4 * kMiB));
  EXPECT_EQ(t.grew_bytes, 0u);
  EXPECT_EQ(t.shrank_bytes, 4 * kMiB);
  EXPECT_EQ(t.unchanged_sites, 1u);
  rows = DiffSites(after, before, {}, &t);
  EXPECT_EQ(t.grew_bytes, 4 * kMiB);
  EXPECT_EQ(rows[0].count_a, 0u);
  EXPECT_EQ(rows[0].count_b, 1u);
}

TEST(SegmentMapTest, OneCharacterPerCellMajorityState) {
  SiteId a, c;
  const Snapshot snap = Parse(RuntimeWrittenSnapshot(&a, &c));
  const SnapDevice& d = snap.devices[0];
  // Largest segment 10 MiB in at most 8 x 2 cells: 1 MiB cells.
  const uint64_t cell = ChooseCellBytes(d, 8, 2);
  EXPECT_EQ(cell, kMiB);
  EXPECT_EQ(SegmentMap(d, d.segments[0], cell, 8),
            (std::vector<std::string>{"######..", ".."}));
  EXPECT_EQ(SegmentMap(d, d.segments[1], cell, 8), (std::vector<std::string>{"#p"}));
  // Half-MiB cells straddling nothing; 4 MiB cells: the first holds 4 MiB allocated.
  EXPECT_EQ(SegmentMap(d, d.segments[0], 4 * kMiB, 8), (std::vector<std::string>{"##."}));
  EXPECT_GE(ChooseCellBytes(SnapDevice{}), 512u);
}

// A segment of nearly 2^64 bytes (a corrupt or hostile dump): the cell size still
// bounds the map to columns x lines cells, and drawing it neither overflows nor
// allocates 2^64 / 512 cells (it did: memtrace oom aborted).
TEST(SegmentMapTest, SegmentOfNearly2To64BytesGivesABoundedMap) {
  SnapDevice d;
  SnapSegment s;
  s.addr = 0;
  s.size = UINT64_MAX;
  s.first_block = 0;
  s.num_blocks = 2;
  d.blocks.push_back(SnapBlock{});
  d.blocks.back().addr = 0;
  d.blocks.back().size = UINT64_MAX / 2;
  d.blocks.back().state = BlockKind::kAllocated;
  d.blocks.push_back(SnapBlock{});
  d.blocks.back().addr = UINT64_MAX / 2;
  d.blocks.back().size = UINT64_MAX - UINT64_MAX / 2;
  d.blocks.back().state = BlockKind::kFree;
  d.segments.push_back(s);
  const uint64_t cell = ChooseCellBytes(d, 8, 2);
  EXPECT_LE(UINT64_MAX / cell, 16u);
  const std::vector<std::string> map = SegmentMap(d, d.segments[0], cell, 8);
  ASSERT_EQ(map.size(), 2u);
  EXPECT_EQ(map[0], "########");
  EXPECT_EQ(map[1], "........");
}

// Deltas of sums near 2^64 (hostile snapshots): saturated, not a signed overflow.
TEST(SiteUsageTest, SignedDeltaSaturates) {
  EXPECT_EQ(SignedDelta(5, 3), -2);
  EXPECT_EQ(SignedDelta(3, 5), 2);
  EXPECT_EQ(SignedDelta(0, UINT64_MAX), INT64_MAX);
  EXPECT_EQ(SignedDelta(UINT64_MAX, 0), INT64_MIN);
  EXPECT_EQ(SignedDelta(uint64_t{1} << 63, 0), INT64_MIN);
  EXPECT_EQ(SignedDelta(0, uint64_t{1} << 63), INT64_MAX);
  SiteDelta d;
  d.bytes_a = UINT64_MAX;
  EXPECT_EQ(d.delta_bytes(), INT64_MIN);
}

TEST(InspectFormatTest, AgesSharesDeltasAndTables) {
  EXPECT_EQ(FormatAge(-1), "-");
  EXPECT_EQ(FormatAge(999'000'000), "999ms");
  EXPECT_EQ(FormatAge(12'340'000'000), "12.3s");
  EXPECT_EQ(FormatAge(245'000'000'000), "4m05s");
  EXPECT_EQ(FormatAge(int64_t{7800} * 1'000'000'000), "2h10m");
  EXPECT_EQ(FormatShare(1, 0), "-");
  EXPECT_EQ(FormatShare(1, 8), "12.5%");
  EXPECT_EQ(FormatDelta(0), "0 B");
  EXPECT_EQ(FormatDelta(-512), "-512 B");
  EXPECT_EQ(FormatDelta(3 * 1024 * 1024 / 2), "+1.50 MiB");
  TextTable t({"<NAME", "BYTES"});
  t.Add({"a", "1"});
  t.Add({"longer", "100"});
  EXPECT_EQ(t.Render(), "NAME    BYTES\na           1\nlonger    100\n");
}

// A listening socket on 127.0.0.1, on a port the kernel picks (stored in *port).
int ListenOnLoopback(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::listen(fd, 1);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

// An HTTP server on a loopback port that answers `replies`, one per connection in
// order, and records the requests (all appended).
class OneShotServer {
 public:
  explicit OneShotServer(std::string reply)
      : OneShotServer(std::vector<std::string>{std::move(reply)}) {}
  explicit OneShotServer(std::vector<std::string> replies) : replies_(std::move(replies)) {
    fd_ = ListenOnLoopback(&port_);
    thread_ = std::thread([this] {
      for (const std::string& reply : replies_) {
        const int c = ::accept(fd_, nullptr, nullptr);
        char buf[4096];
        ssize_t n;
        std::string one;
        while ((n = ::recv(c, buf, sizeof(buf), 0)) > 0) {
          one.append(buf, static_cast<size_t>(n));
          if (one.find("\r\n\r\n") != std::string::npos) break;
        }
        request_ += one;
        ::send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
        ::close(c);
      }
    });
  }
  ~OneShotServer() {
    thread_.join();
    ::close(fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/x"; }
  const std::string& request() const { return request_; }

 private:
  std::vector<std::string> replies_;
  std::string request_;
  int fd_ = -1, port_ = 0;
  std::thread thread_;
};

// The live trace reader keeps the response headers it pages by, and reads a process
// that refuses header=1 (older than it) without it rather than not at all.
TEST(LiveTraceTest, PagesByTheHeadersAndFallsBackWithoutSiteNames) {
  const std::string ev = "{\"seq\":1,\"action\":\"alloc\"}\n";
  OneShotServer s({"HTTP/1.1 400 Bad Request\r\nContent-Length: 9\r\n\r\nno header",
                   "HTTP/1.1 200 OK\r\nX-Devmem-More: 1\r\nX-Devmem-Next-Since: 1\r\n"
                   "X-Devmem-Missed: 2\r\nContent-Length: " + std::to_string(ev.size()) +
                       "\r\n\r\n" + ev,
                   "HTTP/1.1 200 OK\r\nX-Devmem-More: 0\r\nX-Devmem-Next-Since: 1\r\n"
                   "X-Devmem-Missed: 0\r\nContent-Length: 0\r\n\r\n"});
  const std::string base = s.url().substr(0, s.url().size() - 2);  // without "/x"
  absl::StatusOr<LiveTrace> t = FetchLiveTrace(base, "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->pages, 2u);
  EXPECT_EQ(t->missed, 2u);
  EXPECT_EQ(t->text, ev);
  EXPECT_NE(s.request().find("since=0&limit=100000&header=1 "), std::string::npos);
  EXPECT_NE(s.request().find("since=0&limit=100000 "), std::string::npos);
  EXPECT_NE(s.request().find("since=1&limit=100000 "), std::string::npos) << s.request();
}

TEST(HttpGetTest, ChunkedContentLengthAndEofFraming) {
  {
    OneShotServer s("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "5\r\nhello\r\n7\r\n, world\r\n0\r\n\r\n");
    absl::StatusOr<HttpResponse> r = HttpGet(s.url(), "tok");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "hello, world");
    HttpResponse unused;
    (void)unused;
  }
  {
    OneShotServer s("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcdef");
    absl::StatusOr<std::string> body = HttpGetOk(s.url(), "");
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_EQ(*body, "abc");
    EXPECT_EQ(s.request().find("Authorization"), std::string::npos);
  }
  {
    OneShotServer s("HTTP/1.0 200 OK\r\n\r\nto the end");
    absl::StatusOr<std::string> body = HttpGetOk(s.url(), "");
    ASSERT_TRUE(body.ok());
    EXPECT_EQ(*body, "to the end");
  }
  {
    OneShotServer s("HTTP/1.1 401 Unauthorized\r\nContent-Length: 9\r\n\r\nno token\n");
    absl::StatusOr<std::string> body = HttpGetOk(s.url(), "");
    ASSERT_FALSE(body.ok());
    EXPECT_EQ(body.status().message(), "GET " + s.url() + ": HTTP 401 Unauthorized: no token "
                                       "(pass the token with --token-file)");
  }
  {
    OneShotServer s("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort");
    EXPECT_FALSE(HttpGetOk(s.url(), "").ok());
  }
  {
    OneShotServer s("garbage");
    EXPECT_FALSE(HttpGetOk(s.url(), "").ok());
  }
  EXPECT_FALSE(HttpGet("ftp://x", "").ok());
  EXPECT_FALSE(HttpGet("http://127.0.0.1:99999/", "").ok());
}

TEST(HttpGetTest, SendsTheBearerToken) {
  OneShotServer s("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
  ASSERT_TRUE(HttpGetOk(s.url(), "abc123").ok());
  EXPECT_NE(s.request().find("Authorization: Bearer abc123\r\n"), std::string::npos);
  EXPECT_EQ(s.request().rfind("GET /x HTTP/1.1\r\n", 0), 0u);
}

// A server on 127.0.0.1 that answers the headers of a 1000-byte body and then sends one
// byte every 100 ms, never going silent for long: only an overall deadline ends the
// client's wait. It stops when the client closes the connection (send fails) or after
// 20 s at most (so a client without a deadline fails the test instead of hanging it).
class TricklingServer {
 public:
  TricklingServer() {
    fd_ = ListenOnLoopback(&port_);
    thread_ = std::thread([this] {
      const int c = ::accept(fd_, nullptr, nullptr);
      std::string request;
      char buf[4096];
      ssize_t n;
      while ((n = ::recv(c, buf, sizeof(buf), 0)) > 0) {
        request.append(buf, static_cast<size_t>(n));
        if (request.find("\r\n\r\n") != std::string::npos) break;
      }
      const std::string head = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n";
      ::send(c, head.data(), head.size(), MSG_NOSIGNAL);
      std::unique_lock<std::mutex> lock(mu_);
      for (int i = 0; i < 200 && !stop_; ++i) {
        // Pacing, not ordering: the byte rate is what is under test.
        cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stop_; });
        if (stop_ || ::send(c, "x", 1, MSG_NOSIGNAL) != 1) break;
      }
      ::close(c);
    });
  }
  ~TricklingServer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    ::close(fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/x"; }

 private:
  int fd_ = -1, port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// A byte every 100 ms is never 1 s of silence: before the overall deadline the client
// waited for all 1000 bytes (and for 25 s a byte, forever).
TEST(HttpGetTest, ATricklingServerMeetsTheOverallDeadline) {
  TricklingServer server;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<HttpResponse> r = HttpGet(server.url(), "", /*timeout_s=*/1, /*deadline_s=*/1);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("GET " + server.url() + ": no complete answer within 1 s"),
            std::string::npos)
      << r.status();
  EXPECT_LT(took, std::chrono::seconds(5));
}

// The response parser on its own (what the fuzzer feeds): framing, strict numbers.
TEST(HttpGetTest, ParseHttpResponseFramingAndMalformedAnswers) {
  absl::StatusOr<HttpResponse> r =
      ParseHttpResponse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                        "5;ext=1\r\nhello\r\n1\r\n!\r\n0\r\n\r\n");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "hello!");
  EXPECT_EQ(r->reason, "OK");
  r = ParseHttpResponse("HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno more");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->body, "no");
  const struct {
    const char* raw;
    const char* needle;
  } bad[] = {
      {"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nabc", "malformed Content-Length \"-5\""},
      {"HTTP/1.1 200 OK\r\nContent-Length: 3x\r\n\r\nabc", "malformed Content-Length"},
      {"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
       "two different Content-Length"},
      {"HTTP/1.1 2x0 OK\r\n\r\n", "malformed status line"},
      {"HTTP/1.1 001 Unauthorized\r\nContent-Length: 0\r\n\r\n", "malformed status line"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXY0\r\n\r\n",
       "malformed chunked body"},
      {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
       "malformed chunked body"},
      {"HTTP/1.1 200 OK\r\nno end", "no end of headers"},
  };
  for (const auto& b : bad) {
    r = ParseHttpResponse(b.raw);
    ASSERT_FALSE(r.ok()) << b.raw;
    EXPECT_NE(r.status().message().find(b.needle), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace devmem::memtrace
