// allocator/ipc.cc: the allocator-side half of IPC (allocator/ipc.h): which block a
// pointer names, and which backend can export it.
#include "allocator/ipc.h"

#include <unistd.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/caching_allocator.h"

namespace devmem {

void CloseIpcFds(IpcHandle& handle) {
  for (int fd : handle.fds) {
    if (fd >= 0) close(fd);
  }
  handle.fds.clear();
}

absl::StatusOr<IpcBackend*> IpcOf(const CachingAllocator& alloc) {
  auto* ipc = dynamic_cast<IpcBackend*>(&alloc.backend());
  if (ipc == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        alloc.device().ToString(), ": this backend (", alloc.backend().info().backend,
        ") has no IPC: no other process can map its memory"));
  }
  return ipc;
}

absl::StatusOr<IpcHandle> IpcExport(const CachingAllocator& alloc, const void* ptr) {
  absl::StatusOr<IpcBackend*> ipc = IpcOf(alloc);
  if (!ipc.ok()) return ipc.status();
  // The block's extent, read under the device lock. The caller keeps the block
  // allocated while it is exported (ipc.h), so it cannot change under the export.
  const std::optional<BlockInfo> block = alloc.find_allocation(ptr);
  if (!block.has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: ipc_export(%p): not the start of an allocated block", alloc.device().ToString(),
        ptr));
  }
  return (*ipc)->ipc_export(ptr, block->size);
}

}  // namespace devmem
