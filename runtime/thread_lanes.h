// runtime/thread_lanes.h: per-thread lanes of objects that threads write into, given
// back when a thread exits, and only to objects that still exist.
//
// A TraceRing (runtime/trace.h) and a FlightRecorder (runtime/flight_recorder.h) each
// give every thread that records into them a lane of its own (one writer per lane: no
// lock on the hot path), taken on the thread's first event. When the thread exits its
// lanes go back to their owners, so that the next thread reuses them. But an owner may
// be destroyed before a thread that wrote into it exits (a test's ring, a recorder the
// runtime replaced): the exiting thread must then not touch it. So owners are known by
// a uid (never reused, never 0), live owners are listed by uid in a registry, and a
// thread's exit gives each of its lanes back only to an owner the registry still lists,
// under the registry's mutex, which an owner's Unregister also takes: an owner being
// destroyed waits for an exit in progress, and an exit after it finds nothing.
//
// The registry is leaked on purpose: threads may exit after static destructors ran
// (a detached thread, the main thread's own thread_locals at exit()).
//
// Use: a policy struct names the owner, its lane handle and two functions, and is the
// owner's friend if ReleaseLane is private:
//
//   struct MyLanes {
//     using Owner = MyRing;
//     using Lane = MyRing::Lane*;          // copyable, cheap: a pointer or an index
//     static void Release(Owner* owner, Lane lane) { owner->ReleaseLane(lane); }
//     static void Forget() { tls_uid = 0; }  // the hot path's own cache: forget it
//   };
//   using Lanes = ThreadLanes<MyLanes>;
//   MyRing::MyRing() : uid_(Lanes::NewUid()) { ...; Lanes::Register(uid_, this); }
//   MyRing::~MyRing() { Lanes::Unregister(uid_); ... }
//   // cold path, the thread's first event into this ring:
//   if (const Lane* l = Lanes::Find(uid_)) ... else Lanes::Remember(uid_, AcquireLane());
//
// The hot path does not use this header: each owner keeps its own constinit
// thread_local (the last owner's uid and lane), one thread-pointer-relative load, and
// comes here only when that misses.
//
// Thread-safety: every function may be called from any thread. Release is called at
// thread exit, under the registry's mutex, at most once per lane Remember recorded, and
// only while the owner is registered. Forget is called at the end of a thread's exit,
// after every Release.
#pragma once

#include <atomic>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "allocator/mutex.h"

namespace devmem {

template <typename Policy>
class ThreadLanes {
 public:
  using Owner = typename Policy::Owner;
  using Lane = typename Policy::Lane;

  // A new owner identity: 1, 2, ... per policy, never reused (so a thread's cached
  // lane of a destroyed owner never matches a new owner at the same address).
  static uint64_t NewUid() {
    static std::atomic<uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  // `owner` exists under `uid` until Unregister(uid). Registering last in the owner's
  // constructor (nothing after it throws) and unregistering first in its destructor
  // keeps thread exits to fully built owners. Throws std::bad_alloc (nothing changed).
  static void Register(uint64_t uid, Owner* owner) {
    Registry& r = Live();
    MutexLock lock(&r.mu);
    r.owners.emplace(uid, owner);
  }
  // After it returns, no thread's exit touches the owner (one in progress has ended).
  static void Unregister(uint64_t uid) {
    Registry& r = Live();
    MutexLock lock(&r.mu);
    r.owners.erase(uid);
  }

  // The calling thread's lane in the owner `uid`, or null if it has none there.
  static const Lane* Find(uint64_t uid) {
    for (const auto& [u, lane] : ThisThread().lanes) {
      if (u == uid) return &lane;
    }
    return nullptr;
  }
  // The calling thread holds `lane` of the owner `uid` until it exits. Out of memory,
  // the lane is not remembered and so never given back (the owner has one lane fewer
  // for later threads; no error, since this runs on an allocation's path).
  static void Remember(uint64_t uid, Lane lane) noexcept {
    try {
      ThisThread().lanes.emplace_back(uid, lane);
    } catch (...) {
    }
  }

 private:
  struct Registry {
    Mutex mu;
    std::unordered_map<uint64_t, Owner*> owners ABSL_GUARDED_BY(mu);
  };
  static Registry& Live() {
    static Registry* registry = new Registry;  // leaked: see the file comment
    return *registry;
  }

  // A thread's lanes in every owner it recorded into; gives them back when it exits.
  struct Cache {
    std::vector<std::pair<uint64_t, Lane>> lanes;
    ~Cache() {
      {
        Registry& r = Live();
        MutexLock lock(&r.mu);
        for (const auto& [uid, lane] : lanes) {
          auto it = r.owners.find(uid);
          if (it != r.owners.end()) Policy::Release(it->second, lane);
        }
      }
      lanes.clear();
      Policy::Forget();
    }
  };
  static Cache& ThisThread() {
    thread_local Cache cache;
    return cache;
  }
};

}  // namespace devmem
