"""devmem from Python: its statistics and controls under torch.cuda's names.

    import devmem
    devmem.memory_stats(0)["allocated_bytes.all.current"]   # torch.cuda.memory_stats keys
    print(devmem.memory_summary())
    with devmem.tag("forward"):                             # attributes allocations
        ...
    devmem.torch.use()   # devmem as PyTorch's CUDA allocator (devmem/torch.py)

`device` is a devmem device index (capi/devmem.h: cuda:N on CUDA, sim:N on the
simulated device); None means device 0, as torch.cuda's functions mean the current
device. Every function loads libdevmem.so on first use (devmem/_lib.py says which file)
and raises DevmemError (OutOfMemoryError for out of memory) with devmem's message.
Thread-safe, as the C ABI is; tags are per thread.
"""
import contextlib
import ctypes
import json

from . import _lib as _capi
from ._lib import DevmemError, OutOfMemoryError, path as library_path

_check = _capi.check
_owned_string = _capi.owned_string

__version__ = "0.1.0"

__all__ = [
    "DevmemError", "OutOfMemoryError", "library_path", "library_version",
    "memory_stats", "stats_json", "memory_summary", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "mem_get_info", "empty_cache", "snapshot", "tag", "arena",
    "set_per_process_memory_fraction", "memory_allocated", "max_memory_allocated",
    "memory_reserved", "max_memory_reserved",
]

# devmem.stats/1 (docs/formats.md) names -> torch.cuda.memory_stats() names. devmem's
# pools are "all", "small", "large"; PyTorch's "all", "small_pool", "large_pool".
_POOLS = {"all": "all", "small": "small_pool", "large": "large_pool"}
# The per-pool statistics PyTorch has (pending_bytes is devmem's own).
_POOLED = ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
           "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
_UNPOOLED = ("oversize_allocations", "oversize_segments")
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
             "num_device_free", "max_split_size")
_INT64_MAX = (1 << 63) - 1


def _index(device):
    if device is None:
        return 0
    if isinstance(device, bool) or not isinstance(device, int):
        # torch.device and "cuda:1" style names: their index.
        index = getattr(device, "index", None)
        if isinstance(device, str) and ":" in device:
            index = device.rsplit(":", 1)[1]
        try:
            return int(index if index is not None else 0)
        except (TypeError, ValueError):
            raise DevmemError(f"device {device!r}: not a device index", 2) from None
    return device


def library_version():
    """The version of the loaded libdevmem.so ("0.1.0")."""
    return _capi.lib().devmem_version().decode()


def stats_json(device=None):
    """devmem's own statistics of `device` (devmem.stats/1, docs/formats.md): every
    figure, including those PyTorch has no key for (pending_bytes, cache_hits, ...),
    and the per-site counters."""
    return json.loads(_owned_string(_capi.lib().devmem_stats_json(_index(device))))


def memory_stats(device=None):
    """torch.cuda.memory_stats(device): a dict sorted by key, with PyTorch's flat names
    ("allocated_bytes.all.current", "reserved_bytes.large_pool.peak",
    "num_alloc_retries", ...), for every figure devmem has under PyTorch's meaning.
    max_split_size is -1 when unlimited, as PyTorch reports it."""
    stats = stats_json(device)["stats"]
    out = {}
    for name in _POOLED:
        for pool, torch_pool in _POOLS.items():
            for field, value in stats[name][pool].items():
                out[f"{name}.{torch_pool}.{field}"] = value
    for name in _UNPOOLED:
        for field, value in stats[name].items():
            out[f"{name}.{field}"] = value
    for name in _COUNTERS:
        out[name] = stats[name]
    if out["max_split_size"] >= _INT64_MAX:
        out["max_split_size"] = -1
    return dict(sorted(out.items()))


def memory_summary(device=None, abbreviated=False):
    """torch.cuda.memory_summary(device): devmem's statistics table and the sites that
    hold the most memory, as text. `abbreviated` is accepted for PyTorch's signature."""
    return _owned_string(_capi.lib().devmem_memory_summary(_index(device)))


def memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    """torch.cuda.reset_peak_memory_stats: every peak of `device` becomes its current
    value. A device devmem has not used is left alone."""
    _check(_capi.lib().devmem_reset_peak_stats(_index(device)))


def reset_accumulated_memory_stats(device=None):
    """torch.cuda.reset_accumulated_memory_stats: totals and counters back to start."""
    _check(_capi.lib().devmem_reset_accumulated_stats(_index(device)))


def set_per_process_memory_fraction(fraction, device=None):
    """torch.cuda.set_per_process_memory_fraction: caps what `device` reserves at
    `fraction` (0 < fraction <= 1) of its total memory."""
    _check(_capi.lib().devmem_set_memory_fraction(float(fraction), _index(device)))


def mem_get_info(device=None):
    """torch.cuda.mem_get_info: (free, total) bytes of `device` as its driver sees them."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _check(_capi.lib().devmem_mem_get_info(_index(device), ctypes.byref(free), ctypes.byref(total)))
    return free.value, total.value


def empty_cache(device=None):
    """torch.cuda.empty_cache: returns every unused cached segment to the driver; with
    no `device`, on every device devmem has used (as PyTorch does)."""
    _check(_capi.lib().devmem_empty_cache(-1 if device is None else _index(device)))


def snapshot():
    """The runtime's snapshot, devmem.snapshot/1 (docs/formats.md), parsed: every
    device's stats, segments, blocks and live buffers, and the site table.
    `memtrace export --to pytorch-snapshot` turns a saved one into PyTorch's format."""
    return json.loads(_owned_string(_capi.lib().devmem_snapshot_json()))


@contextlib.contextmanager
def tag(name):
    """with devmem.tag("forward"): allocations this thread makes through libdevmem.so
    inside are attributed to the site named after the tag. Tags nest; per thread."""
    if not isinstance(name, str):
        raise TypeError(f"devmem.tag: the tag must be a str, not {type(name).__name__}")
    _check(_capi.lib().devmem_push_tag(name.encode()))
    try:
        yield
    finally:
        _check(_capi.lib().devmem_pop_tag())


@contextlib.contextmanager
def arena(name, device=0):
    """with devmem.arena("step"): this thread's allocations on `device` inside are bump
    allocations in a scoped arena (capi/devmem.h, devmem_arena_push); buffers that
    outlive the block stay valid. Scopes nest; per thread."""
    if not isinstance(name, str):
        raise TypeError(f"devmem.arena: the name must be a str, not {type(name).__name__}")
    _check(_capi.lib().devmem_arena_push(int(device), name.encode()))
    try:
        yield
    finally:
        _check(_capi.lib().devmem_arena_pop())


def __getattr__(name):
    # devmem.torch on first use: importing devmem never imports PyTorch.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'devmem' has no attribute {name!r}")
