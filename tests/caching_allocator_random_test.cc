// tests/caching_allocator_random_test.cc: model-based randomized tests of
// CachingAllocator.
//
// Two threads run random operations (allocations of log-uniform sizes 1 B .. 32 MiB on
// three streams, frees, record_stream with real work on the other stream, empty_cache,
// trim, process_events) against one allocator on a 256 MiB sim device, so OOM is
// frequent. A shadow model checks what the allocator promises:
//   * live buffers never overlap (one interval map per allocator, under a mutex);
//   * every buffer keeps the pattern written into it (first and last 64 bytes and a few
//     words in between, derived from a hash of the buffer's id) until it is freed;
//   * work queued on another stream with record_stream() reads the same pattern, so a
//     block handed out again before that work ran shows up as corruption;
//   * validate() passes every few thousand operations, and at the end the counters
//     equal the operations done and nothing leaks.
// With arenas on (TwoThreadsArenaScopes), each thread also opens and closes scoped
// arenas at random (nested up to 3 deep, on any of the streams, several chunk sizes),
// so its requests are bumps or pool allocations by the rules of allocator/arena.h,
// which the test predicts: the counters must then add up with the bumps and the
// chunks (every allocation is a bump or a pool block, every chunk goes back). A request
// the innermost scope would serve may instead be spilled to the pool by the waste
// bound, which depends on both threads' frees: the model reads the scope's spill count
// around each such request (TwoThreadsArenaScopesWasteBoundOff: none, ever).
//
// Seeded and reproducible per thread (thread interleaving aside): the seed is printed
// on failure; DEVMEM_TEST_SEED overrides it, DEVMEM_TEST_RANDOM_OPS sets the operations
// per thread. No timing assertions.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/arena.h"
#include "allocator/caching_allocator.h"
#include "allocator/errors.h"
#include "allocator/oom_report.h"
#include "allocator/sim_backend.h"
#include "allocator/site.h"
#include "tests/test_util.h"

namespace devmem {
namespace {

using testutil::MakeSimAllocator;
using testutil::NewStream;
using testutil::SimAllocator;
using testutil::SplitMix64;

constexpr uint64_t kDefaultOpsPerThread = 500'000;

// --- the pattern ----------------------------------------------------------------------

inline uint8_t PatternByte(uint64_t id, size_t pos) {
  return static_cast<uint8_t>(SplitMix64(id * 0x100000001b3ULL + pos) >> 24);
}

// Calls f(pos) for each byte position of the pattern of an n-byte buffer.
template <typename F>
inline void ForEachPatternByte(size_t n, F&& f) {
  const size_t head = std::min<size_t>(n, 64);
  for (size_t i = 0; i < head; ++i) f(i);
  const size_t tail_start = n > 64 ? std::max<size_t>(head, n - 64) : n;
  for (size_t i = tail_start; i < n; ++i) f(i);
  if (n > 256) {
    for (size_t at : {n / 4, n / 2, (3 * n) / 4}) {
      for (size_t i = at; i < at + 8; ++i) f(i);
    }
  }
}

inline void FillPattern(void* p, size_t n, uint64_t id) {
  auto* b = static_cast<uint8_t*>(p);
  ForEachPatternByte(n, [&](size_t i) { b[i] = PatternByte(id, i); });
}

// Returns the first bad position, or SIZE_MAX when the pattern is intact.
inline size_t CheckPattern(const void* p, size_t n, uint64_t id) {
  const auto* b = static_cast<const volatile uint8_t*>(p);
  size_t bad = SIZE_MAX;
  ForEachPatternByte(n, [&](size_t i) {
    if (bad == SIZE_MAX && b[i] != PatternByte(id, i)) bad = i;
  });
  return bad;
}

struct Buf {
  void* p;
  size_t n;
  uint64_t id;
  Stream stream;
  bool recorded = false;  // record_stream was called on it
};

// A set of disjoint half-open address ranges (adjacent ones merged).
class IntervalSet {
 public:
  bool Overlaps(uintptr_t a, uintptr_t b) const {
    auto it = r_.upper_bound(a);
    if (it != r_.begin() && std::prev(it)->second > a) return true;
    return it != r_.end() && it->first < b;
  }
  bool Covers(uintptr_t a, uintptr_t b) const {
    auto it = r_.upper_bound(a);
    if (it == r_.begin()) return false;
    --it;
    return it->first <= a && it->second >= b;
  }
  // False when [a, b) overlaps what is there.
  bool Add(uintptr_t a, uintptr_t b) {
    if (Overlaps(a, b)) return false;
    auto next = r_.lower_bound(a);
    if (next != r_.end() && next->first == b) {
      b = next->second;
      next = r_.erase(next);
    }
    if (next != r_.begin()) {
      auto prev = std::prev(next);
      if (prev->second == a) {
        prev->second = b;
        return true;
      }
    }
    r_[a] = b;
    return true;
  }
  // False when [a, b) is not wholly inside one range.
  bool Remove(uintptr_t a, uintptr_t b) {
    if (!Covers(a, b)) return false;
    auto it = std::prev(r_.upper_bound(a));
    const uintptr_t start = it->first, end = it->second;
    r_.erase(it);
    if (start < a) r_[start] = a;
    if (b < end) r_[b] = end;
    return true;
  }

 private:
  std::map<uintptr_t, uintptr_t> r_;
};

// Replays the allocator's event stream (delivered in order, under the device lock)
// against a model: a block may be handed out only over mapped memory that no live or
// pending block uses; memory may be released only when no block uses it; a block whose
// free waits for other streams (the test tells which: those it called record_stream on)
// stays busy until kFreeCompleted.
class ModelObserver : public AllocatorObserver {
 public:
  // Called by the test before free(p) of a block it called record_stream on.
  void ExpectPending(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    recorded_.insert(reinterpret_cast<uintptr_t>(p));
  }

  void on_event(const AllocEvent& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++events_;
    const uintptr_t a = e.addr, b = e.addr + e.size;
    switch (e.action) {
      case AllocAction::kSegmentAlloc:
      case AllocAction::kSegmentMap:
        if (e.size > 0 && !mapped_.Add(a, b)) Violation(e, "memory mapped twice");
        break;
      case AllocAction::kSegmentFree:
      case AllocAction::kSegmentUnmap:
        if (e.size == 0) break;
        if (busy_.Overlaps(a, b)) Violation(e, "memory released while a block in it is live or pending");
        if (!mapped_.Remove(a, b)) Violation(e, "released memory that was not mapped");
        break;
      case AllocAction::kAlloc:
        if (!mapped_.Covers(a, b)) Violation(e, "block handed out over unmapped memory");
        if (!busy_.Add(a, b)) Violation(e, "block handed out over a live or pending block");
        sizes_[a] = e.size;
        recorded_.erase(a);
        break;
      case AllocAction::kFree: {
        auto it = sizes_.find(a);
        if (it == sizes_.end() || it->second != e.size) {
          Violation(e, "free of a block the model does not hold with that size");
          break;
        }
        if (recorded_.erase(a) > 0) {
          pending_.insert(a);  // stays busy until kFreeCompleted
        } else {
          busy_.Remove(a, b);
          sizes_.erase(it);
        }
        break;
      }
      case AllocAction::kFreeCompleted: {
        if (pending_.erase(a) == 0) break;  // an immediate free may report this too
        auto it = sizes_.find(a);
        if (it == sizes_.end() || it->second != e.size) {
          Violation(e, "free completed with another size than the block's");
          break;
        }
        busy_.Remove(a, b);
        sizes_.erase(it);
        ++completed_;
        break;
      }
      default:
        break;
    }
  }

  std::string violation() const {
    std::lock_guard<std::mutex> lock(mu_);
    return violation_;
  }
  int64_t events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  int64_t completed() const {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_;
  }
  size_t pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_.size();
  }

 private:
  void Violation(const AllocEvent& e, const char* what) {
    if (violation_.empty()) {
      violation_ = absl::StrCat("event #", events_, " ", testutil::EventString(e), ": ", what);
    }
  }

  mutable std::mutex mu_;
  IntervalSet mapped_;
  IntervalSet busy_;
  std::map<uintptr_t, size_t> sizes_;  // busy block start -> size
  std::set<uintptr_t> recorded_;       // blocks whose free will be pending
  std::set<uintptr_t> pending_;
  std::string violation_;
  int64_t events_ = 0;
  int64_t completed_ = 0;
};

// --- the shared model -----------------------------------------------------------------

struct Shared {
  CachingAllocator* alloc = nullptr;
  Backend* backend = nullptr;
  std::vector<Stream> streams;
  uint64_t seed = 0;
  bool arenas = false;  // threads open and close scoped arenas at random
  // With arenas, validate() runs with the other threads between operations (each
  // operation holds this shared, validate exclusively): its arena checks are exact
  // only while no arena buffer is allocated or freed (allocator/arena_internal.h).
  std::shared_mutex gate;

  std::mutex mu;  // guards ranges and failure
  std::map<uintptr_t, std::pair<uintptr_t, uint64_t>> ranges;  // start -> (end, id)
  std::string failure;
  std::atomic<bool> failed{false};

  std::atomic<int64_t> stream_checks{0};
  std::atomic<int64_t> stream_checks_done{0};
  ModelObserver* model = nullptr;

  // Buffers handed from one thread to the other (freed or used by the receiver).
  std::mutex mailbox_mu;
  std::vector<Buf> mailbox;

  void Fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (failure.empty()) failure = why;
    failed = true;
  }

  void Insert(void* p, size_t n, uint64_t id) {
    auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu);
    auto next = ranges.lower_bound(a);
    std::string bad;
    if (next != ranges.end() && next->first < a + n) {
      bad = absl::StrCat("new buffer 0x", absl::Hex(a), "+", n, " (id ", id,
                         ") overlaps live 0x", absl::Hex(next->first), "..0x",
                         absl::Hex(next->second.first), " (id ", next->second.second, ")");
    } else if (next != ranges.begin() && std::prev(next)->second.first > a) {
      auto prev = std::prev(next);
      bad = absl::StrCat("new buffer 0x", absl::Hex(a), "+", n, " (id ", id,
                         ") overlaps live 0x", absl::Hex(prev->first), "..0x",
                         absl::Hex(prev->second.first), " (id ", prev->second.second, ")");
    }
    if (!bad.empty()) {
      if (failure.empty()) failure = bad;
      failed = true;
    }
    ranges[a] = {a + n, id};
  }

  void Erase(void* p) {
    std::lock_guard<std::mutex> lock(mu);
    ranges.erase(reinterpret_cast<uintptr_t>(p));
  }
};

struct ThreadResult {
  int64_t allocs = 0;
  int64_t zero_allocs = 0;
  int64_t frees = 0;
  int64_t ooms = 0;
  int64_t record_streams = 0;
  int64_t validates = 0;
  int64_t handed_off = 0;
  int64_t bumps = 0;   // allocations the test predicted an arena serves
  int64_t spills = 0;  // of the requests it predicted one would serve, those the waste
                       // bound sent to the pool instead
  int64_t scopes = 0;  // scopes opened
  SiteId site = kUnknownSite;
};

size_t RandomSize(std::mt19937_64& rng) {
  static constexpr size_t kBoundaries[] = {
      1, 511, 512, 513, kMiB - 512, kMiB, kMiB + 1, 2 * kMiB, 10 * kMiB - 512, 10 * kMiB,
      10 * kMiB + 1, 20 * kMiB, 19 * kMiB};
  if (rng() % 32 == 0) return kBoundaries[rng() % std::size(kBoundaries)];
  // log-uniform in [1, 32 MiB]
  double e = std::uniform_real_distribution<double>(0.0, 25.0)(rng);
  return std::max<size_t>(1, static_cast<size_t>(std::exp2(e)));
}

void RunThread(Shared& sh, int index, uint64_t ops, size_t max_live, ThreadResult* out) {
  std::mt19937_64 rng(SplitMix64(sh.seed + 0x9e37 * (index + 1)));
  CachingAllocator& a = *sh.alloc;
  std::vector<Buf> live;
  live.reserve(max_live + 1);
  uint64_t next_id = (uint64_t{static_cast<uint32_t>(index) + 1} << 48);
  ThreadResult& r = *out;

  auto free_at = [&](size_t i) {
    Buf b = live[i];
    live[i] = live.back();
    live.pop_back();
    size_t bad = CheckPattern(b.p, b.n, b.id);
    if (bad != SIZE_MAX) {
      sh.Fail(absl::StrCat("thread ", index, ": buffer id ", b.id, " at 0x",
                           absl::Hex(reinterpret_cast<uintptr_t>(b.p)), " size ", b.n,
                           " corrupted at byte ", bad, " before its free"));
    }
    sh.Erase(b.p);
    if (b.recorded && sh.model != nullptr) sh.model->ExpectPending(b.p);
    a.free(b.p);
    ++r.frees;
  };

  // Arenas: this thread's open scopes, innermost last, with what decides whether a
  // request is a bump (allocator/arena.h: the innermost scope's stream, at most a
  // quarter of its chunk size).
  struct OpenScope {
    std::unique_ptr<ArenaScope> scope;
    Stream stream;
    size_t max_request;
  };
  std::vector<OpenScope> scopes;
  static constexpr size_t kChunkSizes[] = {64 * kKiB, kMiB, 4 * kMiB};

  for (uint64_t op = 0; op < ops && !sh.failed; ++op) {
    std::shared_lock<std::shared_mutex> op_gate(sh.gate, std::defer_lock);
    if (sh.arenas) op_gate.lock();
    if (sh.arenas) {
      // Drawn only with arenas on, so the other tests keep their sequences.
      const int scope_dice = static_cast<int>(rng() % 100);
      try {
        if (scope_dice < 2 && scopes.size() < 3) {
          const size_t chunk = kChunkSizes[rng() % std::size(kChunkSizes)];
          const Stream s = sh.streams[rng() % sh.streams.size()];
          scopes.push_back({std::make_unique<ArenaScope>(
                                a, rng() % 2 == 0 ? "fwd" : "bwd",
                                ArenaOptions{.chunk_size = chunk, .stream = s,
                                             .max_waste_fraction = {}}),
                            s, chunk / 4});
          ++r.scopes;
        } else if (scope_dice < 4 && !scopes.empty()) {
          scopes.back().scope->close();
          scopes.pop_back();
        }
      } catch (const std::exception& e) {
        sh.Fail(absl::StrCat("thread ", index, " op ", op, ": scope: ", e.what()));
      }
    }
    const int dice = static_cast<int>(rng() % 1000);
    try {
      if (live.size() >= max_live || (dice < 420 && !live.empty())) {
        free_at(rng() % live.size());
      } else if (dice < 900 || live.empty()) {
        const size_t n = RandomSize(rng);
        const Stream s = sh.streams[rng() % sh.streams.size()];
        void* p = nullptr;
        // The innermost scope serves this request (a bump) unless its waste bound sends
        // it to the pool (a spill, allocator/arena.h "Waste"): whether it does depends
        // on both threads' frees, so the model reads the scope's own count, which only
        // this thread writes, before and after.
        const bool arena_request =
            !scopes.empty() && scopes.back().stream == s && n <= scopes.back().max_request;
        const int64_t spills_before =
            arena_request ? scopes.back().scope->summary().spills : 0;
        try {
          p = a.allocate(n, s, r.site);
        } catch (const OutOfMemoryError&) {
          ++r.ooms;
          // A spilled request can fail in the pool like any other.
          if (arena_request && scopes.back().scope->summary().spills != spills_before) {
            ++r.spills;
          }
          // Make room as a program would: drop about half of what this thread holds.
          size_t drop = (live.size() + 1) / 2;
          for (size_t k = 0; k < drop && !live.empty(); ++k) free_at(rng() % live.size());
          continue;
        }
        if (p == nullptr) {
          sh.Fail(absl::StrCat("allocate(", n, ") returned nullptr"));
          break;
        }
        if (reinterpret_cast<uintptr_t>(p) % 512 != 0) {
          sh.Fail(absl::StrCat("allocate(", n, ") returned unaligned ", absl::Hex(reinterpret_cast<uintptr_t>(p))));
        }
        const uint64_t id = next_id++;
        ++r.allocs;
        const bool spilled =
            arena_request && scopes.back().scope->summary().spills != spills_before;
        if (spilled && scopes.back().scope->summary().spills != spills_before + 1) {
          sh.Fail(absl::StrCat("allocate(", n, ") counted more than one spill"));
        }
        const bool bump = arena_request && !spilled;
        r.bumps += bump ? 1 : 0;
        r.spills += spilled ? 1 : 0;
        sh.Insert(p, n, id);
        FillPattern(p, n, id);
        live.push_back({p, n, id, s});
        if ((op & 63) == 0) {
          // An arena buffer's requested size is its rounded size (no per-buffer count).
          std::optional<BlockInfo> info = a.find_allocation(p);
          if (!info.has_value() || info->size < n ||
              (bump ? info->requested != info->size : info->requested != n) ||
              info->stream != s || info->state != BlockState::kAllocated ||
              info->site != r.site) {
            sh.Fail(absl::StrCat("find_allocation disagrees for a fresh ", n,
                                 "-byte block"));
          }
        }
      } else if (dice < 940) {
        // Another stream uses the buffer: declare it, and queue work there that reads
        // the pattern (sometimes slowly), so an early reuse shows as corruption.
        Buf& b = live[rng() % live.size()];
        Stream other = b.stream;
        while (other == b.stream) other = sh.streams[rng() % sh.streams.size()];
        a.record_stream(b.p, other);
        b.recorded = true;
        ++r.record_streams;
        const bool slow = rng() % 8 == 0;
        const void* p = b.p;
        const size_t n = b.n;
        const uint64_t id = b.id;
        Shared* shp = &sh;
        shp->stream_checks++;
        absl::Status st = sh.backend->launch_host_fn(other, [shp, p, n, id, slow, index] {
          size_t bad = CheckPattern(p, n, id);
          if (bad == SIZE_MAX && slow) {
            std::this_thread::sleep_for(std::chrono::microseconds(50));
            bad = CheckPattern(p, n, id);
          }
          if (bad != SIZE_MAX) {
            shp->Fail(absl::StrCat("stream work of thread ", index, " saw buffer id ", id,
                                   " at 0x", absl::Hex(reinterpret_cast<uintptr_t>(p)),
                                   " size ", n, " overwritten at byte ", bad,
                                   ": the block was reused before the stream reached its free"));
          }
          shp->stream_checks_done++;
        });
        if (!st.ok()) sh.Fail(absl::StrCat("launch_host_fn: ", st.ToString()));
      } else if (dice < 950) {
        a.process_events();
      } else if (dice < 955) {
        // Hand a buffer to the other thread.
        size_t i = rng() % live.size();
        {
          std::lock_guard<std::mutex> lock(sh.mailbox_mu);
          sh.mailbox.push_back(live[i]);
        }
        live[i] = live.back();
        live.pop_back();
        ++r.handed_off;
      } else if (dice < 960) {
        // Adopt a buffer the other thread handed over (it may be freed here later).
        std::lock_guard<std::mutex> lock(sh.mailbox_mu);
        if (!sh.mailbox.empty() && live.size() < max_live) {
          live.push_back(sh.mailbox.back());
          sh.mailbox.pop_back();
        }
      } else if (dice < 961) {
        if (a.allocate(0, sh.streams[rng() % sh.streams.size()]) != nullptr) {
          sh.Fail("allocate(0) returned non-null");
        }
        ++r.zero_allocs;
        a.free(nullptr);
      } else if (dice < 963 && rng() % 4 == 0) {
        a.empty_cache();
      } else if (dice < 965 && rng() % 4 == 0) {
        a.trim(std::uniform_int_distribution<size_t>(0, 128 * kMiB)(rng));
      } else if (!live.empty()) {
        free_at(rng() % live.size());
      }
    } catch (const OutOfMemoryError& e) {
      sh.Fail(absl::StrCat("thread ", index, " op ", op,
                           ": OutOfMemoryError from a call that does not allocate: ",
                           e.what()));
    } catch (const InvalidArgumentError& e) {
      sh.Fail(absl::StrCat("thread ", index, " op ", op, ": InvalidArgumentError: ", e.what()));
    } catch (const std::exception& e) {
      sh.Fail(absl::StrCat("thread ", index, " op ", op, ": ", typeid(e).name(), ": ",
                           e.what()));
    }
    if ((op + 1) % 4096 == 0) {
      std::unique_lock<std::shared_mutex> quiet(sh.gate, std::defer_lock);
      if (sh.arenas) {
        op_gate.unlock();
        quiet.lock();
      }
      absl::Status v = a.validate();
      ++r.validates;
      if (!v.ok()) {
        sh.Fail(absl::StrCat("thread ", index, " op ", op, ": validate(): ", v.ToString()));
      }
    }
  }
  std::shared_lock<std::shared_mutex> final_gate(sh.gate, std::defer_lock);
  if (sh.arenas) final_gate.lock();
  while (!live.empty()) {
    try {
      free_at(live.size() - 1);
    } catch (const std::exception& e) {
      sh.Fail(absl::StrCat("thread ", index, " final free: ", e.what()));
      break;
    }
  }
  // Innermost first, as a program's scopes end (the mailbox's buffers escape them).
  while (!scopes.empty()) {
    try {
      scopes.back().scope->close();
    } catch (const std::exception& e) {
      sh.Fail(absl::StrCat("thread ", index, " final close: ", e.what()));
    }
    scopes.pop_back();
  }
}

void ThreadsThreeStreams(const std::string& conf, uint64_t default_seed, uint64_t ops,
                         int threads, bool arenas = false) {
  const uint64_t seed = testutil::TestSeed(default_seed);
  const bool expandable = conf.find("expandable_segments:true") != std::string::npos;
  SCOPED_TRACE(absl::StrCat("seed=", seed, " ops/thread=", ops, " conf=", conf,
                            " (rerun with DEVMEM_TEST_SEED=", seed, ")"));
  // Declared before the allocator: the streams' host functions use it until the
  // allocator (and its backend) are gone.
  Shared sh;
  ModelObserver model;  // outlives the allocator
  SimAllocator t = MakeSimAllocator(conf);
  ASSERT_NE(t.sim, nullptr);
  t->set_observer(&model);
  sh.model = &model;
  sh.alloc = t.get();
  sh.backend = &t->backend();
  sh.seed = seed;
  sh.arenas = arenas;
  sh.streams = {Stream{}, NewStream(*t), NewStream(*t)};

  std::vector<ThreadResult> results(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  for (int i = 0; i < threads; ++i) {
    results[i].site = InternNamedSite("random_test.cc", i + 1, absl::StrCat("thread", i),
                                      i % 2 == 0 ? SiteKind::kAlloc : SiteKind::kClone);
    // 500 live buffers in all, as the two-thread runs always had.
    const size_t max_live = threads == 2 ? (i == 0 ? 300 : 200) : 500 / threads;
    workers.emplace_back(RunThread, std::ref(sh), i, ops, max_live, &results[i]);
  }
  for (std::thread& w : workers) w.join();
  // Buffers still in the mailbox: free them here (the pattern must be intact).
  for (const Buf& b : sh.mailbox) {
    EXPECT_EQ(CheckPattern(b.p, b.n, b.id), SIZE_MAX) << "mailbox buffer " << b.id;
    if (b.recorded) model.ExpectPending(b.p);
    t->free(b.p);
    ++results[0].frees;
  }
  sh.mailbox.clear();

  for (Stream s : sh.streams) t->backend().synchronize_stream(s);
  t->process_events();
  EXPECT_FALSE(sh.failed.load()) << sh.failure;
  EXPECT_EQ(sh.stream_checks.load(), sh.stream_checks_done.load());
  EXPECT_EQ(model.violation(), "") << "the allocator's own event stream broke the model";
  EXPECT_EQ(model.pending(), 0u) << "pending frees never completed";

  int64_t allocs = 0, frees = 0, ooms = 0, records = 0, validates = 0, handed_off = 0;
  int64_t bumps = 0, scopes = 0, spills = 0;
  for (const ThreadResult& r : results) {
    bumps += r.bumps;
    spills += r.spills;
    scopes += r.scopes;
    allocs += r.allocs;
    frees += r.frees;
    ooms += r.ooms;
    records += r.record_streams;
    validates += r.validates;
    handed_off += r.handed_off;
  }
  std::cout << "[ random ] seed=" << seed << " allocs=" << allocs << " ooms=" << ooms
            << " record_streams=" << records << " validates="
            << validates
            << " pending_completed=" << model.completed()
            << " handed_off=" << handed_off << " bumps=" << bumps << " spills=" << spills
            << " scopes=" << scopes
            << " events=" << model.events() << std::endl;
  if (!sh.failed) {
    // The run exercised what it claims to.
    EXPECT_GT(ooms, static_cast<int64_t>(ops / 2000)) << "OOM was not frequent";
    EXPECT_GT(records, static_cast<int64_t>(ops / 100));
    EXPECT_GT(model.completed(), static_cast<int64_t>(ops / 200)) << "few pending frees";
    EXPECT_GT(allocs, static_cast<int64_t>(ops / 2));
    if (arenas) {
      EXPECT_GT(bumps, static_cast<int64_t>(ops / 100)) << "few bumps";
      EXPECT_GT(scopes, static_cast<int64_t>(ops / 200)) << "few scopes";
    }
    if (conf.find("thread_cache:false") == std::string::npos) {
      EXPECT_GT(t->stats().thread_cached[kAggregatePool].allocated, 0)
          << "no block ever entered a thread cache";
    }
  }
  EXPECT_EQ(allocs, frees);

  // With arenas, the pool's allocations are the requests that were not bumps plus the
  // chunks; the arenas counted exactly the bumps the test predicted. Every scope
  // closed, nothing is live in them.
  const ArenaReport arena_report = t->arena_report();
  int64_t arena_bumps = 0, chunk_allocs = 0, scopes_closed = 0, arena_spills = 0;
  for (const ArenaStats& a : arena_report.arenas) {
    arena_bumps += a.allocations;
    arena_spills += a.spills;
    chunk_allocs += a.pool_chunk_allocs;
    scopes_closed += a.scopes_closed;
    EXPECT_EQ(a.open_scopes, 0) << a.name;
  }
  EXPECT_EQ(arena_bumps, bumps);
  EXPECT_EQ(arena_spills, spills);
  if (conf.find("arena_max_waste:0") != std::string::npos) {
    EXPECT_EQ(spills, 0);
  }
  EXPECT_EQ(scopes_closed, scopes);
  EXPECT_EQ(arena_report.live_bytes, 0);
  const int64_t pool_allocs = allocs - bumps + chunk_allocs;

  DeviceStats s = t->stats();
  EXPECT_TRUE(testutil::StatIdentitiesHold(s));
  EXPECT_EQ(s.allocation[kAggregatePool].allocated, pool_allocs);
  // What is still allocated is the arenas' retained (empty) chunks, all of it.
  EXPECT_EQ(arena_report.chunks, arena_report.retained_chunks);
  EXPECT_EQ(s.allocation[kAggregatePool].current, arena_report.chunks);
  // A chunk is a request of its size; the pool's block may be larger (a remainder too
  // small to split stays with it), as for any request.
  EXPECT_EQ(s.requested_bytes[kAggregatePool].current, arena_report.chunk_bytes);
  EXPECT_GE(s.allocated_bytes[kAggregatePool].current, arena_report.chunk_bytes);
  EXPECT_EQ(s.pending_bytes[kAggregatePool].current, 0);
  // Chunks given back so far are pool frees too (the rest go back on empty_cache).
  EXPECT_EQ(s.num_frees, frees - bumps + arena_report.chunks_returned);
  EXPECT_EQ(s.num_ooms, ooms);
  EXPECT_GE(s.cache_hits + s.cache_misses, pool_allocs);
  EXPECT_LE(s.cache_hits + s.cache_misses, pool_allocs + ooms);
  if (!expandable) {  // with expandable segments these count maps and unmaps
    EXPECT_EQ(s.segment[kAggregatePool].allocated, s.num_device_alloc);
    EXPECT_EQ(s.segment[kAggregatePool].freed, s.num_device_free);
  }
  EXPECT_LE(s.reserved_bytes[kAggregatePool].peak, static_cast<int64_t>(256 * kMiB));
  // The device's charge: what is mapped or allocated, plus unmapped granules kept in
  // the handle reserve for the next map (allocator/driver_calls.h).
  EXPECT_EQ(s.reserved_bytes[kAggregatePool].current + s.driver.handle_reserve_bytes,
            static_cast<int64_t>(t.sim->used_bytes()));
  for (const ThreadResult& r : results) {
    SiteStats ss = testutil::SiteStatsFor(t->site_stats(), r.site);
    EXPECT_EQ(ss.total_count, r.allocs - r.bumps);  // bumps are not pool blocks
    EXPECT_EQ(ss.live_count, 0);
    EXPECT_EQ(ss.live_bytes, 0);
    EXPECT_LE(ss.peak_live_bytes, static_cast<int64_t>(256 * kMiB));
  }
  EXPECT_VALID(*t);
  t->empty_cache();
  EXPECT_EQ(t->stats().reserved_bytes[kAggregatePool].current, 0);
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  // Every chunk taken from the pool went back to it.
  EXPECT_EQ(t->arena_report().chunks, 0);
  EXPECT_EQ(t->arena_report().chunks_returned, chunk_allocs);
  EXPECT_EQ(t->stats().num_frees, frees - bumps + chunk_allocs);
  EXPECT_VALID(*t);
  EXPECT_EQ(model.violation(), "");
  t->set_observer(nullptr);
}

TEST(CachingAllocatorRandomTest, TwoThreadsThreeStreamsFrequentOom) {
  ThreadsThreeStreams(
      "sim_capacity:256MiB", 0x5eed0001,
      testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", kDefaultOpsPerThread), 2);
}

TEST(CachingAllocatorRandomTest, TwoThreadsMaxSplitAndGc) {
  ThreadsThreeStreams(
      "sim_capacity:256MiB,max_split_size_mb:24,garbage_collection_threshold:0.6", 0x5eed0003,
      testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", kDefaultOpsPerThread) / 4, 2);
}

// Scoped arenas opened and closed at random on both threads (any stream, nested),
// with buffers handed to the other thread and freed there, record_stream on arena
// buffers, empty_cache and trim while scopes are open, and frequent OOMs (the staged
// retry takes retained chunks back).
TEST(CachingAllocatorRandomTest, TwoThreadsArenaScopes) {
  ThreadsThreeStreams(
      "sim_capacity:256MiB", 0x5eed000b,
      testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", kDefaultOpsPerThread) / 4, 2, /*arenas=*/true);
}

// The same with the waste bound off: every request the innermost scope may serve is a
// bump (allocator/arena.h's rules without "Waste").
TEST(CachingAllocatorRandomTest, TwoThreadsArenaScopesWasteBoundOff) {
  ThreadsThreeStreams(
      "sim_capacity:256MiB,arena_max_waste:0", 0x5eed000c,
      testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", kDefaultOpsPerThread) / 8, 2, /*arenas=*/true);
}

TEST(CachingAllocatorRandomTest, TwoThreadsExpandableSegments) {
  ThreadsThreeStreams(
      "sim_capacity:256MiB,expandable_segments:true", 0x5eed0004,
      testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", kDefaultOpsPerThread) / 4, 2);
}

// Recycling on every growth (threshold 0) on a small device: runs split around holes
// and merge again all the time, across three streams, with frequent OOMs.
TEST(CachingAllocatorRandomTest, TwoThreadsExpandableRecycling) {
  ThreadsThreeStreams(
      "sim_capacity:96MiB,expandable_segments:true,expandable_recycle_threshold:0",
      0x5eed0006, testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", kDefaultOpsPerThread) / 4, 2);
}

// The same model with the thread caches off: the pool alone.
TEST(CachingAllocatorRandomTest, TwoThreadsNoThreadCaches) {
  ThreadsThreeStreams(
      "sim_capacity:256MiB,thread_cache:false", 0x5eed0008,
      testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", kDefaultOpsPerThread) / 4, 2);
}

// Four threads with thread caches (the default), buffers freed on other threads than
// their own, a small device (frequent OOMs, so the retry drains other threads' caches
// while they run) and small cache bounds (frequent flushes).
TEST(CachingAllocatorRandomTest, FourThreadsThreadCachesSmallDevice) {
  ThreadsThreeStreams(
      "sim_capacity:128MiB,thread_cache_max_blocks:16,thread_cache_max_bytes:512KiB",
      0x5eed0009, testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", kDefaultOpsPerThread) / 8, 4);
}

TEST(CachingAllocatorRandomTest, FourThreadsThreadCachesExpandable) {
  ThreadsThreeStreams(
      "sim_capacity:128MiB,expandable_segments:true", 0x5eed000a,
      testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", kDefaultOpsPerThread) / 8, 4);
}

// One thread, so the model can predict the allocation statistics exactly after every
// operation: allocated bytes and count, requested bytes, per pool; and reserved bytes
// always equal what the sim device has handed out.
void SingleThreadExactStatistics(const std::string& conf, uint64_t default_seed,
                                 uint64_t ops) {
  const uint64_t seed = testutil::TestSeed(default_seed);
  SCOPED_TRACE(absl::StrCat("seed=", seed, " ops=", ops, " conf=", conf,
                            " (rerun with DEVMEM_TEST_SEED=", seed, ")"));
  // Declared before the allocator: the streams' host functions use it.
  std::atomic<int64_t> stream_corruptions{0};
  SimAllocator t = MakeSimAllocator(conf);
  ASSERT_NE(t.sim, nullptr);
  std::vector<Stream> streams = {Stream{}, NewStream(*t), NewStream(*t)};
  std::mt19937_64 rng(SplitMix64(seed));
  struct Live {
    void* p;
    size_t n;
    size_t block;
    uint64_t id;
    Stream stream;
  };
  std::vector<Live> live;
  int64_t model_alloc[kNumStatPools] = {}, model_req[kNumStatPools] = {},
          model_count[kNumStatPools] = {};
  std::map<uintptr_t, uintptr_t> ranges;
  uint64_t next_id = 1;
  int64_t ooms = 0;

  auto pool_of = [](size_t block) { return block <= kMiB ? kSmallPool : kLargePool; };
  auto account = [&](const Live& b, int sign) {
    for (int pool : {static_cast<int>(kAggregatePool), static_cast<int>(pool_of(b.block))}) {
      model_alloc[pool] += sign * static_cast<int64_t>(b.block);
      model_req[pool] += sign * static_cast<int64_t>(b.n);
      model_count[pool] += sign;
    }
  };
  auto free_at = [&](size_t i) {
    Live b = live[i];
    live[i] = live.back();
    live.pop_back();
    size_t bad = CheckPattern(b.p, b.n, b.id);
    ASSERT_EQ(bad, SIZE_MAX) << "buffer id " << b.id << " corrupted at byte " << bad;
    ranges.erase(reinterpret_cast<uintptr_t>(b.p));
    t->free(b.p);
    account(b, -1);
  };

  for (uint64_t op = 0; op < ops; ++op) {
    SCOPED_TRACE(absl::StrCat("op ", op));
    const int dice = static_cast<int>(rng() % 100);
    if (live.size() >= 150 || (dice < 42 && !live.empty())) {
      free_at(rng() % live.size());
    } else if (dice < 90 || live.empty()) {
      const size_t n = RandomSize(rng);
      const Stream s = streams[rng() % streams.size()];
      void* p = nullptr;
      try {
        p = t->allocate(n, s);
      } catch (const OutOfMemoryError&) {
        ++ooms;
        size_t drop = (live.size() + 1) / 2;
        for (size_t k = 0; k < drop && !live.empty(); ++k) free_at(rng() % live.size());
        continue;
      }
      ASSERT_NE(p, nullptr);
      std::optional<BlockInfo> info = t->find_allocation(p);
      ASSERT_TRUE(info.has_value());
      ASSERT_GE(info->size, n);
      ASSERT_EQ(info->size % 512, 0u);
      // A block may be larger than the rounded request only by an unsplit rest: at
      // most 1 MiB in the large pool (or < 20 MiB for an oversize block).
      const size_t rounded = testutil::RoundUp(n, 512);
      if (rounded <= kMiB) {
        ASSERT_EQ(info->size, rounded) << "small-pool blocks are split down to 512 B";
      } else if (rounded < 24 * kMiB) {
        ASSERT_LE(info->size, rounded + kMiB) << "the large pool split rule";
      } else {
        ASSERT_LT(info->size, rounded + 20 * kMiB) << "the oversize waste rule";
      }
      const auto a = reinterpret_cast<uintptr_t>(p);
      auto next = ranges.lower_bound(a);
      ASSERT_TRUE(next == ranges.end() || next->first >= a + n) << "overlap";
      ASSERT_TRUE(next == ranges.begin() || std::prev(next)->second <= a) << "overlap";
      ranges[a] = a + n;
      Live b{p, n, info->size, next_id++, s};
      FillPattern(p, n, b.id);
      live.push_back(b);
      account(b, +1);
    } else if (dice < 95) {
      // record_stream with the other stream blocked only briefly: a sleeping host fn.
      const Live& b = live[rng() % live.size()];
      Stream other = b.stream;
      while (other == b.stream) other = streams[rng() % streams.size()];
      t->record_stream(b.p, other);
      const void* p = b.p;
      const size_t n = b.n;
      const uint64_t id = b.id;
      std::atomic<int64_t>* corruptions = &stream_corruptions;
      ASSERT_TRUE(t->backend()
                      .launch_host_fn(other,
                                      [p, n, id, corruptions] {
                                        std::this_thread::sleep_for(
                                            std::chrono::microseconds(20));
                                        if (CheckPattern(p, n, id) != SIZE_MAX) {
                                          corruptions->fetch_add(1);
                                        }
                                      })
                      .ok());
      ASSERT_EQ(stream_corruptions.load(), 0)
          << "stream work saw a buffer overwritten before the stream reached its free";
    } else if (dice < 97) {
      t->process_events();
    } else if (dice < 98) {
      t->trim(std::uniform_int_distribution<size_t>(0, 64 * kMiB)(rng));
    } else if (dice < 99 && rng() % 4 == 0) {
      t->empty_cache();
    } else if (!live.empty()) {
      free_at(rng() % live.size());
    }
    if (::testing::Test::HasFatalFailure()) return;

    DeviceStats s = t->stats();
    for (int pool = 0; pool < kNumStatPools; ++pool) {
      ASSERT_EQ(s.allocated_bytes[pool].current, model_alloc[pool]) << "pool " << pool;
      ASSERT_EQ(s.requested_bytes[pool].current, model_req[pool]) << "pool " << pool;
      ASSERT_EQ(s.allocation[pool].current, model_count[pool]) << "pool " << pool;
    }
    ASSERT_EQ(s.reserved_bytes[kAggregatePool].current + s.driver.handle_reserve_bytes,
              static_cast<int64_t>(t.sim->used_bytes()));
    ASSERT_LE(s.reserved_bytes[kAggregatePool].current, static_cast<int64_t>(128 * kMiB));
    ASSERT_EQ(s.num_ooms, ooms);
    if (op % 2048 == 0) {
      ASSERT_VALID(*t);
      ASSERT_TRUE(testutil::StatIdentitiesHold(s));
    }
  }
  while (!live.empty()) free_at(live.size() - 1);
  for (Stream s : streams) t->backend().synchronize_stream(s);
  EXPECT_EQ(stream_corruptions.load(), 0)
      << "stream work saw a buffer overwritten before the stream reached its free";
  t->empty_cache();
  EXPECT_EQ(t.sim->used_bytes(), 0u);
  EXPECT_GT(ooms, 10) << "OOM was not frequent";
  EXPECT_VALID(*t);
}

TEST(CachingAllocatorRandomTest, SingleThreadExactStatistics) {
  SingleThreadExactStatistics(
      "sim_capacity:128MiB,max_split_size_mb:24,garbage_collection_threshold:0.7",
      0x5eed0002, testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", kDefaultOpsPerThread) / 5);
}

TEST(CachingAllocatorRandomTest, SingleThreadExactStatisticsExpandable) {
  SingleThreadExactStatistics(
      "sim_capacity:128MiB,expandable_segments:true,garbage_collection_threshold:0.7",
      0x5eed0005, testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", kDefaultOpsPerThread) / 10);
}

TEST(CachingAllocatorRandomTest, SingleThreadExactStatisticsRecycling) {
  SingleThreadExactStatistics(
      "sim_capacity:128MiB,expandable_segments:true,expandable_recycle_threshold:0.05",
      0x5eed0007, testutil::EnvOr("DEVMEM_TEST_RANDOM_OPS", kDefaultOpsPerThread) / 10);
}

}  // namespace
}  // namespace devmem
