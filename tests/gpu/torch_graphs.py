#!/usr/bin/env python3
"""A CUDA graph captured with PyTorch's torch.cuda.graph, devmem as the allocator.

    torch_graphs.py [LIBDEVMEM_SO]      (default: what the package finds itself)

devmem.torch.use() installs devmem's graph-pool hooks (PyTorch 2.3+); then a graph
whose captured region allocates and frees temporaries is captured (global capture mode,
PyTorch's default: a cudaMalloc or an event query in it would break the capture) and
replayed: its output must equal eager execution, its memory must sit in a private pool
(devmem's stats say private_reserved_bytes > 0), eager allocations made while the graph
lives must not overlap the pool's blocks (the replay would overwrite them), and
deleting the graph must give the pool back (private_pools 0 after empty_cache).
Without PyTorch, CUDA, a GPU or the hooks it prints "SKIP: ..." and exits 0.
"""
import sys

from gpu_script import fail, import_torch_with_pluggable_allocator, skip, use_package


def main():
    use_package(sys.argv)
    torch = import_torch_with_pluggable_allocator()
    import warnings
    import devmem
    import devmem.torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        devmem.torch.use()
    if not devmem.torch.graphs_supported():
        skip(f"PyTorch {torch.__version__} has no graph-pool hooks on CUDAPluggableAllocator")
    device = torch.cuda.current_device()

    def private():
        s = devmem.stats_json(device)["stats"]
        return s["private_pools"], s["private_reserved_bytes"]

    def body(x):
        tmp = x * 2          # allocated and freed inside the captured region
        out = tmp.sin() + 1
        del tmp
        return out

    x = torch.randn(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as torch.cuda.graph's documentation asks
        for _ in range(3):
            body(x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = body(x)
    pools, reserved = private()
    if pools < 1 or reserved <= 0:
        fail(f"after the capture devmem has {pools} private pools, {reserved} bytes")

    # Eager work while the graph lives: were it handed the memory the captured region
    # freed (tmp), the replay below would overwrite it.
    eager = [torch.empty(1 << 20, device="cuda") for _ in range(8)]
    x.copy_(torch.randn(1 << 20, device="cuda"))
    for t in eager:
        t.fill_(7.0)
    g.replay()
    torch.cuda.synchronize()
    want = body(x)
    if not torch.equal(y, want):
        fail("the replay's output differs from eager execution")
    for t in eager:
        if not bool((t == 7.0).all()):
            fail("a replay overwrote an eager tensor: the graph's memory was handed out")

    del g, y, want
    torch.cuda.synchronize()
    import gc
    gc.collect()
    devmem.empty_cache()
    pools, reserved = private()
    if pools != 0 or reserved != 0:
        fail(f"after the graph was deleted devmem still has {pools} private pools, "
             f"{reserved} bytes")
    print(f"ok: graph captured and replayed through devmem's private pool "
          f"(PyTorch {torch.__version__})")


if __name__ == "__main__":
    main()
