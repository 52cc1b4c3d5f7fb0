// allocator/ipc.h: sharing a block of device memory with another process (IPC).
//
// cudaIpcGetMemHandle works on cudaMalloc'd memory only; a block of an expandable
// segment is virtual-memory mappings, one physical allocation per granule. Such a
// block is exported as one POSIX file descriptor per granule it touches
// (cuMemExportToShareableHandle with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, which
// the segments request when they are created) plus the block's offset into the first
// granule and its size. The file descriptors cross to the other process by SCM_RIGHTS
// over a unix socket (sendmsg: at most 253 per message) or pidfd_getfd(2); the rest of
// the handle is plain bytes. The importer maps the granules, in order, into an address
// range of its own (cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess for its
// device), and the block starts at that range plus `offset`.
//
// Lifetime: the exporter must keep the block allocated until every importer closed
// it (the physical memory lives while a mapping or a descriptor refers to it, but the
// exporter's allocator may hand the block to other work once it is freed). The file
// descriptors belong to whoever holds the handle: CloseIpcFds closes them; importing
// does not (close them once imported).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace devmem {

struct IpcHandle {
  enum class Kind : uint32_t {
    kPosixFd = 2,  // an expandable segment's block: fds, one per granule
  };
  Kind kind = Kind::kPosixFd;
  int device = 0;         // the exporting device's index
  uint64_t offset = 0;    // the block's start from the start of the first granule
  uint64_t size = 0;      // the block's bytes
  uint64_t granule = 0;   // bytes behind each file descriptor
  std::vector<int> fds;   // in address order
};

// Closes the handle's file descriptors (the exporter's after sending them; the
// importer's after importing) and empties the list.
void CloseIpcFds(IpcHandle& handle);

// What a backend offers for IPC (the CUDA backend; tests' fakes). Separate from
// Backend so that only backends with processes to share with implement it: callers
// find it with dynamic_cast. Thread-safe.
class IpcBackend {
 public:
  virtual ~IpcBackend() = default;
  // Exports [p, p + bytes), the whole of an allocated block. Errors name the pointer:
  // InvalidArgument when it is not mapped memory of this device (a regular segment's
  // block: use cudaIpcGetMemHandle on its segment), FailedPrecondition when the
  // mappings were not made shareable (no POSIX file-descriptor handles on this
  // driver), or the driver's error. Nothing is left open on an error.
  virtual absl::StatusOr<IpcHandle> ipc_export(const void* p, size_t bytes) = 0;
  // Maps a handle exported by another process into this one, for this device; returns
  // the block's address. The fds stay the caller's. Errors name what was wrong with
  // the handle, or the driver's call and error; nothing stays mapped on an error.
  virtual absl::StatusOr<void*> ipc_import(const IpcHandle& handle) = 0;
  // Unmaps what ipc_import returned. InvalidArgument for any other pointer.
  virtual absl::Status ipc_close(void* p) = 0;
};

class CachingAllocator;
// Exports the allocated block that starts at `ptr` (what allocate() returned) of
// `alloc`: IpcBackend::ipc_export of the whole block. InvalidArgument naming the
// pointer when it is not the start of an allocated block, Unimplemented naming the
// device when its backend has no IPC (sim, cpu); else ipc_export's errors.
absl::StatusOr<IpcHandle> IpcExport(const CachingAllocator& alloc, const void* ptr);
// `alloc`'s backend as an IpcBackend, or Unimplemented naming the device.
absl::StatusOr<IpcBackend*> IpcOf(const CachingAllocator& alloc);

}  // namespace devmem
