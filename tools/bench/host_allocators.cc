// tools/bench/host_allocators.cc: see host_allocators.h.
#include "tools/bench/host_allocators.h"

#include <jemalloc/jemalloc.h>

#include <cstdlib>
#include <string>

#if defined(DEVMEM_BENCH_MIMALLOC)
#include <dlfcn.h>
#endif

namespace devmem::devbench {
namespace {

struct LoadedMimalloc {
  MimallocApi api;
  std::string problem;
};

const LoadedMimalloc& LoadMimalloc() {
  static const LoadedMimalloc* const mi = [] {
    auto* m = new LoadedMimalloc();  // never destroyed: pointers into it are used until exit
#if defined(DEVMEM_BENCH_MIMALLOC)
    // Never closed: mimalloc keeps per-thread state until the process exits.
    void* lib = dlopen(DEVMEM_BENCH_MIMALLOC, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      m->problem = std::string("cannot load mimalloc: ") + dlerror();
      return m;
    }
    MimallocApi api;
    api.malloc = reinterpret_cast<void* (*)(size_t)>(dlsym(lib, "mi_malloc"));
    api.free = reinterpret_cast<void (*)(void*)>(dlsym(lib, "mi_free"));
    if (api.malloc == nullptr || api.free == nullptr) {
      m->problem = std::string(DEVMEM_BENCH_MIMALLOC) + " has no mi_malloc/mi_free";
    } else {
      m->api = api;
    }
#else
    m->problem = "built without mimalloc (Debian's libmimalloc-dev; scripts/setup.sh installs it)";
#endif
    return m;
  }();
  return *mi;
}

}  // namespace

void* JemallocAlloc(size_t bytes) { return mallocx(bytes, 0); }
void JemallocFree(void* ptr, size_t bytes) { sdallocx(ptr, bytes, 0); }

const MimallocApi& Mimalloc() { return LoadMimalloc().api; }
bool HaveMimalloc() { return Mimalloc().malloc != nullptr; }
const char* MimallocProblem() { return LoadMimalloc().problem.c_str(); }

}  // namespace devmem::devbench
