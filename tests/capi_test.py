#!/usr/bin/env python3
"""libdevmem.so through Python's ctypes, as PyTorch and CuPy call it.

    capi_test.py LIBDEVMEM_SO

Runs on a 64 MiB simulated device (DEVMEM_CONF is set here, before the library's
first call). Checks:
  * the PyTorch-style (devmem_torch_alloc/free) and CuPy-style (devmem_cupy_malloc/
    free) entry points allocate and free, and the snapshot lists each live buffer under
    the pushed tag and the entry point's site;
  * their errors (a foreign stream on the sim, a double free, an OOM whose report names
    the requesting tag and the holder's) reach both the last error and stderr, since
    PyTorch and CuPy ignore a NULL;
  * loading the library leaves the process's malloc alone: jemalloc is not mapped, and
    Python's own allocator, exercised heavily between devmem calls, keeps working;
  * the cpu device works where jemalloc is preloaded and fails cleanly where it is not
    (subprocesses).
Prints "N passed, N failed"; exit status 1 on any failure.
"""
import contextlib
import ctypes
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capi_bindings as capi  # noqa: E402

MiB = 1 << 20
PASSED = []
FAILED = []


def check(cond, what):
    (PASSED if cond else FAILED).append(what)
    if not cond:
        print("FAIL:", what, file=sys.stderr)


@contextlib.contextmanager
def captured_stderr():
    """What C code writes to file descriptor 2 inside the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    out = {}
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            out["text"] = f.read().decode(errors="replace")


def jemalloc_mapped():
    with open("/proc/self/maps") as f:
        return "jemalloc" in f.read()


def test_pytorch_and_cupy_entry_points(lib):
    check(lib.devmem_push_tag(b"model") == capi.DEVMEM_OK, "push_tag")
    p = lib.devmem_torch_alloc(MiB, 0, None)
    check(bool(p), "devmem_torch_alloc returns a pointer")
    ctypes.memset(p, 0x5A, MiB)  # the sim's memory is host accessible
    check(ctypes.string_at(p + MiB - 4, 4) == b"ZZZZ", "the memory is usable")
    c = lib.devmem_cupy_malloc(None, 3000, 0)
    check(bool(c) and c != p, "devmem_cupy_malloc returns another pointer")
    check(lib.devmem_torch_alloc(0, 0, None) is None, "size 0 gives NULL")

    snap = capi.snapshot(lib)
    buf, site = capi.live_buffer(snap, p)
    check(buf is not None and buf["size"] == MiB, "the snapshot lists the torch buffer")
    check(site is not None and site["tag"] == "model" and site["file"] == "capi/torch"
          and site["function"] == "devmem_torch_alloc" and site["kind"] == "alloc",
          "its site is the tag at capi/torch: %r" % (site,))
    buf, site = capi.live_buffer(snap, c)
    check(buf is not None and buf["requested"] == 3000, "the snapshot lists the cupy buffer")
    check(site is not None and site["tag"] == "model" and site["file"] == "capi/cupy",
          "its site is the tag at capi/cupy: %r" % (site,))

    st = capi.stats(lib, 0)
    check(st["schema"] == "devmem.stats/1" and st["device"] == "sim:0", "stats names sim:0")
    torch_site = capi.site_stats(st, "model @ capi/torch (alloc)")
    check(torch_site is not None and torch_site["live_bytes"] == MiB
          and torch_site["live_count"] == 1, "stats count the torch site: %r" % (torch_site,))
    check(st["stats"]["allocation"]["all"]["current"] == 2, "two live allocations")

    lib.devmem_torch_free(p, MiB, 0, None)
    lib.devmem_cupy_free(None, c, 0)
    check(capi.live_buffer(capi.snapshot(lib), p)[0] is None, "freed buffers leave the snapshot")
    check(lib.devmem_pop_tag() == capi.DEVMEM_OK, "pop_tag")
    return p


def test_errors_reach_stderr(lib, freed):
    # A stream the sim did not create.
    with captured_stderr() as err:
        q = lib.devmem_torch_alloc(4096, 0, ctypes.c_void_p(0x1234))
    check(q is None, "a foreign stream on the sim gives NULL")
    check("stream 0x1234 on sim:0" in capi.last_error(lib), "the error names the stream")
    check("devmem_torch_alloc failed" in err["text"], "and is on stderr: %r" % err["text"])

    # A double free through the PyTorch entry point.
    with captured_stderr() as err:
        lib.devmem_torch_free(freed, MiB, 0, None)
    check(hex(freed) in capi.last_error(lib), "a double free names the pointer: "
          + capi.last_error(lib))
    check("devmem_torch_free failed" in err["text"] and hex(freed) in err["text"],
          "and is on stderr")
    check(lib.devmem_free(freed) == capi.DEVMEM_ERR_INVALID, "devmem_free refuses it too")

    # An OOM: the report names who asked and who holds the memory.
    lib.devmem_push_tag(b"weights")
    w = lib.devmem_cupy_malloc(None, 40 * MiB, 0)
    check(bool(w), "40 MiB of 64 fit")
    lib.devmem_push_tag(b"activations")
    with captured_stderr() as err:
        a = lib.devmem_torch_alloc(40 * MiB, 0, None)
    message = capi.last_error(lib)
    check(a is None, "another 40 MiB do not")
    check("out of memory on sim:0" in message, "the last error is the OOM report")
    check("requested by: activations @ capi/torch (alloc)" in message,
          "it names the requesting tag: " + message)
    check("1. weights @ capi/cupy (alloc): 40.0 MiB" in message, "and the holder's")
    check("requested by: activations" in err["text"], "and is on stderr")
    rc = lib.devmem_alloc(ctypes.byref(ctypes.c_void_p()), 40 * MiB, 0, None)
    check(rc == capi.DEVMEM_ERR_OOM, "devmem_alloc says DEVMEM_ERR_OOM")
    check(lib.devmem_error_name(rc) == b"DEVMEM_ERR_OOM", "devmem_error_name")
    lib.devmem_pop_tag()
    lib.devmem_pop_tag()
    lib.devmem_cupy_free(None, w, 0)
    check(lib.devmem_empty_cache(-1) == capi.DEVMEM_OK, "empty_cache")
    st = capi.stats(lib, 0)
    check(st["stats"]["reserved_bytes"]["all"]["current"] == 0, "nothing is reserved after it")
    check(st["stats"]["num_ooms"] == 2, "two OOMs counted")


def test_python_malloc_survives(lib):
    """Python's allocator keeps working around devmem calls: any mix of two mallocs
    (one allocating, the other freeing) would abort the process here. Every devmem call
    must succeed (at most 7 x 4 MiB are live on the 64 MiB device), and every Python
    object kept must still hold what was written into it."""
    rng = random.Random(7)
    keep = []
    live = []
    allocs = 0
    bad = []  # what went wrong, first few
    check(lib.devmem_push_tag(b"churn") == capi.DEVMEM_OK, "push_tag before the churn")
    for i in range(30000):
        n = rng.choice((16, 200, 600, 4000, 70000, 300000))
        obj = bytearray(n)
        obj[-1] = i & 0xFF
        keep.append((i, obj))
        keep.append((i, {str(i): [i] * (n % 50), "s": "x" * (n % 3000)}))
        if len(keep) > 400:
            del keep[: rng.randint(1, 300)]
        if i % 50 == 0:
            p = ctypes.c_void_p()
            rc = lib.devmem_alloc(ctypes.byref(p), rng.randint(1, 4 * MiB), 0, None)
            if rc != capi.DEVMEM_OK or not p.value:
                bad.append("devmem_alloc during churn: %d %s" % (rc, capi.last_error(lib)))
            else:
                live.append(p.value)
                allocs += 1
            if len(live) > 6:
                rc = lib.devmem_free(live.pop(rng.randrange(len(live))))
                if rc != capi.DEVMEM_OK:
                    bad.append("devmem_free during churn: " + capi.last_error(lib))
        if i % 2000 == 0:
            if len(capi.snapshot(lib)["devices"]) < 1:
                bad.append("a snapshot during churn lists no device")
            if lib.devmem_push_tag(("phase%d" % i).encode()) != capi.DEVMEM_OK or \
                    lib.devmem_pop_tag() != capi.DEVMEM_OK:
                bad.append("push/pop tag during churn: " + capi.last_error(lib))
    for p in live:
        if lib.devmem_free(p) != capi.DEVMEM_OK:
            bad.append("devmem_free after churn: " + capi.last_error(lib))
    check(lib.devmem_pop_tag() == capi.DEVMEM_OK, "pop_tag after the churn")
    check(not bad, "every devmem call during the churn succeeded: %r" % bad[:3])
    check(allocs == 600, "600 devmem allocations during the churn, got %d" % allocs)
    corrupt = [i for i, obj in keep
               if (obj[-1] != i & 0xFF if isinstance(obj, bytearray)
                   else obj[str(i)] != [i] * len(obj[str(i)]))]
    check(len(keep) > 0 and not corrupt,
          "30000 rounds of Python allocations around devmem calls left every kept object "
          "intact (%d kept, corrupt: %r)" % (len(keep), corrupt[:3]))
    check(not jemalloc_mapped(), "jemalloc is not loaded into the process")


CPU_SCRIPT = r"""
import ctypes, sys
sys.path.insert(0, sys.argv[2])
import capi_bindings as capi
lib = capi.load(sys.argv[1])
p = ctypes.c_void_p()
rc = lib.devmem_alloc(ctypes.byref(p), 1 << 20, 0, None)
print("rc", rc, capi.last_error(lib).splitlines()[0] if rc else "")
if rc == 0:
    ctypes.memset(p.value, 1, 1 << 20)
    print("device", capi.stats(lib, 0)["device"])
    print("free", lib.devmem_free(p.value))
"""


def run_cpu_device(path, preload):
    env = dict(os.environ, DEVMEM_CONF="backend:cpu")
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = "libjemalloc.so.2"
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run([sys.executable, "-c", CPU_SCRIPT, path, here], env=env,
                          capture_output=True, text=True, timeout=60)


def test_cpu_device(path):
    r = run_cpu_device(path, preload=True)
    check(r.returncode == 0 and "rc 0" in r.stdout and "device cpu" in r.stdout
          and "free 0" in r.stdout,
          "with jemalloc preloaded the cpu device works: %r %r" % (r.stdout, r.stderr))
    r = run_cpu_device(path, preload=False)
    check(r.returncode == 0 and "rc 4" in r.stdout and "mallctl" in r.stdout,
          "without it, the cpu device fails cleanly: %r" % (r.stdout,))
    check("LD_PRELOAD=libjemalloc.so.2" in r.stderr, "and says how to fix it: %r" % r.stderr)


def main():
    path = os.path.abspath(sys.argv[1])
    os.environ["DEVMEM_CONF"] = "backend:sim,sim_capacity:64MiB"
    lib = capi.load(path)
    check(not jemalloc_mapped(), "loading libdevmem.so does not load jemalloc")
    freed = test_pytorch_and_cupy_entry_points(lib)
    test_errors_reach_stderr(lib, freed)
    test_python_malloc_survives(lib)
    test_cpu_device(path)
    print("%d passed, %d failed" % (len(PASSED), len(FAILED)))
    for f in FAILED:
        print("  failed:", f)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
