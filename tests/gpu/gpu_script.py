"""What every GPU check script in tests/gpu/ shares: its exit protocol and the
preconditions it skips on.

A script prints "SKIP: why" and exits 0 where the machine lacks what it needs (no
PyTorch, no CUDA device, a PyTorch without CUDAPluggableAllocator, a libdevmem.so built
without the toolkit), and "FAIL: why" with exit 1 when devmem is wrong;
scripts/gpu-check.sh reads those lines.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def skip(why):
    print("SKIP: " + why)
    sys.exit(0)


def fail(why):
    print("FAIL: " + why)
    sys.exit(1)


def import_torch_with_pluggable_allocator():
    """PyTorch, when it has CUDA, a device and CUDAPluggableAllocator (2.0+); else skips.

    torch.cuda.is_available() does not initialize PyTorch's allocator, so the caller can
    still swap it afterwards."""
    try:
        import torch
    except ImportError:
        skip("PyTorch is not installed")
    if not torch.cuda.is_available():
        skip("PyTorch sees no CUDA device")
    if not hasattr(torch.cuda.memory, "CUDAPluggableAllocator"):
        skip("this PyTorch has no torch.cuda.memory.CUDAPluggableAllocator (2.0+)")
    return torch


def load_devmem_on_cuda(capi, path, framework):
    """libdevmem.so at `path` through tests/capi_bindings.py (`capi`), asked for the CUDA
    backend so that a library built without the toolkit says so instead of quietly
    using the simulated device: skips then, and fails when devmem cannot use cuda:0
    although `framework` ("PyTorch", "CuPy") can."""
    os.environ.setdefault("DEVMEM_CONF", "backend:cuda")
    lib = capi.load(path)
    raw = lib.devmem_stats_json(0)
    if not raw:
        error = capi.last_error(lib)
        if "built without CUDA" in error:
            skip("libdevmem.so was built without the CUDA toolkit: " + error)
        fail("devmem cannot use cuda:0 although %s can: %s" % (framework, error))
    lib.devmem_string_free(raw)
    return lib


def use_package(argv):
    """Puts python/ first on the path and points the devmem package at argv[1] when
    given (else it finds libdevmem.so itself); asks for the CUDA backend so that a
    library built without the toolkit says so instead of using the simulated device."""
    sys.path.insert(0, os.path.join(REPO, "python"))
    if len(argv) > 1:
        os.environ["DEVMEM_LIBRARY"] = os.path.abspath(argv[1])
    os.environ.setdefault("DEVMEM_CONF", "backend:cuda")
