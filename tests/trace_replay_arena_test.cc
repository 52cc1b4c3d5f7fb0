// tests/trace_replay_arena_test.cc: replay with a scoped arena per inferred step
// (ArenaReplay and InferSteps in tools/replay/trace_replay.h): the step rule, what the
// arenas serve and what they report, bad options, and the real traces' step counts.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "allocator/config.h"
#include "allocator/errors.h"
#include "allocator/types.h"
#include "tools/replay/trace_replay.h"

namespace devmem {
namespace {

std::string Alloc(uint64_t addr, uint64_t size, uint64_t stream = 0) {
  return "{\"action\":\"alloc\",\"addr\":" + std::to_string(addr) +
         ",\"size\":" + std::to_string(size) + ",\"stream\":" + std::to_string(stream) + "}\n";
}
std::string Free(uint64_t addr) {
  return "{\"action\":\"free\",\"addr\":" + std::to_string(addr) + "}\n";
}

Trace Parse(const std::string& text) {
  absl::StatusOr<Trace> t = ParseTrace(text, "t.jsonl");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : Trace{};
}

// A parameter buffer that lives throughout, then `steps` steps of `temps` temporaries
// of `size` bytes each (allocated, then freed in order).
std::string Steps(int steps, int temps, uint64_t size) {
  std::string text = Alloc(1, 8 * kMiB);
  uint64_t addr = 100;
  for (int s = 0; s < steps; ++s) {
    for (int i = 0; i < temps; ++i) text += Alloc(addr + i, size);
    for (int i = 0; i < temps; ++i) text += Free(addr + i);
    addr += temps;
  }
  return text + Free(1);
}

TEST(InferStepsTest, AStepEndsAtEachValleyBetweenSwingsOfTheGivenFraction) {
  // ops: 0 = params, then per step 4 allocs and 4 frees: step s ends with op 8s + 8.
  const Trace t = Parse(Steps(3, 4, kMiB));
  ASSERT_EQ(t.peak_requested, 12 * kMiB);
  EXPECT_EQ(InferSteps(t, 0.25), (std::vector<size_t>{8, 16}));  // h = 3 MiB < 4 MiB swing
  // A swing the steps never make: one step (the whole trace).
  EXPECT_TRUE(InferSteps(t, 0.5).empty());  // h = 6 MiB > 4 MiB
}

TEST(InferStepsTest, AWiggleSmallerThanTheSwingDoesNotEndAStep) {
  // A step whose live bytes dip and rise again by less than the swing inside it, then
  // a second step: only the valley between the steps ends one.
  const std::string text = Alloc(1, 4 * kMiB) + Alloc(2, 8 * kMiB) + Free(2) +
                           Alloc(3, 2 * kMiB) + Alloc(4, kMiB) + Free(3) + Free(4) +
                           Alloc(5, 16 * kMiB) + Free(5) + Free(1);
  const Trace t = Parse(text);
  ASSERT_EQ(t.peak_requested, 20 * kMiB);
  // ops: 0 a1, 1 a2, 2 f2, 3 a3, 4 a4, 5 f3, 6 f4, 7 a5, 8 f5, 9 f1; live after each
  // (MiB): 4 12 4 6 7 5 4 20 4 0; h = 5 MiB. The fall 12 -> 4 starts a valley at op 2;
  // the rise to 7 is under h; 4 again at op 6 is not lower, so op 2 stays its first low;
  // the rise to 20 confirms it. The fall at the end is never followed by a rise.
  EXPECT_EQ(InferSteps(t, 0.25), (std::vector<size_t>{2}));
  // A rise of exactly h counts: at swing 0.15 (h = 3 MiB) the dip ends a step too.
  EXPECT_EQ(InferSteps(t, 0.15), (std::vector<size_t>{2, 6}));
  EXPECT_TRUE(InferSteps(Trace{}, 0.25).empty());
}

TEST(ArenaReplayTest, TemporariesAreBumpsAndEscapesAreCountedPerStep) {
  // Three steps of ten 4 KiB temporaries; a 4 KiB buffer of the first step lives to
  // the end (it escapes and pins the first step's chunk).
  std::string text = Alloc(1, 8 * kMiB) + Alloc(2, 4 * kKiB);
  uint64_t addr = 100;
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < 10; ++i) text += Alloc(addr + i, 4 * kKiB);
    text += Alloc(90 + s, 4 * kMiB);  // larger than chunk / 4: the normal path
    for (int i = 0; i < 10; ++i) text += Free(addr + i);
    text += Free(90 + s);
    addr += 10;
  }
  text += Free(2) + Free(1);
  const Trace t = Parse(text);
  ArenaReplay arenas;
  arenas.enabled = true;
  arenas.step_swing = 0.2;  // peak 12 MiB + 44 KiB: h is about 2.4 MiB, each step 4 MiB
  ASSERT_EQ(InferSteps(t, arenas.step_swing).size(), 2u);

  const ReplayResult off = Replay(t, Config{}, kUnboundedCapacity);
  EXPECT_EQ(off.arenas.steps, 0);
  EXPECT_EQ(off.arenas.bumps, 0);

  const ReplayResult on = Replay(t, Config{}, kUnboundedCapacity, nullptr, arenas);
  EXPECT_EQ(on.ooms, 0);
  EXPECT_EQ(on.arenas.steps, 3);
  EXPECT_EQ(on.arenas.bumps, 31);  // the escapee and 30 temporaries; not the 4 MiB ones
  EXPECT_EQ(on.arenas.bump_bytes, 31 * 4 * static_cast<int64_t>(kKiB));
  EXPECT_EQ(on.arenas.escaped_bytes, 4 * static_cast<int64_t>(kKiB));
  EXPECT_EQ(on.arenas.escaped_buffers, 1);
  EXPECT_EQ(on.arenas.max_step_escaped_bytes, 4 * static_cast<int64_t>(kKiB));
  // Step 1's 64 KiB chunk stays pinned by the escapee, so step 2 takes a new one from
  // the pool; step 3 reuses step 2's, which emptied.
  EXPECT_EQ(on.arenas.pool_chunk_allocs, 2);
  EXPECT_EQ(on.arenas.chunk_reuses, 1);
  EXPECT_EQ(on.arenas.peak_chunks, 2);
  EXPECT_EQ(on.arenas.peak_chunk_bytes, 2 * 64 * static_cast<int64_t>(kKiB));
  EXPECT_EQ(on.peak_requested_bytes, off.peak_requested_bytes);  // the program's requests

  // Deterministic, like every replay figure.
  const ReplayResult again = Replay(t, Config{}, kUnboundedCapacity, nullptr, arenas);
  EXPECT_EQ(again.peak_reserved_bytes, on.peak_reserved_bytes);
  EXPECT_EQ(again.arenas.bumps, on.arenas.bumps);
  EXPECT_EQ(again.arenas.peak_chunk_bytes, on.arenas.peak_chunk_bytes);
}

TEST(ArenaReplayTest, OtherStreamsTakeTheNormalPath) {
  // The scope serves stream 0 only (allocator/arena.h): stream 1's temporaries are
  // pool allocations.
  std::string text;
  for (int i = 0; i < 8; ++i) text += Alloc(10 + i, 4 * kKiB, i % 2);
  for (int i = 0; i < 8; ++i) text += Free(10 + i);
  ArenaReplay arenas;
  arenas.enabled = true;
  const ReplayResult r = Replay(Parse(text), Config{}, kUnboundedCapacity, nullptr, arenas);
  EXPECT_EQ(r.arenas.steps, 1);
  EXPECT_EQ(r.arenas.bumps, 4);
}

TEST(ArenaReplayTest, TheMinimumCapacityIsSearchedWithArenasOn) {
  const Trace t = Parse(Steps(3, 8, 256 * kKiB));
  ArenaReplay arenas;
  arenas.enabled = true;
  const MinCapacity m = FindMinCapacity(t, Config{}, kMiB, 256, arenas);
  EXPECT_EQ(Replay(t, Config{}, m.bytes, nullptr, arenas).ooms, 0);
  EXPECT_GT(Replay(t, Config{}, t.peak_requested - 1, nullptr, arenas).ooms, 0);
}

TEST(ArenaReplayTest, BadOptionsAreRefusedNamingTheFieldAndValue) {
  ArenaReplay bad_chunk;
  bad_chunk.enabled = true;
  bad_chunk.chunk_size = 1000;
  absl::Status s = CheckArenaReplay(bad_chunk);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("chunk_size 1000"), std::string::npos) << s;
  ArenaReplay bad_swing;
  bad_swing.step_swing = 0;
  s = CheckArenaReplay(bad_swing);
  EXPECT_NE(s.message().find("step_swing 0"), std::string::npos) << s;
  bad_swing.step_swing = 1.5;
  EXPECT_FALSE(CheckArenaReplay(bad_swing).ok());
  EXPECT_TRUE(CheckArenaReplay(ArenaReplay{}).ok());
  const Trace t = Parse(Steps(1, 2, kKiB));
  EXPECT_THROW(Replay(t, Config{}, kUnboundedCapacity, nullptr, bad_chunk), InvalidArgumentError);
}

// The default rule finds the recorded steps of the real PyTorch traces (3 each: their
// README), which kDefaultStepSwing's comment claims.
TEST(ArenaReplayTest, TheDefaultRuleFindsTheRealTracesSteps) {
  for (const char* name : {"resnet18_train.jsonl.gz", "mobilenet_v2_train.jsonl.gz"}) {
    const std::filesystem::path path =
        std::filesystem::path(DEVMEM_SOURCE_DIR) / "tests" / "data" / "traces" / "real" / name;
    absl::StatusOr<Trace> t = ReadTrace(path.string());
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(InferSteps(*t, kDefaultStepSwing).size(), 2u) << name;  // 3 steps
  }
}

}  // namespace
}  // namespace devmem
