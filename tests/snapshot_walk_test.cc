// tests/snapshot_walk_test.cc: SnapshotWalk (allocator/snapshot_walk.h), the copy of the
// segments' block lists under the device lock. Whatever entry points it is given (none,
// every block, heads, neighbours, repeats, blocks of other segments, addresses in no
// segment) and however many chains there are beside its window, each segment comes
// back whole, once, in address order, with every field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "allocator/block.h"
#include "allocator/free_index.h"
#include "allocator/pool_accounting.h"
#include "allocator/snapshot_walk.h"

namespace devmem::internal {
namespace {

// Segments whose blocks tile them, linked as a pool links them. Block fields differ
// from block to block so that a field copied from the wrong block shows.
class Lists {
 public:
  Lists(const std::vector<size_t>& blocks_per_segment) {
    uintptr_t addr = uintptr_t{1} << 30;
    uint32_t n = 0;
    for (size_t count : blocks_per_segment) {
      auto s = std::make_unique<Segment>();
      s->addr = addr;
      Block* prev = nullptr;
      for (size_t i = 0; i < count; ++i, ++n) {
        auto b = std::make_unique<Block>();
        b->addr = addr;
        b->size = 512 * (1 + n % 5);
        b->requested = n % 3 == 0 ? 0 : b->size - n % 7;
        b->state = n % 3 == 0 ? BlockState::kFree : BlockState::kAllocated;
        b->stream = Stream{100 + n % 4};
        b->site = n;
        b->alloc_time_ns = 1000 + n;
        b->segment = s.get();
        b->prev = prev;
        if (prev != nullptr) prev->next = b.get();
        if (s->head == nullptr) s->head = b.get();
        prev = b.get();
        addr += b->size;
        all_.push_back(std::move(b));
      }
      s->tail = prev;
      s->size = addr - s->addr;
      addr += 1 << 20;  // a gap before the next segment
      segments_.push_back(std::move(s));
    }
  }
  const std::vector<std::unique_ptr<Segment>>& segments() const { return segments_; }
  const std::vector<std::unique_ptr<Block>>& blocks() const { return all_; }

  // What a plain walk of each segment copies.
  std::vector<std::vector<BlockInfo>> Expected() const {
    std::vector<std::vector<BlockInfo>> out;
    for (const auto& s : segments_) {
      std::vector<BlockInfo>& v = out.emplace_back();
      for (const Block* b = s->head; b != nullptr; b = b->next) {
        v.push_back(BlockInfo{b->addr, b->size, b->requested, b->state, b->stream, b->site,
                              b->alloc_time_ns});
      }
    }
    return out;
  }

 private:
  std::vector<std::unique_ptr<Segment>> segments_;
  std::vector<std::unique_ptr<Block>> all_;
};

void ExpectSame(const std::vector<std::vector<BlockInfo>>& got,
                const std::vector<std::vector<BlockInfo>>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_EQ(got[s].size(), want[s].size()) << what << ": segment " << s;
    for (size_t i = 0; i < want[s].size(); ++i) {
      const BlockInfo& g = got[s][i];
      const BlockInfo& w = want[s][i];
      EXPECT_TRUE(g.addr == w.addr && g.size == w.size && g.requested == w.requested &&
                  g.state == w.state && g.stream == w.stream && g.site == w.site &&
                  g.alloc_time_ns == w.alloc_time_ns && g.stack == kNoStack)
          << what << ": segment " << s << " block " << i << " (addr " << w.addr << ")";
    }
  }
}

// Walks `lists` with the blocks at `entries` (indexes into lists.blocks()) as entry
// points, sized for `room` blocks.
std::vector<std::vector<BlockInfo>> Walk(const Lists& lists, const std::vector<size_t>& entries,
                                         size_t room, size_t* chains = nullptr) {
  SnapshotWalk walk(room, lists.segments().size());
  for (const auto& s : lists.segments()) walk.add_segment(s.get());
  for (size_t e : entries) {
    const Block* b = lists.blocks()[e].get();
    walk.add_entry(b->addr, b);
  }
  walk.walk();
  if (chains != nullptr) *chains = walk.chains();
  return walk.take();
}

TEST(SnapshotWalkTest, EverySegmentWholeInAddressOrderWhateverTheEntries) {
  const std::vector<std::vector<size_t>> shapes = {
      {1}, {2}, {7}, {1000}, {1, 1, 1}, {3, 1, 300, 2}, std::vector<size_t>(200, 3)};
  for (const std::vector<size_t>& shape : shapes) {
    const Lists lists(shape);
    const auto want = lists.Expected();
    const size_t n = lists.blocks().size();
    std::vector<std::pair<std::string, std::vector<size_t>>> cases;
    cases.push_back({"no entries", {}});
    std::vector<size_t> every(std::min(n, SnapshotWalk::kMaxEntries));
    for (size_t i = 0; i < every.size(); ++i) every[i] = i;  // heads and neighbours
    cases.push_back({"the first blocks", every});
    cases.push_back({"the last block, twice, and the first", {n - 1, n - 1, 0}});
    std::vector<size_t> random;
    std::mt19937 rng(static_cast<unsigned>(n));
    for (int i = 0; i < 100; ++i) random.push_back(rng() % n);  // repeats likely
    cases.push_back({"random blocks", random});
    for (const auto& [name, entries] : cases) {
      const std::string what = "shape of " + std::to_string(shape.size()) + " segments, " +
                               std::to_string(n) + " blocks, " + name;
      // Room for all, and room for none (the copy grows under the walk).
      ExpectSame(Walk(lists, entries, n), want, what);
      ExpectSame(Walk(lists, entries, 0), want, what + ", no room");
    }
  }
}

TEST(SnapshotWalkTest, EntriesCutTheListsIntoChains) {
  const Lists lists({1000});
  size_t chains = 0;
  std::vector<size_t> entries;
  for (size_t i = 0; i < 1000; i += 10) entries.push_back(i);
  ExpectSame(Walk(lists, entries, 1000, &chains), lists.Expected(), "every 10th block");
  EXPECT_EQ(chains, 100u);  // the head (entry 0 is the head) and 99 more
  // More than kWindow segments: chains start as others finish.
  const Lists many(std::vector<size_t>(3 * SnapshotWalk::kWindow, 2));
  ExpectSame(Walk(many, {}, 0, &chains), many.Expected(), "more segments than the window");
  EXPECT_EQ(chains, 3 * SnapshotWalk::kWindow);
}

TEST(SnapshotWalkTest, AnEntryOutsideTheSegmentsIsIgnored) {
  const Lists lists({5, 5});
  const Lists other({5});  // its blocks lie in none of `lists`' segments, or claim another
  SnapshotWalk walk(10, 2);
  for (const auto& s : lists.segments()) walk.add_segment(s.get());
  const Block* inside = lists.blocks()[2].get();
  walk.add_entry(inside->addr, inside);
  // A block of another segment given at an address inside the first one.
  walk.add_entry(lists.blocks()[3]->addr, other.blocks()[1].get());
  walk.add_entry(uintptr_t{1} << 40, other.blocks()[2].get());  // in no segment
  walk.walk();
  EXPECT_EQ(walk.chains(), 3u);  // two heads and `inside`
  ExpectSame(walk.take(), lists.Expected(), "foreign entries");
}

TEST(SnapshotWalkTest, APoolsBlocksLieTogether) {
  // The walk reads one line of every Block, so what it costs is the memory and pages
  // the Blocks span: made one after another (as a filling pool splits), they lie
  // sizeof(Block) apart, each on its own lines. (From aligned `new` they lay 192 B apart
  // under glibc, among the heap's other objects.) Given back, they are made again.
  PoolAccounting acct(DeviceId{DeviceType::kSim, 0}, /*max_split_size=*/SIZE_MAX);
  FreeIndex free(acct);
  constexpr size_t kBlocks = 1500;  // across a few slabs
  std::vector<Block*> made;
  size_t apart = 0;
  for (size_t i = 0; i < kBlocks; ++i) {
    made.push_back(free.new_block());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(made.back()) % alignof(Block), 0u) << i;
    // and alone in its 128 B pair of lines (sizeof(Block) == 128, block.h)
    EXPECT_EQ(reinterpret_cast<uintptr_t>(made.back()) % 128, 0u) << i;
    if (i > 0 && made[i] == made[i - 1] + 1) ++apart;
  }
  // All but the first of each new slab follow their predecessor.
  EXPECT_GE(apart, kBlocks - kBlocks / 256) << "of " << kBlocks << " Blocks";
  for (Block* b : made) free.delete_block(b);
  std::vector<Block*> again;
  for (size_t i = 0; i < kBlocks; ++i) again.push_back(free.new_block());
  std::sort(made.begin(), made.end());
  std::sort(again.begin(), again.end());
  EXPECT_EQ(again, made);  // the spares, not new memory
  for (Block* b : again) free.delete_block(b);  // the slabs free them (ASan: no leak)
}

}  // namespace
}  // namespace devmem::internal
