// allocator/thread_cache.cc: see thread_cache.h.
#include "allocator/thread_cache.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "allocator/device_pool.h"

namespace devmem::internal {
namespace {

// (Unused under ThreadSanitizer, where the caches' mutexes replace the fences.)
[[maybe_unused]] int Membarrier(int cmd) {
  return static_cast<int>(syscall(__NR_membarrier, cmd, 0, 0));
}

// Registers for private expedited membarrier once; false where the kernel (or a
// seccomp filter) refuses, and always under ThreadSanitizer (the mutex is used there).
bool RegisterMembarrier() {
#if DEVMEM_TCACHE_MUTEX
  return false;
#else
  const int cmds = Membarrier(MEMBARRIER_CMD_QUERY);
  if (cmds < 0 || (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return Membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
#endif
}

// The thread's caches; the destructor runs at thread exit.
struct ThreadCaches {
  std::vector<ThreadCache*> list;
  ~ThreadCaches() {
    std::lock_guard<std::mutex> lock(tcache::RegistryMutex());
    for (ThreadCache* c : list) {
      // Alive: give every block back (DevicePool drains and unlists it). Detached: its
      // pool is gone, and so is the memory its blocks were in.
      if (c->pool != nullptr) c->pool->release_thread_cache(c);
      delete c;
    }
    list.clear();
    tcache::t_last = {};
    tcache::t_exited = true;
  }
};
thread_local ThreadCaches t_caches;

}  // namespace

bool ThreadCacheUsesMembarrier() {
  static const bool registered = RegisterMembarrier();
  return registered;
}

void ThreadCacheHeavyFence() {
#if DEVMEM_TCACHE_MUTEX
  // Under ThreadSanitizer each cache's mutex orders its owner against the quiescer
  // (revoke and wait_quiet take it): no fence is needed, and GCC's TSan does not
  // support one (-Wtsan).
#else
  if (ThreadCacheUsesMembarrier() && Membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) {
    return;
  }
  // Registered caches use only a compiler fence, so a failing membarrier must not
  // happen once registered (it cannot: registration is what makes the command valid).
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

ThreadCache::ThreadCache(DevicePool* p, uint64_t id, const ThreadCacheLimits& limits)
    : pool(p), pool_id(id), light_fence_(ThreadCacheUsesMembarrier()), limits_(limits) {
  const size_t bins = limits.max_size / kMinBlockSize;
  for (Slot& s : slots_) s.bins.resize(bins);
  reserve_site(63);  // the first sites a program interns: their hits need no lock
}

void ThreadCache::wait_quiet() const {
#if DEVMEM_TCACHE_MUTEX
  // Taking the mutex waits for an operation in progress; the owner's next one sees
  // revoke (set under the same mutex).
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(op_mu_));
#else
  // An operation is a few dozen instructions and never blocks: spin briefly, then
  // yield (the owner may have been preempted inside one).
  for (int spins = 0; in_op_.load(std::memory_order_acquire); ++spins) {
    if (spins > 64) std::this_thread::yield();
  }
#endif
}

void ThreadCache::reserve_site(SiteId site) {
  if (site < counters_.sites.size()) return;
  // Grow geometrically so the fast path rarely comes here; `dirty` can then hold every
  // site without reallocating during an operation.
  const size_t n = std::max<size_t>(site + 1, counters_.sites.size() * 2);
  counters_.dirty.reserve(n);
  counters_.sites.resize(n);
  site_windows_ = n;
}

void ThreadCache::reset_counters() {
  for (SiteId s : counters_.dirty) counters_.sites[s] = SiteWindow{};
  counters_.dirty.clear();
  counters_.bytes = WindowCounter{};
  counters_.count = WindowCounter{};
  counters_.requested = WindowCounter{};
}

namespace tcache {

std::mutex& RegistryMutex() {
  static std::mutex* mu = new std::mutex;  // never destroyed: thread exits may follow exit()
  return *mu;
}

uint64_t NewPoolId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

ThreadCache* FindSlow(uint64_t pool_id) {
  if (t_exited) return nullptr;
  for (ThreadCache* c : t_caches.list) {
    if (c->pool_id == pool_id) {
      t_last = {pool_id, c};
      return c;
    }
  }
  return nullptr;
}

void PrepareAdd() {
  // Caches of destroyed pools are dead weight: delete them here (the pool detached
  // them under the registry mutex, so reading `pool` is safe).
  auto& list = t_caches.list;
  list.erase(std::remove_if(list.begin(), list.end(),
                            [](ThreadCache* c) {
                              if (c->pool != nullptr) return false;
                              if (t_last.cache == c) t_last = {};
                              delete c;
                              return true;
                            }),
             list.end());
  list.reserve(list.size() + 1);
}

void Add(ThreadCache* cache) {
  t_caches.list.push_back(cache);  // reserved by PrepareAdd
  t_last = {cache->pool_id, cache};
}

}  // namespace tcache
}  // namespace devmem::internal
