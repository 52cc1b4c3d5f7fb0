"""Finding and loading libdevmem.so, and its C functions with their ctypes types.

Which library (the first that exists):
  1. the file the environment variable DEVMEM_LIBRARY names (an error if it is missing:
     a path set on purpose is never silently replaced by another);
  2. the build tree beside this package: <repo>/build/lib/libdevmem.so when the package
     is imported from <repo>/python (PYTHONPATH=python);
  3. the system loader's libdevmem.so.MAJOR.MINOR, then libdevmem.so (LD_LIBRARY_PATH,
     an installed prefix in the loader's path).

The library is loaded once per process, on first use (importing devmem loads nothing),
and every function's result and argument types are set: ctypes' default int would
truncate pointers. Thread-safe: the first load is guarded by a lock.
"""
import ctypes
import os
import threading

# The SONAME this package was written for (capi/CMakeLists.txt): major.minor.
SONAME = "libdevmem.so.0.1"

DEVMEM_OK = 0
DEVMEM_ERR_OOM = 1
DEVMEM_ERR_INVALID = 2
DEVMEM_ERR_CONFIG = 3
DEVMEM_ERR_INTERNAL = 4

_c = ctypes
_SIGNATURES = {
    "devmem_torch_alloc": (_c.c_void_p, [_c.c_ssize_t, _c.c_int, _c.c_void_p]),
    "devmem_torch_free": (None, [_c.c_void_p, _c.c_ssize_t, _c.c_int, _c.c_void_p]),
    "devmem_torch_record_stream": (None, [_c.c_void_p, _c.c_void_p]),
    "devmem_record_stream": (_c.c_int, [_c.c_void_p, _c.c_void_p]),
    "devmem_release_stream": (_c.c_int, [_c.c_int, _c.c_void_p]),
    "devmem_alloc": (_c.c_int, [_c.POINTER(_c.c_void_p), _c.c_size_t, _c.c_int, _c.c_void_p]),
    "devmem_free": (_c.c_int, [_c.c_void_p]),
    "devmem_empty_cache": (_c.c_int, [_c.c_int]),
    "devmem_last_error": (_c.c_char_p, []),
    "devmem_error_name": (_c.c_char_p, [_c.c_int]),
    # Owned strings stay c_void_p, so that the pointer survives for devmem_string_free.
    "devmem_snapshot_json": (_c.c_void_p, []),
    "devmem_stats_json": (_c.c_void_p, [_c.c_int]),
    "devmem_memory_summary": (_c.c_void_p, [_c.c_int]),
    "devmem_string_free": (None, [_c.c_void_p]),
    "devmem_push_tag": (_c.c_int, [_c.c_char_p]),
    "devmem_pop_tag": (_c.c_int, []),
    "devmem_arena_push": (_c.c_int, [_c.c_int, _c.c_char_p]),
    "devmem_arena_pop": (_c.c_int, []),
    "devmem_version": (_c.c_char_p, []),
    "devmem_reset_peak_stats": (_c.c_int, [_c.c_int]),
    "devmem_reset_accumulated_stats": (_c.c_int, [_c.c_int]),
    "devmem_set_memory_fraction": (_c.c_int, [_c.c_double, _c.c_int]),
    "devmem_mem_get_info": (_c.c_int, [_c.c_int, _c.POINTER(_c.c_size_t),
                                       _c.POINTER(_c.c_size_t)]),
}


class DevmemError(RuntimeError):
    """A devmem call failed; the message is devmem's (it names the bad input)."""

    def __init__(self, message, code=DEVMEM_ERR_INTERNAL):
        super().__init__(message)
        self.code = code


class OutOfMemoryError(DevmemError, MemoryError):
    """DEVMEM_ERR_OOM: the message is devmem's OOM report (holders by site, remedy)."""


_lock = threading.Lock()
_lib = None
_path = None


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    yield os.path.join(repo, "build", "lib", "libdevmem.so")
    yield SONAME
    yield "libdevmem.so"


def _load():
    env = os.environ.get("DEVMEM_LIBRARY")
    if env:
        if not os.path.exists(env):
            raise DevmemError(f"DEVMEM_LIBRARY={env}: no such file", DEVMEM_ERR_CONFIG)
        return ctypes.CDLL(env), os.path.abspath(env)
    tried = []
    for c in _candidates():
        if os.sep in c and not os.path.exists(c):
            tried.append(c)
            continue
        try:
            lib = ctypes.CDLL(c)
        except OSError as e:
            tried.append(f"{c} ({e})")
            continue
        return lib, _loaded_path(lib, c)
    raise DevmemError("libdevmem.so not found; set DEVMEM_LIBRARY to its path. Tried: " +
                      "; ".join(tried), DEVMEM_ERR_CONFIG)


def _loaded_path(lib, name):
    """The file the loader chose for `name` (PyTorch must load the same one)."""
    if os.sep in name:
        return os.path.abspath(name)
    addr = ctypes.cast(lib.devmem_version, ctypes.c_void_p).value
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                if lo <= addr < hi and len(fields) >= 6:
                    return fields[5]
    except OSError:
        pass
    return name


def lib():
    """The loaded library, its functions typed."""
    global _lib, _path
    if _lib is None:
        with _lock:
            if _lib is None:
                loaded, path = _load()
                for name, (restype, argtypes) in _SIGNATURES.items():
                    try:
                        fn = getattr(loaded, name)
                    except AttributeError:
                        raise DevmemError(f"{path} has no {name}: it is older than this "
                                          f"package (needs {SONAME})", DEVMEM_ERR_CONFIG)
                    fn.restype = restype
                    fn.argtypes = argtypes
                _path = path
                _lib = loaded
    return _lib


def path():
    """The path of the loaded libdevmem.so."""
    lib()
    return _path


def check(code):
    """Raises the DevmemError (OutOfMemoryError for OOM) of a failed call's code."""
    if code == DEVMEM_OK:
        return
    message = lib().devmem_last_error().decode(errors="replace")
    raise (OutOfMemoryError if code == DEVMEM_ERR_OOM else DevmemError)(message, code)


def owned_string(ptr):
    """The text of a malloc'd char* the library returned, freed; DevmemError on NULL."""
    if not ptr:
        message = lib().devmem_last_error().decode(errors="replace")
        raise DevmemError(message or "devmem returned NULL", DEVMEM_ERR_INVALID)
    try:
        return ctypes.string_at(ptr).decode()
    finally:
        lib().devmem_string_free(ptr)
