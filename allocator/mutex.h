// allocator/mutex.h: the mutexes devmem uses, annotated for clang's thread-safety
// analysis (ABSL_GUARDED_BY and friends) and visible to ThreadSanitizer.
//
// Why not absl::Mutex: Debian's Abseil is not built with ThreadSanitizer, so TSan cannot
// see absl::Mutex's happens-before edges and reports false races on every field it
// guards. These wrappers sit on std::mutex / std::shared_mutex (pthreads), which TSan
// intercepts, and keep the annotations.
//
//   Mutex mu_;  int n_ ABSL_GUARDED_BY(mu_);
//   { MutexLock lock(&mu_); ++n_; }
//   cv_.wait(lock, [&] { return n_ > 0; });   // CondVar works with MutexLock
#pragma once

#include <condition_variable>
#include <mutex>
#include <shared_mutex>

#include "absl/base/thread_annotations.h"

namespace devmem {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool try_lock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope. Not copyable or movable: it must release the mutex it
// took, on the thread that took it.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : lock_(mu->mu_) {}
  ~MutexLock() ABSL_UNLOCK_FUNCTION() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

// A condition variable waited on with a MutexLock held.
class CondVar {
 public:
  template <typename Predicate>
  void wait(MutexLock& lock, Predicate done) {
    cv_.wait(lock.native(), std::move(done));
  }
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

// A reader-writer mutex, for tables read far more often than written.
class ABSL_LOCKABLE SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void lock_shared() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void unlock_shared() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

class ABSL_SCOPED_LOCKABLE WriterLock {
 public:
  explicit WriterLock(SharedMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->lock();
  }
  ~WriterLock() ABSL_UNLOCK_FUNCTION() { mu_->unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex* mu_;
};

class ABSL_SCOPED_LOCKABLE ReaderLock {
 public:
  explicit ReaderLock(SharedMutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->lock_shared();
  }
  ~ReaderLock() ABSL_UNLOCK_FUNCTION() { mu_->unlock_shared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex* mu_;
};

}  // namespace devmem
