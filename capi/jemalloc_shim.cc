// capi/jemalloc_shim.cc: the three jemalloc functions the cpu backend calls
// (allocator/cpu_backend.cc: mallctl, mallocx, sdallocx), defined inside libdevmem.so,
// which does not link jemalloc (capi/README.md has the details):
//
//   * Debian's libjemalloc.so.2 keeps its thread state in initial-exec TLS (its
//     DT_FLAGS say STATIC_TLS), so a library that needs it cannot be dlopen'ed by a
//     process that did not start with it: "cannot allocate memory in static TLS block"
//     is what Python's ctypes gets;
//   * it is unprefixed: it exports malloc, free and operator new/delete, which have no
//     business joining a process that has its own.
//
// These forward to the jemalloc already in the process (LD_PRELOAD=libjemalloc.so.2,
// or an executable linked with it), found with dlopen(RTLD_NOLOAD), or else to one
// dlopen'ed now with RTLD_LOCAL (its malloc stays out of the global scope), which
// fails wherever static TLS is short. Without jemalloc, mallctl fails with ENOSYS, so
// the cpu backend reports that it cannot create its arena, and the reason is printed
// once on stderr. The cpu device is the only user; cuda and sim never get here.
//
// The symbols are hidden by libdevmem.map, so they bind the cpu backend inside
// libdevmem.so only and never interpose on the process.
#include <dlfcn.h>
#include <jemalloc/jemalloc.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>

namespace {

using MallctlFn = int (*)(const char*, void*, size_t*, void*, size_t);
using MallocxFn = void* (*)(size_t, int);
using SdallocxFn = void (*)(void*, size_t, int);

struct Jemalloc {
  MallctlFn mallctl = nullptr;
  MallocxFn mallocx = nullptr;
  SdallocxFn sdallocx = nullptr;
};

constexpr const char* kJemallocSoname = "libjemalloc.so.2";

// Found once (a function-local static is initialized once, thread-safely).
const Jemalloc& Find() {
  static const Jemalloc found = [] {
    Jemalloc j;
    void* handle = dlopen(kJemallocSoname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (handle == nullptr) handle = dlopen(kJemallocSoname, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      std::fprintf(stderr,
                   "devmem: the cpu device needs jemalloc, which libdevmem.so could not "
                   "load (%s); start the process with LD_PRELOAD=%s to use it\n",
                   why != nullptr ? why : "unknown error", kJemallocSoname);
      return j;
    }
    Jemalloc loaded;
    loaded.mallctl = reinterpret_cast<MallctlFn>(dlsym(handle, "mallctl"));
    loaded.mallocx = reinterpret_cast<MallocxFn>(dlsym(handle, "mallocx"));
    loaded.sdallocx = reinterpret_cast<SdallocxFn>(dlsym(handle, "sdallocx"));
    if (loaded.mallctl == nullptr || loaded.mallocx == nullptr || loaded.sdallocx == nullptr) {
      std::fprintf(stderr, "devmem: %s lacks mallctl, mallocx or sdallocx\n",
                   kJemallocSoname);
      return j;
    }
    return loaded;
  }();
  return found;
}

}  // namespace

extern "C" {

int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen) {
  const Jemalloc& j = Find();
  if (j.mallctl == nullptr) return ENOSYS;
  return j.mallctl(name, oldp, oldlenp, newp, newlen);
}

void* mallocx(size_t size, int flags) {
  const Jemalloc& j = Find();
  if (j.mallocx == nullptr) return nullptr;
  return j.mallocx(size, flags);
}

void sdallocx(void* ptr, size_t size, int flags) {
  const Jemalloc& j = Find();
  if (j.sdallocx != nullptr) j.sdallocx(ptr, size, flags);
}

}  // extern "C"
