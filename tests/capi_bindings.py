"""ctypes bindings of libdevmem.so (capi/devmem.h) for the tests in tests/ and
tests/gpu/. Not a test itself.

    lib = load(path)            # every function with its argument and result types
    stats(lib, device)          # devmem_stats_json parsed, or AssertionError
    snapshot(lib)               # devmem_snapshot_json parsed
    live_buffer(snap, addr)     # (buffer, its site table entry) or (None, None)
"""
import ctypes
import json

DEVMEM_OK = 0
DEVMEM_ERR_OOM = 1
DEVMEM_ERR_INVALID = 2
DEVMEM_ERR_CONFIG = 3
DEVMEM_ERR_INTERNAL = 4

_SIGNATURES = {
    # PyTorch: void* (ssize_t, int, cudaStream_t); void (void*, ssize_t, int, cudaStream_t)
    "devmem_torch_alloc": (ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    "devmem_torch_free": (None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    # PyTorch's set_record_stream_fn: void (void*, cudaStream_t)
    "devmem_torch_record_stream": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    # CuPy: void* (void*, size_t, int); void (void*, void*, int)
    "devmem_cupy_malloc": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]),
    "devmem_cupy_free": (None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]),
    "devmem_alloc": (ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                    ctypes.c_int, ctypes.c_void_p]),
    "devmem_free": (ctypes.c_int, [ctypes.c_void_p]),
    "devmem_record_stream": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),
    "devmem_release_stream": (ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]),
    "devmem_empty_cache": (ctypes.c_int, [ctypes.c_int]),
    "devmem_last_error": (ctypes.c_char_p, []),
    "devmem_error_name": (ctypes.c_char_p, [ctypes.c_int]),
    # Owned strings: c_void_p, so that ctypes does not convert (and lose) the pointer.
    "devmem_snapshot_json": (ctypes.c_void_p, []),
    "devmem_stats_json": (ctypes.c_void_p, [ctypes.c_int]),
    "devmem_string_free": (None, [ctypes.c_void_p]),
    "devmem_push_tag": (ctypes.c_int, [ctypes.c_char_p]),
    "devmem_pop_tag": (ctypes.c_int, []),
    "devmem_arena_push": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p]),
    "devmem_arena_pop": (ctypes.c_int, []),
}


def load(path):
    lib = ctypes.CDLL(path)
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def last_error(lib):
    return lib.devmem_last_error().decode()


def _owned_json(lib, ptr):
    assert ptr, "devmem returned NULL: " + last_error(lib)
    try:
        return json.loads(ctypes.string_at(ptr).decode())
    finally:
        lib.devmem_string_free(ptr)


def stats(lib, device):
    return _owned_json(lib, lib.devmem_stats_json(device))


def snapshot(lib):
    return _owned_json(lib, lib.devmem_snapshot_json())


def live_buffer(snap, addr):
    sites = {s["id"]: s for s in snap["sites"]}
    for device in snap["devices"]:
        for buf in device["live_buffers"]:
            if buf["addr"] == addr:
                return buf, sites.get(buf["site"])
    return None, None


def site_stats(st, where):
    """The entry of devmem_stats_json's "sites" whose text is `where`, or None."""
    for s in st["sites"]:
        if s["where"] == where:
            return s
    return None
