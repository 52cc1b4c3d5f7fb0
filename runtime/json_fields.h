// runtime/json_fields.h: the statistics fields of devmem's JSON formats, one table each
// kind (docs/formats.md, "stats"). The writer (runtime/json.cc) and the reader
// (runtime/json_reader.cc) both walk these tables, so a field written is a field read.
// Internal to the runtime; constexpr data only, no JSON library here.
#pragma once

#include <cstdint>

#include "allocator/stats.h"

namespace devmem::json_fields {

struct StatArrayField {
  const char* name;
  StatArray DeviceStats::*member;
};
inline constexpr StatArrayField kStatArrays[] = {
    {"allocation", &DeviceStats::allocation},
    {"segment", &DeviceStats::segment},
    {"active", &DeviceStats::active},
    {"inactive_split", &DeviceStats::inactive_split},
    {"allocated_bytes", &DeviceStats::allocated_bytes},
    {"reserved_bytes", &DeviceStats::reserved_bytes},
    {"active_bytes", &DeviceStats::active_bytes},
    {"inactive_split_bytes", &DeviceStats::inactive_split_bytes},
    {"requested_bytes", &DeviceStats::requested_bytes},
    {"pending_bytes", &DeviceStats::pending_bytes},
};
struct StatField {
  const char* name;
  Stat DeviceStats::*member;
};
inline constexpr StatField kStats[] = {
    {"oversize_allocations", &DeviceStats::oversize_allocations},
    {"oversize_segments", &DeviceStats::oversize_segments},
};
struct CounterField {
  const char* name;
  int64_t DeviceStats::*member;
};
inline constexpr CounterField kCounters[] = {
    {"num_alloc_retries", &DeviceStats::num_alloc_retries},
    {"num_ooms", &DeviceStats::num_ooms},
    {"num_device_alloc", &DeviceStats::num_device_alloc},
    {"num_device_free", &DeviceStats::num_device_free},
    {"num_sync_all_streams", &DeviceStats::num_sync_all_streams},
    {"cache_hits", &DeviceStats::cache_hits},
    {"cache_misses", &DeviceStats::cache_misses},
    {"num_frees", &DeviceStats::num_frees},
    {"max_split_size", &DeviceStats::max_split_size},
};
// Written always, read when present (files from before private pools have none).
inline constexpr CounterField kOptionalCounters[] = {
    {"private_pools", &DeviceStats::private_pools},
    {"private_reserved_bytes", &DeviceStats::private_reserved_bytes},
    {"private_allocated_bytes", &DeviceStats::private_allocated_bytes},
};
inline constexpr const char* kPoolNames[kNumStatPools] = {"all", "small", "large"};

}  // namespace devmem::json_fields
