// tests/segment_kind_policy_test.cc: what expandable_segments means on each kind of
// backend (allocator/segment_kind_policy.h), one row per case; and that a pool
// applies it (auto on the sim: expandable; on a backend whose mappings lack peer
// access or IPC: regular).
#include "allocator/segment_kind_policy.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "allocator/caching_allocator.h"
#include "tests/hooked_backend.h"
#include "tests/test_util.h"

namespace devmem::internal {
namespace {

TEST(SegmentKindPolicyTest, Table) {
  constexpr SharingSupport kNotNeeded{};  // sim, cpu
  constexpr SharingSupport kNeither{.needed = true};
  constexpr SharingSupport kPeerOnly{.needed = true, .vmm_peer_access = true};
  constexpr SharingSupport kIpcOnly{.needed = true, .vmm_ipc = true};
  constexpr SharingSupport kBoth{.needed = true, .vmm_peer_access = true, .vmm_ipc = true};
  struct Row {
    ExpandableMode mode;
    bool virtual_memory;
    SharingSupport sharing;
    SegmentKind kind;
    bool warn;
  };
  const SegmentKind R = SegmentKind::kRegular;
  const SegmentKind E = SegmentKind::kExpandable;
  const std::vector<Row> rows = {
      // false: always regular, silently.
      {ExpandableMode::kOff, true, kBoth, R, false},
      {ExpandableMode::kOff, false, kNotNeeded, R, false},
      // true: wherever there is virtual memory, whatever sharing lacks; else a warning.
      {ExpandableMode::kOn, true, kNeither, E, false},
      {ExpandableMode::kOn, true, kNotNeeded, E, false},
      {ExpandableMode::kOn, false, kBoth, R, true},
      // auto: the sim (nothing else reaches its memory) gets them ...
      {ExpandableMode::kAuto, true, kNotNeeded, E, false},
      // ... CUDA only when its mappings support both peer access and IPC ...
      {ExpandableMode::kAuto, true, kBoth, E, false},
      {ExpandableMode::kAuto, true, kNeither, R, false},
      {ExpandableMode::kAuto, true, kPeerOnly, R, false},  // no POSIX FD handles
      {ExpandableMode::kAuto, true, kIpcOnly, R, false},
      // ... and nothing without virtual memory, silently.
      {ExpandableMode::kAuto, false, kNotNeeded, R, false},
      {ExpandableMode::kAuto, false, kBoth, R, false},
  };
  for (const Row& r : rows) {
    const SegmentKindDecision d = DecideSegmentKind(r.mode, r.virtual_memory, r.sharing);
    const std::string row =
        std::string(ExpandableModeName(r.mode)) + (r.virtual_memory ? " vm" : " no-vm") +
        " needed=" + std::to_string(r.sharing.needed) +
        " peer=" + std::to_string(r.sharing.vmm_peer_access) +
        " ipc=" + std::to_string(r.sharing.vmm_ipc);
    EXPECT_EQ(d.kind, r.kind) << row << ": " << d.reason;
    EXPECT_EQ(d.warn, r.warn) << row << ": " << d.reason;
    EXPECT_FALSE(d.reason.empty()) << row;
  }
}

// A sim backend that says its memory is shared (as CUDA's is) with the given support.
class SharedSim : public testutil::HookedBackend {
 public:
  SharedSim(std::unique_ptr<Backend> inner, SharingSupport sharing)
      : HookedBackend(std::move(inner)), sharing_(sharing) {}
  SharingSupport sharing() const override { return sharing_; }

 private:
  SharingSupport sharing_;
};

// Whether a 3 MiB allocation made a reservation (expandable) or a segment (regular).
bool UsesExpandable(std::unique_ptr<Backend> backend, const char* conf) {
  absl::StatusOr<Config> config = ParseConfig(conf);
  EXPECT_TRUE(config.ok()) << config.status();
  CachingAllocator alloc(std::move(backend), *config);
  void* p = alloc.allocate(3 * kMiB);
  const AllocatorSnapshot snap = alloc.snapshot();
  alloc.free(p);
  EXPECT_EQ(snap.segments.size(), 1u);
  return !snap.segments.empty() && snap.segments[0].expandable;
}

std::unique_ptr<Backend> Sim() {
  return MakeSimBackend(testutil::MakeSimConfig("sim_capacity:64MiB"), 0);
}

TEST(SegmentKindPolicyTest, PoolsApplyIt) {
  EXPECT_TRUE(UsesExpandable(Sim(), "expandable_segments:auto"));
  EXPECT_FALSE(UsesExpandable(Sim(), "expandable_segments:false"));
  EXPECT_FALSE(UsesExpandable(
      std::make_unique<SharedSim>(Sim(), SharingSupport{.needed = true,
                                                        .vmm_peer_access = true}),
      "expandable_segments:auto"));
  EXPECT_TRUE(UsesExpandable(
      std::make_unique<SharedSim>(
          Sim(), SharingSupport{.needed = true, .vmm_peer_access = true, .vmm_ipc = true}),
      "expandable_segments:auto"));
  EXPECT_TRUE(UsesExpandable(
      std::make_unique<SharedSim>(Sim(), SharingSupport{.needed = true}),
      "expandable_segments:true"));
}

}  // namespace
}  // namespace devmem::internal
