#!/usr/bin/env python3
"""A PyTorch training run on devmem's allocator gives the losses PyTorch's own gives.

    torch_training_step.py [LIBDEVMEM_SO]          (default: build/lib/libdevmem.so)
    torch_training_step.py --one own|devmem LIB    (one run; JSON on stdout)

Runs the same small training twice, each in a fresh process (the allocator can only
be chosen before the first CUDA allocation): a CNN + MLP head (conv 3->16, relu,
maxpool, linear 16*8*8->64, relu, linear 64->10), fixed seed, synthetic data, 8 SGD
steps with momentum on cuda:0, deterministic algorithms (torch.use_deterministic_
algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8, cuDNN benchmark off). Once with PyTorch's
caching allocator, once with devmem as torch.cuda.memory.CUDAPluggableAllocator
(devmem_torch_alloc / devmem_torch_free). Expected: every step's loss bit-for-bit
equal (the same kernels on the same data; memory addresses do not enter the
arithmetic), and devmem saw the allocations (devmem_stats_json counts them).
Prints "ok: ..." and exits 0; "SKIP: ..." and exits 0 without PyTorch/CUDA/GPU;
"FAIL: ..." and exits 1 otherwise.
"""
import ctypes
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 8


def train(mode, lib):
    import torch

    if not torch.cuda.is_available():
        return {"skip": "PyTorch sees no GPU"}
    if mode == "devmem":
        alloc = torch.cuda.memory.CUDAPluggableAllocator(lib, "devmem_torch_alloc",
                                                         "devmem_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(1234)
    dev = torch.device("cuda:0")
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(99)
    x = torch.randn(64, 3, 16, 16, generator=gen).to(dev)
    y = torch.randint(0, 10, (64,), generator=gen).to(dev)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out = {"losses": [float.hex(v) for v in losses], "loss_values": losses}
    if mode == "devmem":
        lib_handle = ctypes.CDLL(lib)
        lib_handle.devmem_stats_json.restype = ctypes.c_void_p
        raw = lib_handle.devmem_stats_json(0)
        stats = json.loads(ctypes.string_at(raw).decode())["stats"]
        out["devmem_allocations"] = stats["allocation"]["all"]["allocated"]
        out["devmem_peak_reserved"] = stats["reserved_bytes"]["all"]["peak"]
    else:
        out["torch_peak_reserved"] = torch.cuda.max_memory_reserved(0)
    return out


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--one":
        mode, lib = sys.argv[2], sys.argv[3]
        print(json.dumps(train(mode, lib)))
        return 0
    lib = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                          os.path.join(HERE, "..", "..", "build", "lib", "libdevmem.so"))
    try:
        import torch
    except ImportError as err:
        print(f"SKIP: PyTorch is not installed ({err})")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: PyTorch sees no GPU")
        return 0
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    runs = {}
    for mode in ("own", "devmem"):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", mode, lib],
                              capture_output=True, text=True, env=env, timeout=300)
        try:
            runs[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            print(f"FAIL: the {mode} run exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
            return 1
        if "skip" in runs[mode]:
            print(f"SKIP: {runs[mode]['skip']}")
            return 0
    own, dm = runs["own"], runs["devmem"]
    print(f"losses (PyTorch's allocator): {own['loss_values']}")
    print(f"losses (devmem):              {dm['loss_values']}")
    if dm.get("devmem_allocations", 0) == 0:
        print("FAIL: devmem saw no allocation: the pluggable allocator was not used")
        return 1
    if own["losses"] != dm["losses"]:
        worst = max(abs(a - b) for a, b in zip(own["loss_values"], dm["loss_values"]))
        print(f"FAIL: the losses differ (largest difference {worst:.3g})")
        return 1
    print(f"ok: {STEPS} steps, every loss bit-for-bit equal; devmem made "
          f"{dm['devmem_allocations']} allocations, peak reserved "
          f"{dm['devmem_peak_reserved'] / 2**20:.1f} MiB vs PyTorch's "
          f"{own['torch_peak_reserved'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
