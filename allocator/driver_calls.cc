// allocator/driver_calls.cc: see driver_calls.h.
#include "allocator/driver_calls.h"

#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "allocator/string_view_bridge.h"

namespace devmem {
namespace {

constexpr std::string_view kNames[kNumDriverCalls] = {
    "malloc", "free", "address_reserve", "address_free", "create",
    "release", "map", "unmap", "set_access", "export", "import"};

// Microseconds with up to three decimals ("7.6", "50"), for FormatSimDriverCosts.
std::string FormatUs(uint64_t ns) {
  if (ns % 1000 == 0) return absl::StrCat(ns / 1000);
  std::string s = absl::StrFormat("%d.%03d", ns / 1000, ns % 1000);
  while (s.back() == '0') s.pop_back();
  return s;
}

}  // namespace

std::string_view DriverCallName(DriverCall call) {
  const int i = static_cast<int>(call);
  return i >= 0 && i < kNumDriverCalls ? kNames[i] : std::string_view("unknown");
}

int64_t DriverCallStats::total_ns() const {
  int64_t total = 0;
  for (int64_t v : ns) total += v;
  return total;
}

DriverCallStats DriverCallCounter::read() const {
  DriverCallStats s;
  for (int i = 0; i < kNumDriverCalls; ++i) {
    s.calls[i] = calls_[i].load(std::memory_order_relaxed);
    s.ns[i] = ns_[i].load(std::memory_order_relaxed);
  }
  return s;
}

SimDriverCosts A100Costs() {
  SimDriverCosts c;
  auto set = [&](DriverCall call, uint64_t ns) { c.ns[static_cast<int>(call)] = ns; };
  set(DriverCall::kMalloc, 50'000);
  set(DriverCall::kFree, 50'000);
  set(DriverCall::kAddressReserve, 1'000);
  set(DriverCall::kAddressFree, 1'000);
  set(DriverCall::kCreate, 50'000);
  set(DriverCall::kRelease, 18'000);
  set(DriverCall::kMap, 1'000);
  set(DriverCall::kUnmap, 18'000);
  set(DriverCall::kSetAccess, 28'000);
  return c;
}

std::string ParseSimDriverCosts(std::string_view text, SimDriverCosts* out) {
  if (text == "a100") {
    *out = A100Costs();
    return "";
  }
  if (text == "none") {
    *out = SimDriverCosts{};
    return "";
  }
  SimDriverCosts costs = A100Costs();
  for (absl::string_view piece : absl::StrSplit(Av(text), '/')) {
    const std::string_view part = Sv(piece);
    const size_t eq = part.find('=');
    if (eq == std::string_view::npos) {
      return absl::StrCat("has \"", Av(part),
                          "\", which is not call=microseconds (or use a100 or none)");
    }
    const std::string_view name = part.substr(0, eq);
    int call = -1;
    for (int i = 0; i < kNumDriverCallsBeforeIpc; ++i) {
      if (kNames[i] == name) call = i;
    }
    if (call < 0) {
      return absl::StrCat(
          "names the call \"", Av(name), "\", not one of ",
          absl::StrJoin(kNames, kNames + kNumDriverCallsBeforeIpc, ", ",
                        [](std::string* out, std::string_view n) { out->append(n); }),
          Av(name == "export" || name == "import"
                 ? " (the sim shares no memory: it never exports or imports)"
                 : ""));
    }
    double us = 0;
    if (!absl::SimpleAtod(Av(part.substr(eq + 1)), &us) || !std::isfinite(us) || us < 0 ||
        us > 1e6) {
      return absl::StrCat("gives ", Av(name), " the cost \"", Av(part.substr(eq + 1)),
                          "\", not a number of microseconds in 0 .. 1000000");
    }
    costs.ns[call] = static_cast<uint64_t>(std::llround(us * 1000));
  }
  *out = costs;
  return "";
}

std::string FormatSimDriverCosts(const SimDriverCosts& costs) {
  if (costs == A100Costs()) return "a100";
  if (costs == SimDriverCosts{}) return "none";
  const SimDriverCosts base = A100Costs();
  std::vector<std::string> parts;
  for (int i = 0; i < kNumDriverCalls; ++i) {
    if (costs.ns[i] != base.ns[i]) {
      parts.push_back(absl::StrCat(Av(kNames[i]), "=", FormatUs(costs.ns[i])));
    }
  }
  return absl::StrJoin(parts, "/");
}

}  // namespace devmem
