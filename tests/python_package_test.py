"""tests/python_package_test.py [LIBDEVMEM_SO]: the devmem Python package (python/devmem)
over libdevmem.so on a 64 MiB sim device. Runs under pytest (ctest python.package, when
pytest is installed) or as a plain unittest program.

Each test allocates through the C ABI (devmem_alloc, what PyTorch's and CuPy's entry
points also reach) and reads the figures back through the package, in PyTorch's key
names. The tests share one process and so one runtime: each frees what it allocates and
compares figures relative to where it started.
"""
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(os.path.dirname(HERE), "python")
# The library: the first argument (ctest passes the built one), else DEVMEM_LIBRARY, else
# what the package finds itself. Under pytest the arguments are pytest's, so ctest sets
# DEVMEM_LIBRARY there.
if len(sys.argv) > 1 and ".so" in sys.argv[1]:
    os.environ["DEVMEM_LIBRARY"] = os.path.abspath(sys.argv[1])
os.environ.setdefault("DEVMEM_CONF", "backend:sim,sim_capacity:64MiB")
sys.path.insert(0, PYTHON_DIR)

import devmem  # noqa: E402
from devmem import _lib  # noqa: E402

MiB = 1 << 20


def alloc(size):
    p = ctypes.c_void_p()
    _lib.check(_lib.lib().devmem_alloc(ctypes.byref(p), size, 0, None))
    return p.value


def free(p):
    _lib.check(_lib.lib().devmem_free(p))


class MemoryStats(unittest.TestCase):
    def test_torch_key_names(self):
        keys = set(devmem.memory_stats(0))
        # Names torch.cuda.memory_stats() has (PyTorch 2.x, c10/cuda/CUDACachingAllocator).
        for k in ("allocated_bytes.all.current", "reserved_bytes.large_pool.peak",
                  "allocation.small_pool.allocated", "segment.all.freed",
                  "active_bytes.large_pool.current", "inactive_split_bytes.all.peak",
                  "requested_bytes.small_pool.current", "oversize_allocations.current",
                  "oversize_segments.peak", "num_alloc_retries", "num_ooms",
                  "num_sync_all_streams", "num_device_alloc", "num_device_free",
                  "max_split_size"):
            self.assertIn(k, keys)
        # devmem's own names ("small" pool, pending_bytes, cache_hits) are not PyTorch's.
        for k in keys:
            self.assertNotIn(".small.", k)
            self.assertNotIn(".large.", k)
            self.assertFalse(k.startswith(("pending_bytes", "cache_", "num_frees")), k)
        self.assertEqual(list(devmem.memory_stats(0)), sorted(keys))
        self.assertEqual(devmem.memory_stats(0)["max_split_size"], -1)  # unlimited

    def test_figures_follow_allocations(self):
        before = devmem.memory_stats()
        big, small = alloc(3 * MiB), alloc(1000)
        during = devmem.memory_stats()
        free(big)
        free(small)
        after = devmem.memory_stats()
        d = lambda s, k: s[k] - before[k]  # noqa: E731
        self.assertEqual(d(during, "allocated_bytes.large_pool.current"), 3 * MiB)
        self.assertEqual(d(during, "allocated_bytes.small_pool.current"), 1024)  # 512 B rounding
        self.assertEqual(d(during, "requested_bytes.small_pool.current"), 1000)
        self.assertEqual(d(during, "allocation.all.current"), 2)
        self.assertEqual(d(after, "allocated_bytes.all.current"), 0)
        self.assertEqual(d(after, "allocated_bytes.all.freed"), 3 * MiB + 1024)
        self.assertEqual(devmem.memory_allocated(), after["allocated_bytes.all.current"])
        self.assertGreaterEqual(devmem.max_memory_allocated(), 3 * MiB + 1024)

    def test_reset_peak(self):
        free(alloc(5 * MiB))
        self.assertGreaterEqual(devmem.memory_stats()["allocated_bytes.all.peak"], 5 * MiB)
        devmem.reset_peak_memory_stats()
        s = devmem.memory_stats()
        self.assertEqual(s["allocated_bytes.all.peak"], s["allocated_bytes.all.current"])
        self.assertEqual(s["reserved_bytes.all.peak"], s["reserved_bytes.all.current"])
        devmem.reset_peak_memory_stats(-1)  # every device: fine too

    def test_reset_accumulated(self):
        free(alloc(MiB))
        devmem.reset_accumulated_memory_stats()
        s = devmem.memory_stats()
        self.assertEqual(s["allocated_bytes.all.freed"], 0)
        self.assertEqual(s["allocated_bytes.all.allocated"], s["allocated_bytes.all.current"])

    def test_bad_device_names_it(self):
        with self.assertRaisesRegex(devmem.DevmemError, "-5"):
            devmem.memory_stats(-5)
        with self.assertRaisesRegex(devmem.DevmemError, "-7"):
            devmem.reset_peak_memory_stats(-7)
        with self.assertRaisesRegex(devmem.DevmemError, "'cuda:x'"):
            devmem.memory_stats("cuda:x")
        self.assertEqual(devmem.memory_stats("sim:0").keys(), devmem.memory_stats(0).keys())


class Controls(unittest.TestCase):
    def test_mem_get_info(self):
        free0, total = devmem.mem_get_info()
        self.assertEqual(total, 64 * MiB)
        p = alloc(8 * MiB)
        free1, _ = devmem.mem_get_info()
        free(p)
        self.assertLessEqual(free1, free0 - 8 * MiB)  # the sim: capacity - reserved

    def test_arena_scope(self):
        with devmem.arena("step"):
            a = alloc(1000)
            b = alloc(1000)
            self.assertEqual(b - a, 1024)  # bumps in one chunk
            free(a)
        free(b)  # escaped the block: still valid
        with self.assertRaises(TypeError):
            with devmem.arena(3):
                pass
        with self.assertRaises(devmem.DevmemError) as e:
            with devmem.arena("x", device=-1):
                pass
        self.assertIn("device -1", str(e.exception))
        devmem.empty_cache()

    def test_empty_cache(self):
        free(alloc(4 * MiB))
        self.assertGreater(devmem.memory_reserved(), 0)
        devmem.empty_cache()
        self.assertEqual(devmem.memory_reserved(), 0)
        self.assertEqual(devmem.mem_get_info()[0], 64 * MiB)

    def test_memory_fraction(self):
        devmem.empty_cache()
        try:
            devmem.set_per_process_memory_fraction(0.25)
            with self.assertRaises(devmem.OutOfMemoryError) as oom:
                alloc(20 * MiB)
            self.assertIn("per_process_memory_fraction", str(oom.exception))
            self.assertIsInstance(oom.exception, MemoryError)
            free(alloc(8 * MiB))  # under the cap
        finally:
            devmem.set_per_process_memory_fraction(1.0)
        free(alloc(20 * MiB))
        for bad in (0.0, 1.5, -1.0, float("nan")):
            with self.assertRaisesRegex(devmem.DevmemError, "fraction .* not in"):
                devmem.set_per_process_memory_fraction(bad)

    def test_summary(self):
        with devmem.tag("summary-holder"):
            p = alloc(2 * MiB)
        try:
            text = devmem.memory_summary()
        finally:
            free(p)
        self.assertIn("devmem memory summary", text)
        self.assertIn("Allocated memory", text)
        self.assertRegex(text, r"2\.0+ MiB.*summary-holder @ capi")

    def test_versions(self):
        self.assertEqual(devmem.library_version(), devmem.__version__)
        self.assertTrue(os.path.exists(devmem.library_path()))


class TagsAndSnapshot(unittest.TestCase):
    def test_tag_names_the_site(self):
        with devmem.tag("forward"):
            with devmem.tag("attention"):
                inner = alloc(MiB)
            outer = alloc(MiB)
        untagged = alloc(MiB)
        snap = devmem.snapshot()
        for p in (inner, outer, untagged):
            free(p)
        sites = {s["id"]: s for s in snap["sites"]}
        tags = {}
        for d in snap["devices"]:
            for b in d["live_buffers"]:
                tags[b["addr"]] = sites[b["site"]]["tag"]
        self.assertEqual(tags[inner], "attention")
        self.assertEqual(tags[outer], "forward")
        self.assertEqual(tags[untagged], "")
        self.assertEqual(snap["schema"], "devmem.snapshot/1")

    def test_tag_pops_on_exception(self):
        with self.assertRaises(ZeroDivisionError):
            with devmem.tag("doomed"):
                1 / 0
        # The stack is empty again: one more pop is an error that says so.
        with self.assertRaisesRegex(devmem.DevmemError, "no tag pushed"):
            _lib.check(_lib.lib().devmem_pop_tag())
        with self.assertRaises(TypeError):
            with devmem.tag(b"bytes"):
                pass


def _run_python(code, env_extra, path_extra=()):
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([*path_extra, PYTHON_DIR])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60)


class TorchGraphHooks(unittest.TestCase):
    """devmem.torch installs its graph-pool hooks where PyTorch takes them (no PyTorch
    here: an object with the setters of CUDAPluggableAllocator.allocator())."""

    class _Pluggable:
        def __init__(self, hooks):
            self._hooks = hooks

        def allocator(self):
            return self._hooks

    def test_hooks_get_devmems_functions(self):
        import devmem.torch as dt
        got = {}

        class Hooks:
            def set_begin_allocate_to_pool(self, f): got["begin"] = f
            def set_end_allocate_to_pool_fn(self, f): got["end"] = f
            def set_release_pool(self, f): got["release"] = f

        dt._install_graph_hooks(self._Pluggable(Hooks()), "test")
        lib = _lib.lib()
        for key, name in (("begin", "devmem_torch_begin_allocate_to_pool"),
                          ("end", "devmem_torch_end_allocate_to_pool"),
                          ("release", "devmem_torch_release_pool")):
            self.assertEqual(got[key], ctypes.cast(getattr(lib, name), ctypes.c_void_p).value)
        self.assertTrue(dt.graphs_supported())
        dt._graphs = False

    def test_release_stream_refusals_name_the_stream(self):
        import devmem.torch as dt
        with self.assertRaisesRegex(devmem.DevmemError, r"devmem_release_stream\(0, NULL\)"):
            dt.release_stream(0, device=0)
        # The sim device has no streams to release (on CUDA the handle is retired).
        with self.assertRaisesRegex(devmem.DevmemError, "sim:0 has no streams"):
            dt.release_stream(0x1234, device=0)

    def test_without_hooks_it_warns_and_says_unsupported(self):
        import devmem.torch as dt
        with self.assertWarnsRegex(RuntimeWarning, "not safe"):
            dt._install_graph_hooks(self._Pluggable(object()), "2.1")
        self.assertFalse(dt.graphs_supported())


class Loading(unittest.TestCase):
    def test_missing_library_is_named(self):
        r = _run_python("import devmem; devmem.memory_stats()",
                        {"DEVMEM_LIBRARY": "/nonexistent/libdevmem.so"})
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("DEVMEM_LIBRARY=/nonexistent/libdevmem.so: no such file", r.stderr)

    def test_import_loads_nothing(self):
        r = _run_python("import sys, devmem; print('devmem._lib' in sys.modules, "
                        "devmem._lib._lib is None, 'torch' in sys.modules)",
                        {"DEVMEM_LIBRARY": "/nonexistent/libdevmem.so"})
        self.assertEqual(r.stdout.split(), ["True", "True", "False"], r.stderr)

    def test_pip_install(self):
        # pip install ./python, offline: --no-build-isolation, so the interpreter needs
        # setuptools and wheel itself (Debian's python3 has them: scripts/setup.sh).
        have = "import setuptools, wheel, pip"
        python = next((p for p in (sys.executable, "/usr/bin/python3")
                       if os.path.exists(p) and subprocess.run(
                           [p, "-c", have], capture_output=True).returncode == 0), None)
        if python is None:
            self.skipTest("no interpreter with pip, setuptools and wheel "
                          "(python3-pip python3-setuptools python3-wheel)")
        with tempfile.TemporaryDirectory() as tmp:
            # From a copy: setuptools writes build/ and *.egg-info beside pyproject.toml.
            source, target = os.path.join(tmp, "src"), os.path.join(tmp, "site")
            shutil.copytree(PYTHON_DIR, source, ignore=shutil.ignore_patterns("__pycache__"))
            r = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps",
                                "--no-build-isolation", "--no-index", "--target", target,
                                source], capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run([python, "-c",
                                "import devmem; print(devmem.__file__); "
                                "print(devmem.memory_stats()['allocated_bytes.all.current'])"],
                               env={**os.environ, "PYTHONPATH": target}, capture_output=True,
                               text=True, timeout=60, cwd=target)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(r.stdout.startswith(target), r.stdout)


# Stand-ins for PyTorch builds without what use() needs: each must be refused, saying why.
FAKE_TORCH = {
    "no_cuda_build": "version = type('v', (), {'cuda': None})()\n__version__ = '2.3.0+cpu'\n",
    "no_pluggable": ("version = type('v', (), {'cuda': '12.1'})()\n__version__ = '1.13.1'\n"
                     "class cuda:\n    class memory: pass\n"),
    "no_gpu": ("version = type('v', (), {'cuda': '12.1'})()\n__version__ = '2.3.0'\n"
               "class cuda:\n    is_available = staticmethod(lambda: False)\n"
               "    class memory:\n        CUDAPluggableAllocator = object\n"),
}
EXPECTED = {
    "no_cuda_build": "built without CUDA",
    "no_pluggable": "no torch.cuda.memory.CUDAPluggableAllocator",
    "no_gpu": "CUDA is not available to PyTorch",
}


class TorchUse(unittest.TestCase):
    def test_refusals_say_why(self):
        for case, source in FAKE_TORCH.items():
            with tempfile.TemporaryDirectory() as d:
                os.makedirs(os.path.join(d, "torch"))
                with open(os.path.join(d, "torch", "__init__.py"), "w") as f:
                    f.write(source)
                r = _run_python("import devmem.torch\ntry:\n    devmem.torch.use()\n"
                                "except RuntimeError as e:\n    print(e)\n", {}, [d])
                self.assertIn(EXPECTED[case], r.stdout, case + r.stderr)

    def test_without_torch(self):
        r = _run_python("import devmem.torch\ntry:\n    devmem.torch.use()\n"
                        "except RuntimeError as e:\n    print(e)\n", {})
        try:
            import torch  # noqa: F401
            self.skipTest("torch is installed for this interpreter")
        except ImportError:
            self.assertIn("PyTorch is not installed", r.stdout, r.stderr)


# A PyTorch with CUDA as far as use() can tell: CUDAPluggableAllocator and
# change_current_allocator record what they get. SETTER adds set_record_stream_fn to
# the native allocator (recent PyTorch); RECORD gives torch.Tensor a record_stream that
# records its calls (every PyTorch).
WORKING_TORCH = """
version = type('v', (), {'cuda': '12.1'})()
__version__ = '2.5.0'
hook = []
calls = []
class _Native:
    pass
class _Pluggable:
    def __init__(self, path, alloc, free):
        self.native = _Native()
    def allocator(self):
        return self.native
class cuda:
    is_available = staticmethod(lambda: True)
    class memory:
        CUDAPluggableAllocator = _Pluggable
        change_current_allocator = staticmethod(lambda a: None)
class _Storage:
    def __init__(self, p): self.p = p
    def data_ptr(self): return self.p
class Stream:
    def __init__(self, raw): self.cuda_stream = raw
class Tensor:
    def __init__(self, p): self.p = p
    def untyped_storage(self): return _Storage(self.p)
"""
SETTER = "_Native.set_record_stream_fn = lambda self, fn: hook.append(fn)\n"
RECORD = "Tensor.record_stream = lambda self, stream: calls.append(stream)\n"


class TorchRecordStream(unittest.TestCase):
    def run_with_torch(self, source, code):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "torch"))
            with open(os.path.join(d, "torch", "__init__.py"), "w") as f:
                f.write(WORKING_TORCH + source)
            return _run_python("import ctypes, devmem, devmem.torch, torch\n"
                               "lib = devmem._lib.lib()\n" + code, {}, [d])

    def test_the_hook_where_pytorch_takes_one(self):
        r = self.run_with_torch(SETTER + RECORD, """
            devmem.torch.use()
            print("route", devmem.torch.record_stream_route())
            fn = torch.hook[0]
            print("ours", fn == ctypes.cast(lib.devmem_torch_record_stream, ctypes.c_void_p).value)
            # Called as PyTorch calls it, with a pointer devmem does not hold.
            ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(fn)(0x1000, None)
            print("last", lib.devmem_last_error().decode())
            print("wrapped", torch.Tensor.record_stream.__name__)
        """.replace("\n            ", "\n"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("route hook", r.stdout)
        self.assertIn("ours True", r.stdout)
        self.assertIn("0x1000", r.stdout)  # it reached devmem_record_stream
        self.assertIn("devmem_torch_record_stream failed", r.stderr)
        self.assertIn("wrapped <lambda>", r.stdout)  # no wrapper besides the hook

    def test_a_wrapper_where_it_takes_none(self):
        r = self.run_with_torch(RECORD, """
            devmem.torch.use()
            print("route", devmem.torch.record_stream_route())
            p = ctypes.c_void_p()
            devmem._lib.check(lib.devmem_alloc(ctypes.byref(p), 4096, 0, None))
            t = torch.Tensor(p.value)
            t.record_stream(torch.Stream(0))
            print("pytorch saw", len(torch.calls))
            devmem._lib.check(lib.devmem_free(p))
            try:
                t.record_stream(torch.Stream(0))
            except devmem.DevmemError as e:
                print("refused", hex(p.value) in str(e))
        """.replace("\n            ", "\n"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("route wrapper", r.stdout)
        self.assertIn("pytorch saw 1", r.stdout)
        self.assertIn("refused True", r.stdout)  # devmem's record_stream named the pointer
        self.assertNotIn("warning", r.stderr)

    def test_a_warning_where_neither_is_possible(self):
        r = self.run_with_torch("", """
            devmem.torch.use()
            devmem.torch.use()
            print("route", devmem.torch.record_stream_route())
        """.replace("\n            ", "\n"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("route None", r.stdout)
        self.assertEqual(r.stderr.count("devmem.torch: warning:"), 1, r.stderr)
        self.assertIn("devmem.torch.record_stream(tensor, stream)", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]])
