// tests/fake_cuda/fake_cuda_ipc_test.cc: IPC of expandable segments (allocator/ipc.h)
// on the fake, whose shareable handles are memfds, so two processes really share the
// memory:
//   FakeCudaIpcTest.TwoProcessesShareAnExpandableBlock   fork; the parent allocates
//       and fills a block spanning three granules at an offset, exports it
//       (IpcExport) and sends the handle over a unix socket (the fds by SCM_RIGHTS);
//       the child imports it, reads the parent's bytes and writes its own, which the
//       parent then reads; both processes end with nothing leaked (the fake's check);
//   FakeCudaIpcTest.ExportAndImportAreCountedWithTheOtherDriverCalls   export and
//       import calls (and an import's undo) in the backend's driver-call stats;
//   FakeCudaIpcModelTest   exporting a handle created without the POSIX FD type
//       fails as CUDA does (CUDA_ERROR_INVALID_VALUE);
//   FakeCudaIpcTest.WithoutPosixFdHandlesSegmentsAreRegular   a driver without POSIX
//       file-descriptor handles: sharing() says no IPC, expandable_segments:auto
//       gives regular segments, and an export says why it cannot.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "allocator/backend.h"
#include "allocator/caching_allocator.h"
#include "allocator/driver_calls.h"
#include "allocator/ipc.h"
#include "allocator/types.h"
#include "cuda/cuda_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/fake_cuda/fake_cuda_test_util.h"

namespace devmem {
namespace {

using fake_cuda_test::CudaAllocator;
using fake_cuda_test::CudaBackend;
using fake_cuda_test::DriverFn;
using fake_cuda_test::InChild;
using fake_cuda_test::Live;
using fake_cuda_test::ScopedEnv;

constexpr size_t kG = size_t{2} << 20;

// The handle's plain part, as it crosses the socket; the fds go as SCM_RIGHTS.
struct Wire {
  uint32_t kind;
  int32_t device;
  uint64_t offset, size, granule, fds;
};

bool Send(int sock, const IpcHandle& h) {
  Wire w{static_cast<uint32_t>(h.kind), h.device, h.offset, h.size, h.granule,
         h.fds.size()};
  iovec iov{&w, sizeof w};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * h.fds.size()));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * h.fds.size());
  std::memcpy(CMSG_DATA(c), h.fds.data(), sizeof(int) * h.fds.size());
  return sendmsg(sock, &msg, 0) == static_cast<ssize_t>(sizeof w);
}

bool Receive(int sock, IpcHandle* h) {
  Wire w{};
  iovec iov{&w, sizeof w};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * 64));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  if (recvmsg(sock, &msg, 0) != static_cast<ssize_t>(sizeof w)) return false;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS ||
      c->cmsg_len != CMSG_LEN(sizeof(int) * w.fds)) {
    return false;
  }
  h->kind = static_cast<IpcHandle::Kind>(w.kind);
  h->device = w.device;
  h->offset = w.offset;
  h->size = w.size;
  h->granule = w.granule;
  h->fds.resize(w.fds);
  std::memcpy(h->fds.data(), CMSG_DATA(c), sizeof(int) * w.fds);
  return true;
}

unsigned char Pattern(size_t i) { return static_cast<unsigned char>(i * 7 + 3); }

// The importing process: reads the exporter's pattern, writes 0xEE over the first
// kilobyte. Exits 0 when all went well, with nothing leaked (the fake's exit check).
[[noreturn]] void Importer(int sock) {
  int failed = 0;
  {
    IpcHandle h;
    if (!Receive(sock, &h)) std::_Exit(10);
    absl::StatusOr<std::unique_ptr<Backend>> backend = NewCudaBackend(0);
    if (!backend.ok()) std::_Exit(11);
    auto* ipc = dynamic_cast<IpcBackend*>(backend->get());
    absl::StatusOr<void*> p = ipc->ipc_import(h);
    CloseIpcFds(h);  // the mapping keeps the memory
    if (!p.ok()) {
      std::fprintf(stderr, "import: %s\n", std::string(p.status().message()).c_str());
      std::_Exit(12);
    }
    std::vector<unsigned char> host(h.size);
    if (!CudaCopyToHost(0, host.data(), *p, h.size).ok()) failed = 13;
    for (size_t i = 0; i < host.size() && failed == 0; ++i) {
      if (host[i] != Pattern(i)) failed = 14;
    }
    if (!CudaMemsetSync(0, *p, 0xEE, 1024).ok()) failed = 15;
    if (!ipc->ipc_close(*p).ok()) failed = 16;
    if (ipc->ipc_close(*p).code() != absl::StatusCode::kInvalidArgument) failed = 17;
    const char done = 1;
    if (write(sock, &done, 1) != 1) failed = 18;
  }
  std::exit(failed);  // runs the fake's leak check
}

TEST(FakeCudaIpcTest, TwoProcessesShareAnExpandableBlock) {
  InChild([] {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    // Before any CUDA call: the child starts with no fake state and no threads.
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(sv[0]);
      Importer(sv[1]);
    }
    close(sv[1]);
    {
      // auto: the fake's driver has POSIX file-descriptor handles, so expandable.
      auto a = CudaAllocator(0, "expandable_segments:auto");
      ASSERT_TRUE(a);
      EXPECT_TRUE(a->backend().sharing().vmm_ipc);
      void* first = a->allocate(3 * kMiB);   // maps [0, 4 MiB) of the reservation
      void* block = a->allocate(5 * kMiB);   // [3 MiB, 8 MiB): three granules
      ASSERT_TRUE(a->snapshot().segments.at(0).expandable);
      std::vector<unsigned char> host(5 * kMiB);
      for (size_t i = 0; i < host.size(); ++i) host[i] = Pattern(i);
      ASSERT_EQ(cudaMemcpy(block, host.data(), host.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
      absl::StatusOr<IpcHandle> h = IpcExport(*a, block);
      ASSERT_TRUE(h.ok()) << h.status();
      EXPECT_EQ(h->fds.size(), 3u);
      EXPECT_EQ(h->offset, kMiB);
      EXPECT_EQ(h->size, 5 * kMiB);
      EXPECT_EQ(h->granule, kG);
      ASSERT_TRUE(Send(sv[0], *h));
      CloseIpcFds(*h);
      char done = 0;
      EXPECT_EQ(read(sv[0], &done, 1), 1);  // the importer wrote and closed
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "the importer exited with " << status;
      // The importer's write reached this process's memory.
      std::vector<unsigned char> back(2048);
      ASSERT_EQ(CudaCopyToHost(0, back.data(), block, back.size()), absl::OkStatus());
      for (size_t i = 0; i < back.size(); ++i) {
        ASSERT_EQ(back[i], i < 1024 ? 0xEE : Pattern(i)) << i;
      }
      // Not the start of a block: an error naming the pointer.
      absl::StatusOr<IpcHandle> bad = IpcExport(*a, static_cast<char*>(block) + 512);
      EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_TRUE(absl::StrContains(bad.status().message(), "not the start of an allocated"))
          << bad.status();
      a->free(block);
      a->free(first);
    }
    close(sv[0]);
  });
}

// cuMemExportToShareableHandle and cuMemImportFromShareableHandle are counted (and
// timed) with the other driver calls, one per granule, as are the calls an import and
// its undo make around them; failed calls count too. (In one process: the fake imports
// its own export as a new handle of the same memory.)
TEST(FakeCudaIpcTest, ExportAndImportAreCountedWithTheOtherDriverCalls) {
  auto a = CudaAllocator(0, "expandable_segments:true");
  auto importer = CudaBackend(0);
  ASSERT_TRUE(a && importer);
  auto* ipc = dynamic_cast<IpcBackend*>(importer.get());
  ASSERT_NE(ipc, nullptr);
  void* block = a->allocate(5 * kMiB);  // three granules
  auto delta = [](const DriverCallStats& before, const DriverCallStats& after,
                  DriverCall c) { return after.count(c) - before.count(c); };

  const DriverCallStats exporter0 = a->stats().driver;
  absl::StatusOr<IpcHandle> h = IpcExport(*a, block);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->fds.size(), 3u);
  const DriverCallStats exporter1 = a->stats().driver;
  EXPECT_EQ(delta(exporter0, exporter1, DriverCall::kExport), 3);
  EXPECT_GE(exporter1.ns[static_cast<int>(DriverCall::kExport)],
            exporter0.ns[static_cast<int>(DriverCall::kExport)]);
  EXPECT_EQ(exporter1.total_ns() - exporter0.total_ns(),
            exporter1.ns[static_cast<int>(DriverCall::kExport)] -
                exporter0.ns[static_cast<int>(DriverCall::kExport)]);  // nothing else

  const DriverCallStats i0 = importer->driver_calls();
  absl::StatusOr<void*> p = ipc->ipc_import(*h);
  ASSERT_TRUE(p.ok()) << p.status();
  const DriverCallStats i1 = importer->driver_calls();
  EXPECT_EQ(delta(i0, i1, DriverCall::kImport), 3);
  EXPECT_EQ(delta(i0, i1, DriverCall::kAddressReserve), 1);
  EXPECT_EQ(delta(i0, i1, DriverCall::kMap), 3);
  EXPECT_EQ(delta(i0, i1, DriverCall::kSetAccess), 1);
  ASSERT_EQ(ipc->ipc_close(*p), absl::OkStatus());
  const DriverCallStats i2 = importer->driver_calls();
  EXPECT_EQ(delta(i1, i2, DriverCall::kUnmap), 1);
  EXPECT_EQ(delta(i1, i2, DriverCall::kRelease), 3);
  EXPECT_EQ(delta(i1, i2, DriverCall::kAddressFree), 1);

  {  // The second import fails: both attempts count, and the undo's calls.
    ScopedEnv fail("DEVMEM_FAKE_CUDA_FAIL", "cuMemImportFromShareableHandle:2");
    absl::StatusOr<void*> failed = ipc->ipc_import(*h);
    EXPECT_FALSE(failed.ok());
    EXPECT_TRUE(absl::StrContains(failed.status().message(),
                                  "cuMemImportFromShareableHandle(fd "))
        << failed.status();
  }
  const DriverCallStats i3 = importer->driver_calls();
  EXPECT_EQ(delta(i2, i3, DriverCall::kImport), 2);
  EXPECT_EQ(delta(i2, i3, DriverCall::kMap), 1);
  EXPECT_EQ(delta(i2, i3, DriverCall::kUnmap), 1);
  EXPECT_EQ(delta(i2, i3, DriverCall::kRelease), 1);
  EXPECT_EQ(delta(i2, i3, DriverCall::kAddressFree), 1);
  EXPECT_EQ(Live("mappings"), 3u);  // only the exporter's own granules

  CloseIpcFds(*h);
  a->free(block);
  a->empty_cache();
  EXPECT_EQ(Live("mappings"), 0u);
}

TEST(FakeCudaIpcModelTest, ExportNeedsThePosixFdTypeRequestedAtCreation) {
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // a current context for the driver
  auto create = DriverFn<decltype(&cuMemCreate)>("cuMemCreate");
  auto release = DriverFn<decltype(&cuMemRelease)>("cuMemRelease");
  auto share = DriverFn<decltype(&cuMemExportToShareableHandle)>(
      "cuMemExportToShareableHandle");
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle plain = 0;
  ASSERT_EQ(create(&plain, kG, &prop, 0), CUDA_SUCCESS);
  int fd = -1;
  EXPECT_EQ(share(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(fd, -1);
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle shareable = 0;
  ASSERT_EQ(create(&shareable, kG, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(share(&fd, shareable, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
            CUDA_SUCCESS);
  EXPECT_GE(fd, 0);
  close(fd);
  EXPECT_EQ(release(plain), CUDA_SUCCESS);
  EXPECT_EQ(release(shareable), CUDA_SUCCESS);
  EXPECT_EQ(devmem_fake_cuda_live("handles"), 0u);
}

TEST(FakeCudaIpcTest, WithoutPosixFdHandlesSegmentsAreRegular) {
  ::setenv("DEVMEM_FAKE_CUDA_NO_POSIX_FD", "1", 1);
  {
    auto regular = CudaAllocator(0, "expandable_segments:auto");
    auto asked = CudaAllocator(0, "expandable_segments:true");
    ASSERT_TRUE(regular && asked);
    EXPECT_FALSE(regular->backend().sharing().vmm_ipc);
    EXPECT_TRUE(regular->backend().sharing().vmm_peer_access);
    void* p = regular->allocate(3 * kMiB);
    void* q = asked->allocate(3 * kMiB);
    EXPECT_FALSE(regular->snapshot().segments.at(0).expandable);
    EXPECT_TRUE(asked->snapshot().segments.at(0).expandable);
    absl::StatusOr<IpcHandle> r = IpcExport(*regular, p);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "cudaIpcGetMemHandle")) << r.status();
    absl::StatusOr<IpcHandle> e = IpcExport(*asked, q);
    EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
    EXPECT_TRUE(absl::StrContains(e.status().message(),
                                  "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0"))
        << e.status();
    regular->free(p);
    asked->free(q);
  }
  ::unsetenv("DEVMEM_FAKE_CUDA_NO_POSIX_FD");
}

}  // namespace
}  // namespace devmem
