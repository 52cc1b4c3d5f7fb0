// tools/bench/perf_counter.cc: see perf_counter.h.
#include "tools/bench/perf_counter.h"

#if defined(__linux__)
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#endif

namespace devmem::devbench {

#if defined(__linux__)
InstructionCounter::InstructionCounter() {
  perf_event_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.type = PERF_TYPE_HARDWARE;
  attr.size = sizeof(attr);
  attr.config = PERF_COUNT_HW_INSTRUCTIONS;
  attr.disabled = 1;
  attr.exclude_kernel = 1;  // allowed at perf_event_paranoid <= 2
  attr.exclude_hv = 1;
  fd_ = static_cast<int>(syscall(SYS_perf_event_open, &attr, /*pid=*/0, /*cpu=*/-1,
                                 /*group_fd=*/-1, /*flags=*/0));
  if (fd_ < 0) {
    why_ = std::string("perf_event_open(instructions): ") + std::strerror(errno);
  }
}

InstructionCounter::~InstructionCounter() {
  if (fd_ >= 0) close(fd_);
}

void InstructionCounter::start() {
  ioctl(fd_, PERF_EVENT_IOC_RESET, 0);
  ioctl(fd_, PERF_EVENT_IOC_ENABLE, 0);
}

uint64_t InstructionCounter::stop() {
  ioctl(fd_, PERF_EVENT_IOC_DISABLE, 0);
  uint64_t count = 0;
  if (read(fd_, &count, sizeof(count)) != static_cast<ssize_t>(sizeof(count))) return 0;
  return count;
}
#else
InstructionCounter::InstructionCounter() : why_("perf_event_open is Linux only") {}
InstructionCounter::~InstructionCounter() = default;
void InstructionCounter::start() {}
uint64_t InstructionCounter::stop() { return 0; }
#endif

}  // namespace devmem::devbench
