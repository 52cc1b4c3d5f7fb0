// tests/fake_cuda/fake_cuda_test_util.h: what several fake-CUDA test files share.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <functional>

#include "gtest/gtest.h"

namespace devmem::fake_cuda_test {

// Runs `body` in a child process (EXPECT_EXIT, threadsafe style: a fresh exec of this
// binary running just the current case); the case passes when the child ran it
// without a failure. For cases that fault a device: a sticky error lasts as long as
// the process.
inline void InChild(const std::function<void()>& body) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        body();
        std::exit(::testing::Test::HasFailure() ? 1 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

// The driver's entry point `name`, as the backend fetches it.
template <typename Fn>
Fn DriverFn(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  EXPECT_EQ(
      cudaGetDriverEntryPointByVersion(name, &p, CUDA_VERSION, cudaEnableDefault, &found),
      cudaSuccess);
  EXPECT_EQ(found, cudaDriverEntryPointSuccess) << name;
  return reinterpret_cast<Fn>(p);
}

}  // namespace devmem::fake_cuda_test
