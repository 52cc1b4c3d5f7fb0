// tools/bench/bench_util.cc: see bench_util.h.
#include "tools/bench/bench_util.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "allocator/types.h"

namespace devmem::devbench {
namespace {

template <int N>
std::source_location SiteOf() {
  return std::source_location::current();
}

template <int... N>
std::array<std::source_location, sizeof...(N)> SitesOf(std::integer_sequence<int, N...>) {
  return {SiteOf<N>()...};
}

}  // namespace

int64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

std::vector<size_t> LogUniformSizes(size_t lo, size_t hi, uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(std::log(static_cast<double>(lo)),
                                           std::log(static_cast<double>(hi)));
  std::vector<size_t> sizes(n);
  for (size_t& s : sizes) s = static_cast<size_t>(std::exp(u(rng)));
  return sizes;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Config SimConfig(const Config& base) {
  Config config = base;
  config.backend = BackendKind::kSim;
  config.sim_capacity = size_t{1} << 40;  // address space only: nothing is touched
  return config;
}

const std::array<std::source_location, kNumSites>& Sites() {
  static const auto sites = SitesOf(std::make_integer_sequence<int, kNumSites>{});
  return sites;
}

}  // namespace devmem::devbench
