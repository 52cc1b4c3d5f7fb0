// allocator/driver_calls.h: what a backend's driver calls cost, by kind.
//
// Every backend that talks to a driver counts each call it makes, by kind, and the
// time spent in them: measured around the call on CUDA (cuda/cuda_backend.cc),
// modelled by the sim backend's driver cost model (SimDriverCosts below; nothing is
// slept). DevicePool::stats() copies the backend's figures into
// DeviceStats::driver, so they reach the stats JSON, snapshots and /metrics
// (devmem_driver_calls_total{call=...}, docs/metrics.md). The kinds are a fixed, small
// set (a bounded metrics label); a backend counts a call under the kind whose CUDA
// call it makes or emulates.
//
// The physical-handle reserve: with virtual memory, unmapping keeps the physical
// allocation behind each granule (its cuMemCreate handle) instead of releasing it, so
// that the next map reuses it rather than calling cuMemCreate (7.6-193 us per 2 MiB
// on an A100). Its bytes are device memory still held: `handle_reserve_bytes`, counted
// by the expandable segments against the memory limit and released by every
// reclaim (trim, empty_cache, garbage collection, the OOM retry).
//
// Thread-safety: DriverCallCounter may be updated and read from any thread (relaxed
// atomics: each figure is exact, a read of several may mix moments).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>


namespace devmem {

enum class DriverCall : int {
  kMalloc = 0,       // cudaMalloc (a regular segment)
  kFree,             // cudaFree
  kAddressReserve,   // cuMemAddressReserve
  kAddressFree,      // cuMemAddressFree
  kCreate,           // cuMemCreate (one physical granule)
  kRelease,          // cuMemRelease
  kMap,              // cuMemMap (one handle)
  kUnmap,            // cuMemUnmap (one contiguous range)
  kSetAccess,        // cuMemSetAccess (one contiguous range, every device at once)
  kExport,           // cuMemExportToShareableHandle (one granule; allocator/ipc.h)
  kImport,           // cuMemImportFromShareableHandle (one granule)
};
inline constexpr int kNumDriverCalls = 11;
// The kinds before kExport: what files written before IPC calls were counted hold, and
// what the sim's driver cost model charges (the sim shares no memory, so it never
// exports or imports). Readers take the later kinds as 0 when a file lacks them.
inline constexpr int kNumDriverCallsBeforeIpc = static_cast<int>(DriverCall::kExport);

// "malloc", "free", "address_reserve", "address_free", "create", "release", "map",
// "unmap", "set_access", "export", "import": the metrics label and the JSON key.
std::string_view DriverCallName(DriverCall call);

// One device's driver figures since its backend was made (never reset: counters).
struct DriverCallStats {
  std::array<int64_t, kNumDriverCalls> calls{};
  std::array<int64_t, kNumDriverCalls> ns{};  // time in those calls (see the top)
  int64_t handle_reserve_bytes = 0;           // unmapped physical memory kept for reuse

  int64_t count(DriverCall c) const { return calls[static_cast<int>(c)]; }
  int64_t total_ns() const;
  friend bool operator==(const DriverCallStats&, const DriverCallStats&) = default;
};

// The accumulator a backend keeps.
class DriverCallCounter {
 public:
  void add(DriverCall call, int64_t n, int64_t ns) {
    calls_[static_cast<int>(call)].fetch_add(n, std::memory_order_relaxed);
    ns_[static_cast<int>(call)].fetch_add(ns, std::memory_order_relaxed);
  }
  // The counts and times (handle_reserve_bytes is the backend's to fill in).
  DriverCallStats read() const;

 private:
  std::array<std::atomic<int64_t>, kNumDriverCalls> calls_{};
  std::array<std::atomic<int64_t>, kNumDriverCalls> ns_{};
};

// The sim backend's driver cost model: nanoseconds per call of each kind. The
// defaults (A100Costs) are published A100 figures:
//   * cuMemCreate 7.6-193 us per 2 MiB, cuMemSetAccess 21-36 us, cuMemUnmap 11-26 us
//     (tails near 1 ms), cuMemMap about 1 us: kvcached's VMM microbenchmark; the model
//     takes the middle of each range (create 50 us, set_access 28 us, unmap 18 us,
//     map 1 us). cuMemRelease is taken as unmap's cost, cuMemAddressReserve/Free as
//     map's (cheap: no physical memory).
//   * cudaMalloc about 50 us for small and medium sizes, rising above 512 KiB (the
//     University of Virginia's CUDA memory-management overhead measurements,
//     cs.virginia.edu/~mwb7w/cuda_support/memory_management_overhead.html): the model
//     charges 50 us per cudaMalloc and per cudaFree (cudaFree also synchronizes the
//     device, which the model does not charge).
// The model charges per call, not per byte: a cuMemSetAccess or cuMemUnmap of a long
// range costs more on real hardware than one of 2 MiB, so for batched calls the
// estimate is a lower bound.
struct SimDriverCosts {
  std::array<uint64_t, kNumDriverCalls> ns{};
  friend bool operator==(const SimDriverCosts&, const SimDriverCosts&) = default;
};
SimDriverCosts A100Costs();
// The config key sim_driver_cost (docs/configuration.md): "a100" (the defaults),
// "none" (every call free), or '/'-separated call=microseconds overrides of the
// defaults ("create=193/unmap=26"; microseconds may be fractional, 0 .. 10^6). On a
// bad value returns why (naming the part), leaving *out unchanged.
std::string ParseSimDriverCosts(std::string_view text, SimDriverCosts* out);
// The canonical text of `costs`: "a100", "none", or the overrides that differ from
// A100Costs(), in DriverCall order.
std::string FormatSimDriverCosts(const SimDriverCosts& costs);

}  // namespace devmem
