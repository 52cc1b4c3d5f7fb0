// tools/bench/snapshot_serve.cc: devmem-bench-snapshot, the live snapshot's cost as a
// client sees it (scripts/bench_snapshot.sh runs it).
//
//   build/bin/devmem-bench-snapshot [--buffers N] [--trace N] [--gets N] [--json]
//
// Fills the runtime's allocator for sim:0 with N live buffers (default 100,000; sizes
// 512 B .. 1 MiB log-uniform from 256 call sites, with a freed buffer between live ones
// now and then so that segments hold free blocks too) and its event trace with at
// least --trace events (default 100,000; the ring is sized to hold exactly that many),
// serves /debug/snapshot on 127.0.0.1 (runtime/http_server.h) and GETs it over real
// HTTP (tools/http/http_get.h) --gets times after one warm-up (default 9). Reports:
//   served_ms          median wall time of one GET, connect to last byte (target <= 50)
//   lock_hold_ms       the longest device-lock hold of those snapshots, measured inside
//                      the allocator (CachingAllocator::snapshot_lock_stats; target <= 1)
//   lock_hold_cpu_ms   the same in the holder's CPU time (on a loaded machine the wall
//                      time is mostly preemption while the lock is held)
//   lock_hold_median_ms, lock_hold_median_cpu_ms  the median hold, wall and CPU: the
//                      typical stall, where the longest is the worst one (a single
//                      preemption, or a neighbour's burst of memory traffic, sets it)
//   lock_holds_ms      every hold measured, in order (the GETs', then the in-process
//                      snapshots'), so that "every get <= X" can be checked
//   lock_hold_first_ms the warm-up GET's hold: the pool's first snapshot (its copy's
//                      arrays made and touched then, before the lock)
//   lock_hold_faults   the most page faults one hold took (SnapshotLockStats; 0 expected:
//                      what the copy writes is touched before the lock)
//   served_cpu_ms      the CPU time one GET took, medians: the server's (the process's
//   client_cpu_ms      CPU time over the GET less the client thread's: the copy, the
//                      JSON and the sends) and the client's (receiving and de-chunking);
//                      the load-independent figures (on 2 cores the two overlap)
//   snapshot_ms, json_ms  the in-process split of a served snapshot: the copy
//                      (Runtime::snapshot) and its JSON (SnapshotToJson), medians; and
//                      the same in the thread's CPU time (snapshot_cpu_ms, json_cpu_ms)
// Timing is reported, not asserted (machines differ). Exit status: 0; 1 when a GET
// fails or the snapshot lacks the buffers; 2 bad arguments or a malformed DEVMEM_CONF
// (whose policy keys apply; the backend, http and trace_entries are the bench's own).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "allocator/config.h"
#include "allocator/site.h"
#include "allocator/snapshot.h"
#include "allocator/types.h"
#include "devmem/devmem_version.h"
#include "runtime/http_server.h"
#include "runtime/json.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"
#include "tools/bench/bench_util.h"
#include "tools/http/http_get.h"

namespace devmem::devbench {
namespace {

constexpr double kServedTargetMs = 50;
constexpr double kLockTargetMs = 1;

struct Options {
  size_t buffers = 100'000;
  size_t trace = 100'000;
  int gets = 9;
  bool json = false;
};

// Parses `text` as a count for `flag` (> 0); prints the error and returns false if not.
bool ParseCountArg(const char* flag, const char* text, size_t* out) {
  uint64_t n = 0;
  if (!absl::SimpleAtoi(text, &n) || n == 0 || n > 100'000'000) {
    std::fprintf(stderr, "devmem-bench-snapshot: %s \"%s\": expected a count in 1 .. 10^8\n",
                 flag, text);
    return false;
  }
  *out = static_cast<size_t>(n);
  return true;
}

double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

std::string FormatMs(double ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f", ms);
  return text;
}

// The CPU time of every thread of this process (the server's workers with the client).
int64_t ProcessCpuNowNs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// N live buffers (every 8th allocation is freed again, so free blocks sit between live
// ones), then alloc+free pairs until the trace has seen `trace` events in all.
void Fill(CachingAllocator& alloc, const Options& o, std::vector<void*>* live) {
  const std::vector<size_t> sizes = LogUniformSizes(512, kMiB, 7, o.buffers);
  live->reserve(o.buffers);
  size_t events = 0;
  for (size_t i = 0; live->size() < o.buffers; ++i) {
    const SiteId site = InternSite(Sites()[i % kNumSites], SiteKind::kAlloc);
    void* p = alloc.allocate(sizes[i % sizes.size()], {}, site);
    ++events;
    if (i % 8 == 7) {
      alloc.free(p);
      ++events;
    } else {
      live->push_back(p);
    }
  }
  for (size_t i = 0; events < o.trace; ++i, events += 2) {
    alloc.free(alloc.allocate(sizes[i % sizes.size()], {},
                              InternSite(Sites()[i % kNumSites], SiteKind::kAlloc)));
  }
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const bool has_value = i + 1 < argc;
    if (std::strcmp(a, "--json") == 0) {
      o.json = true;
    } else if (std::strcmp(a, "--buffers") == 0 && has_value) {
      if (!ParseCountArg(a, argv[++i], &o.buffers)) return 2;
    } else if (std::strcmp(a, "--trace") == 0 && has_value) {
      if (!ParseCountArg(a, argv[++i], &o.trace)) return 2;
    } else if (std::strcmp(a, "--gets") == 0 && has_value) {
      size_t n = 0;
      if (!ParseCountArg(a, argv[++i], &n) || n > 1000) {
        if (n > 1000) std::fprintf(stderr, "devmem-bench-snapshot: --gets: at most 1000\n");
        return 2;
      }
      o.gets = static_cast<int>(n);
    } else if (std::strcmp(a, "--version") == 0) {
      std::printf("%s %s\n", "devmem-bench-snapshot", DEVMEM_VERSION);
      return 0;
    } else if (std::strcmp(a, "--help") == 0 || std::strcmp(a, "-h") == 0) {
      std::printf(
          "usage: devmem-bench-snapshot [--buffers N] [--trace N] [--gets N] [--json]\n"
          "Fills sim:0 with N live buffers (default 100000) and the trace with N events\n"
          "(default 100000), serves /debug/snapshot on 127.0.0.1 and GETs it N times\n"
          "(default 9): the median served time and the longest device-lock hold.\n");
      return 0;
    } else {
      std::fprintf(stderr, "devmem-bench-snapshot: bad argument \"%s\" (try --help)\n", a);
      return 2;
    }
  }
  const absl::StatusOr<Config> env = ConfigFromEnv();
  if (!env.ok()) {
    std::fprintf(stderr, "devmem-bench-snapshot: %s\n",
                 std::string(env.status().message()).c_str());
    return 2;
  }
  Config config = SimConfig(*env);
  config.http = "127.0.0.1:0";
  config.trace_entries = o.trace;
  std::shared_ptr<CachingAllocator> alloc;
  try {
    if (absl::Status s = Runtime::Init(config); !s.ok()) {
      std::fprintf(stderr, "devmem-bench-snapshot: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    alloc = Runtime::Get().allocator(DeviceId{DeviceType::kSim, 0});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "devmem-bench-snapshot: DEVMEM_CONF: %s\n", e.what());
    return 2;
  }
  std::vector<void*> live;
  Fill(*alloc, o, &live);
  const size_t trace_held = Runtime::Get().trace()->since(0).size();
  const std::string url = Runtime::Get().http()->url() + "/debug/snapshot";

  // The served figure: GETs over loopback, each timed from connect to last byte.
  std::vector<double> served, holds, cpu_holds, server_cpu, client_cpu;
  size_t body_bytes = 0;
  double first_hold = 0;
  int64_t faults = 0;  // the most in one measured hold
  for (int r = 0; r <= o.gets; ++r) {
    const int64_t t0 = NowNs(), p0 = ProcessCpuNowNs(), c0 = ThreadCpuNowNs();
    absl::StatusOr<std::string> body = memtrace::HttpGetOk(url, "");
    const int64_t t1 = NowNs(), p1 = ProcessCpuNowNs(), c1 = ThreadCpuNowNs();
    if (!body.ok()) {
      std::fprintf(stderr, "devmem-bench-snapshot: %s\n",
                   std::string(body.status().message()).c_str());
      return 1;
    }
    if (r == 0) {  // the warm-up: check that it is the snapshot asked for
      absl::StatusOr<RuntimeSnapshot> snap = SnapshotFromJson(*body);
      size_t blocks = 0;
      if (snap.ok()) {
        for (const AllocatorSnapshot& d : snap->devices) {
          for (const SegmentInfo& s : d.segments) {
            for (const BlockInfo& b : s.blocks) blocks += b.state == BlockState::kAllocated;
          }
        }
      }
      if (!snap.ok() || blocks < o.buffers) {
        std::fprintf(stderr, "devmem-bench-snapshot: %s: %s\n", url.c_str(),
                     snap.ok() ? "fewer live buffers than allocated"
                               : std::string(snap.status().message()).c_str());
        return 1;
      }
      body_bytes = body->size();
      first_hold = Ms(alloc->snapshot_lock_stats().last_ns);
      continue;
    }
    served.push_back(Ms(t1 - t0));
    server_cpu.push_back(Ms((p1 - p0) - (c1 - c0)));
    client_cpu.push_back(Ms(c1 - c0));
    const SnapshotLockStats lock = alloc->snapshot_lock_stats();
    holds.push_back(Ms(lock.last_ns));
    cpu_holds.push_back(Ms(lock.last_cpu_ns));
    faults = std::max(faults, lock.last_faults);
  }
  // The in-process split of the same work (no HTTP): the copy and its JSON.
  std::vector<double> copy_ms, json_ms, copy_cpu_ms, json_cpu_ms;
  for (int r = 0; r < o.gets; ++r) {
    const int64_t t0 = NowNs(), c0 = ThreadCpuNowNs();
    RuntimeSnapshot snap = Runtime::Get().snapshot();
    const int64_t t1 = NowNs(), c1 = ThreadCpuNowNs();
    std::string text = SnapshotToJson(snap);
    const int64_t t2 = NowNs(), c2 = ThreadCpuNowNs();
    copy_ms.push_back(Ms(t1 - t0));
    json_ms.push_back(Ms(t2 - t1));
    copy_cpu_ms.push_back(Ms(c1 - c0));
    json_cpu_ms.push_back(Ms(c2 - c1));
    const SnapshotLockStats lock = alloc->snapshot_lock_stats();
    holds.push_back(Ms(lock.last_ns));
    cpu_holds.push_back(Ms(lock.last_cpu_ns));
    faults = std::max(faults, lock.last_faults);
  }
  const double lock_max = *std::max_element(holds.begin(), holds.end());
  const double lock_cpu_max = *std::max_element(cpu_holds.begin(), cpu_holds.end());
  const double lock_median = Median(holds);
  const double lock_cpu_median = Median(cpu_holds);
  const double served_ms = Median(served);
  for (void* p : live) alloc->free(p);

  if (o.json) {
    std::string each;
    for (double h : holds) each += (each.empty() ? "" : ", ") + FormatMs(h);
    std::printf(
        "{\"live_buffers\": %zu, \"trace_entries\": %zu, \"snapshot_bytes\": %zu, "
        "\"served_ms\": %.2f, \"served_cpu_ms\": %.2f, \"client_cpu_ms\": %.2f, "
        "\"lock_hold_ms\": %.3f, \"lock_hold_cpu_ms\": %.3f, "
        "\"lock_hold_median_ms\": %.3f, \"lock_hold_median_cpu_ms\": %.3f, "
        "\"lock_holds_ms\": [%s], \"lock_hold_first_ms\": %.3f, \"lock_hold_faults\": %lld, "
        "\"snapshot_ms\": %.2f, \"json_ms\": %.2f, \"snapshot_cpu_ms\": %.2f, "
        "\"json_cpu_ms\": %.2f}\n",
        live.size(), trace_held, body_bytes, served_ms, Median(server_cpu), Median(client_cpu),
        lock_max, lock_cpu_max, lock_median, lock_cpu_median, each.c_str(), first_hold,
        static_cast<long long>(faults), Median(copy_ms), Median(json_ms), Median(copy_cpu_ms),
        Median(json_cpu_ms));
    return 0;
  }
  std::printf("/debug/snapshot of sim:0: %zu live buffers, %zu trace entries, %zu bytes\n",
              live.size(), trace_held, body_bytes);
  std::printf("%-34s %8.2f ms   target <= %.0f ms\n", "served (median GET)", served_ms,
              kServedTargetMs);
  std::printf("%-34s %8.2f ms   (client %.2f ms)\n", "  CPU: the server's (median)",
              Median(server_cpu), Median(client_cpu));
  std::printf("%-34s %8.3f ms   target <= %.0f ms\n", "device lock held (longest)", lock_max,
              kLockTargetMs);
  std::printf("%-34s %8.3f ms   (without preemption)\n", "  in the holder's CPU time", lock_cpu_max);
  std::printf("%-34s %8.3f ms   (CPU %.3f ms)\n", "device lock held (median)", lock_median,
              lock_cpu_median);
  std::printf("%-34s %8.3f ms   (page faults in a hold: at most %lld)\n",
              "  the first snapshot's", first_hold, static_cast<long long>(faults));
  std::printf("%-34s %8.2f ms   (CPU %.2f ms)\n", "in process: the copy (median)",
              Median(copy_ms), Median(copy_cpu_ms));
  std::printf("%-34s %8.2f ms   (CPU %.2f ms)\n", "in process: the JSON (median)",
              Median(json_ms), Median(json_cpu_ms));
  return 0;
}

}  // namespace
}  // namespace devmem::devbench

int main(int argc, char** argv) { return devmem::devbench::Main(argc, argv); }
