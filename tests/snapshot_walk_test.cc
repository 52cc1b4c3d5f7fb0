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
  // Blocks from `new`, or from `slabs` (as a pool makes them; then every `spare_every`-th
  // Block made is given back before the next is made, so spares lie among them).
  explicit Lists(const std::vector<size_t>& blocks_per_segment, FreeIndex* slabs = nullptr,
                 size_t spare_every = 0) {
    uintptr_t addr = uintptr_t{1} << 30;
    uint32_t n = 0;
    for (size_t count : blocks_per_segment) {
      auto s = std::make_unique<Segment>();
      s->addr = addr;
      Block* prev = nullptr;
      for (size_t i = 0; i < count; ++i, ++n) {
        Block* b = nullptr;
        if (slabs == nullptr) {
          b = owned_.emplace_back(std::make_unique<Block>()).get();
        } else {
          if (spare_every != 0 && n % spare_every == spare_every - 1) {
            spares_.push_back(slabs->new_block());  // given back below, once all are made
          }
          b = slabs->new_block();
        }
        b->addr = addr;
        b->size = 512 * (1 + n % 5);
        b->requested = n % 3 == 0 ? 0 : b->size - n % 7;
        b->state = n % 3 == 0 ? BlockState::kFree : BlockState::kAllocated;
        b->stream = Stream{100 + n % 4};
        b->site = n;
        b->alloc_time_ns = 1000 + n;
        b->segment = s.get();
        b->prev = prev;
        if (prev != nullptr) prev->next = b;
        if (s->head == nullptr) s->head = b;
        prev = b;
        addr += b->size;
        all_.push_back(b);
      }
      s->tail = prev;
      s->size = addr - s->addr;
      addr += 1 << 20;  // a gap before the next segment
      segments_.push_back(std::move(s));
    }
    for (Block* b : spares_) slabs->delete_block(b);
  }
  const std::vector<std::unique_ptr<Segment>>& segments() const { return segments_; }
  const std::vector<Block*>& blocks() const { return all_; }

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
  std::vector<std::unique_ptr<Block>> owned_;  // from `new`
  std::vector<Block*> spares_;                 // given back to the slabs
  std::vector<Block*> all_;
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
  SnapshotWalk walk;
  for (size_t e : entries) walk.add_entry(lists.blocks()[e]);
  walk.reserve(room, lists.segments().size());
  walk.prefetch();
  for (const auto& s : lists.segments()) walk.add_segment(s.get());
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
  const Lists other({5});  // its blocks lie in none of `lists`' segments
  SnapshotWalk walk;
  walk.reserve(10, 2);
  const Block* inside = lists.blocks()[2];
  walk.add_entry(inside);
  // A block that claims an address inside the first segment but another segment.
  Block foreign;
  foreign.addr = lists.blocks()[3]->addr;
  foreign.segment = other.segments()[0].get();
  walk.add_entry(&foreign);
  walk.add_entry(other.blocks()[2]);  // in no segment
  Block spare;  // as delete_block() leaves it: addr 0, no segment
  walk.add_entry(&spare);
  for (const auto& s : lists.segments()) walk.add_segment(s.get());
  walk.walk();
  EXPECT_EQ(walk.chains(), 3u);  // two heads and `inside`
  ExpectSame(walk.take(), lists.Expected(), "foreign entries");
}

// The entries a snapshot uses: Blocks picked from the pool's slabs, spares among them.
// Whatever they are, the segments come back whole; where the Blocks were made in
// address order (a filling pool), they cut the lists into chains of nearly one length,
// so that the window stays full to the end of the walk (snapshot_walk.h: with entries
// at random list positions the longest chains were ~6x the mean).
TEST(SnapshotWalkTest, EntriesPickedFromTheSlabsCutEvenChains) {
  PoolAccounting acct(DeviceId{DeviceType::kSim, 0}, /*max_split_size=*/SIZE_MAX);
  for (const size_t spare_every : {size_t{0}, size_t{2}, size_t{7}}) {
    FreeIndex slabs(acct);
    // Across several slabs (the first holds 512 Blocks, each next one twice as many).
    const Lists lists({20'000, 3, 1, 5'000}, &slabs, spare_every);
    const std::string what = "a spare every " + std::to_string(spare_every) + " Blocks";
    SnapshotWalk walk;
    walk.pick_entries(slabs);
    walk.reserve(lists.blocks().size(), lists.segments().size());
    walk.prefetch();
    for (const auto& s : lists.segments()) walk.add_segment(s.get());
    walk.walk();
    const size_t chains = walk.chains();
    // The heads, and most of the kMaxEntries entries (spares and heads are dropped).
    EXPECT_GT(chains, SnapshotWalk::kMaxEntries / 3) << what;
    EXPECT_LE(chains, SnapshotWalk::kMaxEntries + lists.segments().size()) << what;
    const size_t mean = lists.blocks().size() / chains;
    EXPECT_LE(walk.longest_chain(), 3 * mean) << what << ": " << chains << " chains";
    ExpectSame(walk.take(), lists.Expected(), what);
  }
}

// The pool keeps one walk between snapshots (its arrays' pages touched once): each use
// copies only what it walks, whatever the object walked before (more blocks, fewer,
// other segments), and take() keeps the copy's room, given back only when it is over
// 4x what a walk asks for.
TEST(SnapshotWalkTest, OneWalkServesManySnapshots) {
  const Lists big({3000, 5, 1000});
  const Lists small({7, 2});
  const Lists other(std::vector<size_t>(300, 3));
  SnapshotWalk walk;
  auto copy = [&walk](const Lists& lists, const std::vector<size_t>& entries, size_t room) {
    for (size_t e : entries) walk.add_entry(lists.blocks()[e]);
    walk.reserve(room, lists.segments().size());
    walk.prefetch();
    for (const auto& s : lists.segments()) walk.add_segment(s.get());
    walk.walk();
    return walk.take();
  };
  ExpectSame(copy(big, {10, 500, 3001, 3900}, 4005), big.Expected(), "big");
  EXPECT_EQ(walk.blocks(), 0u);  // take() empties it...
  EXPECT_EQ(walk.block_room(), 4005u);  // ...and keeps the room
  // Fewer blocks than the room kept, then more, then none kept at all asked for.
  ExpectSame(copy(small, {1}, 1024), small.Expected(), "small after big");
  EXPECT_EQ(walk.block_room(), 4005u);  // 1024 * 4 >= 4005: kept
  ExpectSame(copy(other, {0, 5, 899}, 900), other.Expected(), "other after small");
  EXPECT_EQ(walk.block_room(), 900u);  // 4005 > 4 * 900: given back, made again
  ExpectSame(copy(big, {}, 0), big.Expected(), "big, no room asked for");
  ExpectSame(copy(small, {}, 9), small.Expected(), "small after the copy grew");
  EXPECT_EQ(walk.block_room(), 9u);
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
