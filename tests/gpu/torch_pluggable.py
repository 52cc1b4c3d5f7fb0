#!/usr/bin/env python3
"""PyTorch with devmem as its CUDA allocator (torch.cuda.memory.CUDAPluggableAllocator).

    torch_pluggable.py [LIBDEVMEM_SO]      (default: build/lib/libdevmem.so)

Swaps PyTorch's allocator for libdevmem.so's devmem_torch_alloc/devmem_torch_free
before any CUDA memory is allocated, trains a small MLP for five steps on the GPU and
on the CPU from the same weights and data, and checks that:
  * the losses agree (the memory devmem hands out holds what PyTorch wrote) and fall;
  * devmem saw the allocations: devmem_stats_json names cuda:N and counts them, the
    tag pushed around the training is a site with live buffers, and every parameter
    is a live devmem buffer under that tag in the snapshot;
  * PyTorch's current stream reaches devmem (a tensor made under a side stream is a
    block of that cudaStream_t), and freed tensors leave the snapshot.
Needs PyTorch with CUDA and a GPU: without them it prints "SKIP: ..." and exits 0.
Nothing here calls torch.cuda.memory_allocated()/memory_stats(): with a pluggable
allocator PyTorch raises for those (devmem's stats are read through the C API).
"""
import copy
import ctypes
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import capi_bindings as capi  # noqa: E402
from gpu_script import fail, import_torch_with_pluggable_allocator, load_devmem_on_cuda  # noqa: E402


def main():
    path = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(HERE, "..", "..", "build", "lib", "libdevmem.so"))
    torch = import_torch_with_pluggable_allocator()

    lib = load_devmem_on_cuda(capi, path, "PyTorch")  # devmem itself must run on CUDA

    # The same path: PyTorch's ctypes.CDLL gets the handle loaded above, so both see one
    # devmem runtime.
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        path, "devmem_torch_alloc", "devmem_torch_free")
    torch.cuda.memory.change_current_allocator(allocator)

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, 10))
    x = torch.randn(32, 64)
    y = torch.randint(0, 10, (32,))

    def train(model, inputs, targets):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = []
        for _ in range(5):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    tag = b"torch_pluggable"
    if lib.devmem_push_tag(tag) != capi.DEVMEM_OK:
        fail(capi.last_error(lib))
    gpu_model = copy.deepcopy(cpu_model).to("cuda")
    gpu_losses = train(gpu_model, x.cuda(), y.cuda())
    lib.devmem_pop_tag()
    torch.cuda.synchronize()
    cpu_losses = train(cpu_model, x, y)
    print("losses (cuda):", ["%.5f" % v for v in gpu_losses])
    print("losses (cpu): ", ["%.5f" % v for v in cpu_losses])
    for g, c in zip(gpu_losses, cpu_losses):
        if abs(g - c) > 1e-3 * max(1.0, abs(c)):
            fail("the GPU losses differ from the CPU's: %r vs %r" % (gpu_losses, cpu_losses))
    if not gpu_losses[-1] < gpu_losses[0]:
        fail("the loss did not fall: %r" % gpu_losses)

    device = torch.cuda.current_device()
    st = capi.stats(lib, device)
    if st["device"] != "cuda:%d" % device:
        fail("devmem_stats_json(%d) is for %s" % (device, st["device"]))
    allocations = st["stats"]["allocation"]["all"]["allocated"]
    where = "torch_pluggable @ capi/torch (alloc)"
    site = capi.site_stats(st, where)
    print("devmem on %s: %d allocations; %s: %r" % (st["device"], allocations, where, site))
    params = list(gpu_model.parameters())
    if allocations < len(params) or site is None or site["live_count"] < len(params):
        fail("devmem did not see PyTorch's allocations: %r" % st["sites"])
    snap = capi.snapshot(lib)
    for p in params:
        buf, entry = capi.live_buffer(snap, p.data_ptr())
        if buf is None or entry is None or entry["tag"] != "torch_pluggable":
            fail("parameter %s at %#x is not a live devmem buffer under the tag: %r"
                 % (tuple(p.shape), p.data_ptr(), (buf, entry)))

    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        t.fill_(7)
    side.synchronize()
    addr = t.data_ptr()
    buf, _ = capi.live_buffer(capi.snapshot(lib), addr)
    if buf is None or buf["stream"] != side.cuda_stream:
        fail("a tensor made on stream %#x is %r in devmem" % (side.cuda_stream, buf))
    if int(t.sum().item()) != 7 << 20:
        fail("the side-stream tensor does not hold what was written")
    del t
    torch.cuda.synchronize()
    if capi.live_buffer(capi.snapshot(lib), addr)[0] is not None:
        fail("a deleted tensor is still live in devmem")
    if lib.devmem_empty_cache(device) != capi.DEVMEM_OK:
        fail(capi.last_error(lib))
    print("ok: PyTorch trained on devmem (%d allocations on %s)" % (allocations, st["device"]))


if __name__ == "__main__":
    main()
