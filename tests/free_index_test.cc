// tests/free_index_test.cc: FreeIndex's Block objects (allocator/free_index.h) under
// AddressSanitizer: a Block given back with delete_block() stays in its slab as a
// spare, so ASan alone would let a stale Block* read it; the index poisons spares (and
// the slabs' room not made into Blocks yet) and unpoisons each Block it hands out. In
// a build without ASan there is nothing to see: these tests skip themselves.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "allocator/asan_poison.h"
#include "allocator/block.h"
#include "allocator/free_index.h"
#include "allocator/pool_accounting.h"

#ifdef DEVMEM_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace devmem::internal {
namespace {

// Whether any byte of `b` is poisoned / every byte is.
bool AnyPoisoned(const Block* b) {
#ifdef DEVMEM_ASAN
  return __asan_region_is_poisoned(const_cast<Block*>(b), sizeof(Block)) != nullptr;
#else
  (void)b;
  return false;
#endif
}
bool AllPoisoned(const Block* b) {
#ifdef DEVMEM_ASAN
  const auto* p = reinterpret_cast<const char*>(b);
  for (size_t i = 0; i < sizeof(Block); ++i) {
    if (!__asan_address_is_poisoned(p + i)) return false;
  }
  return true;
#else
  (void)b;
  return false;
#endif
}

// A read the compiler must keep: the access ASan checks.
size_t ReadSize(const Block* b) { return *static_cast<const volatile size_t*>(&b->size); }

TEST(FreeIndexAsanTest, SparesArePoisonedUntilHandedOutAgain) {
  if (!kAsanPoisons) GTEST_SKIP() << "not an AddressSanitizer build";
  PoolAccounting acct(DeviceId{DeviceType::kSim, 0}, /*max_split_size=*/SIZE_MAX);
  FreeIndex free(acct);
  Block* a = free.new_block();
  Block* b = free.new_block();
  EXPECT_FALSE(AnyPoisoned(a));
  EXPECT_FALSE(AnyPoisoned(b));
  // The next Block of the slab, not made yet, is room nothing may read.
  EXPECT_TRUE(AllPoisoned(b + 1));
  free.delete_block(a);
  EXPECT_TRUE(AllPoisoned(a));  // a spare now
  EXPECT_FALSE(AnyPoisoned(b));  // its neighbour is untouched
  Block* again = free.new_block();
  ASSERT_EQ(again, a);  // the spare, handed out again, readable and writable
  EXPECT_FALSE(AnyPoisoned(again));
  again->size = 4096;
  EXPECT_EQ(ReadSize(again), 4096u);
  // reserve_spare's Block is a spare from the start.
  free.reserve_spare();
  Block* reserved = free.new_block();
  EXPECT_FALSE(AnyPoisoned(reserved));
  free.delete_block(reserved);
  EXPECT_TRUE(AllPoisoned(reserved));
  free.delete_block(again);
  free.delete_block(b);
  // The index is destroyed with spares in it: it unpoisons its slabs before freeing
  // them (ASan would otherwise report the slab's own destructor calls).
}

TEST(FreeIndexAsanTest, AStaleBlockPointerIsReported) {
  if (!kAsanPoisons) GTEST_SKIP() << "not an AddressSanitizer build";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  PoolAccounting acct(DeviceId{DeviceType::kSim, 0}, /*max_split_size=*/SIZE_MAX);
  FreeIndex free(acct);
  Block* b = free.new_block();
  b->size = 512;
  free.delete_block(b);  // b is stale from here on
  EXPECT_DEATH(ReadSize(b), "AddressSanitizer: use-after-poison");
}

}  // namespace
}  // namespace devmem::internal
