// allocator/stream_retire.h: streams retired by release_stream (internal).
//
// Free blocks are keyed by the raw stream handle, and a driver gives a destroyed
// stream's handle to the next stream it creates while the kernels queued on the old
// one still run. Before a program destroys a stream it calls
// CachingAllocator::release_stream(stream): one event is recorded on the stream, and
// every block of that stream that is cached or freed (free, thread-cached, pending,
// and the allocated ones when they are freed later) waits for that event, pending,
// instead of being handed to the next stream with that handle.
//
// A handle's states:
//   live      (no entry) the usual case;
//   retiring  release_stream recorded the event, which has not completed: blocks of
//             the stream wait for it; allocating on (or record_stream with) the handle
//             is refused; memory of the stream goes back only after the event;
//   retired   the event completed: no work of the old stream remains, and the handle
//             names no stream devmem knows of, so nothing may synchronize it (the
//             stream is destroyed: the driver would refuse, the fake CUDA aborts).
//             The next allocation or record_stream on the handle is a new stream's:
//             the entry goes and the handle is live again.
// Nothing here ever synchronizes the stream itself: release paths wait for the
// retirement's event (synchronize_for_release).
//
// Owns: the retirement events (from Backend::record_event, released once completed)
// and each retiring stream's list of waiting blocks (not the blocks). Each listed
// block counts one of its `pending_events` for the entry: the poll decrements it and
// hands blocks reaching 0 to the caller, as EventQueues::poll does for its events.
// Thread-safety: none; guarded by the owning DevicePool's mutex.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "allocator/backend.h"
#include "allocator/block.h"
#include "allocator/poll_work.h"

namespace devmem::internal {

enum class StreamRetireState { kLive, kRetiring, kRetired };

class StreamRetirements {
 public:
  explicit StreamRetirements(Backend& backend) : backend_(backend) {}
  // Releases the events still held (the pool waited for them first, or is poisoned).
  ~StreamRetirements();
  StreamRetirements(const StreamRetirements&) = delete;
  StreamRetirements& operator=(const StreamRetirements&) = delete;

  // No handle retiring or retired: the check every hot-path caller makes first.
  bool empty() const { return entries_.empty(); }
  // Retirements whose event has not been seen to complete.
  size_t retiring() const { return retiring_; }
  StreamRetireState state(Stream s) const {
    if (entries_.empty()) return StreamRetireState::kLive;
    auto it = entries_.find(s);
    if (it == entries_.end()) return StreamRetireState::kLive;
    return it->second.done ? StreamRetireState::kRetired : StreamRetireState::kRetiring;
  }

  // Starts retiring `s` (live or retired): records its event and reserves room for
  // `waits` blocks. Throws what Backend::record_event throws (or std::bad_alloc),
  // changing nothing.
  void begin(Stream s, size_t waits);
  // Makes room for one more waiting block of retiring `s` (may throw std::bad_alloc,
  // changing nothing), so that add_wait cannot throw.
  void reserve_wait(Stream s);
  // `b` waits for the retirement of `s` (retiring): the caller counts it in
  // b->pending_events. Never throws after begin() or reserve_wait() made room.
  void add_wait(Stream s, Block* b);
  // A retired handle is used again (a new stream): forgets it, so it is live.
  void forget(Stream s) { entries_.erase(s); }

  // Releases the retirement events that completed (with `wait`: waits for each
  // first), querying at most `budget` of them, and calls done(b) for each waiting
  // block whose pending_events reaches 0. Returns the events queried or waited for.
  size_t poll(bool wait, size_t budget, absl::FunctionRef<void(Block*)> done);

  // What a release of memory cached for `s` waits for instead of the stream: live,
  // the stream (Backend::synchronize_stream); retiring, its retirement event;
  // retired, nothing (its work completed, and the handle must not be synchronized).
  void synchronize_for_release(Stream s);

  // Where retiring() != 0 is published (PollWork::kRetirements, allocator/poll_work.h),
  // by begin() and poll() as they change it; null: nowhere. EventQueues sets it.
  void set_poll_work(PollWork* work) {
    work_ = work;
    publish();
  }

  // validate()'s share: adds one to `waits[b]` for each listed wait, and fails when a
  // listed block is not pending or the retired entries still list blocks.
  absl::Status count_waits(absl::flat_hash_map<const Block*, int>* waits) const;

 private:
  struct Entry {
    Event event;        // valid while !done
    bool done = false;  // the event completed (retired)
    std::vector<Block*> blocks;  // waiting (retiring only)
  };
  void publish() {
    if (work_ != nullptr) work_->set(PollWork::kRetirements, retiring_ != 0);
  }
  Backend& backend_;
  PollWork* work_ = nullptr;
  absl::flat_hash_map<Stream, Entry> entries_;
  size_t retiring_ = 0;
};

}  // namespace devmem::internal
