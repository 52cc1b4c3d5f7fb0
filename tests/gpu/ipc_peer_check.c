/* tests/gpu/ipc_peer_check.c: peer access and IPC of expandable segments through
 * libdevmem.so's C ABI (capi/devmem.h), with nothing but the CUDA runtime beside it.
 * The worked example of capi/README.md's "Peer access" and "IPC" paragraphs.
 *
 *   ipc_peer_check peer   device 1 reads and writes blocks of device 0's expandable
 *                         segments: one allocated before devmem_enable_peer_access(1, 0)
 *                         (its mappings re-granted) and one after (granted when mapped).
 *                         A pattern goes from a device-1 buffer into each block by
 *                         cudaMemcpyPeer, run by device 1, and back into a second
 *                         device-1 buffer, which must equal the first. Prints
 *                         "SKIP: <reason>" and exits 0 with fewer than two devices or a
 *                         pair without peer access.
 *   ipc_peer_check ipc    fork; the child allocates a block spanning more than one
 *                         granule at an offset into its first granule, fills it,
 *                         exports it (devmem_ipc_export) and sends the handle over a
 *                         socketpair (the descriptors by SCM_RIGHTS); the parent imports
 *                         it (devmem_ipc_import), reads the child's pattern with
 *                         cudaMemcpy, writes its own, closes (devmem_ipc_close) and says
 *                         so; the child reads the parent's pattern back and frees the
 *                         block. Prints "SKIP: <reason>" and exits 0 where the driver
 *                         cannot export mappings (no POSIX file-descriptor handles, or no
 *                         virtual memory management: devmem_ipc_export's error says which).
 *
 * Both modes set DEVMEM_CONF=backend:cuda,expandable_segments:true. Prints "ok: ..." and
 * exits 0 on success; prints "FAIL: <what>" and exits 1 otherwise.
 *
 * Built where the CUDA toolkit is found: against libdevmem.so and the real runtime
 * (devmem_ipc_peer_check, which scripts/gpu-check.sh bundles and runs on a GPU), and
 * against the fake CUDA runtime (devmem_ipc_peer_check_fake, ctest fake_cuda.ipc_peer_check.*,
 * tests/fake_cuda/CMakeLists.txt). */
#define _GNU_SOURCE /* socketpair, CMSG_*, setenv with -std=c99 too */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "capi/devmem.h"

#define MiB ((size_t)1 << 20)
#define MAX_FDS 64 /* SCM_RIGHTS takes at most 253 per message; the block needs 3 or so */

static int fail(const char* what) {
  fprintf(stderr, "FAIL: %s (devmem: %s)\n", what, devmem_last_error());
  return 1;
}

static int cuda_fail(const char* call, cudaError_t e) {
  fprintf(stderr, "FAIL: %s: %s (%s)\n", call, cudaGetErrorName(e), cudaGetErrorString(e));
  return 1;
}

static unsigned char pattern(size_t i, unsigned seed) {
  return (unsigned char)(i * 7u + seed * 31u + 3u);
}

static void fill(unsigned char* p, size_t n, unsigned seed) {
  size_t i;
  for (i = 0; i < n; ++i) p[i] = pattern(i, seed);
}

/* The index of the first byte that is not the pattern, or n. */
static size_t first_wrong(const unsigned char* p, size_t n, unsigned seed) {
  size_t i;
  for (i = 0; i < n; ++i) {
    if (p[i] != pattern(i, seed)) return i;
  }
  return n;
}

/* ---- peer ---------------------------------------------------------------------------- */

/* A pattern from device 1's `src` into device 0's `block` and back into device 1's
 * `dst`, both copies run by device 1 (cudaMemcpyPeer runs on the current device). */
static int peer_round_trip(const char* which, void* block, void* src, void* dst, size_t n,
                           unsigned seed, unsigned char* host) {
  cudaError_t e;
  size_t wrong;
  fill(host, n, seed);
  if ((e = cudaSetDevice(1)) != cudaSuccess) return cuda_fail("cudaSetDevice(1)", e);
  if ((e = cudaMemcpy(src, host, n, cudaMemcpyHostToDevice)) != cudaSuccess) {
    return cuda_fail("cudaMemcpy to the device-1 buffer", e);
  }
  if ((e = cudaMemset(dst, 0, n)) != cudaSuccess) return cuda_fail("cudaMemset", e);
  if ((e = cudaMemcpyPeer(block, 0, src, 1, n)) != cudaSuccess) {
    fprintf(stderr, "the %s block:\n", which);
    return cuda_fail("cudaMemcpyPeer(device 0's block <- device 1)", e);
  }
  if ((e = cudaMemcpyPeer(dst, 1, block, 0, n)) != cudaSuccess) {
    fprintf(stderr, "the %s block:\n", which);
    return cuda_fail("cudaMemcpyPeer(device 1 <- device 0's block)", e);
  }
  memset(host, 0, n);
  if ((e = cudaMemcpy(host, dst, n, cudaMemcpyDeviceToHost)) != cudaSuccess) {
    return cuda_fail("cudaMemcpy from the device-1 buffer", e);
  }
  wrong = first_wrong(host, n, seed);
  if (wrong != n) {
    fprintf(stderr, "FAIL: the %s block: byte %zu of %zu came back as 0x%02x, not 0x%02x\n",
            which, wrong, n, host[wrong], pattern(wrong, seed));
    return 1;
  }
  /* Device 0 sees the same bytes. */
  memset(host, 0, n);
  if ((e = cudaSetDevice(0)) != cudaSuccess) return cuda_fail("cudaSetDevice(0)", e);
  if ((e = cudaMemcpy(host, block, n, cudaMemcpyDeviceToHost)) != cudaSuccess) {
    return cuda_fail("cudaMemcpy from device 0's block", e);
  }
  wrong = first_wrong(host, n, seed);
  if (wrong != n) {
    fprintf(stderr, "FAIL: the %s block: device 0 reads byte %zu as 0x%02x, not 0x%02x\n",
            which, wrong, host[wrong], pattern(wrong, seed));
    return 1;
  }
  return 0;
}

static int run_peer(void) {
  const size_t n = 5 * MiB; /* more than one 2 MiB granule */
  int count = 0, can = 0, rc = 1;
  cudaError_t e;
  void *before = NULL, *after = NULL, *src = NULL, *dst = NULL;
  unsigned char* host = NULL;

  if ((e = cudaGetDeviceCount(&count)) != cudaSuccess) {
    printf("SKIP: cudaGetDeviceCount: %s (%s)\n", cudaGetErrorName(e), cudaGetErrorString(e));
    return 0;
  }
  if (count < 2) {
    printf("SKIP: peer access needs two devices, this machine has %d\n", count);
    return 0;
  }
  if ((e = cudaDeviceCanAccessPeer(&can, 1, 0)) != cudaSuccess) {
    return cuda_fail("cudaDeviceCanAccessPeer(1, 0)", e);
  }
  if (!can) {
    printf("SKIP: cudaDeviceCanAccessPeer(1, 0) is 0: device 1 cannot reach device 0\n");
    return 0;
  }
  host = malloc(n);
  if (host == NULL) return fail("malloc");
  if (devmem_alloc(&before, n, 0, NULL) != DEVMEM_OK) {
    rc = fail("devmem_alloc before enabling peer access");
    goto out;
  }
  /* As the program enables peer access for its cudaMalloc'd memory: device 1 may reach
   * device 0's (the runtime's part), and device 0's expandable segments (devmem's). */
  if ((e = cudaSetDevice(1)) != cudaSuccess) {
    rc = cuda_fail("cudaSetDevice(1)", e);
    goto out;
  }
  e = cudaDeviceEnablePeerAccess(0, 0);
  if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
    rc = cuda_fail("cudaDeviceEnablePeerAccess(0) on device 1", e);
    goto out;
  }
  (void)cudaGetLastError(); /* an "already enabled" is not this program's error */
  if (devmem_enable_peer_access(1, 0) != DEVMEM_OK) {
    rc = fail("devmem_enable_peer_access(1, 0)");
    goto out;
  }
  if (devmem_alloc(&after, n, 0, NULL) != DEVMEM_OK) {
    rc = fail("devmem_alloc after enabling peer access");
    goto out;
  }
  if ((e = cudaSetDevice(1)) != cudaSuccess) {
    rc = cuda_fail("cudaSetDevice(1)", e);
    goto out;
  }
  if ((e = cudaMalloc(&src, n)) != cudaSuccess || (e = cudaMalloc(&dst, n)) != cudaSuccess) {
    rc = cuda_fail("cudaMalloc on device 1", e);
    goto out;
  }
  if (peer_round_trip("earlier", before, src, dst, n, 1, host) != 0) goto out;
  if (peer_round_trip("later", after, src, dst, n, 2, host) != 0) goto out;
  printf("ok: peer: device 1 copied 5 MiB into and out of two expandable blocks of "
         "device 0 (one allocated before devmem_enable_peer_access, one after)\n");
  rc = 0;
out:
  if (src != NULL) cudaFree(src);
  if (dst != NULL) cudaFree(dst);
  if (before != NULL && devmem_free(before) != DEVMEM_OK) rc = fail("devmem_free");
  if (after != NULL && devmem_free(after) != DEVMEM_OK) rc = fail("devmem_free");
  if (devmem_empty_cache(-1) != DEVMEM_OK) rc = fail("devmem_empty_cache");
  free(host);
  return rc;
}

/* ---- ipc ----------------------------------------------------------------------------- */

/* The handle's plain part, as it crosses the socket; the descriptors go as SCM_RIGHTS.
 * num_fds 0 with a message in `skip`: the exporter cannot export, and says why. */
struct wire {
  uint32_t kind;
  int32_t device;
  uint64_t offset, size, granule, num_fds;
  char skip[512];
};

static int send_handle(int sock, const struct wire* w, const int* fds) {
  struct iovec iov;
  struct msghdr msg;
  char control[CMSG_SPACE(sizeof(int) * MAX_FDS)];
  memset(&msg, 0, sizeof msg);
  memset(control, 0, sizeof control);
  iov.iov_base = (void*)w;
  iov.iov_len = sizeof *w;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (w->num_fds > 0) {
    struct cmsghdr* c;
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * w->num_fds);
    c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * w->num_fds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * w->num_fds);
  }
  return sendmsg(sock, &msg, 0) == (ssize_t)sizeof *w ? 0 : -1;
}

/* Fills *h (fds malloc'd, as devmem_ipc_handle_close frees them) from the socket. */
static int receive_handle(int sock, struct wire* w, devmem_ipc_handle* h) {
  struct iovec iov;
  struct msghdr msg;
  struct cmsghdr* c;
  char control[CMSG_SPACE(sizeof(int) * MAX_FDS)];
  memset(&msg, 0, sizeof msg);
  memset(h, 0, sizeof *h);
  iov.iov_base = w;
  iov.iov_len = sizeof *w;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (recvmsg(sock, &msg, 0) != (ssize_t)sizeof *w) return -1;
  if (w->num_fds == 0) return 0;
  c = CMSG_FIRSTHDR(&msg);
  if (c == NULL || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
      c->cmsg_len != CMSG_LEN(sizeof(int) * w->num_fds) || w->num_fds > MAX_FDS) {
    return -1;
  }
  h->fds = malloc(sizeof(int) * w->num_fds);
  if (h->fds == NULL) return -1;
  memcpy(h->fds, CMSG_DATA(c), sizeof(int) * w->num_fds);
  h->kind = w->kind;
  h->device = w->device;
  h->offset = w->offset;
  h->size = w->size;
  h->granule = w->granule;
  h->num_fds = w->num_fds;
  return 0;
}

/* The exporting process. Exit status 0: done (or skipped, told to the parent). */
static int exporter(int sock) {
  const size_t first_size = 3 * MiB, n = 5 * MiB; /* the block: [3 MiB, 8 MiB) */
  void *first = NULL, *block = NULL;
  unsigned char* host = malloc(n);
  devmem_ipc_handle h;
  struct wire w;
  cudaError_t e;
  int rc = 1;
  char done = 0;
  size_t wrong;
  memset(&h, 0, sizeof h);
  memset(&w, 0, sizeof w);
  if (host == NULL) return fail("malloc");
  if (devmem_alloc(&first, first_size, 0, NULL) != DEVMEM_OK ||
      devmem_alloc(&block, n, 0, NULL) != DEVMEM_OK) {
    rc = fail("child: devmem_alloc on device 0");
    goto out;
  }
  fill(host, n, 1);
  if ((e = cudaMemcpy(block, host, n, cudaMemcpyHostToDevice)) != cudaSuccess) {
    rc = cuda_fail("child: cudaMemcpy into the block", e);
    goto out;
  }
  if (devmem_ipc_export(block, &h) != DEVMEM_OK) {
    const char* why = devmem_last_error();
    if (strstr(why, "POSIX_FILE_DESCRIPTOR_SUPPORTED is 0") != NULL ||
        strstr(why, "cudaIpcGetMemHandle") != NULL) {
      /* No POSIX fd handles, or no virtual memory management (the segment is regular:
       * the allocator said so on stderr when it fell back). */
      snprintf(w.skip, sizeof w.skip, "%s", why);
      rc = send_handle(sock, &w, NULL) == 0 ? 0 : fail("child: sendmsg");
    } else {
      rc = fail("child: devmem_ipc_export");
    }
    goto out;
  }
  if (h.num_fds < 2 || h.offset == 0 || h.num_fds > MAX_FDS) {
    fprintf(stderr, "FAIL: child: the block should span more than one granule at an "
            "offset: %llu descriptors of %llu bytes, offset %llu\n",
            (unsigned long long)h.num_fds, (unsigned long long)h.granule,
            (unsigned long long)h.offset);
    goto out;
  }
  w.kind = h.kind;
  w.device = h.device;
  w.offset = h.offset;
  w.size = h.size;
  w.granule = h.granule;
  w.num_fds = h.num_fds;
  if (send_handle(sock, &w, h.fds) != 0) {
    rc = fail("child: sendmsg");
    goto out;
  }
  devmem_ipc_handle_close(&h); /* the parent has its own descriptors now */
  if (read(sock, &done, 1) != 1 || done != 1) {
    fprintf(stderr, "FAIL: child: the parent did not finish its side\n");
    goto out;
  }
  memset(host, 0, n);
  if ((e = cudaMemcpy(host, block, n, cudaMemcpyDeviceToHost)) != cudaSuccess) {
    rc = cuda_fail("child: cudaMemcpy from the block", e);
    goto out;
  }
  wrong = first_wrong(host, n, 2);
  if (wrong != n) {
    fprintf(stderr, "FAIL: child: byte %zu of the block is 0x%02x, not the parent's 0x%02x\n",
            wrong, host[wrong], pattern(wrong, 2));
    goto out;
  }
  rc = 0;
out:
  devmem_ipc_handle_close(&h);
  if (block != NULL && devmem_free(block) != DEVMEM_OK) rc = fail("child: devmem_free");
  if (first != NULL && devmem_free(first) != DEVMEM_OK) rc = fail("child: devmem_free");
  if (devmem_empty_cache(-1) != DEVMEM_OK) rc = fail("child: devmem_empty_cache");
  free(host);
  return rc;
}

/* The importing process: no CUDA call before the fork (the child is made first). */
static int importer(int sock, pid_t child) {
  struct wire w;
  devmem_ipc_handle h;
  void* p = NULL;
  unsigned char* host = NULL;
  cudaError_t e;
  int rc = 1, status = 0;
  const char done = 1;
  size_t wrong;
  memset(&w, 0, sizeof w);
  if (receive_handle(sock, &w, &h) != 0) {
    fprintf(stderr, "FAIL: parent: no handle from the child (it exited?)\n");
    goto wait_child;
  }
  if (w.num_fds == 0) {
    w.skip[sizeof w.skip - 1] = '\0';
    printf("SKIP: the driver cannot export expandable segments here: %s\n", w.skip);
    rc = 0;
    goto wait_child;
  }
  host = malloc(h.size);
  if (host == NULL) {
    rc = fail("malloc");
    goto close_fds;
  }
  if (devmem_ipc_import(0, &h, &p) != DEVMEM_OK) {
    rc = fail("parent: devmem_ipc_import");
    goto close_fds;
  }
  devmem_ipc_handle_close(&h); /* the mapping keeps the memory */
  if ((e = cudaMemcpy(host, p, w.size, cudaMemcpyDeviceToHost)) != cudaSuccess) {
    rc = cuda_fail("parent: cudaMemcpy from the imported block", e);
    goto unmap;
  }
  wrong = first_wrong(host, w.size, 1);
  if (wrong != w.size) {
    fprintf(stderr, "FAIL: parent: byte %zu of the imported block is 0x%02x, not the "
            "child's 0x%02x\n", wrong, host[wrong], pattern(wrong, 1));
    goto unmap;
  }
  fill(host, w.size, 2);
  if ((e = cudaMemcpy(p, host, w.size, cudaMemcpyHostToDevice)) != cudaSuccess) {
    rc = cuda_fail("parent: cudaMemcpy into the imported block", e);
    goto unmap;
  }
  rc = 0;
unmap:
  if (devmem_ipc_close(0, p) != DEVMEM_OK) rc = fail("parent: devmem_ipc_close");
  if (rc == 0 && devmem_ipc_close(0, p) != DEVMEM_ERR_INVALID) {
    rc = fail("parent: a second devmem_ipc_close of the pointer was not DEVMEM_ERR_INVALID");
  }
close_fds:
  devmem_ipc_handle_close(&h);
  /* The child reads the parent's pattern after this byte, or (rc != 0) finds no byte. */
  if (rc == 0 && write(sock, &done, 1) != 1) rc = fail("parent: write");
wait_child:
  close(sock);
  if (waitpid(child, &status, 0) != child) {
    rc = fail("parent: waitpid");
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "FAIL: the exporting child ended with status %d\n", status);
    rc = 1;
  }
  free(host);
  if (rc == 0 && w.num_fds > 0) {
    printf("ok: ipc: a %llu-byte block at offset %llu of %llu granules of %llu bytes, "
           "exported by one process and imported by another, read and written both ways\n",
           (unsigned long long)w.size, (unsigned long long)w.offset,
           (unsigned long long)w.num_fds, (unsigned long long)w.granule);
  }
  return rc;
}

static int run_ipc(void) {
  int sv[2];
  pid_t pid;
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return fail("socketpair");
  /* Before any CUDA call: a process must not use CUDA state it inherited by fork. */
  fflush(stdout);
  fflush(stderr);
  pid = fork();
  if (pid < 0) return fail("fork");
  if (pid == 0) {
    int rc;
    close(sv[0]);
    rc = exporter(sv[1]);
    close(sv[1]);
    exit(rc);
  }
  close(sv[1]);
  return importer(sv[0], pid);
}

int main(int argc, char** argv) {
  if (argc != 2 || (strcmp(argv[1], "peer") != 0 && strcmp(argv[1], "ipc") != 0)) {
    fprintf(stderr, "usage: %s peer|ipc\n", argv[0]);
    return 2;
  }
  if (setenv("DEVMEM_CONF", "backend:cuda,expandable_segments:true", 1) != 0) {
    return fail("setenv");
  }
  return strcmp(argv[1], "peer") == 0 ? run_peer() : run_ipc();
}
