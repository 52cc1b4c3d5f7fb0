#!/usr/bin/env python3
"""The devmem Python package (python/devmem) with PyTorch on a GPU.

    torch_package.py [LIBDEVMEM_SO]      (default: what the package finds itself)

devmem.torch.use() installs devmem as PyTorch's CUDA allocator; then tensors made
under devmem.tag("forward") must show in devmem.memory_stats() under PyTorch's key
names, in memory_summary() under the tag's site, and in the snapshot; peaks reset,
empty_cache() returns the cache, and mem_get_info() agrees with PyTorch's total;
Tensor.record_stream reaches devmem (a block freed while a side stream reads it is
not reused early).
Needs PyTorch 2.0+ with CUDA and a GPU: without them it prints "SKIP: ..." and exits 0.
"""
import sys

from gpu_script import fail, import_torch_with_pluggable_allocator, skip, use_package


def main():
    use_package(sys.argv)
    torch = import_torch_with_pluggable_allocator()
    import devmem
    import devmem.torch
    try:
        devmem.memory_stats(0)
    except devmem.DevmemError as e:
        if "built without CUDA" in str(e):
            skip("libdevmem.so was built without the CUDA toolkit: %s" % e)
        fail("devmem cannot use cuda:0 although PyTorch can: %s" % e)
    devmem.torch.use()
    if devmem.torch.use() is not devmem.torch.use():
        fail("a second devmem.torch.use() installed another allocator")

    device = torch.cuda.current_device()
    before = devmem.memory_stats(device)
    with devmem.tag("forward"):
        t = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        t.fill_(1)
    torch.cuda.synchronize()
    during = devmem.memory_stats(device)
    grew = during["allocated_bytes.all.current"] - before["allocated_bytes.all.current"]
    if grew < (64 << 20):
        fail("a 64 MiB tensor grew allocated_bytes.all.current by %d" % grew)
    if during["allocated_bytes.large_pool.peak"] < (64 << 20):
        fail("allocated_bytes.large_pool.peak is %d" % during["allocated_bytes.large_pool.peak"])
    summary = devmem.memory_summary(device)
    if "forward @ capi/torch" not in summary:
        fail("memory_summary does not name the tag's site:\n" + summary)
    snap = devmem.snapshot()
    sites = {s["id"]: s for s in snap["sites"]}
    live = [b for d in snap["devices"] for b in d["live_buffers"] if b["addr"] == t.data_ptr()]
    if not live or sites[live[0]["site"]]["tag"] != "forward":
        fail("the tensor at %#x is not a live buffer tagged forward: %r" % (t.data_ptr(), live))
    free, total = devmem.mem_get_info(device)
    torch_free, torch_total = torch.cuda.mem_get_info(device)
    if total != torch_total or not 0 < free <= total:
        fail("mem_get_info (%d, %d), PyTorch's (%d, %d)" % (free, total, torch_free, torch_total))
    del t
    torch.cuda.synchronize()
    devmem.reset_peak_memory_stats(device)
    after = devmem.memory_stats(device)
    if after["allocated_bytes.all.peak"] != after["allocated_bytes.all.current"]:
        fail("reset_peak_memory_stats left the peak at %d" % after["allocated_bytes.all.peak"])
    devmem.empty_cache()
    if devmem.memory_stats(device)["reserved_bytes.all.current"] > during["reserved_bytes.all.current"] - (64 << 20):
        fail("empty_cache returned nothing")
    check_record_stream(torch, devmem)
    print("ok: devmem.torch.use() and devmem's torch.cuda-style stats on %s (%s)"
          % ("cuda:%d" % device, devmem.library_path()))


def check_record_stream(torch, devmem):
    """Tensor.record_stream reaches devmem (the hook or the wrapper, whichever this
    PyTorch allows): a tensor freed while a side stream still works on it is not handed
    to the next allocation on its own stream until the side stream is past it."""
    route = devmem.torch.record_stream_route()
    if route is None:
        fail("this PyTorch (%s) took neither the record_stream hook nor the wrapper"
             % torch.__version__)
    x = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    x.fill_(3)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # the side stream is busy for a while (~0.1 s)
        y = x.clone()                   # and then reads x
    x.record_stream(side)
    ptr = x.data_ptr()
    del x
    z = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    reused_early = z.data_ptr() == ptr
    side.synchronize()
    if reused_early:
        fail("record_stream (%s) did not reach devmem: x's block went to the next "
             "allocation while the side stream still read it" % route)
    if int(y.sum().item()) != 3 * (8 << 20):
        fail("the side stream's copy of x is wrong")
    print("ok: Tensor.record_stream reaches devmem (%s)" % route)


if __name__ == "__main__":
    main()
