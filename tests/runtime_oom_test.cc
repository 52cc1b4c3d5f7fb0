// tests/runtime_oom_test.cc: what happens on an OOM (runtime/oom.h,
// runtime/device_observer.h): the dump file is written, complete and readable, at most
// once per interval per device; callbacks get the report; a failing dump or a throwing
// callback does not get in the way; the runtime's own allocators report to its
// callbacks.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <source_location>
#include <sstream>
#include <string>
#include <vector>

#include "allocator/arena.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "nlohmann/json.hpp"
#include "runtime/device_observer.h"
#include "runtime/json.h"
#include "runtime/oom.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"

namespace devmem {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<CachingAllocator> SmallSim(int index) {
  Config c;
  c.backend = BackendKind::kSim;
  c.sim_capacity = 64 * kMiB;
  return std::make_shared<CachingAllocator>(MakeSimBackend(c, index), c);
}

// A fresh directory under the test's temp dir.
std::string FreshDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) /
                       (name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::vector<fs::path> Files(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  return out;
}

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Provokes one OOM: 100 MiB on a 64 MiB device.
void Oom(CachingAllocator& a, SiteId site) {
  EXPECT_THROW(a.allocate(100 * kMiB, {}, site), OutOfMemoryError);
}

TEST(OomDumpTest, DumpIsWrittenReadableAndRateLimited) {
  const std::string dir = FreshDir("oom-dump");
  auto alloc = SmallSim(41);
  TraceRing ring(256);
  OomDumper dumper(dir);  // one per second per device
  OomCallbackList callbacks;
  std::vector<OomReport> seen;
  callbacks.add([&](const OomReport& r) { seen.push_back(r); });
  DeviceObserver observer(alloc.get(), &ring, &dumper, &callbacks);
  alloc->set_observer(&observer);

  const SiteId holder = InternSite(std::source_location::current(), SiteKind::kClone, "holder");
  void* held = alloc->allocate(30 * kMiB, {}, holder);
  const SiteId asker = InternSite(std::source_location::current(), SiteKind::kAlloc);
  Oom(*alloc, asker);
  Oom(*alloc, asker);  // within the second: no second dump
  alloc->free(held);
  alloc->set_observer(nullptr);

  // Callbacks are not rate limited.
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].requested_bytes, 100 * kMiB);
  EXPECT_EQ(seen[0].device, (DeviceId{DeviceType::kSim, 41}));
  EXPECT_EQ(dumper.skipped(), 1);

  const std::vector<fs::path> files = Files(dir);
  ASSERT_EQ(files.size(), 1u) << "expected exactly one dump (and no temporary file)";
  const std::string name = files[0].filename().string();
  const std::string prefix = "devmem-oom-sim41-";
  EXPECT_EQ(name.rfind(prefix, 0), 0u) << name;
  EXPECT_NE(name.find("-" + std::to_string(getpid()) + ".json"), std::string::npos) << name;

  const std::string text = Read(files[0]);
  SiteMap sites;
  std::vector<TraceEvent> trace;
  absl::StatusOr<RuntimeSnapshot> snap = SnapshotFromJson(text, &sites, &trace);
  ASSERT_TRUE(snap.ok()) << snap.status();
  ASSERT_EQ(snap->devices.size(), 1u);
  EXPECT_EQ(snap->devices[0].device, (DeviceId{DeviceType::kSim, 41}));
  EXPECT_EQ(snap->devices[0].stats.allocated_bytes[kAggregatePool].current,
            static_cast<int64_t>(30 * kMiB));
  ASSERT_FALSE(trace.empty());
  EXPECT_EQ(trace.back().action, AllocAction::kOom);
  EXPECT_EQ(sites.count(holder), 1u);  // top holder's site is in the table
  EXPECT_EQ(sites.count(asker), 1u);   // so is the asker's

  const nlohmann::json j = nlohmann::json::parse(text);
  const nlohmann::json& oom = j.at("oom");
  EXPECT_EQ(oom.at("device"), "sim:41");
  EXPECT_EQ(oom.at("requested_bytes"), 100 * kMiB);
  EXPECT_EQ(oom.at("site"), asker);
  EXPECT_EQ(oom.at("cause"), std::string(OomCauseName(seen[0].cause)));
  ASSERT_FALSE(oom.at("top_sites").empty());
  EXPECT_EQ(oom["top_sites"][0]["site"], holder);
  EXPECT_EQ(oom["top_sites"][0]["copy"], true);
  EXPECT_EQ(oom["top_sites"][0]["live_bytes"], 30 * kMiB);
  EXPECT_GT(oom.at("copy_share").get<double>(), 0.99);
  EXPECT_FALSE(oom.at("remedy").get<std::string>().empty());

  // The reader gives the "oom" object back as written (memtrace oom shows it).
  absl::StatusOr<SnapshotFile> file = ParseSnapshotJson(text, name);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->oom.has_value());
  EXPECT_EQ(file->oom->device, "sim:41");
  EXPECT_EQ(file->oom->requested_bytes, 100 * kMiB);
  EXPECT_EQ(file->oom->site, asker);
  EXPECT_EQ(file->oom->cause, oom.at("cause"));
  ASSERT_EQ(file->oom->top_sites.size(), oom.at("top_sites").size());
  EXPECT_EQ(file->oom->top_sites[0].site, holder);
  EXPECT_EQ(file->oom->top_sites[0].where, oom["top_sites"][0]["where"]);
  EXPECT_TRUE(file->oom->top_sites[0].copy);
  EXPECT_EQ(file->oom->message, oom.at("message"));
  EXPECT_EQ(file->oom->remedy, oom.at("remedy"));
  EXPECT_EQ(file->sites.size(), sites.size());
  EXPECT_FALSE(ParseSnapshotJson(text.substr(0, text.size() / 2), name).ok());
  fs::remove_all(dir);
}

// The dump says what scoped arenas hold (docs/formats.md: arena_live_bytes,
// arena_escaped_bytes, arena_retained_bytes) and names the arena's chunks as a site of
// kind arena among the top holders.
TEST(OomDumpTest, DumpSaysWhatScopedArenasHold) {
  const std::string dir = FreshDir("oom-dump-arena");
  auto alloc = SmallSim(44);
  TraceRing ring(256);
  OomDumper dumper(dir);
  OomCallbackList callbacks;
  DeviceObserver observer(alloc.get(), &ring, &dumper, &callbacks);
  alloc->set_observer(&observer);
  std::vector<void*> escaped;
  {
    ArenaScope arena(*alloc, "leaky");
    for (int i = 0; i < 20; ++i) escaped.push_back(alloc->allocate(kMiB));
  }
  Oom(*alloc, InternSite(std::source_location::current(), SiteKind::kAlloc));
  for (void* p : escaped) alloc->free(p);
  alloc->set_observer(nullptr);

  const std::vector<fs::path> files = Files(dir);
  ASSERT_EQ(files.size(), 1u);
  const nlohmann::json j = nlohmann::json::parse(Read(files[0]));
  const nlohmann::json& oom = j.at("oom");
  EXPECT_EQ(oom.at("arena_live_bytes"), 20 * kMiB);
  EXPECT_EQ(oom.at("arena_escaped_bytes"), 20 * kMiB);
  EXPECT_EQ(oom.at("arena_retained_bytes"), 0);  // the staged retry took them back
  EXPECT_NE(oom.at("message").get<std::string>().find("scoped arenas hold"), std::string::npos);
  ASSERT_FALSE(oom.at("top_sites").empty());
  const auto top = oom["top_sites"][0]["site"].get<SiteId>();
  bool named = false;
  for (const auto& site : j.at("sites")) {
    if (site.at("id").get<SiteId>() == top) {
      named = site.at("kind") == "arena" && site.at("tag") == "leaky";
    }
  }
  EXPECT_TRUE(named) << j.at("sites").dump();
  fs::remove_all(dir);
}

TEST(OomDumpTest, EachDeviceAndEachIntervalGetsItsOwnDump) {
  const std::string dir = FreshDir("oom-interval");
  auto a = SmallSim(42);
  auto b = SmallSim(43);
  OomDumper dumper(dir, /*min_interval_ns=*/0);
  DeviceObserver oa(a.get(), nullptr, &dumper, nullptr);
  DeviceObserver ob(b.get(), nullptr, &dumper, nullptr);
  a->set_observer(&oa);
  b->set_observer(&ob);
  Oom(*a, kUnknownSite);
  Oom(*a, kUnknownSite);  // no interval: a second file, not an overwrite
  Oom(*b, kUnknownSite);
  a->set_observer(nullptr);
  b->set_observer(nullptr);
  int sim42 = 0, sim43 = 0;
  for (const fs::path& p : Files(dir)) {
    const std::string name = p.filename().string();
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << name;
    sim42 += name.rfind("devmem-oom-sim42-", 0) == 0;
    sim43 += name.rfind("devmem-oom-sim43-", 0) == 0;
    EXPECT_TRUE(SnapshotFromJson(Read(p)).ok()) << name;
  }
  EXPECT_EQ(sim42, 2);
  EXPECT_EQ(sim43, 1);
  fs::remove_all(dir);
}

TEST(OomDumpTest, UnwritableDirectoryNeitherThrowsNorStopsCallbacks) {
  auto alloc = SmallSim(44);
  OomDumper dumper("/proc/devmem-cannot-write-here");
  OomCallbackList callbacks;
  int calls = 0;
  callbacks.add([&](const OomReport&) { ++calls; });
  DeviceObserver observer(alloc.get(), nullptr, &dumper, &callbacks);
  alloc->set_observer(&observer);
  Oom(*alloc, kUnknownSite);  // still OutOfMemoryError, not some other exception
  alloc->set_observer(nullptr);
  EXPECT_EQ(calls, 1);
  OomReport report;
  EXPECT_EQ(dumper.MaybeDump(report, *alloc, nullptr), "");
}

// Mode bits of `p` without following a final symlink.
mode_t ModeOf(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

// Whatever the umask, a dump is readable by its owner only (it holds file paths, tags
// and the program's memory layout).
TEST(OomDumpFileTest, DumpsAreCreated0600WhateverTheUmask) {
  const std::string dir = FreshDir("oom-mode");
  auto alloc = SmallSim(46);
  OomDumper dumper(dir, /*min_interval_ns=*/0);
  DeviceObserver observer(alloc.get(), nullptr, &dumper, nullptr);
  alloc->set_observer(&observer);
  const mode_t old_umask = umask(0);
  Oom(*alloc, kUnknownSite);
  umask(old_umask);
  alloc->set_observer(nullptr);
  const std::vector<fs::path> files = Files(dir);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(ModeOf(files[0]), 0600u) << files[0];
  fs::remove_all(dir);
}

// Another user of a shared directory plants symlinks on the names a dump could take
// (the final name and the old, predictable temporary name); the victim must be left
// alone and the symlinks must stay symlinks.
TEST(OomDumpFileTest, PlantedSymlinksAreNeitherFollowedNorReplaced) {
  const std::string dir = FreshDir("oom-symlink");
  const std::string victim_dir = FreshDir("oom-victim");
  const fs::path victim = fs::path(victim_dir) / "secret";
  std::ofstream(victim) << "secret";
  fs::permissions(victim, fs::perms::owner_read | fs::perms::owner_write);
  const std::string stem = "devmem-oom-sim0-1700000000000-" + std::to_string(getpid());
  const fs::path planted = fs::path(dir) / (stem + ".json");
  fs::create_symlink(victim, planted);
  fs::create_symlink(victim, fs::path(dir) / ("." + stem + ".json.tmp"));

  absl::StatusOr<std::string> written = WriteDumpFile(dir, stem, "{\"dump\":1}");
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, (fs::path(dir) / (stem + "-2.json")).string());
  EXPECT_EQ(Read(*written), "{\"dump\":1}\n");
  EXPECT_EQ(Read(victim), "secret");
  EXPECT_TRUE(fs::is_symlink(planted));
  EXPECT_EQ(fs::read_symlink(planted), victim);
  // Nothing else appeared: no temporary file left over.
  EXPECT_EQ(Files(dir).size(), 3u);
  fs::remove_all(dir);
  fs::remove_all(victim_dir);
}

TEST(OomDumpFileTest, UnsafeDirectoriesAreRefusedWithTheReason) {
  const std::string dir = FreshDir("oom-unsafe");
  fs::permissions(dir, fs::perms::all);  // 0777, no sticky bit
  absl::StatusOr<std::string> written = WriteDumpFile(dir, "devmem-oom-x", "{}");
  ASSERT_FALSE(written.ok());
  EXPECT_NE(written.status().message().find(dir), std::string::npos) << written.status();
  EXPECT_NE(written.status().message().find("sticky"), std::string::npos) << written.status();
  EXPECT_TRUE(Files(dir).empty());
  // With the sticky bit (like /tmp) others cannot replace our files: accepted.
  fs::permissions(dir, fs::perms::all | fs::perms::sticky_bit);
  written = WriteDumpFile(dir, "devmem-oom-x", "{}");
  EXPECT_TRUE(written.ok()) << written.status();
  // Group-writable without the sticky bit is refused as well.
  fs::permissions(dir, fs::perms::owner_all | fs::perms::group_all);
  EXPECT_FALSE(WriteDumpFile(dir, "devmem-oom-y", "{}").ok());

  // A regular file where the directory should be.
  const fs::path file = fs::path(dir) / "plain";
  std::ofstream(file) << "x";
  written = WriteDumpFile(file.string(), "devmem-oom-x", "{}");
  ASSERT_FALSE(written.ok());
  EXPECT_NE(written.status().message().find(file.string()), std::string::npos);

  // A directory owned by another user (needs root to make one; the reason itself is
  // checked below for everyone).
  if (geteuid() == 0) {
    const fs::path theirs = fs::path(dir) / "theirs";
    fs::create_directory(theirs);
    ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
    written = WriteDumpFile(theirs.string(), "devmem-oom-x", "{}");
    ASSERT_FALSE(written.ok());
    EXPECT_NE(written.status().message().find("owned by uid 65534"), std::string::npos)
        << written.status();
    EXPECT_TRUE(Files(theirs.string()).empty());
  }
  struct stat st {};
  st.st_mode = S_IFDIR | 0700;
  st.st_uid = 1234;
  EXPECT_EQ(UnsafeDumpDirectoryReason(st, 1234), "");
  EXPECT_NE(UnsafeDumpDirectoryReason(st, 999).find("owned by uid 1234"), std::string::npos);
  st.st_uid = 0;  // root's directories are trusted (root can write anywhere anyway)
  EXPECT_EQ(UnsafeDumpDirectoryReason(st, 999), "");
  st.st_mode = S_IFDIR | 0757;
  EXPECT_NE(UnsafeDumpDirectoryReason(st, 999).find("others"), std::string::npos);
  st.st_mode = S_IFDIR | 01777;
  EXPECT_EQ(UnsafeDumpDirectoryReason(st, 999), "");
  st.st_mode = S_IFREG | 0600;
  EXPECT_NE(UnsafeDumpDirectoryReason(st, 0).find("not a directory"), std::string::npos);
  fs::remove_all(dir);
}

TEST(OomDumpFileTest, DumpDirectoryProblemIsKnownBeforeTheFirstOom) {
  const std::string dir = FreshDir("oom-problem");
  EXPECT_EQ(DumpDirectoryProblem(dir), "");
  EXPECT_EQ(DumpDirectoryProblem(dir + "/not/yet"), "");  // created at the first dump
  fs::permissions(dir, fs::perms::all);
  const std::string problem = DumpDirectoryProblem(dir);
  EXPECT_NE(problem.find(dir), std::string::npos) << problem;
  EXPECT_NE(problem.find("sticky"), std::string::npos) << problem;
  fs::remove_all(dir);
}

// The dumper reports the refusal on stderr and writes nothing; a directory it has to
// create gets mode 0700.
TEST(OomDumpFileTest, DumperSaysWhyItRefusesAndCreatesPrivateDirectories) {
  const std::string dir = FreshDir("oom-refuse");
  fs::permissions(dir, fs::perms::all);
  auto alloc = SmallSim(47);
  OomDumper dumper(dir, /*min_interval_ns=*/0);
  OomReport report;
  report.device = DeviceId{DeviceType::kSim, 47};
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(dumper.MaybeDump(report, *alloc, nullptr), "");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("refusing the OOM dump directory " + dir), std::string::npos) << err;
  EXPECT_TRUE(Files(dir).empty());

  fs::permissions(dir, fs::perms::owner_all);
  const std::string nested = (fs::path(dir) / "a" / "dumps").string();
  OomDumper fresh(nested, 0);
  const std::string path = fresh.MaybeDump(report, *alloc, nullptr);
  ASSERT_NE(path, "");
  EXPECT_EQ(ModeOf(nested), 0700u);
  EXPECT_TRUE(SnapshotFromJson(Read(path)).ok());
  fs::remove_all(dir);
}

TEST(OomCallbackTest, AddRemoveThrowAndSelfRemoval) {
  OomCallbackList list;
  int a = 0, b = 0, c = 0;
  const int ia = list.add([&](const OomReport&) { ++a; });
  list.add([&](const OomReport&) { ++b; throw std::runtime_error("callback failure"); });
  int ic = 0;
  ic = list.add([&](const OomReport&) {
    ++c;
    EXPECT_TRUE(list.remove(ic));  // removing itself does not wait for itself
  });
  EXPECT_EQ(list.size(), 3u);
  list.run(OomReport{});
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 1);  // threw, and the next one still ran
  EXPECT_EQ(c, 1);
  EXPECT_EQ(list.size(), 2u);
  EXPECT_TRUE(list.remove(ia));
  EXPECT_FALSE(list.remove(ia));
  EXPECT_FALSE(list.remove(12345));
  list.run(OomReport{});
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 2);
  EXPECT_EQ(c, 1);
}

// The runtime's registry installs its observer on allocators given to it, so its
// callbacks see their OOMs. Uses a device index nothing else uses, and restores it.
TEST(OomCallbackTest, RuntimeCallbacksSeeOomsOfInstalledAllocators) {
  Runtime& rt = Runtime::Get();
  const DeviceId dev{DeviceType::kSim, 45};
  auto alloc = SmallSim(dev.index);
  std::shared_ptr<CachingAllocator> previous = rt.exchange_allocator(dev, alloc);
  std::vector<OomReport> seen;
  const int id = rt.add_oom_callback([&](const OomReport& r) {
    if (r.device == dev) seen.push_back(r);
  });
  Oom(*rt.allocator(dev), kUnknownSite);
  EXPECT_TRUE(rt.remove_oom_callback(id));
  EXPECT_FALSE(rt.remove_oom_callback(id));
  Oom(*alloc, kUnknownSite);  // no callback any more
  rt.exchange_allocator(dev, previous);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].requested_bytes, 100 * kMiB);
}

}  // namespace
}  // namespace devmem
