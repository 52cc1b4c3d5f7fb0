// tests/coarse_clock_test.cc: the coarse ticker (allocator/coarse_clock.h) and the
// allocation time a thread-cache hit stamps with it: published before the first use
// returns, never ahead of CoarseNowNs(), never decreasing, advancing while used, and
// withdrawn in a forked child until EnsureCoarseTicker restarts the ticker; fork()
// waits for a ticker thread still starting, and the thread parks rather than exits.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "allocator/caching_allocator.h"
#include "allocator/coarse_clock.h"
#include "tests/coarse_clock_test_util.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using coarse_clock_internal::g_published_ns;

using testutil::PublishedPasses;

// Copies the file at `path` to stderr, prefixed by `what`. No heap: a forked child of a
// multithreaded parent may have inherited an allocator lock held (how it got stuck).
void CopyToStderr(const char* what, const char* path) {
  char buf[4096];
  const int n = std::snprintf(buf, sizeof(buf), "  %s: ", what);
  (void)!write(2, buf, static_cast<size_t>(n));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    for (ssize_t got; (got = read(fd, buf, sizeof(buf))) > 0;) {
      (void)!write(2, buf, static_cast<size_t>(got));
    }
    close(fd);
  }
  (void)!write(2, "\n", 1);
}

// A forked child whose ticker never published: says on stderr where each of its
// threads is (the ticker's state, each task's kernel wait channel, system call and
// kernel stack, and a user-space backtrace where gdb is installed), so that a failure
// in CI names the cause. Allocates nothing (raw system calls, fixed buffers).
void DumpStuckChild() {
  char line[512];
  coarse_clock_internal::TickerStateForTest(line, sizeof(line));
  char head[640];
  const int n = std::snprintf(head, sizeof(head),
                              "forked child %d: no ticker published within 10 s; %s\n",
                              static_cast<int>(getpid()), line);
  (void)!write(2, head, static_cast<size_t>(n));
  const int dir = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    alignas(8) char entries[4096];
    for (long got; (got = syscall(SYS_getdents64, dir, entries, sizeof(entries))) > 0;) {
      for (long at = 0; at < got;) {
        const char* name = entries + at + 19;  // linux_dirent64: ino, off, reclen, type
        unsigned short reclen = 0;
        std::memcpy(&reclen, entries + at + 16, sizeof(reclen));
        at += reclen;
        if (name[0] == '.') continue;
        for (const char* what : {"comm", "wchan", "syscall", "stack"}) {
          char path[128];
          std::snprintf(path, sizeof(path), "/proc/self/task/%s/%s", name, what);
          std::snprintf(line, sizeof(line), "task %s %s", name, what);
          CopyToStderr(line, path);
        }
      }
    }
    close(dir);
  }
  if (access("/usr/bin/gdb", X_OK) == 0 && access("/usr/bin/timeout", X_OK) == 0) {
    char pid[16];
    std::snprintf(pid, sizeof(pid), "%d", static_cast<int>(getpid()));
    // Bounded (60 s), within the test's time limit under a sanitizer (180 s).
    char* argv[] = {const_cast<char*>("/usr/bin/timeout"), const_cast<char*>("60"),
                    const_cast<char*>("/usr/bin/gdb"), const_cast<char*>("-q"),
                    const_cast<char*>("-batch"), const_cast<char*>("-p"), pid,
                    const_cast<char*>("-ex"), const_cast<char*>("thread apply all bt"),
                    nullptr};
    pid_t gdb = 0;
    // posix_spawn (no fork handlers, no heap); gdb writes to this child's stderr.
    if (posix_spawn(&gdb, argv[0], nullptr, nullptr, argv, environ) == 0) {
      int status = 0;
      waitpid(gdb, &status, 0);
    }
  }
}

TEST(CoarseClockTest, PublishedWhileUsedNeverAheadNeverBackAndAdvances) {
  CoarseTickerUse use;
  EXPECT_NE(g_published_ns.load(), 0) << "published before the first use returns";
  int64_t last = 0;
  for (int i = 0; i < 10000; ++i) {
    const int64_t p = PublishedCoarseNowNs();
    const int64_t c = CoarseNowNs();
    ASSERT_LE(p, c) << "never ahead of the clock (ages stay >= 0)";
    ASSERT_GE(p, last) << "never decreases";
    last = p;
  }
  EXPECT_TRUE(PublishedPasses(CoarseNowNs())) << "the ticker keeps publishing";
}

// A hit (allocate from this thread's cache) stamps the block with the published time:
// not ahead of the clock read after it, and current to within the ticker's delay.
TEST(CoarseClockTest, ACacheHitsAllocationTimeComesFromTheTicker) {
  auto t = testutil::MakeSimAllocator("expandable_segments:false");
  t->free(t->allocate(4096));  // makes this thread's cache (a ticker use) and fills it
  ASSERT_TRUE(PublishedPasses(CoarseNowNs()));  // the ticker runs
  const int64_t before = g_published_ns.load();
  const DeviceStats stats_before = t->stats();
  void* p = t->allocate(4000);
  const int64_t after = CoarseNowNs();
  ASSERT_EQ(t->stats().cache_hits, stats_before.cache_hits + 1) << "a hit";
  std::optional<BlockInfo> b = t->find_allocation(p);
  ASSERT_TRUE(b.has_value());
  EXPECT_GE(b->alloc_time_ns, before);
  EXPECT_LE(b->alloc_time_ns, after);
  t->free(p);
}

// fork(): the child has no ticker thread, so the parent's last value would stand still
// there; it is withdrawn (hits read the clock) until EnsureCoarseTicker starts one, and
// that one publishes. The fork comes once the parent's ticker runs (its publish passed
// `before`): a fork during the thread's start is AForkWaitsForATickerThreadStillStarting's.
TEST(CoarseClockTest, AForkedChildReadsTheClockUntilRestarted) {
  CoarseTickerUse use;
  ASSERT_NE(g_published_ns.load(), 0);
  ASSERT_TRUE(PublishedPasses(CoarseNowNs())) << "the parent's ticker never published";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (g_published_ns.load() != 0) _exit(2);
    // The ticker was publishing, so its start was over: fork() had nothing to wait for.
    if (!coarse_clock_internal::TickerStartedAtForkForTest()) _exit(6);
    const int64_t c0 = CoarseNowNs();
    if (PublishedCoarseNowNs() < c0) _exit(3);  // the clock itself
    EnsureCoarseTicker();
    if (g_published_ns.load() == 0) _exit(4);
    if (!PublishedPasses(CoarseNowNs())) {  // a ticker runs in the child
      DumpStuckChild();
      _exit(5);
    }
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Reads `key`=N from the ticker's state line (TickerStateForTest); -1 when it is not
// there (or the ticker's mutex was held).
long long TickerStateField(const char* key) {
  char line[256];
  coarse_clock_internal::TickerStateForTest(line, sizeof(line));
  char pattern[64];
  std::snprintf(pattern, sizeof(pattern), "%s=", key);
  const char* at = std::strstr(line, pattern);
  if (at == nullptr) return -1;
  return std::strtoll(at + std::strlen(pattern), nullptr, 10);
}

// Waits (up to 10 s, on a condition, not a time) until the ticker thread parks, or no
// ticker thread exists (where it exited). Allocates nothing: a forked child may call it.
void WaitUntilParkedOrGone() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (TickerStateField("parked") != 1 && TickerStateField("running") != 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // polls, orders nothing
  }
}

// fork() waits for a ticker thread that is still starting (its start may hold a heap
// lock the child would inherit held, coarse_clock.cc). The wait is bounded (1 s): on a
// loaded machine the thread may take longer to start, and then the fork goes ahead as
// designed; that is not a failure of the code. It is told apart from a fork that did
// not wait by how long fork() took. Each attempt runs in a fresh child process, where
// no ticker thread exists yet, so that the fork comes during a start.
TEST(CoarseClockTest, AForkWaitsForATickerThreadStillStarting) {
  constexpr int kAttempts = 3;
  constexpr int kStarted = 0, kNotWaited = 6, kBoundElapsed = 7;
  int result = -1;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // No ticker thread here (the child of any fork has none): this use starts one,
      // and the fork below comes while it starts.
      if (TickerStateField("running") != 0) _exit(2);
      CoarseTickerUse use;
      const auto t0 = std::chrono::steady_clock::now();
      const pid_t grandchild = fork();
      const auto took = std::chrono::steady_clock::now() - t0;
      if (grandchild < 0) _exit(3);
      if (grandchild == 0) {
        _exit(coarse_clock_internal::TickerStartedAtForkForTest() ? kStarted : kNotWaited);
      }
      int status = 0;
      if (waitpid(grandchild, &status, 0) != grandchild || !WIFEXITED(status)) _exit(4);
      if (WEXITSTATUS(status) == kNotWaited && took >= std::chrono::milliseconds(900)) {
        _exit(kBoundElapsed);  // the start took longer than fork() waits
      }
      _exit(WEXITSTATUS(status));
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    result = WEXITSTATUS(status);
    if (result != kBoundElapsed) break;
  }
  if (result == kBoundElapsed) {
    GTEST_SKIP() << "the ticker thread took over fork()'s 1 s bound to start, " << kAttempts
                 << " times: the machine is loaded; the wait itself was not tested";
  }
  EXPECT_EQ(result, kStarted) << (result == kNotWaited
                                      ? "fork() returned before the bound with the ticker "
                                        "thread still starting: it did not wait"
                                      : "the attempt's child failed");
}

// After the last use ends the ticker thread parks instead of exiting (a fork() meeting
// an exiting thread could hand the child a heap lock held, with nothing to wait for:
// coarse_clock.cc), and the next use wakes that same thread.
TEST(CoarseClockTest, TheTickerThreadParksWhenTheLastUseEndsAndIsWokenByTheNext) {
  if (TickerStateField("users") != 0) {
    GTEST_SKIP() << "another test's use of the ticker is alive in this process";
  }
  long long generation = -1;
  {
    CoarseTickerUse use;
    ASSERT_TRUE(PublishedPasses(CoarseNowNs()));  // its thread runs
    generation = TickerStateField("generation");
  }
  EXPECT_EQ(g_published_ns.load(), 0) << "withdrawn with the last use";
  WaitUntilParkedOrGone();
  EXPECT_EQ(TickerStateField("running"), 1) << "the ticker thread exited";
  EXPECT_EQ(TickerStateField("parked"), 1);
  const int64_t parked_value = g_published_ns.load();
  EXPECT_EQ(parked_value, 0) << "a parked ticker published";
  CoarseTickerUse again;
  ASSERT_TRUE(PublishedPasses(CoarseNowNs())) << "the parked thread was not woken";
  EXPECT_EQ(TickerStateField("generation"), generation) << "a new thread was started";
  EXPECT_EQ(TickerStateField("parked"), 0);
}

// A child forked while the parent's ticker thread is parked: the parent's thread was
// blocked on the ticker's condition variable, and the child's copy of it still counts
// that waiter (glibc's, a waiter's group reference), which no thread of the child will
// ever drop. The child starts its own ticker and stops it again, several times: each
// start wakes a parked thread and each end notifies, and a notify that has to close
// the dead waiter's group waited for it forever, holding the ticker's mutex (the child
// hung in its second start, the ticker never published). The fork handler gives the
// child fresh condition variables.
TEST(CoarseClockTest, AForkedChildOfAParkedTickerStartsAndParksItsOwnAgainAndAgain) {
  if (TickerStateField("users") != 0) {
    GTEST_SKIP() << "another test's use of the ticker is alive in this process";
  }
  {
    CoarseTickerUse use;
    ASSERT_TRUE(PublishedPasses(CoarseNowNs()));  // its thread runs
  }
  WaitUntilParkedOrGone();
  ASSERT_EQ(TickerStateField("parked"), 1);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    for (int i = 0; i < 5; ++i) {
      {
        CoarseTickerUse use;  // a thread started (the first time), or the parked one woken
        if (!PublishedPasses(CoarseNowNs())) {
          DumpStuckChild();
          _exit(3);
        }
      }
      WaitUntilParkedOrGone();
      if (TickerStateField("parked") != 1) _exit(4);
    }
    _exit(0);
  }
  // Bounded: a hung child is killed, and fails the test.
  int status = 0;
  pid_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((got = waitpid(pid, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (got == 0) {
    kill(pid, SIGKILL);
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    FAIL() << "the forked child hung (killed after 60 s): a start or end of its ticker "
              "blocked on the condition variable the parent's parked thread waited on";
  }
  ASSERT_EQ(got, pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace devmem
