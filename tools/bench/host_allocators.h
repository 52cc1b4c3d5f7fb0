// tools/bench/host_allocators.h: the host allocators devmem-bench compares against,
// behind one shape: alloc(bytes) and free(ptr, bytes).
//
// jemalloc is always there (devmem's cpu backend links it); its mallocx/sdallocx with
// flags 0 go through its thread cache (tcache). mimalloc (Debian's libmimalloc-dev) is
// optional: the build records where the library is, and Mimalloc() loads it on first
// use (dlopen, RTLD_LOCAL); when that failed HaveMimalloc() is false and
// MimallocProblem() says why.
// mi_malloc/mi_free use mimalloc's thread-local heaps.
//
// Which malloc the process uses is not changed: mimalloc exports malloc too, so it is
// loaded locally instead of linked (linked, it would replace jemalloc, the process's
// malloc until then, and change what devmem's own host allocations cost).
//
// Thread-safety: all are thread-safe (the allocators' own guarantees; the loading is
// done once, under a function-local static's guard).
#pragma once

#include <cstddef>

namespace devmem::devbench {

void* JemallocAlloc(size_t bytes);
void JemallocFree(void* ptr, size_t bytes);

// mimalloc's entry points, loaded once; both null when it could not be loaded.
struct MimallocApi {
  void* (*malloc)(size_t) = nullptr;  // mi_malloc
  void (*free)(void*) = nullptr;      // mi_free
};
const MimallocApi& Mimalloc();
bool HaveMimalloc();
const char* MimallocProblem();  // "" when HaveMimalloc()

}  // namespace devmem::devbench
