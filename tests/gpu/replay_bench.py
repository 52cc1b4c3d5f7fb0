#!/usr/bin/env python3
"""One allocation trace replayed through four allocators, side by side.

    replay_bench.py [--lib LIBDEVMEM_SO] [--allocators devmem,torch,async,malloc]
                    [--json OUT.json] [--repeat N] TRACE [TRACE...]
    replay_bench.py --one ALLOCATOR [--lib ...] TRACE      (one run; JSON on stdout)

Allocators (each replays in a process of its own, so that one's cache, pool or
CUDA context state cannot favour the next):
  devmem   libdevmem.so's C ABI: devmem_alloc / devmem_free on device 0, default
           stream (DEVMEM_CONF applies: backend:sim replays on the simulated device,
           which is what the ctest gpu_check.offline does without a GPU).
  torch    PyTorch's caching allocator: torch.cuda.caching_allocator_alloc /
           caching_allocator_delete on cuda:0, current stream.
  async    cudaMallocAsync / cudaFreeAsync on the legacy default stream, from the
           device's default memory pool with cudaMemPoolAttrReleaseThreshold set
           (--release-threshold, default UINT64_MAX: the pool keeps what it has), via
           ctypes on the libcudart that PyTorch (or the system) provides.
  malloc   plain cudaMalloc / cudaFree, via the same libcudart.

Figures per allocator and trace:
  pair_ns_p50 / pair_ns_p99   alloc call + the matching free call, in ns, timed with
                              time.perf_counter_ns around each call; every allocator is
                              called from Python, so each figure includes the call
                              overhead (call_floor_ns: a ctypes call that does nothing
                              useful, devmem_version or cudaGetLastError, for scale);
  peak_reserved_bytes         what the allocator holds from the driver at its peak:
                              devmem's reserved_bytes peak, torch.cuda.max_memory_reserved,
                              the pool's cudaMemPoolAttrReservedMemHigh, and for plain
                              cudaMalloc the peak of the live requested bytes (it caches
                              nothing; the driver's own rounding is not visible);
  peak_requested_bytes        the trace's own peak of live requested bytes;
  driver_calls                devmem: num_device_alloc (cudaMalloc or map calls),
                              num_device_free (cudaFree or unmap calls), num_sync_all_streams,
                              cache_misses; torch: its num_device_alloc / num_device_free;
                              malloc: the calls themselves; async: not observable.
The trace's streams are ignored (every allocator replays on one stream); sizes are
the events' requested bytes ("requested", else "size"); frees match allocations by
address. Output: one table on stdout, and with --json every figure as one document.
A missing framework or library is a "skipped" entry with the reason, not a failure;
a failed allocation (out of memory, a driver error) is a failure naming the event.
"""
import argparse
import ctypes
import glob
import gzip
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ALLOCATORS = ("devmem", "torch", "async", "malloc")


class Skip(Exception):
    pass


def read_trace(path):
    """[(kind, key, size)]: ("a", addr, bytes) for an allocation, ("f", addr, 0)."""
    opener = gzip.open if path.endswith(".gz") else open
    events = []
    with opener(path, "rt") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                e = json.loads(line)
            except ValueError as err:
                raise SystemExit(f"{path}:{number}: not JSON: {err}")
            action = e.get("action")
            if action == "alloc":
                size = int(e.get("requested", e.get("size", 0)))
                events.append(("a", int(e["addr"]), size))
            elif action == "free":
                events.append(("f", int(e["addr"]), 0))
    if not events:
        raise SystemExit(f"{path}: no alloc or free events")
    return events


def percentile(sorted_values, q):
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[i]


def load_cudart():
    """libcudart through ctypes: the one PyTorch ships (nvidia/cuda_runtime), else the
    loader's. Raises Skip with the names tried."""
    candidates = []
    for base in sys.path:
        candidates += sorted(glob.glob(os.path.join(base, "nvidia", "cuda_runtime", "lib",
                                                    "libcudart.so*")))
    candidates += ["libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"]
    errors = []
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError as err:
            errors.append(str(err))
    raise Skip("no libcudart could be loaded (" + "; ".join(errors[-3:]) + ")")


class Replayer:
    """alloc(size) -> handle, free(handle); stats() after the replay."""

    def call_floor(self):
        return None

    def stats(self):
        return {}


class Devmem(Replayer):
    def __init__(self, lib_path):
        if not os.path.exists(lib_path):
            raise Skip(f"{lib_path} does not exist")
        lib = ctypes.CDLL(lib_path)
        lib.devmem_alloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                     ctypes.c_int, ctypes.c_void_p]
        lib.devmem_free.argtypes = [ctypes.c_void_p]
        lib.devmem_stats_json.restype = ctypes.c_void_p
        lib.devmem_string_free.argtypes = [ctypes.c_void_p]
        lib.devmem_last_error.restype = ctypes.c_char_p
        lib.devmem_version.restype = ctypes.c_char_p
        self.lib = lib
        self.out = ctypes.c_void_p()
        self.alloc_fn = lib.devmem_alloc
        self.free_fn = lib.devmem_free
        self.ref = ctypes.byref(self.out)

    def alloc(self, size):
        rc = self.alloc_fn(self.ref, size, 0, None)
        if rc != 0:
            raise RuntimeError(f"devmem_alloc({size}): error {rc}: "
                               f"{self.lib.devmem_last_error().decode()}")
        return self.out.value

    def free(self, p):
        rc = self.free_fn(p)
        if rc != 0:
            raise RuntimeError(f"devmem_free: {self.lib.devmem_last_error().decode()}")

    def call_floor(self):
        return self.lib.devmem_version

    def stats(self):
        raw = self.lib.devmem_stats_json(0)
        doc = json.loads(ctypes.string_at(raw).decode())
        self.lib.devmem_string_free(raw)
        s = doc["stats"]
        return {
            "device": doc.get("device"),
            "peak_reserved_bytes": s["reserved_bytes"]["all"]["peak"],
            "driver_calls": {k: s.get(k) for k in ("num_device_alloc", "num_device_free",
                                                   "num_sync_all_streams", "cache_misses",
                                                   "cache_hits", "num_alloc_retries")},
        }


class Torch(Replayer):
    def __init__(self, lib_path):
        try:
            import torch
        except ImportError as err:
            raise Skip(f"PyTorch is not installed ({err})")
        if not torch.cuda.is_available():
            raise Skip("PyTorch sees no GPU")
        self.torch = torch
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats(0)
        self.alloc_fn = torch.cuda.caching_allocator_alloc
        self.free_fn = torch.cuda.caching_allocator_delete

    def alloc(self, size):
        return self.alloc_fn(size, 0)

    def free(self, p):
        self.free_fn(p)

    def call_floor(self):
        return self.torch.cuda.current_device

    def stats(self):
        m = self.torch.cuda.memory_stats(0)
        return {
            "device": f"cuda:0 ({self.torch.cuda.get_device_name(0)})",
            "peak_reserved_bytes": self.torch.cuda.max_memory_reserved(0),
            "driver_calls": {"num_device_alloc": m.get("num_device_alloc"),
                             "num_device_free": m.get("num_device_free"),
                             "num_alloc_retries": m.get("num_alloc_retries")},
        }


class Cudart(Replayer):
    def __init__(self, lib_path, asynchronous, release_threshold):
        self.rt = rt = load_cudart()
        self.asynchronous = asynchronous
        count = ctypes.c_int()
        if rt.cudaGetDeviceCount(ctypes.byref(count)) != 0 or count.value == 0:
            raise Skip("cudaGetDeviceCount finds no GPU")
        self.check(rt.cudaSetDevice(0), "cudaSetDevice(0)")
        self.ptr = ctypes.c_void_p()
        self.ref = ctypes.byref(self.ptr)
        self.calls = {"cudaMalloc": 0, "cudaFree": 0}
        self.live = 0
        self.sizes = {}
        self.peak_live = 0
        if asynchronous:
            self.pool = ctypes.c_void_p()
            self.check(rt.cudaDeviceGetDefaultMemPool(ctypes.byref(self.pool), 0),
                       "cudaDeviceGetDefaultMemPool")
            threshold = ctypes.c_uint64(release_threshold)
            # cudaMemPoolAttrReleaseThreshold = 4
            self.check(rt.cudaMemPoolSetAttribute(self.pool, 4, ctypes.byref(threshold)),
                       "cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)")
            zero = ctypes.c_uint64(0)
            # cudaMemPoolAttrReservedMemHigh = 6: reset to 0 so the peak is this run's
            rt.cudaMemPoolSetAttribute(self.pool, 6, ctypes.byref(zero))
            rt.cudaMallocAsync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            rt.cudaFreeAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        else:
            rt.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            rt.cudaFree.argtypes = [ctypes.c_void_p]

    def check(self, rc, what):
        if rc != 0:
            self.rt.cudaGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what}: CUDA error {rc}: "
                               f"{self.rt.cudaGetErrorString(rc).decode()}")

    def alloc(self, size):
        if self.asynchronous:
            rc = self.rt.cudaMallocAsync(self.ref, size, None)
        else:
            rc = self.rt.cudaMalloc(self.ref, size)
            self.calls["cudaMalloc"] += 1
        self.check(rc, f"cudaMalloc{'Async' if self.asynchronous else ''}({size})")
        return self.ptr.value

    def free(self, p):
        if self.asynchronous:
            self.check(self.rt.cudaFreeAsync(p, None), "cudaFreeAsync")
        else:
            self.calls["cudaFree"] += 1
            self.check(self.rt.cudaFree(p), "cudaFree")

    def call_floor(self):
        return self.rt.cudaGetLastError

    def stats(self):
        self.check(self.rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        if self.asynchronous:
            high = ctypes.c_uint64()
            self.check(self.rt.cudaMemPoolGetAttribute(self.pool, 6, ctypes.byref(high)),
                       "cudaMemPoolGetAttribute(cudaMemPoolAttrReservedMemHigh)")
            return {"device": "cuda:0", "peak_reserved_bytes": high.value,
                    "driver_calls": {"note": "inside the driver's pool: not observable"}}
        return {"device": "cuda:0", "peak_reserved_bytes": None,
                "peak_reserved_note": "plain cudaMalloc caches nothing: see peak_requested_bytes",
                "driver_calls": dict(self.calls)}


def make(name, args):
    if name == "devmem":
        return Devmem(args.lib)
    if name == "torch":
        return Torch(args.lib)
    if name == "async":
        return Cudart(args.lib, True, args.release_threshold)
    if name == "malloc":
        return Cudart(args.lib, False, 0)
    raise SystemExit(f"unknown allocator {name!r} (one of {', '.join(ALLOCATORS)})")


def floor_ns(fn):
    if fn is None:
        return None
    samples = []
    for _ in range(2000):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    samples.sort()
    return percentile(samples, 0.5)


def run_one(name, trace_path, args):
    """Replays `trace_path` through allocator `name`; returns the result document."""
    try:
        r = make(name, args)
    except Skip as why:
        return {"allocator": name, "trace": trace_path, "skipped": str(why)}
    events = read_trace(trace_path)
    clock = time.perf_counter_ns
    pairs = []
    live_handles = {}  # trace addr -> (handle, size, alloc ns)
    live = peak = 0
    for repeat in range(args.repeat):
        for number, (kind, addr, size) in enumerate(events, 1):
            if kind == "a":
                if addr in live_handles:
                    raise SystemExit(f"{trace_path}: event {number}: address {addr:#x} "
                                     "allocated twice without a free")
                t0 = clock()
                handle = r.alloc(size)
                dt = clock() - t0
                live_handles[addr] = (handle, size, dt)
                live += size
                peak = max(peak, live)
            else:
                entry = live_handles.pop(addr, None)
                if entry is None:
                    continue  # freed before the trace began
                handle, size, alloc_ns = entry
                t0 = clock()
                r.free(handle)
                pairs.append(alloc_ns + clock() - t0)
                live -= size
        for handle, size, _ in live_handles.values():  # what the trace leaves live
            r.free(handle)
            live -= size
        live_handles.clear()
    pairs.sort()
    doc = {
        "allocator": name,
        "trace": trace_path,
        "events": len(events) * args.repeat,
        "pairs": len(pairs),
        "pair_ns_p50": percentile(pairs, 0.50),
        "pair_ns_p99": percentile(pairs, 0.99),
        "call_floor_ns": floor_ns(r.call_floor()),
        "peak_requested_bytes": peak,
    }
    doc.update(r.stats())
    if doc.get("peak_reserved_bytes") is None and name == "malloc":
        doc["peak_reserved_bytes"] = peak
    return doc


def mib(n):
    return "-" if n is None else f"{n / 2**20:.1f} MiB"


def table(results):
    lines = [f"{'trace':<28} {'allocator':<8} {'p50 ns':>9} {'p99 ns':>9} "
             f"{'floor ns':>9} {'peak reserved':>14} {'peak requested':>15}  driver calls"]
    for d in results:
        trace = os.path.basename(d["trace"])[:28]
        if "skipped" in d:
            lines.append(f"{trace:<28} {d['allocator']:<8} skipped: {d['skipped']}")
            continue
        if "failed" in d:
            lines.append(f"{trace:<28} {d['allocator']:<8} FAILED: {d['failed']}")
            continue
        calls = ", ".join(f"{k}={v}" for k, v in (d.get("driver_calls") or {}).items()
                          if v is not None)
        lines.append(f"{trace:<28} {d['allocator']:<8} {d['pair_ns_p50']:>9} "
                     f"{d['pair_ns_p99']:>9} {d['call_floor_ns'] or '-':>9} "
                     f"{mib(d['peak_reserved_bytes']):>14} "
                     f"{mib(d['peak_requested_bytes']):>15}  {calls}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--lib", default=os.path.join(HERE, "..", "..", "build", "lib",
                                                 "libdevmem.so"))
    p.add_argument("--allocators", default=",".join(ALLOCATORS))
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--repeat", type=int, default=1, help="replay each trace N times")
    p.add_argument("--release-threshold", type=int, default=2**64 - 1)
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        try:
            doc = run_one(args.one, args.traces[0], args)
        except RuntimeError as err:
            doc = {"allocator": args.one, "trace": args.traces[0], "failed": str(err)}
        print(json.dumps(doc))
        return 1 if "failed" in doc else 0
    results = []
    failed = False
    for trace in args.traces:
        for name in args.allocators.split(","):
            cmd = [sys.executable, os.path.abspath(__file__), "--one", name, "--lib", args.lib,
                   "--repeat", str(args.repeat), "--release-threshold",
                   str(args.release_threshold), trace]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            try:
                doc = json.loads(proc.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                doc = {"allocator": name, "trace": trace,
                       "failed": f"exit status {proc.returncode}: "
                                 f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}"}
            failed |= "failed" in doc
            results.append(doc)
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "devmem.replay_bench/1",
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "results": results}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
