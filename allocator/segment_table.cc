// allocator/segment_table.cc: see segment_table.h.
#include "allocator/segment_table.h"

#include <string>

#include "absl/strings/str_format.h"
#include "allocator/pool_policy.h"

namespace devmem::internal {
namespace {

absl::Status Violation(const std::string& what) {
  return absl::InternalError("devmem validate(): " + what);
}

}  // namespace

Block* SegmentTable::block_containing(uintptr_t addr) const {
  auto it = segments_.upper_bound(addr);
  if (it == segments_.begin()) return nullptr;
  --it;
  const Segment* s = it->second;
  if (addr >= s->addr + s->size) return nullptr;
  for (Block* b = s->head; b != nullptr; b = b->next) {
    if (addr >= b->addr && addr < b->addr + b->size) return b;
  }
  return nullptr;
}

std::vector<Segment*> SegmentTable::unused() const {
  std::vector<Segment*> unused;
  for (const auto& [addr, s] : segments_) {
    // A private pool's segments go back only through release_pool (private_pools.h).
    if (s->busy_blocks == 0 && s->private_pool == nullptr) unused.push_back(s);
  }
  return unused;
}

absl::Status SegmentTable::validate(
    absl::FunctionRef<absl::Status(const Segment*)> on_segment,
    absl::FunctionRef<absl::Status(const Block*)> on_block) const {
  uintptr_t previous_end = 0;
  for (const auto& [base, s] : segments_) {
    if (base != s->addr) return Violation("segment table key differs from its address");
    if (s->addr < previous_end) {
      return Violation(absl::StrFormat("segment %#x overlaps the segment before it",
                                       s->addr));
    }
    previous_end = s->addr + s->size;
    if (absl::Status st = on_segment(s); !st.ok()) return st;
    if (s->head == nullptr || s->head->prev != nullptr) {
      return Violation(absl::StrFormat("segment %#x: bad head block", s->addr));
    }
    uintptr_t expect = s->addr;
    int busy = 0;
    const Block* prev = nullptr;
    for (const Block* b = s->head; b != nullptr; prev = b, b = b->next) {
      if (b->addr != expect || b->size == 0 || b->prev != prev || b->segment != s) {
        return Violation(absl::StrFormat(
            "segment %#x: blocks do not tile it (block %#x size %u, expected address "
            "%#x)",
            s->addr, b->addr, b->size, expect));
      }
      if (b->addr % kMinBlockSize != 0 || b->size % kMinBlockSize != 0) {
        return Violation(absl::StrFormat("block %#x size %u is not %u-byte aligned",
                                         b->addr, b->size, kMinBlockSize));
      }
      if (b->stream != s->stream) {
        return Violation(absl::StrFormat("block %#x is on another stream than its segment",
                                         b->addr));
      }
      expect += b->size;
      if (b->state != BlockState::kFree) ++busy;
      if (absl::Status st = on_block(b); !st.ok()) return st;
    }
    if (prev != s->tail) {
      return Violation(absl::StrFormat("segment %#x: tail pointer is not its last block",
                                       s->addr));
    }
    if (expect != s->addr + s->size) {
      return Violation(absl::StrFormat(
          "segment %#x of %u bytes: its blocks end at %#x, not at its end", s->addr,
          s->size, expect));
    }
    if (busy != s->busy_blocks) {
      return Violation(absl::StrFormat("segment %#x: busy count %d, recount %d", s->addr,
                                       s->busy_blocks, busy));
    }
    if (busy == 0 && s->head->next != nullptr) {
      return Violation(absl::StrFormat("unused segment %#x is not one free block",
                                       s->addr));
    }
  }
  return absl::OkStatus();
}

}  // namespace devmem::internal
