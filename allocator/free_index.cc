// allocator/free_index.cc: see free_index.h.
#include "allocator/free_index.h"

#include "absl/strings/str_format.h"

namespace devmem::internal {

FreeIndex::~FreeIndex() {
  for (Block* b : spares_) delete b;
}

void FreeIndex::delete_block(Block* b) {
  // Field by field rather than `*b = Block{}`: GCC 12 warns (falsely) about the
  // moved-from temporary's InlinedVector storage.
  b->addr = 0;
  b->size = 0;
  b->requested = 0;
  b->segment = nullptr;
  b->prev = b->next = nullptr;
  b->stream = Stream{};
  b->state = BlockState::kFree;
  b->site = kUnknownSite;
  b->pending_events = 0;
  b->alloc_time_ns = 0;
  b->stream_uses.clear();
  try {
    spares_.push_back(b);
  } catch (...) {
    delete b;
  }
}

absl::Status FreeIndex::validate_free_block(const Block* b) const {
  const FreeSet& s = set(b->segment->small_pool);
  auto it = s.find(b);
  if (it == s.end() || *it != b) {
    return absl::InternalError(absl::StrFormat(
        "devmem validate(): free block %#x is missing from its free set", b->addr));
  }
  if (!b->stream_uses.empty()) {
    return absl::InternalError(absl::StrFormat(
        "devmem validate(): free block %#x has %u recorded streams (they must be cleared "
        "when it is freed)",
        b->addr, b->stream_uses.size()));
  }
  return absl::OkStatus();
}

absl::Status FreeIndex::validate_count(size_t free_blocks) const {
  if (free_blocks != size()) {
    return absl::InternalError(absl::StrFormat(
        "devmem validate(): free sets hold %u blocks but segments hold %u free", size(),
        free_blocks));
  }
  return absl::OkStatus();
}

}  // namespace devmem::internal
