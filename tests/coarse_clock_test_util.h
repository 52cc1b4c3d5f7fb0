// tests/coarse_clock_test_util.h: waiting on the coarse ticker (allocator/coarse_clock.h),
// shared by the coarse-clock and trace-clock tests.
//
// Allocates nothing (steady_clock, sleep_for, an atomic load), so a forked child of a
// multithreaded test may call it.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

#include "allocator/coarse_clock.h"

namespace devmem::testutil {

// Waits (up to 10 s) until the ticker's published value passes `t`; false when it
// never did.
inline bool PublishedPasses(int64_t t) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (coarse_clock_internal::g_published_ns.load(std::memory_order_relaxed) <= t) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // time passing, no order
  }
  return true;
}

}  // namespace devmem::testutil
