"""devmem as PyTorch's CUDA allocator.

    import devmem.torch
    devmem.torch.use()     # before the first CUDA tensor
    ... train ...
    print(devmem.memory_summary())

use() installs libdevmem.so's devmem_torch_alloc/devmem_torch_free through
torch.cuda.memory.CUDAPluggableAllocator (PyTorch 2.0 and later), the same file the
devmem package loaded, so devmem.memory_stats() and the rest see PyTorch's memory.
Where that cannot work it raises RuntimeError saying why: PyTorch missing, built
without CUDA, no GPU or driver, a PyTorch without CUDAPluggableAllocator, or an
allocator PyTorch has already initialized. capi/README.md says what changes once
devmem is PyTorch's allocator (torch.cuda.memory_stats() raises: use devmem's).
"""
from . import _lib

_installed = None


def use():
    """Makes devmem PyTorch's CUDA allocator; returns the CUDAPluggableAllocator.
    Calling it again returns the installed one."""
    global _installed
    if _installed is not None:
        return _installed
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(f"devmem.torch.use(): PyTorch is not installed ({e})") from None
    if getattr(torch.version, "cuda", None) is None:
        raise RuntimeError(f"devmem.torch.use(): this PyTorch ({torch.__version__}) was built "
                           "without CUDA, so it has no CUDA allocator to replace")
    pluggable = getattr(torch.cuda.memory, "CUDAPluggableAllocator", None)
    if pluggable is None:
        raise RuntimeError(f"devmem.torch.use(): PyTorch {torch.__version__} has no "
                           "torch.cuda.memory.CUDAPluggableAllocator (PyTorch 2.0 or later)")
    if not torch.cuda.is_available():
        raise RuntimeError("devmem.torch.use(): CUDA is not available to PyTorch "
                           "(torch.cuda.is_available() is False: no GPU, or no driver)")
    allocator = pluggable(_lib.path(), "devmem_torch_alloc", "devmem_torch_free")
    try:
        torch.cuda.memory.change_current_allocator(allocator)
    except RuntimeError as e:
        raise RuntimeError("devmem.torch.use(): PyTorch refused the allocator: call it "
                           f"before the first CUDA tensor exists ({e})") from None
    _installed = allocator
    return allocator
