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

CUDA graphs (torch.cuda.graph, torch.cuda.make_graphed_callables): where PyTorch's
pluggable allocator takes the graph-pool hooks (set_begin_allocate_to_pool,
set_end_allocate_to_pool_fn, set_release_pool on CUDAPluggableAllocator.allocator():
PyTorch 2.3 and later), use() installs devmem's, so a capture allocates from a private
pool whose memory no eager work is handed while the graph lives (graphs_supported() is
then True). Without them PyTorch never tells devmem about a capture: use() warns once,
and graphs_supported() is False. devmem still keeps such a capture intact (no cudaMalloc
in global mode, no event query or synchronize on a capturing stream), but memory freed
inside the captured region can be handed to other work that the graph's replays then
overwrite: do not capture graphs through devmem on such a PyTorch.

Tensor.record_stream(stream) must reach devmem, or a tensor used on a side stream (a
copy, an NCCL collective) is reused while that stream still works on it. use() makes
it so, in the first way this PyTorch allows (record_stream_route() says which):
  "hook"     the pluggable allocator's set_record_stream_fn (recent PyTorch) gets
             libdevmem.so's devmem_torch_record_stream;
  "wrapper"  otherwise torch.Tensor.record_stream is wrapped: PyTorch's own call, then
             devmem's record_stream on the storage's pointer and stream.cuda_stream;
  None       neither is possible: a warning says so once, and record_stream(tensor,
             stream) below must be called instead.
"""
import ctypes
import functools
import sys
import warnings

from . import _lib

_installed = None
_route = None
_warned = False


def record_stream(tensor, stream):
    """devmem's record_stream for a CUDA tensor: the free of its storage waits for the
    work queued so far on `stream` (a torch.cuda.Stream, or a raw cudaStream_t int).
    Raises DevmemError naming the pointer when devmem does not hold the storage."""
    storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    raw = getattr(stream, "cuda_stream", stream)
    _lib.check(_lib.lib().devmem_record_stream(ctypes.c_void_p(storage.data_ptr()),
                                               ctypes.c_void_p(raw or None)))


def release_stream(stream, device=None):
    """Retires `stream` (a torch.cuda.Stream, or a raw cudaStream_t int) of `device`
    (torch.cuda.current_device() when None) before the caller destroys it: devmem caches
    memory by stream handle, and a destroyed stream's handle comes back for the next
    stream created while the old one's kernels still run. Allocating on the handle is
    refused (DevmemError naming it) until those kernels are done. PyTorch's pooled
    streams are never destroyed; call it for an external stream before
    cudaStreamDestroy. Raises DevmemError for the default stream or a bad device."""
    raw = getattr(stream, "cuda_stream", stream)
    if device is None:
        device = getattr(stream, "device_index", None)
    if device is None:
        import torch
        device = torch.cuda.current_device()
    _lib.check(_lib.lib().devmem_release_stream(int(device), ctypes.c_void_p(raw or None)))


def record_stream_route():
    """How Tensor.record_stream reaches devmem since use(): "hook", "wrapper" or None."""
    return _route


def _install_record_stream(torch, allocator):
    native = allocator.allocator() if callable(getattr(allocator, "allocator", None)) else None
    setter = getattr(native, "set_record_stream_fn", None)
    if callable(setter):
        hook = ctypes.cast(_lib.lib().devmem_torch_record_stream, ctypes.c_void_p).value
        setter(hook)
        return "hook"
    original = getattr(getattr(torch, "Tensor", None), "record_stream", None)
    if original is None:
        return None

    @functools.wraps(original)
    def wrapped(self, stream):
        original(self, stream)  # PyTorch's own bookkeeping (a no-op for a pluggable one)
        record_stream(self, stream)

    try:
        torch.Tensor.record_stream = wrapped
    except (AttributeError, TypeError):  # a Tensor type that takes no attributes
        return None
    return "wrapper"


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
    _install_graph_hooks(allocator, torch.__version__)
    global _route, _warned
    _route = _install_record_stream(torch, allocator)
    if _route is None and not _warned:
        _warned = True
        print("devmem.torch: warning: this PyTorch offers no way to pass "
              "Tensor.record_stream to devmem (no set_record_stream_fn, and "
              "torch.Tensor.record_stream cannot be wrapped): a tensor used on another "
              "stream may be reused early; call devmem.torch.record_stream(tensor, "
              "stream) where you call tensor.record_stream(stream)", file=sys.stderr)
    _installed = allocator
    return allocator


_graphs = False


def graphs_supported():
    """True once use() installed devmem's graph-pool hooks (see the module text)."""
    return _graphs


def _install_graph_hooks(allocator, version):
    global _graphs
    hooks = allocator.allocator() if hasattr(allocator, "allocator") else None
    names = ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool")
    if hooks is None or not all(hasattr(hooks, n) for n in names):
        warnings.warn(f"devmem.torch: PyTorch {version} has no graph-pool hooks on "
                      "CUDAPluggableAllocator (PyTorch 2.3 or later): CUDA graphs captured "
                      "with devmem as the allocator are not safe (memory freed inside the "
                      "capture may be reused by eager work)", RuntimeWarning, stacklevel=3)
        return
    lib = _lib.lib()
    address = lambda name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    hooks.set_begin_allocate_to_pool(address("devmem_torch_begin_allocate_to_pool"))
    hooks.set_end_allocate_to_pool_fn(address("devmem_torch_end_allocate_to_pool"))
    hooks.set_release_pool(address("devmem_torch_release_pool"))
    _graphs = True
