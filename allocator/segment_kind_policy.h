// allocator/segment_kind_policy.h: which kind of segments a device's pool uses, from
// the expandable_segments key and what the backend offers (an internal header; a pure
// decision, pinned by tests/segment_kind_policy_test.cc's table).
//
// Expandable segments are virtual-memory mappings. On CUDA such memory is reachable
// by other devices only where access was granted (cuMemSetAccess) and by other
// processes only through a shareable handle (cudaIpcGetMemHandle does not work on
// it), so a program whose peer kernels, peer copies, NCCL buffers or IPC worked with
// cudaMalloc'd memory would fault or fail with them. Hence:
//   * false: regular segments;
//   * true: expandable wherever the backend has virtual memory management (the user
//     asked; peer access and IPC work only as far as the backend supports them);
//     otherwise regular, with a warning;
//   * auto (the default): expandable where the backend has virtual memory management
//     and either nothing else can reach its memory (the sim: one process, no peers;
//     SharingSupport::needed false) or its mappings support both peer access and IPC
//     (CUDA with the driver's POSIX file-descriptor handles); regular elsewhere,
//     silently.
#pragma once

#include <string_view>

#include "allocator/backend.h"
#include "allocator/config.h"

namespace devmem::internal {

enum class SegmentKind { kRegular, kExpandable };

struct SegmentKindDecision {
  SegmentKind kind = SegmentKind::kRegular;
  // Print a warning once for the device: expandable segments were asked for and
  // cannot be had.
  bool warn = false;
  std::string_view reason;  // why, in a few words (for the warning and the docs)
};

// `virtual_memory`: the backend implements reserve/map/unmap (caps().virtual_memory
// with a granularity > 0).
inline SegmentKindDecision DecideSegmentKind(ExpandableMode mode, bool virtual_memory,
                                             const SharingSupport& sharing) {
  if (mode == ExpandableMode::kOff) {
    return {SegmentKind::kRegular, false, "expandable_segments:false"};
  }
  if (!virtual_memory) {
    return {SegmentKind::kRegular, mode == ExpandableMode::kOn,
            "the backend has no virtual memory management"};
  }
  if (mode == ExpandableMode::kOn) {
    return {SegmentKind::kExpandable, false, "expandable_segments:true"};
  }
  if (!sharing.needed) {
    return {SegmentKind::kExpandable, false, "no other device or process reaches the memory"};
  }
  if (sharing.vmm_peer_access && sharing.vmm_ipc) {
    return {SegmentKind::kExpandable, false, "mappings support peer access and IPC"};
  }
  return {SegmentKind::kRegular, false,
          !sharing.vmm_peer_access ? "mappings lack peer access" : "mappings lack IPC"};
}

}  // namespace devmem::internal
