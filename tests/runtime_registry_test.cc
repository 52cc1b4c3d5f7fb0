// tests/runtime_registry_test.cc: the process-wide registry (runtime/runtime.h): the
// default device, one allocator per device, set/exchange_allocator, Init after first
// use, snapshot(), and Shutdown (idempotent, threads joined, usable afterwards, clean
// exit) in a child process so that the rest of this binary keeps its runtime.
//
// The runtime is a singleton: tests here use device indices nothing else uses and
// restore what they change, so they pass in any order and alone.
#include <gtest/gtest.h>

#include <dirent.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"

namespace devmem {
namespace {

std::shared_ptr<CachingAllocator> SmallSim(int index) {
  Config c;
  c.backend = BackendKind::kSim;
  c.sim_capacity = 64 * kMiB;
  return std::make_shared<CachingAllocator>(MakeSimBackend(c, index), c);
}

TEST(RuntimeRegistryTest, DefaultDeviceFollowsTheConfiguration) {
  Runtime& rt = Runtime::Get();
  DeviceId want;
  switch (rt.config().backend) {
    case BackendKind::kCpu: want = DeviceId{DeviceType::kCpu, 0}; break;
    case BackendKind::kSim: want = DeviceId{DeviceType::kSim, 0}; break;
    case BackendKind::kCuda: want = DeviceId{DeviceType::kCuda, 0}; break;
    case BackendKind::kAuto:
      want = ResolveAutoBackend() == BackendKind::kCuda ? DeviceId{DeviceType::kCuda, 0}
                                                        : DeviceId{DeviceType::kSim, 0};
      break;
  }
  EXPECT_EQ(rt.default_device(), want);
  EXPECT_EQ(&Runtime::Get(), &rt);
}

TEST(RuntimeRegistryTest, OneAllocatorPerDevice) {
  Runtime& rt = Runtime::Get();
  const DeviceId dev{DeviceType::kSim, 51};
  std::shared_ptr<CachingAllocator> a = rt.allocator(dev);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->device(), dev);
  EXPECT_EQ(rt.allocator(dev), a);
  EXPECT_EQ(rt.allocator(DeviceId{DeviceType::kSim, 52}).get() == a.get(), false);
  bool listed = false;
  DeviceId last{DeviceType::kCpu, -1};
  for (const auto& each : rt.allocators()) {
    listed |= each == a;
    EXPECT_LT(last, each->device());  // device order
    last = each->device();
  }
  EXPECT_TRUE(listed);
  // The runtime's allocators use the configuration's policy keys.
  EXPECT_EQ(a->config().max_split_size, rt.config().max_split_size);
  EXPECT_EQ(a->config().backend, BackendKind::kSim);
}

TEST(RuntimeRegistryTest, DevicesThatCannotBeHadAreNamed) {
  Runtime& rt = Runtime::Get();
  try {
    rt.allocator(DeviceId{DeviceType::kSim, -3});
    ADD_FAILURE() << "sim:-3 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("sim:-3"), std::string::npos) << e.what();
  }
  if (ResolveAutoBackend() != BackendKind::kCuda) {
    try {
      rt.allocator(DeviceId{DeviceType::kCuda, 0});
      ADD_FAILURE() << "cuda:0 without a GPU was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
    }
  }
}

TEST(RuntimeRegistryTest, SetAndExchangeAllocator) {
  Runtime& rt = Runtime::Get();
  const DeviceId dev{DeviceType::kSim, 53};
  auto mine = SmallSim(dev.index);
  std::shared_ptr<CachingAllocator> before = rt.exchange_allocator(dev, nullptr);
  rt.set_allocator(mine);
  EXPECT_EQ(rt.allocator(dev), mine);
  auto other = SmallSim(dev.index);
  EXPECT_EQ(rt.exchange_allocator(dev, other), mine);
  EXPECT_EQ(rt.allocator(dev), other);
  EXPECT_EQ(rt.exchange_allocator(dev, nullptr), other);
  // None installed: the next use creates one from the configuration.
  std::shared_ptr<CachingAllocator> made = rt.allocator(dev);
  EXPECT_NE(made, mine);
  EXPECT_NE(made, other);
  EXPECT_EQ(made->device(), dev);
  EXPECT_THROW(rt.set_allocator(nullptr), std::invalid_argument);
  EXPECT_THROW(rt.exchange_allocator(DeviceId{DeviceType::kSim, 54}, mine),
               std::invalid_argument);  // mine is sim:53
  rt.exchange_allocator(dev, before);
}

TEST(RuntimeRegistryTest, InitAfterFirstUse) {
  Runtime& rt = Runtime::Get();
  EXPECT_TRUE(Runtime::Init(rt.config()).ok());  // the same configuration: fine
  Config other = rt.config();
  other.trace_entries = rt.config().trace_entries + 17;
  absl::Status s = Runtime::Init(other);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find("trace_entries:" + std::to_string(other.trace_entries)),
            std::string::npos)
      << s;
}

TEST(RuntimeRegistryTest, SnapshotCoversEveryDevice) {
  Runtime& rt = Runtime::Get();
  const DeviceId dev{DeviceType::kSim, 55};
  auto mine = SmallSim(dev.index);
  std::shared_ptr<CachingAllocator> before = rt.exchange_allocator(dev, mine);
  void* p = mine->allocate(4096);
  const RuntimeSnapshot snap = rt.snapshot();
  mine->free(p);
  rt.exchange_allocator(dev, before);
  bool found = false;
  for (const AllocatorSnapshot& d : snap.devices) {
    if (d.device != dev) continue;
    found = true;
    EXPECT_EQ(d.stats.allocation[kAggregatePool].current, 1);
  }
  EXPECT_TRUE(found);
  EXPECT_GT(snap.time_ns, 0);
  EXPECT_GT(snap.unix_time_ns, int64_t{1'600'000'000} * 1'000'000'000);
}

// The threads of this process that have not begun to exit. A thread that
// pthread_join() has waited for can still be listed in /proc/self/task for a moment:
// the kernel wakes the joiner when the thread's memory is released (clear_child_tid in
// exit_mm) and unlists the thread only later (exit_notify), so a raw count right after
// a join may still include it (under load it did, now and then). Such a thread has
// PF_EXITING set in its flags from the start of do_exit, before that wake-up, so it is
// left out here: the count is exact the moment join returns, with nothing to wait for.
int LiveThreadCount() {
  constexpr unsigned long kPfExiting = 0x4;  // include/linux/sched.h
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string stat;
    if (!std::getline(in, stat)) continue;  // gone since readdir: it has exited
    // "tid (comm) state ppid pgrp session tty_nr tpgid flags ...": comm may hold
    // spaces and parentheses, so the fields are counted from the last ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) return -1;
    std::istringstream fields(stat.substr(close + 1));
    std::string skip;
    unsigned long flags = 0;
    for (int i = 0; i < 6; ++i) fields >> skip;  // state .. tpgid
    if (!(fields >> flags)) return -1;
    n += (flags & kPfExiting) == 0;
  }
  closedir(d);
  return n;
}

// In a child process (a fresh runtime, configured here): tracing reaches the runtime's
// allocators, the poller thread exists and Shutdown joins it, Shutdown twice is fine,
// the registry still works after it, and exit (which calls Shutdown again) is clean.
TEST(RuntimeShutdownTest, IdempotentJoinsThreadsAndExitsCleanly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Config config;
        config.backend = BackendKind::kSim;
        config.sim_capacity = 256 * kMiB;
        config.trace_entries = 64;
        if (!Runtime::Init(config).ok()) std::exit(3);
        Runtime& rt = Runtime::Get();
        const int threads_before = LiveThreadCount();
        if (threads_before < 0) std::exit(8);  // /proc/self/task unreadable
        auto a = rt.allocator(DeviceId{DeviceType::kSim, 0});
        a->free(a->allocate(1000));
        if (rt.trace() == nullptr || rt.trace()->next_seq() < 4) std::exit(4);
        const int threads_running = LiveThreadCount();
        if (threads_running < threads_before + 1) std::exit(5);  // the poller
        rt.Shutdown();
        rt.Shutdown();
        if (LiveThreadCount() != threads_running - 1) std::exit(6);
        auto b = rt.allocator(DeviceId{DeviceType::kSim, 1});  // still usable
        b->free(b->allocate(1000));
        if (LiveThreadCount() != threads_running - 1) std::exit(7);  // no new poller
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// In a child process (a fresh runtime and poller): a cross-stream free is polled and
// freed by the poller alone (nothing else calls process_events), and then, idle, the
// poller's rounds take no lock: neither the registry's (poller_stats) nor the device's
// (poll_stats). Before the poll-work flag every round took both. The waits poll the
// counters with a deadline that only ends a failing run; no timing is asserted.
TEST(RuntimePollerTest, PollsQueuedEventsAndTakesNoLockWhileIdle) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Config config;
        config.backend = BackendKind::kSim;
        config.sim_capacity = 256 * kMiB;
        if (!Runtime::Init(config).ok()) std::exit(3);
        Runtime& rt = Runtime::Get();
        auto a = rt.allocator(DeviceId{DeviceType::kSim, 0});
        absl::StatusOr<Stream> side = a->backend().create_stream();
        if (!side.ok()) std::exit(4);
        void* p = a->allocate(4096);
        a->record_stream(p, *side);
        a->free(p);  // pending until the poller sees the event on `side` complete
        a->backend().synchronize_stream(*side);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (a->stats().pending_bytes[kAggregatePool].current != 0) {
          if (std::chrono::steady_clock::now() > deadline) std::exit(5);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (a->poll_stats().locked == 0) std::exit(6);  // the poller freed it, locked
        // Idle: 20 more rounds, none of which may take a lock.
        const Runtime::PollerStats idle = rt.poller_stats();
        const PollStats device_idle = a->poll_stats();
        while (rt.poller_stats().rounds < idle.rounds + 20) {
          if (std::chrono::steady_clock::now() > deadline) std::exit(7);
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        if (rt.poller_stats().registry_locks != idle.registry_locks) std::exit(8);
        if (a->poll_stats().locked != device_idle.locked) std::exit(9);
        if (!a->validate().ok()) std::exit(10);
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// The trace is on by default (a running process can be looked into without a
// restart), with kDefaultTraceEntries events; trace_entries:0 turns it off. In child
// processes: each needs a fresh runtime.
TEST(RuntimeTraceDefaultTest, OnByDefaultAndZeroTurnsItOff) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        Config config;  // trace_entries left at its default
        config.backend = BackendKind::kSim;
        config.sim_capacity = 256 * kMiB;
        if (!Runtime::Init(config).ok()) std::exit(3);
        Runtime& rt = Runtime::Get();
        if (rt.trace() == nullptr) std::exit(4);
        if (rt.trace()->capacity() != kDefaultTraceEntries) std::exit(5);
        auto a = rt.allocator(DeviceId{DeviceType::kSim, 0});
        void* p = a->allocate(1000);
        a->free(p);
        int seen = 0;
        for (const TraceEvent& e : rt.trace()->since(0)) {
          if (e.addr == reinterpret_cast<uintptr_t>(p) &&
              (e.action == AllocAction::kAlloc || e.action == AllocAction::kFree)) {
            ++seen;
          }
        }
        std::exit(seen == 2 ? 0 : 6);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        absl::StatusOr<Config> config = ParseConfig("backend:sim,trace_entries:0");
        if (!config.ok() || !Runtime::Init(*config).ok()) std::exit(3);
        std::exit(Runtime::Get().trace() == nullptr ? 0 : 4);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace devmem
