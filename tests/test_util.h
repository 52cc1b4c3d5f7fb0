// tests/test_util.h: helpers shared by the allocator tests.
//
//   auto t = devmem::testutil::MakeSimAllocator("sim_capacity:64MiB,max_split_size_mb:32");
//   void* p = t->allocate(1000);
//   t.sim->used_bytes();            // the SimBackend behind the allocator
//   EXPECT_VALID(*t);               // validate() is OK
//
// Everything here uses only the public API of allocator/ (stats(), snapshot(),
// validate(), find_allocation(), site_stats()) so the tests stay independent of the
// implementation's internals.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "allocator/backend.h"
#include "allocator/backend_factory.h"
#include "allocator/caching_allocator.h"
#include "allocator/config.h"
#include "allocator/observer.h"
#include "allocator/oom_report.h"
#include "allocator/sim_backend.h"
#include "allocator/snapshot.h"
#include "allocator/stats.h"

namespace devmem::testutil {

// Rounds `n` up to a multiple of `unit` (a power of two).
constexpr size_t RoundUp(size_t n, size_t unit) { return (n + unit - 1) / unit * unit; }

// Parses `conf` (DEVMEM_CONF syntax) on top of a sim-backed Config whose capacity is
// `default_capacity` unless `conf` names sim_capacity itself. Expandable segments are
// off unless `conf` turns them on: most policy tests pin the regular-segment policy
// (the one a backend without virtual memory gets), and the sim backend would otherwise
// use expandable segments by default (expandable_segments:auto; DefaultPolicyTest
// covers that default).
inline Config MakeSimConfig(std::string_view conf, size_t default_capacity = kGiB) {
  Config base;
  base.backend = BackendKind::kSim;
  base.sim_capacity = default_capacity;
  base.expandable_segments = ExpandableMode::kOff;
  if (conf.empty()) return base;
  absl::StatusOr<Config> parsed = ParseConfig(conf, base);
  EXPECT_TRUE(parsed.ok()) << "bad test config \"" << conf << "\": " << parsed.status();
  if (!parsed.ok()) return base;
  parsed->backend = BackendKind::kSim;
  return *parsed;
}

// A CachingAllocator on a fresh simulated device, plus the SimBackend it owns.
struct SimAllocator {
  std::unique_ptr<CachingAllocator> alloc;
  SimBackend* sim = nullptr;  // owned by `alloc`; null if the factory gave another type
  Config config;

  CachingAllocator* operator->() const { return alloc.get(); }
  CachingAllocator& operator*() const { return *alloc; }
  CachingAllocator* get() const { return alloc.get(); }
};

inline SimAllocator MakeSimAllocator(std::string_view conf = "",
                                     size_t default_capacity = kGiB) {
  SimAllocator t;
  t.config = MakeSimConfig(conf, default_capacity);
  std::unique_ptr<Backend> backend = MakeSimBackend(t.config, /*index=*/0);
  EXPECT_NE(backend, nullptr);
  t.sim = dynamic_cast<SimBackend*>(backend.get());
  EXPECT_NE(t.sim, nullptr) << "MakeSimBackend did not return a SimBackend";
  t.alloc = std::make_unique<CachingAllocator>(std::move(backend), t.config);
  return t;
}

// Creates a stream on the allocator's backend (fails the test if it cannot).
inline Stream NewStream(CachingAllocator& alloc) {
  absl::StatusOr<Stream> s = alloc.backend().create_stream();
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Stream{};
}

// Reads the seed of a randomized test: DEVMEM_TEST_SEED when set, else `fallback`.
inline uint64_t TestSeed(uint64_t fallback) {
  const char* env = std::getenv("DEVMEM_TEST_SEED");
  uint64_t seed = 0;
  if (env != nullptr && *env != '\0' && absl::SimpleAtoi(env, &seed)) return seed;
  return fallback;
}

// Reads a positive integer from the environment (for scaling randomized tests).
inline uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* env = std::getenv(name);
  uint64_t value = 0;
  if (env != nullptr && *env != '\0' && absl::SimpleAtoi(env, &value) && value > 0) {
    return value;
  }
  return fallback;
}

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// --- validate() -------------------------------------------------------------------

inline ::testing::AssertionResult IsValid(const CachingAllocator& alloc) {
  absl::Status s = alloc.validate();
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "validate() failed: " << s;
}
#define EXPECT_VALID(alloc) EXPECT_TRUE(::devmem::testutil::IsValid(alloc))
#define ASSERT_VALID(alloc) ASSERT_TRUE(::devmem::testutil::IsValid(alloc))

// --- stats ------------------------------------------------------------------------

inline std::string StatString(const Stat& s) {
  return absl::StrCat("{current=", s.current, " peak=", s.peak, " allocated=", s.allocated,
                      " freed=", s.freed, "}");
}

// Compares every field of two DeviceStats and names the ones that differ.
inline ::testing::AssertionResult StatsEqual(const DeviceStats& a, const DeviceStats& b) {
  std::ostringstream diff;
  auto arr = [&](const char* name, const StatArray& x, const StatArray& y) {
    static constexpr const char* kPools[] = {"aggregate", "small", "large"};
    for (int i = 0; i < kNumStatPools; ++i) {
      if (!(x[i] == y[i])) {
        diff << "\n  " << name << "[" << kPools[i] << "]: " << StatString(x[i]) << " vs "
             << StatString(y[i]);
      }
    }
  };
  auto one = [&](const char* name, const Stat& x, const Stat& y) {
    if (!(x == y)) diff << "\n  " << name << ": " << StatString(x) << " vs " << StatString(y);
  };
  auto num = [&](const char* name, int64_t x, int64_t y) {
    if (x != y) diff << "\n  " << name << ": " << x << " vs " << y;
  };
  arr("allocation", a.allocation, b.allocation);
  arr("segment", a.segment, b.segment);
  arr("active", a.active, b.active);
  arr("inactive_split", a.inactive_split, b.inactive_split);
  arr("allocated_bytes", a.allocated_bytes, b.allocated_bytes);
  arr("reserved_bytes", a.reserved_bytes, b.reserved_bytes);
  arr("active_bytes", a.active_bytes, b.active_bytes);
  arr("inactive_split_bytes", a.inactive_split_bytes, b.inactive_split_bytes);
  arr("requested_bytes", a.requested_bytes, b.requested_bytes);
  arr("pending_bytes", a.pending_bytes, b.pending_bytes);
  arr("thread_cached", a.thread_cached, b.thread_cached);
  arr("thread_cached_bytes", a.thread_cached_bytes, b.thread_cached_bytes);
  one("oversize_allocations", a.oversize_allocations, b.oversize_allocations);
  one("oversize_segments", a.oversize_segments, b.oversize_segments);
  num("num_alloc_retries", a.num_alloc_retries, b.num_alloc_retries);
  num("num_ooms", a.num_ooms, b.num_ooms);
  num("num_device_alloc", a.num_device_alloc, b.num_device_alloc);
  num("num_device_free", a.num_device_free, b.num_device_free);
  num("num_sync_all_streams", a.num_sync_all_streams, b.num_sync_all_streams);
  num("cache_hits", a.cache_hits, b.cache_hits);
  num("cache_misses", a.cache_misses, b.cache_misses);
  num("num_frees", a.num_frees, b.num_frees);
  num("max_split_size", a.max_split_size, b.max_split_size);
  std::string d = diff.str();
  if (d.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "stats differ (before vs after):" << d;
}

// current == allocated - freed and peak >= current for every Stat.
inline ::testing::AssertionResult StatIdentitiesHold(const DeviceStats& s) {
  std::ostringstream bad;
  auto check = [&](const char* name, int pool, const Stat& x) {
    if (x.current != x.allocated - x.freed || x.peak < x.current || x.current < 0) {
      bad << "\n  " << name << "[" << pool << "] " << StatString(x);
    }
  };
  auto arr = [&](const char* name, const StatArray& x) {
    for (int i = 0; i < kNumStatPools; ++i) check(name, i, x[i]);
    // the aggregate is the sum of the two pools
    if (x[kAggregatePool].current !=
        x[kSmallPool].current + x[kLargePool].current) {
      bad << "\n  " << name << ": aggregate current " << x[kAggregatePool].current
          << " != small " << x[kSmallPool].current << " + large "
          << x[kLargePool].current;
    }
  };
  arr("allocation", s.allocation);
  arr("segment", s.segment);
  arr("active", s.active);
  arr("inactive_split", s.inactive_split);
  arr("allocated_bytes", s.allocated_bytes);
  arr("reserved_bytes", s.reserved_bytes);
  arr("active_bytes", s.active_bytes);
  arr("inactive_split_bytes", s.inactive_split_bytes);
  arr("requested_bytes", s.requested_bytes);
  arr("pending_bytes", s.pending_bytes);
  arr("thread_cached", s.thread_cached);
  arr("thread_cached_bytes", s.thread_cached_bytes);
  check("oversize_allocations", 0, s.oversize_allocations);
  check("oversize_segments", 0, s.oversize_segments);
  for (int i = 0; i < kNumStatPools; ++i) {
    if (s.active_bytes[i].current !=
        s.allocated_bytes[i].current + s.pending_bytes[i].current) {
      bad << "\n  active_bytes[" << i << "] != allocated + pending";
    }
    if (s.reserved_bytes[i].current < s.active_bytes[i].current) {
      bad << "\n  reserved_bytes[" << i << "] < active_bytes";
    }
  }
  std::string b = bad.str();
  if (b.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "stat identities broken:" << b;
}

// The report of the OutOfMemoryError that `f` throws; nullopt (and a failure for any
// other exception) when it throws none.
template <typename F>
std::optional<OomReport> CatchOom(F&& f) {
  try {
    f();
  } catch (const OutOfMemoryError& e) {
    return e.report();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception: " << e.what();
  }
  return std::nullopt;
}

// --- snapshot ---------------------------------------------------------------------

inline const SegmentInfo* FindSegment(const AllocatorSnapshot& snap, const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  for (const SegmentInfo& s : snap.segments) {
    if (a >= s.addr && a < s.addr + s.size) return &s;
  }
  return nullptr;
}

inline const BlockInfo* FindBlock(const AllocatorSnapshot& snap, const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  for (const SegmentInfo& s : snap.segments) {
    for (const BlockInfo& b : s.blocks) {
      if (b.addr == a) return &b;
    }
  }
  return nullptr;
}

// The pointers point into `snap`: never pass a temporary snapshot.
const SegmentInfo* FindSegment(AllocatorSnapshot&&, const void*) = delete;
const BlockInfo* FindBlock(AllocatorSnapshot&&, const void*) = delete;

inline size_t CountSegments(const AllocatorSnapshot& snap, std::optional<bool> small = {}) {
  size_t n = 0;
  for (const SegmentInfo& s : snap.segments) {
    if (!small.has_value() || s.small_pool == *small) ++n;
  }
  return n;
}

// Checks the snapshot's own promises: segments in address order, blocks tiling each
// segment exactly, no two adjacent free blocks.
inline ::testing::AssertionResult SnapshotWellFormed(const AllocatorSnapshot& snap) {
  uintptr_t prev_end = 0;
  for (const SegmentInfo& s : snap.segments) {
    if (s.addr < prev_end) {
      return ::testing::AssertionFailure()
             << "segments out of order or overlapping at 0x" << std::hex << s.addr;
    }
    prev_end = s.addr + s.size;
    uintptr_t at = s.addr;
    bool prev_free = false;
    for (const BlockInfo& b : s.blocks) {
      if (b.addr != at || b.size == 0) {
        return ::testing::AssertionFailure()
               << "blocks do not tile segment 0x" << std::hex << s.addr << " at 0x" << at;
      }
      bool is_free = b.state == BlockState::kFree;
      if (is_free && prev_free) {
        return ::testing::AssertionFailure()
               << "adjacent free blocks left uncoalesced at 0x" << std::hex << b.addr;
      }
      prev_free = is_free;
      at += b.size;
    }
    if (at != s.addr + s.size) {
      return ::testing::AssertionFailure()
             << "blocks of segment 0x" << std::hex << s.addr << " end at 0x" << at
             << " not at 0x" << s.addr + s.size;
    }
  }
  return ::testing::AssertionSuccess();
}

// --- site stats -------------------------------------------------------------------

inline SiteStats SiteStatsFor(const std::vector<SiteStats>& all, SiteId site) {
  return site < all.size() ? all[site] : SiteStats{};
}

// --- streams ----------------------------------------------------------------------

// Holds a stream's worker inside a host function until Release() (or destruction), so
// events recorded on that stream stay incomplete. Declare it AFTER the allocator so it
// is destroyed (released) first, or the allocator's destructor would wait forever.
class StreamBlocker {
 public:
  StreamBlocker(Backend& backend, Stream stream) : future_(promise_.get_future().share()) {
    std::shared_future<void> f = future_;
    absl::Status s = backend.launch_host_fn(stream, [f] { f.wait(); });
    EXPECT_TRUE(s.ok()) << s;
  }
  ~StreamBlocker() { Release(); }
  StreamBlocker(const StreamBlocker&) = delete;
  StreamBlocker& operator=(const StreamBlocker&) = delete;

  void Release() {
    std::call_once(released_, [this] { promise_.set_value(); });
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_;
  std::once_flag released_;
};

// --- observer ---------------------------------------------------------------------

class RecordingObserver : public AllocatorObserver {
 public:
  void on_event(const AllocEvent& event) override {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(event);
  }
  void on_oom(const OomReport& report) override {
    std::lock_guard<std::mutex> lock(mu_);
    ooms_.push_back(report);
    events_at_oom_.push_back(events_.size());
  }
  std::vector<AllocEvent> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  // Events except the kinds in `skip`.
  std::vector<AllocEvent> events_without(std::initializer_list<AllocAction> skip) const {
    std::vector<AllocEvent> out;
    for (const AllocEvent& e : events()) {
      if (std::find(skip.begin(), skip.end(), e.action) == skip.end()) out.push_back(e);
    }
    return out;
  }
  std::vector<OomReport> ooms() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ooms_;
  }
  std::vector<size_t> events_at_oom() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_at_oom_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    events_.clear();
    ooms_.clear();
    events_at_oom_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::vector<AllocEvent> events_;
  std::vector<OomReport> ooms_;
  std::vector<size_t> events_at_oom_;
};

inline std::string EventString(const AllocEvent& e) {
  return absl::StrCat(std::string(AllocActionName(e.action)), "{addr=0x", absl::Hex(e.addr),
                      " size=", e.size, " requested=", e.requested, " site=", e.site,
                      " stream=", e.stream.handle, "}");
}

// --- messages ---------------------------------------------------------------------

inline std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// True when `text` names the pointer `p` in hex (as %p or 0x... print it; case and
// leading zeros ignored).
inline bool MentionsPointer(std::string_view text, const void* p) {
  std::string hex = absl::StrCat(absl::Hex(reinterpret_cast<uintptr_t>(p)));
  return Lower(text).find(hex) != std::string::npos;
}

// True when `text` names the size `n` in decimal or in hex.
inline bool MentionsSize(std::string_view text, size_t n) {
  std::string lower = Lower(text);
  return lower.find(std::to_string(n)) != std::string::npos ||
         lower.find(absl::StrCat("0x", absl::Hex(n))) != std::string::npos;
}

}  // namespace devmem::testutil
