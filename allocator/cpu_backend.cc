// allocator/cpu_backend.cc: the cpu backend (cpu_backend.h): jemalloc's mallocx and
// sdallocx on an arena of devmem's own.
#include "allocator/cpu_backend.h"

#include <jemalloc/jemalloc.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "allocator/config.h"

namespace devmem {
namespace {

constexpr size_t kCpuSegmentAlign = 4096;

// devmem's arena, created on first use. Arenas cannot be handed back while their
// memory may still be in use, so there is one per process (a function-local static:
// created once, thread-safe), shared by every cpu backend.
const absl::StatusOr<unsigned>& DevmemArena() {
  static const absl::StatusOr<unsigned> arena = []() -> absl::StatusOr<unsigned> {
    unsigned index = 0;
    size_t len = sizeof(index);
    if (int err = mallctl("arenas.create", &index, &len, nullptr, 0); err != 0) {
      return absl::InternalError(absl::StrCat(
          "cpu: jemalloc mallctl(\"arenas.create\") failed: ", std::strerror(err)));
    }
    return index;
  }();
  return arena;
}

// The flags of every mallocx/sdallocx pair: devmem's arena, page alignment, and no
// thread cache (segments are large and long-lived; a tcache would only hold them back
// from the arena).
int Flags(unsigned arena) {
  return MALLOCX_ARENA(arena) | MALLOCX_ALIGN(kCpuSegmentAlign) | MALLOCX_TCACHE_NONE;
}

size_t PageSize() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(DeviceId device) : device_(device) {}
  DeviceId device() const override { return device_; }
  Capabilities caps() const override {
    return Capabilities{
        .streams = false, .virtual_memory = false, .host_accessible = true};
  }
  DeviceInfo info() const override {
    return DeviceInfo{.name = "host (jemalloc)", .uuid = "", .backend = "cpu"};
  }

  absl::StatusOr<void*> allocate_segment(size_t bytes) override {
    // mallocx(0) is undefined behaviour in jemalloc.
    if (bytes == 0) return absl::InvalidArgumentError("cpu: allocate_segment of 0 bytes");
    const absl::StatusOr<unsigned>& arena = DevmemArena();
    if (!arena.ok()) return arena.status();
    void* p = mallocx(bytes, Flags(*arena));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu: out of memory: jemalloc mallocx could not allocate ",
                       FormatBytes(bytes), " (", bytes, " bytes)"));
    }
    return p;
  }

  void free_segment(void* p, size_t bytes) override {
    // allocate_segment succeeded, so the arena exists.
    sdallocx(p, bytes, Flags(*DevmemArena()));
  }

  // Physical and available memory of the machine (not of a cgroup limit, which the
  // kernel does not report through sysconf).
  MemInfo mem_info() override {
    const size_t page = PageSize();
    return MemInfo{.free_bytes = static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * page,
                   .total_bytes = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page};
  }

  absl::Status launch_host_fn(Stream stream, std::function<void()> fn) override {
    if (stream.handle != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cpu: launch_host_fn on stream ", stream.handle,
                       "; the cpu backend has only the default stream 0"));
    }
    if (!fn)
      return absl::InvalidArgumentError("cpu: launch_host_fn of an empty function");
    // Host work is synchronous: the "stream" has reached it at once. Marked as a
    // callback all the same, so the rule of backend.h holds on every backend.
    StreamCallbackScope scope;
    fn();
    return absl::OkStatus();
  }
  // Every event is complete when recorded; one nonzero handle serves for all.
  Event record_event(Stream) override { return Event{1}; }
  bool event_done(Event) override { return true; }
  void synchronize_event(Event) override {}
  void release_event(Event) override {}
  void synchronize_stream(Stream) override {}
 private:
  const DeviceId device_;
};

}  // namespace

std::unique_ptr<Backend> NewCpuBackend(DeviceId device) {
  return std::make_unique<CpuBackend>(device);
}

}  // namespace devmem
