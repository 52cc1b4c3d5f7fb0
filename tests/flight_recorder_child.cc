// tests/flight_recorder_child.cc: the process tests/postmortem_test.py kills.
//
//   devmem_flight_child RECORD SEED TWO_DEVICES   (reports on stdout, binary)
//
// Runs the runtime with flight_recorder:RECORD on the sim backend and allocates and
// frees from two threads, forever, until it is killed. Thread t (0, 1) has sites of its
// own (file "child_t<t>.cc", lines 1..4) on sim:0, or thread 1 on sim:1 when
// TWO_DEVICES is 1. Around every operation the thread writes two reports to stdout
// (each one write(2) of a Report, shorter than PIPE_BUF, so the two threads' reports
// never mix):
//   kind 0 ("about to"): the site and the change of its live bytes the operation makes
//   kind 1 ("done"):     the site and its live bytes now (the allocator's own count)
// so that after a SIGKILL at any moment, a site's live bytes in the record are its last
// "done" value, or that plus the change of an "about to" that has no "done" yet (the
// operation in flight).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/site.h"
#include "runtime/runtime.h"

namespace {

struct Report {
  uint32_t thread;
  uint32_t kind;  // 0 about to, 1 done
  uint32_t site;
  uint32_t device;  // the device index (sim:N)
  int64_t value;    // kind 0: the change in live bytes; kind 1: live bytes now
  int64_t op;
};
static_assert(sizeof(Report) == 32);

void Send(const Report& r) {
  const char* p = reinterpret_cast<const char*>(&r);
  size_t left = sizeof(r);
  while (left > 0) {
    const ssize_t n = write(1, p, left);
    if (n <= 0) _exit(3);  // the reader is gone
    p += n;
    left -= static_cast<size_t>(n);
  }
}

int64_t LiveBytes(devmem::CachingAllocator& a, devmem::SiteId site) {
  const std::vector<devmem::SiteStats> stats = a.site_stats();
  return site < stats.size() ? stats[site].live_bytes : 0;
}

void Work(uint32_t t, int device, uint64_t seed) {
  devmem::Runtime& rt = devmem::Runtime::Get();
  std::shared_ptr<devmem::CachingAllocator> a = rt.allocator({devmem::DeviceType::kSim, device});
  devmem::SiteId sites[4];
  for (uint32_t k = 0; k < 4; ++k) {
    sites[k] = devmem::InternNamedSite(absl::StrCat("child_t", t, ".cc"), k + 1, "Work",
                                       devmem::SiteKind::kAlloc);
  }
  struct Live {
    void* p;
    uint32_t k;
    int64_t bytes;  // its block's bytes (the change in its site's live bytes)
  };
  std::vector<Live> live;
  std::mt19937_64 rng(seed * 2 + t);
  for (int64_t op = 0;; ++op) {
    if (!live.empty() && (live.size() > 64 || rng() % 2 == 0)) {
      const size_t i = rng() % live.size();
      const Live l = live[i];
      live[i] = live.back();
      live.pop_back();
      Send({t, 0, sites[l.k], static_cast<uint32_t>(device), -l.bytes, op});
      a->free(l.p);
      Send({t, 1, sites[l.k], static_cast<uint32_t>(device), LiveBytes(*a, sites[l.k]), op});
    } else {
      const uint32_t k = static_cast<uint32_t>(rng() % 4);
      // Multiples of 512 up to 1 MiB: the small pool, where a block is exactly the
      // rounded request (so "about to" knows the change before the allocation).
      const size_t bytes = 512 * (1 + rng() % 2048);
      Send({t, 0, sites[k], static_cast<uint32_t>(device), static_cast<int64_t>(bytes), op});
      const int64_t before = LiveBytes(*a, sites[k]);
      void* p = a->allocate(bytes, {}, sites[k]);
      const int64_t after = LiveBytes(*a, sites[k]);
      live.push_back({p, k, after - before});
      Send({t, 1, sites[k], static_cast<uint32_t>(device), after, op});
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: devmem_flight_child RECORD SEED TWO_DEVICES\n");
    return 2;
  }
  absl::StatusOr<devmem::Config> config = devmem::ParseConfig(
      absl::StrCat("backend:sim,sim_capacity:4GiB,flight_recorder:\"", argv[1], "\""));
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  if (absl::Status s = devmem::Runtime::Init(*config); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  const uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  const bool two_devices = std::string(argv[3]) == "1";
  try {
    devmem::Runtime::Get().allocator({devmem::DeviceType::kSim, 0});  // the runtime starts
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  std::thread t0(Work, 0, 0, seed), t1(Work, 1, two_devices ? 1 : 0, seed);
  t0.join();  // never: the test kills the process
  t1.join();
  return 0;
}
