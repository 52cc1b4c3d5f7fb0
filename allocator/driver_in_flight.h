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
// Operations: a pool call that may release the lock for driver calls (the staged
// retry, trim, empty_cache, the poll's deferred recycles) is one from start to end, its
// gaps between calls included. begin_allocate_to_pool waits until none is under way
// and no call is in flight (wait_for_idle): once a capture may begin, no unlocked
// driver call of an earlier decision may still come.
//
// Invariants (validate): bytes are held exactly while calls are in flight.
// Thread-safety: guarded by the owning DevicePool's mutex, like the sources.
#pragma once

#include <condition_variable>
#include <cstddef>

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
  void begin_give_back(size_t bytes) {
    give_back_bytes_ += bytes;
    ++give_back_calls_;
  }
  // Wakes wait_for_give_backs() when the last one ends.
  void end_give_back(size_t bytes) {
    give_back_bytes_ -= bytes;
    if (--give_back_calls_ == 0) done_.notify_all();
  }

  // What the device holds (or is about to) beyond reserved_bytes: counted against the
  // memory limit.
  size_t bytes() const { return grow_bytes_ + give_back_bytes_; }
  size_t give_back_bytes() const { return give_back_bytes_; }
  int calls() const { return grow_calls_ + give_back_calls_; }

  // Returns once no give-back is in flight. `mu` is the device lock, held by the
  // caller; it is released while waiting (so the pool may change meanwhile).
  void wait_for_give_backs(Mutex* mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    done_.wait(*mu, [this] { return give_back_calls_ == 0; });
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
  // Waited on with the device lock (a Mutex is BasicLockable).
  std::condition_variable_any done_;
};

}  // namespace devmem::internal
