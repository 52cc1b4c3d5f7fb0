// allocator/release_fence.cc: see release_fence.h.
#include "allocator/release_fence.h"

namespace devmem::internal {

ReleaseFence::~ReleaseFence() {
  // Not finished: maybe not completed, so none is kept (release_event never throws and
  // needs no lock: backends are thread-safe).
  for (const Event e : events_) backend_.release_event(e);
}

void ReleaseFence::record(const std::vector<Stream>& streams) {
  events_.reserve(events_.size() + streams.size());  // may throw: before any record
  for (const Stream s : streams) {
    if (retirements_ != nullptr && !retirements_->empty()) {
      const StreamRetireState state = retirements_->state(s);
      if (state == StreamRetireState::kRetired) continue;  // its work completed
      if (state == StreamRetireState::kRetiring) {
        // Unreached by the release paths (release_fence.h); kept correct anyway.
        retirements_->synchronize_for_release(s);
        continue;
      }
    }
    events_.push_back(pool_ != nullptr ? pool_->record(s) : backend_.record_event(s));
  }
}

void ReleaseFence::wait() {
  for (const Event e : events_) backend_.synchronize_event(e);
  waited_ = true;
}

void ReleaseFence::finish() noexcept {
  for (const Event e : events_) {
    if (waited_ && pool_ != nullptr) {
      pool_->recycle(e);
    } else {
      backend_.release_event(e);
    }
  }
  events_.clear();
}

}  // namespace devmem::internal
