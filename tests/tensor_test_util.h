// tests/tensor_test_util.h: a small simulated device for the tensor tests.
//
//   class MyTest : public devmem::tensor_test::SimDeviceTest {};
//   TEST_F(MyTest, Works) {
//     Tensor t = zeros({4, 4}, On());      // on kSimDevice, served by alloc()
//     EXPECT_EQ(LiveBlocks(), 1);
//   }
//
// The fixture installs a fresh 64 MiB sim allocator for kSimDevice in the tensor
// layer's registry (ScopedAllocatorOverride), so a test reads exactly its own
// allocations in alloc().stats() and site_stats(). The device index is one no other
// code uses by default.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/stats.h"
#include "tensor/device_registry.h"
#include "tensor/tensor.h"

namespace devmem::tensor_test {

inline constexpr DeviceId kSimDevice{DeviceType::kSim, 11};
inline constexpr DeviceId kOtherSimDevice{DeviceType::kSim, 12};

inline std::shared_ptr<CachingAllocator> MakeSmallSim(int index,
                                                      size_t capacity = 64 * kMiB) {
  Config config;
  config.backend = BackendKind::kSim;
  config.sim_capacity = capacity;
  return std::make_shared<CachingAllocator>(MakeSimBackend(config, index), config);
}

class SimDeviceTest : public ::testing::Test {
 public:  // ExpectInvalid below reads the counters
  SimDeviceTest() : alloc_(MakeSmallSim(kSimDevice.index)), use_(alloc_) {}
  ~SimDeviceTest() override {
    const absl::Status s = alloc_->validate();
    EXPECT_TRUE(s.ok()) << s;
  }

  CachingAllocator& alloc() const { return *alloc_; }
  // Blocks allocated now (the allocator's live count).
  int64_t LiveBlocks() const {
    return alloc_->stats().allocation[kAggregatePool].current;
  }
  // Blocks ever allocated (grows by one per allocation; views must not move it).
  int64_t BlocksEverAllocated() const {
    return alloc_->stats().allocation[kAggregatePool].allocated;
  }
  static TensorOptions On(DType dtype = DType::kFloat32) {
    return TensorOptions{dtype, kSimDevice};
  }

  std::shared_ptr<CachingAllocator> alloc_;
  ScopedAllocatorOverride use_;
};

// Runs `fn`, expects InvalidArgumentError whose message contains every one of `parts`,
// and that the device's live block count is the same afterwards (nothing leaked).
template <typename Fn>
void ExpectInvalid(const SimDeviceTest& t, std::initializer_list<std::string_view> parts,
                   Fn&& fn) {
  const int64_t live = t.LiveBlocks();
  try {
    fn();
    ADD_FAILURE() << "expected InvalidArgumentError mentioning " << *parts.begin();
  } catch (const InvalidArgumentError& e) {
    const std::string message = e.what();
    for (std::string_view part : parts) {
      EXPECT_NE(message.find(part), std::string::npos)
          << "message \"" << message << "\" does not mention \"" << part << "\"";
    }
  }
  EXPECT_EQ(t.LiveBlocks(), live) << "the throw leaked a block";
}

}  // namespace devmem::tensor_test
