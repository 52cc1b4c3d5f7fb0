// tests/fake_cuda/fake_cuda_test_util.h: what several fake-CUDA test files share: the
// backend and allocator on a fake device, the allocator suites' fixture and their two
// segment kinds, a child process per case, the driver's entry points, and the scoped
// environment variables the fake reads.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "allocator/backend.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/types.h"
#include "cuda/cuda_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_cuda/fake_cuda.h"

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

// How many of the fake's `what` ("allocations", "mappings", ...) are live.
inline size_t Live(const char* what) { return devmem_fake_cuda_live(what); }

// Sets an environment variable for the scope (the fake reads DEVMEM_FAKE_CUDA_FAIL,
// _NO_VMM, _NO_PEER, _MISSING ... at every call), and puts back the value it had
// before (or unsets it), so that a case leaves the process's environment as it found
// it: ctest sets some of these variables for a whole run (fake_cuda.no_device).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* before = std::getenv(name)) before_ = before;
    ::setenv(name, value, /*overwrite=*/1);
  }
  ~ScopedEnv() {
    if (before_) {
      ::setenv(name_, before_->c_str(), /*overwrite=*/1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> before_;
};

// The CUDA backend of fake device `index`; null (and a failed expectation) if it
// cannot be made.
inline std::unique_ptr<Backend> CudaBackend(int index = 0) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = NewCudaBackend(index);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

// A CachingAllocator on fake device `index` (cuda:index), configured by `conf`
// (DEVMEM_CONF syntax, e.g. "expandable_segments:true"); null (and a failed
// expectation naming the cause) if the configuration or the backend is refused.
inline std::unique_ptr<CachingAllocator> CudaAllocator(int index, const std::string& conf) {
  Config base;
  base.backend = BackendKind::kCuda;
  absl::StatusOr<Config> config = ParseConfig(conf, base);
  EXPECT_TRUE(config.ok()) << conf << ": " << config.status();
  std::unique_ptr<Backend> backend = CudaBackend(index);
  if (!config.ok() || backend == nullptr) return nullptr;
  return std::make_unique<CachingAllocator>(std::move(backend), *config);
}

// The two segment kinds the allocator suites run on, as their parameter, and the name
// each case gets: Segments/<Suite>.<Case>/regular and .../expandable.
inline auto SegmentKinds() {
  return ::testing::Values("expandable_segments:false", "expandable_segments:true");
}
inline std::string SegmentKindName(const ::testing::TestParamInfo<const char*>& info) {
  return absl::StrContains(info.param, "true") ? "expandable" : "regular";
}

// The allocator suites' fixture: alloc_ is a CachingAllocator on cuda:0 configured by
// the case's parameter (one of SegmentKinds()). Instantiate a suite derived from it with
//   INSTANTIATE_TEST_SUITE_P(Segments, Suite, SegmentKinds(), SegmentKindName);
// Each suite's TearDown says what must hold after its cases (the checks differ from
// suite to suite; ExpectValidAndEmptied is the common part).
class CudaAllocatorTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    alloc_ = CudaAllocator(0, GetParam());
    ASSERT_TRUE(alloc_);
  }
  bool Expandable() const { return absl::StrContains(GetParam(), "true"); }
  // A new stream of the allocator's device (Stream{}, the legacy one, on failure).
  Stream NewStream() {
    absl::StatusOr<Stream> s = alloc_->backend().create_stream();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : Stream{};
  }
  void ExpectValid() const {
    const absl::Status st = alloc_->validate();
    EXPECT_TRUE(st.ok()) << st;
  }
  // validate() holds, and empty_cache gives every segment back (nothing is allocated).
  void ExpectValidAndEmptied() {
    ExpectValid();
    alloc_->empty_cache();
    EXPECT_EQ(alloc_->stats().reserved_bytes[kAggregatePool].current, 0);
  }

  std::unique_ptr<CachingAllocator> alloc_;
};

}  // namespace devmem::fake_cuda_test
