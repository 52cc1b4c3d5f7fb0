/* capi/devmem.h: devmem's C ABI, the interface of libdevmem.so.
 *
 * Programs that are not C++ (Python through ctypes, PyTorch, CuPy, C) use devmem as
 * their device-memory allocator through these functions. capi/README.md shows how to
 * load the library from PyTorch and CuPy.
 *
 * Plain C99 plus POSIX's ssize_t: no CUDA header is needed. A stream is declared
 * `void*`; on CUDA it is the cudaStream_t (a pointer too, so the ABI is the same).
 *
 * Devices. `device` N is device N of the runtime's default type: cuda:N when the
 * runtime runs on CUDA (DEVMEM_CONF backend:auto found a GPU, or backend:cuda), sim:N
 * on the simulated device (backend:sim, or auto without a GPU), and cpu (N must be 0)
 * with backend:cpu. The runtime is created by the first call of any function here,
 * from the environment variable DEVMEM_CONF (docs/configuration.md); every device's
 * allocator is created on its first use. An index the runtime does not have (cuda:N
 * past the GPUs present, sim:N at or past the key sim_devices, 64 by default) is
 * DEVMEM_ERR_INVALID and creates nothing.
 *
 * Streams. NULL is the device's default stream. On CUDA any other value is passed
 * through as a cudaStream_t of the caller's (it must belong to the device, and be
 * retired with devmem_release_stream before cudaStreamDestroy: see there). The sim and
 * cpu devices know only the streams they created themselves, so through this API only
 * NULL is valid there; any other value is DEVMEM_ERR_INVALID. A block is reused only
 * on the stream it was allocated on; use on another stream must be declared with
 * devmem_record_stream.
 *
 * Sites. Every allocation is attributed to a site of kind alloc, so that stats,
 * snapshots and out-of-memory reports say who holds the memory. The site names the
 * entry point ("capi" for devmem_alloc, "capi/torch", "capi/cupy") and the innermost
 * tag this thread pushed with devmem_push_tag: "train @ capi/torch (alloc)".
 *
 * Errors. No C++ exception ever leaves these functions. A failure returns an error code
 * (or NULL where the function returns a pointer) and sets this thread's last error
 * message, which devmem_last_error returns. Success leaves the last error as it was.
 *
 * Thread-safety: every function may be called from any thread at any time. The last
 * error and the tag stack are per thread.
 *
 * Symbols: libdevmem.so exports the devmem_* functions only. It does not export or
 * replace malloc, free or operator new, and does not link jemalloc (capi/README.md
 * says why); the cpu device (backend:cpu) works only when jemalloc is already loaded
 * (LD_PRELOAD=libjemalloc.so.2).
 */
#ifndef DEVMEM_CAPI_DEVMEM_H_
#define DEVMEM_CAPI_DEVMEM_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t (POSIX) */

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes returned by the int functions. */
#define DEVMEM_OK 0
/* Device memory is exhausted after the allocator's staged retry (freeing cached
   blocks, synchronizing streams). The last error is the OOM report: what was asked,
   what the device and devmem hold, the largest holders by site, cause and remedy. */
#define DEVMEM_ERR_OOM 1
/* A bad argument: an unknown, interior or already freed pointer (the message names
   the pointer), a size that overflows, a device index that does not exist, a stream
   the device cannot use, an empty tag stack. Nothing changed. */
#define DEVMEM_ERR_INVALID 2
/* The runtime could not start: DEVMEM_CONF is malformed (the message names the key
   and value) or its http listener could not be opened. Every call fails the same way
   until the process restarts with a valid configuration. */
#define DEVMEM_ERR_CONFIG 3
/* Anything else: a driver failure that is not about memory (the message names the
   call and the CUDA error), host memory exhausted while doing the bookkeeping. After
   a driver error such as a device-side assert, the device's allocator is poisoned:
   every later call on that device that would reach it returns DEVMEM_ERR_INTERNAL
   with the first error in the message, changing nothing; stats and snapshots still
   answer. The library never ends the process for one. */
#define DEVMEM_ERR_INTERNAL 4

/* ---- PyTorch: torch.cuda.memory.CUDAPluggableAllocator ------------------------- */

/* The allocation function of CUDAPluggableAllocator(path, "devmem_torch_alloc",
 * "devmem_torch_free"): `size` bytes on cuda device `device` (devmem device N as
 * above), usable at once by work on `stream` (PyTorch passes its current stream).
 *
 * Returns the pointer, or NULL for size 0. The caller owns the memory until it passes
 * it to devmem_torch_free (or devmem_free).
 * Errors: NULL with the last error set, and the message is also written to stderr:
 * PyTorch does not check the pointer its allocation function returns (a NULL becomes
 * a tensor whose data pointer is 0), so stderr is the one place the report is sure to
 * be seen. A negative size is DEVMEM_ERR_INVALID.
 * Thread-safe. */
void* devmem_torch_alloc(ssize_t size, int device, void* stream);

/* The free function of CUDAPluggableAllocator: frees `ptr`, which devmem_torch_alloc
 * returned for `device`. `size` and `stream` are what PyTorch recorded at allocation
 * and are not needed (the block remembers its stream). NULL does nothing.
 * Errors: a pointer that is not a live allocation of that device is reported on stderr
 * and in the last error; nothing is freed. Thread-safe. */
void devmem_torch_free(void* ptr, ssize_t size, int device, void* stream);

/* The record-stream hook of CUDAPluggableAllocator (PyTorch's set_record_stream_fn,
 * `void(void* ptr, cudaStream_t stream)`): Tensor.record_stream(stream) on a tensor
 * whose storage starts at `ptr` reaches devmem_record_stream(ptr, stream), so the
 * block's free waits for the work queued on `stream` (side-stream copies, NCCL
 * collectives). python/devmem/torch.py installs it where PyTorch can take it.
 * Errors: as devmem_torch_free (PyTorch ignores the result): the last error, and a
 * line on stderr. Thread-safe. */
void devmem_torch_record_stream(void* ptr, void* stream);

/* ---- CuPy: cupy.cuda.memory.CFunctionAllocator ----------------------------------- */

/* The malloc function of CFunctionAllocator(0, malloc_addr, free_addr, owner), of the
 * type CuPy casts it to, void*(*)(void*, size_t, int): `size` bytes on device
 * `device_id` on its default stream. `param` is ignored (pass 0).
 * Returns the pointer (NULL for size 0, which CuPy never asks for). The caller owns it
 * until devmem_cupy_free.
 * Errors: NULL with the last error set, also written to stderr (CuPy does not check
 * the pointer either; capi/README.md shows a wrapper that raises instead).
 * Thread-safe. */
void* devmem_cupy_malloc(void* param, size_t size, int device_id);

/* The free function of CFunctionAllocator, void(*)(void*, void*, int): frees `ptr`
 * of device `device_id`. `param` is ignored; NULL does nothing.
 * Errors: reported on stderr and in the last error; nothing is freed. Thread-safe. */
void devmem_cupy_free(void* param, void* ptr, int device_id);

/* ---- The general API --------------------------------------------------------------- */

/* Allocates `size` bytes on `device`, usable at once by work on `stream` (NULL: the
 * default stream), and stores the pointer in *out (NULL for size 0). The pointer is
 * 512-byte aligned. The caller owns the memory until devmem_free.
 * Returns DEVMEM_OK; DEVMEM_ERR_OOM (the last error is the OOM report, naming the
 * requesting site and the largest holders); DEVMEM_ERR_INVALID for out == NULL, a bad
 * device or stream, or a size that overflows; DEVMEM_ERR_CONFIG. *out is NULL after
 * any error (when out is not NULL). Thread-safe. */
int devmem_alloc(void** out, size_t size, int device, void* stream);

/* Frees a pointer returned by any allocation function here, on whichever device it
 * lives. If other streams were declared with devmem_record_stream, the block is reused
 * only after they reach this point. NULL does nothing.
 * Returns DEVMEM_OK, or DEVMEM_ERR_INVALID when `ptr` is not the start of a live
 * allocation (unknown, interior or already freed: the message names the pointer and
 * says which); nothing changes then. Thread-safe. */
int devmem_free(void* ptr);

/* Declares that work on `stream` uses the live allocation `ptr` (the pointer an
 * allocation function returned). Its free will then wait for that work before the
 * block is reused. `stream` follows the stream rules above.
 * Returns DEVMEM_OK or DEVMEM_ERR_INVALID (ptr not allocated, a bad stream).
 * Thread-safe. */
int devmem_record_stream(void* ptr, void* stream);

/* Retires `stream` of `device` before the caller destroys it (cudaStreamDestroy).
 * The driver gives a destroyed stream's handle to the next stream created while the
 * kernels queued on the old one still run, and devmem caches memory by handle: without
 * this call the new stream could be handed a block those kernels still use, and a
 * later release of the old stream's memory would synchronize a destroyed handle. One
 * event is recorded on `stream`; its cached blocks, and its live ones once freed,
 * wait for that event, and nothing synchronizes the stream afterwards. Until the event
 * completes, allocating on the handle or devmem_record_stream with it is
 * DEVMEM_ERR_INVALID (the message names the stream); then the handle serves a new
 * stream. Call it after queuing the stream's last work. A device devmem has not used
 * holds nothing of the stream: nothing happens.
 * Returns DEVMEM_OK; DEVMEM_ERR_INVALID for a bad device, NULL (the default stream is
 * never destroyed), a stream released already whose work has not completed, a graph
 * capture under way, or any stream on a device without streams (sim, cpu), changing
 * nothing; DEVMEM_ERR_INTERNAL for a driver error; DEVMEM_ERR_CONFIG. Thread-safe. */
int devmem_release_stream(int device, void* stream);

/* Returns every unused cached segment of `device` to the driver, after waiting for
 * pending cross-stream frees; `device` -1 does so for every device devmem has used.
 * Live allocations are not touched. A device devmem has not used has nothing cached:
 * nothing happens (no allocator, and no CUDA context, is created for it).
 * Returns DEVMEM_OK, DEVMEM_ERR_INVALID (a device below -1) or DEVMEM_ERR_CONFIG.
 * Thread-safe. */
int devmem_empty_cache(int device);

/* The message of the most recent failed call on this thread ("" when none has failed).
 * Owned by devmem: valid until the next failing call on this thread; copy it to keep
 * it. Never NULL. Thread-safe (each thread has its own). */
const char* devmem_last_error(void);

/* The name of an error code: "DEVMEM_OK", "DEVMEM_ERR_OOM", ...; "unknown" for other
 * values. A static string: never freed. Thread-safe. */
const char* devmem_error_name(int code);

/* The runtime's snapshot as JSON (docs/formats.md, devmem.snapshot/1): every device
 * with its stats, segments, blocks and live buffers, and the site table, in which the
 * sites of this API carry the tags pushed with devmem_push_tag.
 * Returns a NUL-terminated string from malloc that the caller owns and frees with
 * devmem_string_free; NULL on failure (the last error says why). Thread-safe. */
char* devmem_snapshot_json(void);

/* One device's statistics as JSON (docs/formats.md, devmem.stats/1): the device name
 * ("cuda:0", "sim:0"), every DeviceStats field in PyTorch's vocabulary, and the
 * counters of every site that allocated on it, with its tag and text ("where").
 * Returns a malloc'd string the caller frees with devmem_string_free; NULL on failure
 * (a bad device: DEVMEM_ERR_INVALID in the last error). Thread-safe. */
char* devmem_stats_json(int device);

/* Frees a string returned by devmem_snapshot_json or devmem_stats_json (it came from
 * the C library's malloc, so free() would do too). NULL does nothing; any other pointer
 * is undefined behaviour. Never fails. Thread-safe. */
void devmem_string_free(char* s);

/* Pushes `tag` on this thread's tag stack: until it is popped, allocations this thread
 * makes through this API are attributed to the site named after it (the text is
 * copied). Tags nest; the innermost names the site. Tags are per thread: work that a
 * framework runs on its own threads (PyTorch's autograd engine runs backward on one)
 * is attributed to the untagged site unless those threads push tags too. A tag is cut
 * to its first 256 bytes, and bytes that are not valid UTF-8 are replaced by U+FFFD in
 * every report. A thread's stack holds at most 1024 tags.
 * Returns DEVMEM_OK, or DEVMEM_ERR_INVALID for a NULL tag or a full stack (the last
 * error says so). Thread-safe. */
int devmem_push_tag(const char* tag);

/* Pops the innermost tag of this thread.
 * Returns DEVMEM_OK, or DEVMEM_ERR_INVALID when this thread has no tag pushed.
 * Thread-safe. */
int devmem_pop_tag(void);

/* ---- Scoped step arenas (allocator/arena.h) --------------------------------------- */

/* Opens an arena scope named `name` on `device` for this thread: until the matching
 * devmem_arena_pop, this thread's allocations through this API on that device (default
 * stream, at most 1 MiB each) are bump allocations in chunks (64 KiB, growing to
 * 4 MiB) the arena takes from the device's pool; their frees (from any thread) are O(1). Buffers that outlive the
 * scope stay valid ("escaped"; counted per arena name in devmem_stats_json). Scopes
 * nest; the innermost of a device wins. A thread's stack holds at most 64 scopes.
 * Returns DEVMEM_OK, or DEVMEM_ERR_INVALID for a NULL or empty name, a bad device or a
 * full stack (the last error says so). Thread-safe. */
int devmem_arena_push(int device, const char* name);

/* Closes this thread's innermost arena scope. Empty chunks are kept for the next scope
 * (devmem_empty_cache gives them back). Returns DEVMEM_OK, or DEVMEM_ERR_INVALID when
 * this thread has no scope pushed. Thread-safe. */
int devmem_arena_pop(void);

/* ---- Version, and what PyTorch's torch.cuda memory functions do ------------------- */
/* Added for python/devmem (README.md, "Python"), which gives them PyTorch's names. */

/* The version of the loaded libdevmem.so, "MAJOR.MINOR.PATCH" (devmem_version.h's
 * DEVMEM_VERSION is the version of the headers). A static string: never freed.
 * Never fails. Thread-safe. */
const char* devmem_version(void);

/* torch.cuda.reset_peak_memory_stats: sets every peak of `device`'s statistics to its
 * current value; `device` -1 does so on every device devmem has used. A device devmem
 * has not used has no statistics: nothing happens.
 * Returns DEVMEM_OK, DEVMEM_ERR_INVALID (a device below -1) or DEVMEM_ERR_CONFIG.
 * Thread-safe. */
int devmem_reset_peak_stats(int device);

/* torch.cuda.reset_accumulated_memory_stats: sets every total ("allocated", "freed")
 * and counter (retries, OOMs, device allocs and frees, hits, misses) of `device` to its
 * starting value; -1 and unused devices as for devmem_reset_peak_stats.
 * Returns DEVMEM_OK, DEVMEM_ERR_INVALID or DEVMEM_ERR_CONFIG. Thread-safe. */
int devmem_reset_accumulated_stats(int device);

/* torch.cuda.set_per_process_memory_fraction: caps what `device` reserves at
 * `fraction` of its total memory (0 < fraction <= 1; DEVMEM_CONF's
 * per_process_memory_fraction is the starting value). Memory already reserved above
 * the cap is kept; later segment allocations that would pass it fail as OOM, whose
 * report names the cap. Creates the device's allocator if needed.
 * Returns DEVMEM_OK; DEVMEM_ERR_INVALID for a fraction outside (0, 1] (the message
 * names it; nothing changes) or a bad device; DEVMEM_ERR_CONFIG. Thread-safe. */
int devmem_set_memory_fraction(double fraction, int device);

/* torch.cuda.mem_get_info: stores the free and total bytes of `device` as its driver
 * sees them (free counts other processes' use; the sim device's free is its capacity
 * minus what devmem reserved) in *free_bytes and *total_bytes. Creates the device's
 * allocator if needed.
 * Returns DEVMEM_OK; DEVMEM_ERR_INVALID for a NULL pointer or a bad device (the
 * outputs are untouched then); DEVMEM_ERR_CONFIG. Thread-safe. */
int devmem_mem_get_info(int device, size_t* free_bytes, size_t* total_bytes);

/* torch.cuda.memory_summary: `device`'s statistics as a readable table (the shape of
 * PyTorch's), followed by the sites holding the most memory.
 * Returns a malloc'd string the caller frees with devmem_string_free; NULL on failure
 * (a bad device: DEVMEM_ERR_INVALID in the last error). Thread-safe. */
char* devmem_memory_summary(int device);

/* ---- CUDA graphs: private pools (allocator/pool_id.h) --------------------------------- */

/* The three calls PyTorch's CUDAPluggableAllocator forwards for graph capture
 * (set_begin_allocate_to_pool, set_end_allocate_to_pool_fn, set_release_pool:
 * void(int device, MempoolId_t, std::function<bool(cudaStream_t)>) and
 * void(int device, MempoolId_t)). A MempoolId_t is a pair of 64-bit ids, passed here as
 * `id_first`, `id_second`; (0, 0) is the default pool and names no private pool. The
 * std::function becomes a C function and its context: `filter(filter_ctx, stream)`
 * returns nonzero for the streams whose allocations go to the pool. It is called under
 * devmem's lock on every allocation on `device` while the pool is being allocated to,
 * so it must be quick and must not call devmem. NULL means "every stream of the device
 * that is capturing a graph now" (cudaStreamGetCaptureInfo; on sim no stream captures).
 *
 * From devmem_begin_allocate_to_pool to the matching devmem_end_allocate_to_pool,
 * allocations on streams the filter takes use only the pool's memory, and what is freed
 * goes back to the pool, never to other work: a graph's replays reuse its addresses. A
 * begin on a live pool shares it. devmem_release_pool drops the pool's use count; at
 * zero its memory goes back to the device as its blocks are freed (now for the unused
 * ones, unless another capture is under way). While any pool is being allocated to,
 * devmem queries no event, synchronizes nothing and gives no memory back, so it never
 * breaks a capture.
 * Returns DEVMEM_OK; DEVMEM_ERR_INVALID naming the pool for misuse (the default id, a
 * bad device, ending a pool not being allocated to, releasing a pool still being
 * allocated to, unknown or already released), changing nothing; DEVMEM_ERR_CONFIG.
 * Thread-safe. */
typedef int (*devmem_stream_filter)(void* filter_ctx, void* stream);
int devmem_begin_allocate_to_pool(int device, uint64_t id_first, uint64_t id_second,
                                  devmem_stream_filter filter, void* filter_ctx);
int devmem_end_allocate_to_pool(int device, uint64_t id_first, uint64_t id_second);
int devmem_release_pool(int device, uint64_t id_first, uint64_t id_second);

/* ---- Peer access ----------------------------------------------------------------------- */

/* Lets `device` read and write every block of `peer`'s allocator, those allocated now
 * and later: what cudaDeviceEnablePeerAccess(peer) with `device` current does for
 * cudaMalloc'd memory, extended to expandable segments (virtual-memory mappings, which
 * cudaDeviceEnablePeerAccess does not reach: without this, peer kernels, peer copies
 * and NCCL buffers of another GPU fault on them). Call it where the program enables
 * peer access. Idempotent; one way (call it again with the two swapped for the other
 * direction). Creates `peer`'s allocator if needed.
 * Returns DEVMEM_OK; DEVMEM_ERR_INVALID naming both devices for device == peer, a bad
 * device, a pair the hardware cannot connect (cudaDeviceCanAccessPeer is 0) and on the
 * sim and cpu devices (no peers); DEVMEM_ERR_INTERNAL for a driver failure (the message
 * names the call); DEVMEM_ERR_CONFIG. Nothing changes on an error. Thread-safe. */
int devmem_enable_peer_access(int device, int peer);

/* ---- IPC: sharing a block with another process (allocator/ipc.h) ---------------------- */

/* A block of an expandable segment (virtual-memory mappings, on which
 * cudaIpcGetMemHandle does not work), exported: one POSIX file descriptor per granule
 * the block touches, in address order, and where the block lies in them. Send the
 * numbers as plain bytes and the descriptors with SCM_RIGHTS over a unix socket
 * (sendmsg; at most 253 descriptors per message) or let the other process take them
 * with pidfd_getfd(2); there, put its own descriptor numbers in `fds`. A block of a
 * regular segment (cudaMalloc'd) is not exported here: share its segment with
 * cudaIpcGetMemHandle. */
typedef struct devmem_ipc_handle {
  uint32_t kind;    /* 2: POSIX file descriptors, one per granule */
  int32_t device;   /* the exporting device */
  uint64_t offset;  /* the block's start from the start of the first granule */
  uint64_t size;    /* the block's bytes */
  uint64_t granule; /* bytes behind each descriptor */
  uint64_t num_fds;
  int* fds;         /* malloc'd; devmem_ipc_handle_close closes and frees them */
} devmem_ipc_handle;

/* Exports the allocated block that starts at `ptr` (what devmem_alloc returned) into
 * *out. Keep the block allocated until every importer closed it.
 * Returns DEVMEM_OK; DEVMEM_ERR_INVALID naming the pointer for one that is not the
 * start of an allocated block, a block of a regular segment, a device whose driver
 * cannot export mappings (no POSIX file-descriptor handles) and the sim and cpu
 * devices (no other process can map their memory); DEVMEM_ERR_INTERNAL for a driver
 * failure; DEVMEM_ERR_CONFIG. *out is zeroed on an error (when out is not NULL).
 * Thread-safe. */
int devmem_ipc_export(const void* ptr, devmem_ipc_handle* out);

/* Maps a block another process exported into this one, on `device` (the same GPU,
 * seen from this process), and stores its address in *out. The descriptors stay the
 * caller's (close them with devmem_ipc_handle_close once imported). The memory is not
 * devmem's to cache: give it back with devmem_ipc_close.
 * Returns DEVMEM_OK; DEVMEM_ERR_INVALID for NULL arguments, a bad device or a handle
 * this device cannot map (another granularity, no descriptors; the message says
 * which); DEVMEM_ERR_INTERNAL for a driver failure; DEVMEM_ERR_CONFIG. Nothing stays
 * mapped on an error. Thread-safe. */
int devmem_ipc_import(int device, const devmem_ipc_handle* handle, void** out);

/* Unmaps a block devmem_ipc_import returned on `device`.
 * Returns DEVMEM_OK; DEVMEM_ERR_INVALID naming the pointer for any other pointer (or
 * one closed already). Thread-safe. */
int devmem_ipc_close(int device, void* ptr);

/* Closes the handle's descriptors, frees its array and zeroes it. NULL does nothing. */
void devmem_ipc_handle_close(devmem_ipc_handle* handle);

#ifdef __cplusplus
} /* extern "C" */

/* ---- PyTorch's graph-pool hooks (C++ only) ------------------------------------------- */

/* The functions PyTorch's CUDAPluggableAllocator takes through its Python binding's
 * set_begin_allocate_to_pool, set_end_allocate_to_pool_fn and set_release_pool (PyTorch
 * 2.3 and later; python/devmem/torch.py installs them): PyTorch casts the address to
 * void(int, c10::cuda::MempoolId_t, std::function<bool(cudaStream_t)>) and
 * void(int, c10::cuda::MempoolId_t), so these have exactly those C++ types
 * (MempoolId_t is std::pair<unsigned long long, unsigned long long>; cudaStream_t is
 * CUstream_st*) and C names. They do what devmem_begin_allocate_to_pool,
 * devmem_end_allocate_to_pool and devmem_release_pool do; PyTorch ignores what they
 * could return, so a failure is written to stderr and left as the last error. */
#include <functional>
#include <utility>
struct CUstream_st;
extern "C" {
void devmem_torch_begin_allocate_to_pool(
    int device, std::pair<unsigned long long, unsigned long long> pool,
    std::function<bool(CUstream_st*)> filter);
void devmem_torch_end_allocate_to_pool(int device,
                                       std::pair<unsigned long long, unsigned long long> pool);
void devmem_torch_release_pool(int device,
                               std::pair<unsigned long long, unsigned long long> pool);
} /* extern "C" */
#endif

#endif /* DEVMEM_CAPI_DEVMEM_H_ */
