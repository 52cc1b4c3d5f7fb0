// tests/test_backend.h: the backend the allocator policy suite
// (tests/caching_allocator_policy_test.cc) runs on, chosen by DEVMEM_TEST_BACKEND:
//   unset or "sim"  the simulated device (MakeSimAllocator, tests/test_util.h): ctest's
//                   devmem_tests;
//   "cuda"          device 0 of the CUDA backend: the fake CUDA runtime in ctest's
//                   fake_cuda.policy.* (devmem_fake_cuda_policy_tests), a GPU in
//                   scripts/gpu-check.sh.
// On cuda a test's sim_capacity (what the policy tests size their out-of-memory cases
// by) is the allocator's memory limit instead: per_process_memory_fraction becomes the
// test's fraction times capacity / the device's total, so the staged retry, the last
// resort and the OOM meet the same limit as on the sim. used_bytes() is the device
// memory the allocator took since it was made (the device's free bytes then, less now).
// A case that needs the sim itself (its address space, its cost model, device-level
// figures only the sim has) skips elsewhere, saying why (DEVMEM_SIM_ONLY).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "tests/hooked_backend.h"
#include "tests/test_util.h"

namespace devmem::testutil {

// The backend named by DEVMEM_TEST_BACKEND; a value other than sim or cuda fails the
// test that asks (naming it) and gives sim.
inline BackendKind PolicyTestBackend() {
  const char* env = std::getenv("DEVMEM_TEST_BACKEND");
  if (env == nullptr || *env == '\0' || std::string_view(env) == "sim") {
    return BackendKind::kSim;
  }
  if (std::string_view(env) == "cuda") return BackendKind::kCuda;
  ADD_FAILURE() << "DEVMEM_TEST_BACKEND=" << env << ": expected sim or cuda";
  return BackendKind::kSim;
}

// A SimAllocator (`sim` set on the sim only) on the policy suite's backend.
struct TestAllocator : SimAllocator {
  size_t free_at_start = 0;  // the device's free bytes when the allocator was made
  // Device memory held by this allocator's segments (and the backend's reserve).
  size_t used_bytes() const {
    if (sim != nullptr) return sim->used_bytes();
    const size_t free_now = alloc->backend().mem_info().free_bytes;
    return free_at_start > free_now ? free_at_start - free_now : 0;
  }
};

// The cuda backend (device 0) for a policy test's `conf`, with t->config (the capacity
// as the memory limit, above) and t->free_at_start set.
inline absl::StatusOr<std::unique_ptr<Backend>> MakeCudaTestBackend(std::string_view conf,
                                                                    size_t default_capacity,
                                                                    TestAllocator* t) {
  t->config = MakeSimConfig(conf, default_capacity);
  t->config.backend = BackendKind::kCuda;
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeBackend(t->config, 0);
  if (!backend.ok()) return backend;
  const MemInfo info = (*backend)->mem_info();
  t->free_at_start = info.free_bytes;
  t->config.per_process_memory_fraction *= std::min(
      1.0, static_cast<double>(t->config.sim_capacity) / static_cast<double>(info.total_bytes));
  return backend;
}

// MakeSimAllocator(conf, default_capacity) on the sim; on cuda the same config on
// device 0 with the capacity as its memory limit (above).
inline TestAllocator MakeTestAllocator(std::string_view conf = "",
                                       size_t default_capacity = kGiB) {
  TestAllocator t;
  if (PolicyTestBackend() == BackendKind::kSim) {
    static_cast<SimAllocator&>(t) = MakeSimAllocator(conf, default_capacity);
    return t;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeCudaTestBackend(conf, default_capacity, &t);
  EXPECT_TRUE(backend.ok()) << "DEVMEM_TEST_BACKEND=cuda: " << backend.status();
  if (!backend.ok()) return t;  // no allocator: the test fails at its first use
  t.alloc = std::make_unique<CachingAllocator>(std::move(*backend), t.config);
  return t;
}

// MakeHookedSimAllocator (tests/hooked_backend.h) on the policy suite's backend: the
// backend wrapped in a HookedBackend, which `*hooks` points at.
inline TestAllocator MakeHookedTestAllocator(std::string_view conf, HookedBackend** hooks,
                                             size_t default_capacity = kGiB) {
  TestAllocator t;
  if (PolicyTestBackend() == BackendKind::kSim) {
    static_cast<SimAllocator&>(t) = MakeHookedSimAllocator(conf, hooks, default_capacity);
    return t;
  }
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      MakeCudaTestBackend(conf, default_capacity, &t);
  EXPECT_TRUE(backend.ok()) << "DEVMEM_TEST_BACKEND=cuda: " << backend.status();
  if (!backend.ok()) return t;
  auto hooked = std::make_unique<HookedBackend>(std::move(*backend));
  *hooks = hooked.get();
  t.alloc = std::make_unique<CachingAllocator>(std::move(hooked), t.config);
  return t;
}

// Writes `value` over [p, p + n) where the host can reach the device's memory (the sim;
// the checks that a block is usable end to end), and does nothing elsewhere: CUDA
// memory is not host memory (the fake CUDA runtime ends the process on a host touch).
inline void FillIfHostAccessible(const SimAllocator& t, void* p, int value, size_t n) {
  if (t->backend().caps().host_accessible) std::memset(p, value, n);
}

}  // namespace devmem::testutil

// In a test on a TestAllocator `t`: skips unless it runs on the sim, saying why.
#define DEVMEM_SIM_ONLY(t, why)                                            \
  do {                                                                     \
    if ((t).sim == nullptr) GTEST_SKIP() << "sim-specific: " << (why);     \
  } while (0)
