// allocator/driver_in_flight.h: the driver calls a DevicePool's segment sources make with
// the device lock released (internal).
//
// No driver call runs under the device lock on the allocation path: a source registers
// the call's intent under the lock (here: its bytes; the source itself keeps what the
// call touches out of everyone else's reach), releases the lock (ScopedUnlock), calls
// the driver, takes the lock back and links or unlinks the result. Two kinds:
//   grow       cudaMalloc of a regular segment, a map (cuMemCreate + cuMemMap +
//              cuMemSetAccess) of an expandable run: the bytes are not reserved yet;
//   give-back  cudaFree of a released segment, an unmap (cuMemUnmap) of a released run
//              or of recycled granules: the bytes left reserved_bytes already (the
//              statistics say what the pool holds), but the device has them until
//              the call returns.
// Both count against the memory limit (bytes()), so two threads cannot both overshoot
// it, and the staged retry's last stage waits for give-backs in flight
// (wait_for_give_backs) before it declares an OOM: memory on its way back to the
// device must not make an allocation fail.
//
// Give-back generations (liveness): a waiter waits only for the give-backs begun before
// it, never until none is in flight at all, or a steady stream of other threads'
// trims, empty_caches and releases, each begun before the last ended, could hold an
// allocating thread off indefinitely. Each give-back belongs to the generation that was
// open when it began (begin_give_back returns it as its ticket; end_give_back takes it
// back). A waiter closes the open generation if it holds calls (later give-backs go
// into a new one) and returns once every generation up to the one it closed has no
// call left. The caller grows right after (in the same lock hold) and, should the grow
// still fail while later give-backs are in flight, waits again for those (or grows
// again when one ended while its driver call ran with the lock released:
// give_backs_ended): each round ends with the give-backs it found in flight, so no
// round is held open by the rate at which others begin. The rounds themselves are not
// capped: while other threads keep giving memory back and taking it again, so that
// every grow fails yet some give-back is always in flight or just ended, the caller
// keeps retrying (others progress meanwhile: starvation, not a deadlock). A cap would
// report an OOM while memory is on its way back, which stage 2 promises not to.
//
// Operations: a pool call that may release the lock for driver calls (the staged
// retry, trim, empty_cache, the poll's deferred recycles) is one from start to end, its
// gaps between calls included. begin_allocate_to_pool waits until none is under way
// and no call is in flight (wait_for_idle): once a capture may begin, no unlocked
// driver call of an earlier decision may still come.
//
// Invariants (validate): bytes are held exactly while calls are in flight; the
// generations' call counts add up to the give-backs in flight, and only the open
// (last) one may be the first with none left.
// Thread-safety: guarded by the owning DevicePool's mutex, like the sources.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "allocator/mutex.h"

namespace devmem::internal {

// Releases a held Mutex for its scope and takes it back at the end (also when the scope
// is left by an exception). Does nothing for nullptr (the caller keeps the lock).
class ScopedUnlock {
 public:
  explicit ScopedUnlock(Mutex* mu) ABSL_NO_THREAD_SAFETY_ANALYSIS : mu_(mu) {
    if (mu_ != nullptr) mu_->unlock();
  }
  ~ScopedUnlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (mu_ != nullptr) mu_->lock();
  }
  ScopedUnlock(const ScopedUnlock&) = delete;
  ScopedUnlock& operator=(const ScopedUnlock&) = delete;

 private:
  Mutex* const mu_;
};

class DriverInFlight {
 public:
  DriverInFlight() = default;
  DriverInFlight(const DriverInFlight&) = delete;
  DriverInFlight& operator=(const DriverInFlight&) = delete;

  // One operation (see above) for its scope; the lock is held at both ends.
  class Operation {
   public:
    explicit Operation(DriverInFlight& f) : f_(f) { ++f_.operations_; }
    ~Operation() {
      --f_.operations_;
      f_.notify_if_idle();
    }
    Operation(const Operation&) = delete;
    Operation& operator=(const Operation&) = delete;

   private:
    DriverInFlight& f_;
  };

  void begin_grow(size_t bytes) {
    grow_bytes_ += bytes;
    ++grow_calls_;
  }
  // Wakes wait_for_idle() when the last call ends, and wait_until() on every one.
  void end_grow(size_t bytes) {
    grow_bytes_ -= bytes;
    --grow_calls_;
    done_.notify_all();
  }
  // A give-back's generation, from begin_give_back to its end_give_back.
  using Ticket = uint64_t;
  // Registers one give-back of `bytes`; returns its ticket. Every give-back begun in
  // one lock hold gets the same one (only a waiter, holding the lock, opens another).
  Ticket begin_give_back(size_t bytes) {
    give_back_bytes_ += bytes;
    ++give_back_calls_;
    ++generation_calls_.back();
    return open_generation();
  }
  // Ends a give-back begun with `ticket`; wakes the waiters when a generation drained.
  void end_give_back(size_t bytes, Ticket ticket) {
    give_back_bytes_ -= bytes;
    --give_back_calls_;
    ++give_backs_ended_;
    --generation_calls_[ticket - first_generation_];
    bool drained = false;
    while (generation_calls_.size() > 1 && generation_calls_.front() == 0) {
      generation_calls_.pop_front();
      ++first_generation_;
      drained = true;
    }
    if (drained || give_back_calls_ == 0) done_.notify_all();
  }
  // What the device holds (or is about to) beyond reserved_bytes: counted against the
  // memory limit.
  size_t bytes() const { return grow_bytes_ + give_back_bytes_; }
  size_t give_back_bytes() const { return give_back_bytes_; }
  int calls() const { return grow_calls_ + give_back_calls_; }
  // How many give-backs have ended so far: a caller that released the lock (a grow's
  // driver call) tells by it whether memory came back meanwhile.
  uint64_t give_backs_ended() const { return give_backs_ended_; }

  // Returns once every give-back begun before this call has ended (see above: later
  // ones may still be in flight). `mu` is the device lock, held by the caller; it is
  // released while waiting (so the pool may change meanwhile). May throw bad_alloc
  // (closing a generation), before any change.
  void wait_for_give_backs(Mutex* mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (generation_calls_.back() > 0) generation_calls_.push_back(0);  // closes it
    // Every generation up to `last` is closed: no give-back joins it any more.
    const Ticket last = open_generation() - 1;
    done_.wait(*mu, [this, last] { return first_generation_ > last; });
  }
  // Returns once no operation is under way and no call is in flight (the same).
  void wait_for_idle(Mutex* mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    done_.wait(*mu, [this] { return idle(); });
  }
  // Returns once `done()` holds, evaluated with `mu` held after each grow ends (the
  // same): for a condition that only the end of a grow can make true.
  template <typename Pred>
  void wait_until(Mutex* mu, Pred done) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    done_.wait(*mu, done);
  }

  // This part's share of validate().
  absl::Status validate() const {
    int generations = 0;
    for (const int n : generation_calls_) generations += n;
    if (generation_calls_.empty() ||
        (generation_calls_.size() > 1 && generation_calls_.front() == 0) ||
        generations != give_back_calls_) {
      return absl::InternalError(absl::StrFormat(
          "devmem validate(): %d give-backs in flight, but their %u generations "
          "(the first %u) count %d",
          give_back_calls_, generation_calls_.size(), first_generation_, generations));
    }
    if (grow_calls_ < 0 || give_back_calls_ < 0 || (grow_calls_ == 0) != (grow_bytes_ == 0) ||
        (give_back_calls_ == 0) != (give_back_bytes_ == 0)) {
      return absl::InternalError(absl::StrFormat(
          "devmem validate(): driver calls in flight: %d growing hold %u bytes, %d giving "
          "back hold %u bytes",
          grow_calls_, grow_bytes_, give_back_calls_, give_back_bytes_));
    }
    return absl::OkStatus();
  }

 private:
  bool idle() const { return operations_ == 0 && grow_calls_ == 0 && give_back_calls_ == 0; }
  void notify_if_idle() {
    if (idle()) done_.notify_all();
  }

  int operations_ = 0;
  size_t grow_bytes_ = 0;
  int grow_calls_ = 0;
  size_t give_back_bytes_ = 0;
  int give_back_calls_ = 0;
  // Give-backs in flight per generation, from first_generation_ to the open one (the
  // last; never empty). Closed generations that drained are dropped from the front.
  std::deque<int> generation_calls_{0};
  uint64_t give_backs_ended_ = 0;
  Ticket first_generation_ = 0;
  Ticket open_generation() const { return first_generation_ + generation_calls_.size() - 1; }
  // Waited on with the device lock (a Mutex is BasicLockable).
  std::condition_variable_any done_;
};

}  // namespace devmem::internal
