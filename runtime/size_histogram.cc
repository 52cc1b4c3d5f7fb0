// runtime/size_histogram.cc: per-device power-of-two size counts, counted per thread.
//
// Structure: a device's index is claimed once in keys_ with a compare-and-swap (two
// devices reporting their first event at once take different indices; later events
// find it by a scan of a handful of loads). Counters live in shards: one per recording
// thread, each counter written by that thread only (relaxed load + relaxed store, no
// read-modify-write), read by counts() with relaxed loads. A shard's per-device
// counters are allocated by its owner on the device's first event and published with a
// release store. A thread remembers where it counted last (tls_last, in the header for
// the inline fast path), so a steady
// stream of allocations on one device costs one thread_local read, two compares and two
// load/store pairs.
//
// Ownership: a shard is shared by the histogram's list and the owning thread's
// thread_local table (shared_ptr), so either may go first: a thread that exits marks
// its shards free (release), and a histogram that dies leaves its shards to the threads
// still holding them. Handing a freed shard to a new thread happens under mu_ after an
// acquire load of its `in_use`, which orders the old owner's last stores before the new
// owner's first ones. A thread whose thread_local table is already destroyed (a later
// thread_local destructor that allocates) counts into the histogram's one shared shard,
// with read-modify-writes: rare, and correct.
#include "runtime/size_histogram.h"

#include <algorithm>
#include <bit>
#include <memory>
#include <utility>
#include <vector>

namespace devmem {

struct SizeHistogram::Shard {
  using DeviceCounts = SizeHistogram::DeviceCounts;  // (size_histogram.h)
  // By device index (keys_); null until the owner first records on that device.
  std::array<std::atomic<DeviceCounts*>, kMaxDevices> devices{};
  // True while a live thread owns the shard. Cleared (release) by the owner's exit; set
  // again only under the histogram's mu_.
  std::atomic<bool> in_use{true};

  ~Shard() {
    for (auto& d : devices) delete d.load(std::memory_order_relaxed);
  }

  // Counts one request into `c`, which belongs to a shard the calling thread owns.
  static void Bump(DeviceCounts& c, int bucket, size_t bytes) {
    size_histogram_internal::Bump(c.buckets[static_cast<size_t>(bucket)], 1);
    size_histogram_internal::Bump(c.sum_bytes, bytes);
  }

  // Owner only (not the shared shard): the counters of `device`, made on first use.
  DeviceCounts& owned_counts(int device) {
    DeviceCounts* c = devices[device].load(std::memory_order_relaxed);
    if (c == nullptr) {
      c = new DeviceCounts();
      devices[device].store(c, std::memory_order_release);  // publishes the zeroes
    }
    return *c;
  }

  // True for the one shard of a histogram that every thread may write (with
  // read-modify-writes): for threads whose thread_local table is already destroyed.
  bool shared = false;

  void add_shared(int device, int bucket, size_t bytes) {
    DeviceCounts* c = devices[device].load(std::memory_order_acquire);
    if (c == nullptr) {
      auto fresh = std::make_unique<DeviceCounts>();
      if (devices[device].compare_exchange_strong(c, fresh.get(), std::memory_order_acq_rel)) {
        c = fresh.release();
      }  // else c is the winner's
    }
    c->buckets[static_cast<size_t>(bucket)].fetch_add(1, std::memory_order_relaxed);
    c->sum_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
};

namespace {

std::atomic<uint64_t> g_next_histogram_id{1};

// The calling thread's shards, one per histogram it recorded into (usually one: the
// process's). Its destructor frees them for other threads to take over.
struct ThreadShards {
  struct Ref {
    uint64_t histogram_id;
    std::shared_ptr<SizeHistogram::Shard> shard;
  };
  std::vector<Ref> refs;
  ~ThreadShards();
};
thread_local ThreadShards tls_shards;
using size_histogram_internal::LastCounts;
using size_histogram_internal::tls_last;  // record()'s fast path (size_histogram.h)
// Set when this thread's tls_shards is destroyed (a thread_local destructor that runs
// later may still allocate). Trivially destructible, so it stays readable until the
// thread is gone.
thread_local bool tls_shards_destroyed = false;

ThreadShards::~ThreadShards() {
  tls_shards_destroyed = true;
  tls_last = LastCounts{};  // the shards go back: no fast path into them any more
  for (Ref& r : refs) r.shard->in_use.store(false, std::memory_order_release);
}

}  // namespace

SizeHistogram::SizeHistogram()
    : id_(g_next_histogram_id.fetch_add(1, std::memory_order_relaxed)) {
  auto shared = std::make_shared<Shard>();
  shared->shared = true;
  MutexLock lock(&mu_);
  shards_.push_back(std::move(shared));  // shards_.front(), never handed to a thread
}
SizeHistogram::~SizeHistogram() = default;

SizeHistogram& SizeHistogram::Process() {
  static SizeHistogram* const instance = new SizeHistogram();
  return *instance;
}

DeviceId SizeHistogram::DecodeDevice(uint32_t key) {
  return DeviceId{static_cast<DeviceType>(key >> 24), static_cast<int>((key & 0xFFFFFF) - 1)};
}

int SizeHistogram::device_index(DeviceId device) {
  const uint32_t key = EncodeDevice(device);
  for (int i = 0; i < kMaxDevices; ++i) {
    uint32_t seen = keys_[i].load(std::memory_order_acquire);
    if (seen == key) return i;
    if (seen == 0) {
      // Claim it; if another device won the race, keep scanning (it may have been
      // this same device, reported from another thread: compare again).
      if (keys_[i].compare_exchange_strong(seen, key, std::memory_order_acq_rel)) return i;
      if (seen == key) return i;
    }
  }
  return -1;
}

SizeHistogram::Shard& SizeHistogram::thread_shard() {
  if (tls_shards_destroyed) [[unlikely]] {
    MutexLock lock(&mu_);
    return *shards_.front();
  }
  // The first entry is the one looked at first: a thread records into one histogram.
  std::vector<ThreadShards::Ref>& refs = tls_shards.refs;
  if (!refs.empty() && refs.front().histogram_id == id_) return *refs.front().shard;
  for (ThreadShards::Ref& r : refs) {
    if (r.histogram_id == id_) return *r.shard;
  }
  return claim_shard();
}

SizeHistogram::Shard& SizeHistogram::claim_shard() {
  std::vector<ThreadShards::Ref>& refs = tls_shards.refs;
  // Drop the shards of histograms that died (this thread holds the last reference).
  std::erase_if(refs, [](const ThreadShards::Ref& r) { return r.shard.use_count() == 1; });
  std::shared_ptr<Shard> shard;
  {
    MutexLock lock(&mu_);
    for (const std::shared_ptr<Shard>& s : shards_) {
      if (!s->shared && !s->in_use.load(std::memory_order_acquire)) {  // its thread exited
        s->in_use.store(true, std::memory_order_relaxed);
        shard = s;
        break;
      }
    }
    if (shard == nullptr) shard = shards_.emplace_back(std::make_shared<Shard>());
  }
  refs.insert(refs.begin(), ThreadShards::Ref{id_, shard});
  return *shard;
}

void SizeHistogram::record_slow(DeviceId device, size_t requested) {
  const int index = device_index(device);
  if (index < 0) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  Shard& shard = thread_shard();
  if (shard.shared) {
    shard.add_shared(index, BucketOf(requested), requested);
    return;
  }
  Shard::DeviceCounts& counts = shard.owned_counts(index);
  Shard::Bump(counts, BucketOf(requested), requested);
  tls_last = LastCounts{id_, device, &counts};
}

void SizeHistogram::record_event_slow(const AllocEvent& event) {
  record_slow(event.device, event.requested);
}

std::vector<SizeHistogram::Counts> SizeHistogram::counts() const {
  std::vector<Counts> out;
  MutexLock lock(&mu_);
  for (int i = 0; i < kMaxDevices; ++i) {
    const uint32_t key = keys_[i].load(std::memory_order_acquire);
    if (key == 0) continue;
    Counts& c = out.emplace_back();
    c.device = DecodeDevice(key);
    for (const std::shared_ptr<Shard>& shard : shards_) {
      const Shard::DeviceCounts* d = shard->devices[i].load(std::memory_order_acquire);
      if (d == nullptr) continue;
      for (int b = 0; b < kNumBuckets; ++b) {
        c.buckets[b] += d->buckets[b].load(std::memory_order_relaxed);
      }
      c.sum_bytes += d->sum_bytes.load(std::memory_order_relaxed);
    }
    for (uint64_t n : c.buckets) c.count += n;
  }
  std::sort(out.begin(), out.end(),
            [](const Counts& a, const Counts& b) { return a.device < b.device; });
  return out;
}

size_t SizeHistogram::shard_count() const {
  MutexLock lock(&mu_);
  return shards_.size() - 1;  // not the shared one
}

}  // namespace devmem
