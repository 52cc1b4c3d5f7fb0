#!/usr/bin/env python3
"""CuPy with devmem as its allocator (cupy.cuda.memory.CFunctionAllocator).

    cupy_allocator.py [LIBDEVMEM_SO]       (default: build/lib/libdevmem.so)

Sets CuPy's allocator to libdevmem.so's devmem_cupy_malloc/devmem_cupy_free, computes
on the GPU and checks the results against NumPy, and checks that devmem saw the
allocations: the tag pushed around them is a site with allocations in
devmem_stats_json, a live array's buffer is a live devmem buffer under the tag in the
snapshot, and a deleted array's buffer is not.
Needs CuPy and a GPU: without them it prints "SKIP: ..." and exits 0.
"""
import ctypes
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import capi_bindings as capi  # noqa: E402
from gpu_script import fail, load_devmem_on_cuda, skip  # noqa: E402


def main():
    path = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(HERE, "..", "..", "build", "lib", "libdevmem.so"))
    try:
        import cupy
        import numpy
    except ImportError:
        skip("CuPy is not installed")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError without a driver
        skip("CuPy sees no CUDA device (%s)" % e)
    if count == 0:
        skip("CuPy sees no CUDA device")
    if not hasattr(cupy.cuda.memory, "CFunctionAllocator"):
        skip("this CuPy has no cupy.cuda.memory.CFunctionAllocator")

    lib = load_devmem_on_cuda(capi, path, "CuPy")

    # CuPy calls malloc as void*(void* param, size_t size, int device_id) and free as
    # void(void* param, void* ptr, int device_id); `lib` is the owner kept alive.
    malloc_addr = ctypes.cast(lib.devmem_cupy_malloc, ctypes.c_void_p).value
    free_addr = ctypes.cast(lib.devmem_cupy_free, ctypes.c_void_p).value
    allocator = cupy.cuda.memory.CFunctionAllocator(0, malloc_addr, free_addr, lib)
    cupy.cuda.set_allocator(allocator.malloc)

    n = 1 << 20
    lib.devmem_push_tag(b"cupy_allocator")
    a = cupy.arange(n, dtype=cupy.int64)
    total = int((a * 2).sum())
    rng = numpy.random.default_rng(0)
    m = rng.standard_normal((256, 256))
    g = cupy.asarray(m)
    product = cupy.asnumpy(g @ g.T)
    lib.devmem_pop_tag()
    cupy.cuda.Device().synchronize()
    if total != n * (n - 1):
        fail("sum of 2*arange(%d) is %d, not %d" % (n, total, n * (n - 1)))
    if not numpy.allclose(product, m @ m.T, rtol=1e-6, atol=1e-6):
        fail("the matrix product differs from NumPy's")

    device = cupy.cuda.Device().id
    st = capi.stats(lib, device)
    where = "cupy_allocator @ capi/cupy (alloc)"
    site = capi.site_stats(st, where)
    print("devmem on %s: %s: %r" % (st["device"], where, site))
    if st["device"] != "cuda:%d" % device or site is None or site["total_count"] < 3:
        fail("devmem did not see CuPy's allocations: %r" % st["sites"])
    addr = a.data.ptr
    buf, entry = capi.live_buffer(capi.snapshot(lib), addr)
    if buf is None or entry is None or entry["tag"] != "cupy_allocator":
        fail("the array at %#x is not a live devmem buffer under the tag: %r" % (addr, (buf, entry)))
    del a
    cupy.cuda.Device().synchronize()
    if capi.live_buffer(capi.snapshot(lib), addr)[0] is not None:
        fail("a deleted array is still live in devmem")
    print("ok: CuPy computed on devmem (%d allocations under the tag)" % site["total_count"])


if __name__ == "__main__":
    main()
