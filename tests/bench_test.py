#!/usr/bin/env python3
"""tests/bench_test.py: devmem-bench as a user runs it (tools/bench/).

  bench_test.py DEVMEM_BENCH

  - `--json`: exit status 0, one JSON object whose figures are positive numbers and
    timed_segment_allocs 0 (every timed pair a cache hit); the shipped-path figures
    (tcache_pair_ns beside jemalloc, and mimalloc when the bench was built with it: then
    ratio_tcache_mimalloc is their quotient), threads2_speedup with each thread's CPU ns
    per pair alone and beside the other (or, where no pass ran both threads at once,
    none of the three and a note saying so: the machine decides, see check_threads2),
    the threads2 passes and those that counted, and the same through mimalloc when it
    ran at once, tensor_create_ns,
    intern_256_sites_ns; steady_maps_2streams a count >= 0; instructions_per_pair a
    positive number where perf_event_open is allowed, else absent with a note on
    stderr. No figure is compared with its target: speed is not a test's business;
  - the human table prints every figure beside its target;
  - `--threads2 --json` and `--threads2`: only the threads2 figures, exit status 0;
  - `--tensor`: one JSON line holding only a positive tensor_create_ns, exit status 0;
  - a policy under which timed pairs reach the device (expandable_recycle_threshold:0
    unmaps and maps idle granules all the time): exit status 1 and a message saying
    segments were allocated while timing;
  - a malformed DEVMEM_CONF: exit status 2, a message naming DEVMEM_CONF and the key.
"""
import json
import os
import subprocess
import sys

bench = sys.argv[1]
FIGURES = ["pair_ns_small", "jemalloc_pair_ns_small", "ratio_small", "pair_ns_mixed",
           "jemalloc_pair_ns_mixed", "ratio_mixed", "tensor_copy_ns", "slice_ns",
           "atomic_pair_ns", "untraced_pair_ns", "traced_pair_ns", "tracing_overhead_ratio",
           "tcache_pair_ns", "jemalloc_pair_ns_tcache", "tensor_create_ns",
           "intern_256_sites_ns", "arena_pair_ns", "arena_pool_pair_ns", "arena_step_ns",
           "pool_step_ns", "unsampled_pair_ns", "sampled_pair_ns",
           "sampled_stacks_overhead_ratio"]
# Present only when enough passes ran both threads at once (tools/bench/threads2.h).
THREADS2_FIGURES = ["threads2_speedup", "threads2_cpu_ns_per_pair_1", "threads2_cpu_ns_per_pair_2"]
THREADS2_ONLY_FIGURES = THREADS2_FIGURES + ["one_thread_pairs_per_s", "two_threads_pairs_per_s"]
MIMALLOC_FIGURES = ["mimalloc_pair_ns_tcache", "ratio_tcache_mimalloc", "ratio_arena_mimalloc"]


def fail(why):
    print("FAILED:", why)
    sys.exit(1)


def check_threads2(out, stderr, figures, where):
    """The threads2 keys of one --json object: whether the two threads ran at once is the
    machine's doing, so either every figure is there with the passes that counted, or
    none is and stderr says why; the pass counts are there either way."""
    passes, counted = out.get("threads2_passes"), out.get("threads2_passes_counted")
    if not isinstance(passes, int) or passes <= 0 or not isinstance(counted, int) \
            or not 0 <= counted <= passes:
        fail("%s: threads2_passes %r, threads2_passes_counted %r: expected counts, "
             "0 <= counted <= passes > 0" % (where, passes, counted))
    if counted > 0 and not 0.9 <= out.get("threads2_overlap", -1) <= 1.0:
        fail("%s: threads2_overlap %r: expected the counted passes' overlap, 0.9 .. 1"
             % (where, out.get("threads2_overlap")))
    if "threads2_speedup" in out:
        for k in figures:
            if not isinstance(out.get(k), (int, float)) or out[k] <= 0:
                fail("%s: %s: expected a positive number, got %r" % (where, k, out.get(k)))
        if counted < 3:
            fail("%s: a threads2_speedup from %d counted passes" % (where, counted))
    elif any(k in out for k in figures) or "no threads2_speedup" not in stderr:
        fail("%s: no threads2_speedup: expected none of %s and a note saying why"
             % (where, figures))
    # The same harness through mimalloc (the machine's reference): all three or none
    # (no mimalloc, or with a note).
    mi = ["threads2_speedup_mimalloc", "threads2_cpu_ns_per_pair_1_mimalloc",
          "threads2_cpu_ns_per_pair_2_mimalloc"]
    if "threads2_speedup_mimalloc" in out:
        for k in mi:
            if not isinstance(out.get(k), (int, float)) or out[k] <= 0:
                fail("%s: %s: expected a positive number, got %r" % (where, k, out.get(k)))
    elif any(k in out for k in mi):
        fail("%s: %s without threads2_speedup_mimalloc" % (where, mi))


def run(conf, args=("--json",)):
    env = dict(os.environ)
    env.pop("DEVMEM_CONF", None)
    if conf is not None:
        env["DEVMEM_CONF"] = conf
    r = subprocess.run([bench, *args], capture_output=True, text=True, env=env, timeout=300)
    print("$ DEVMEM_CONF=%r devmem-bench %s -> %d" % (conf, " ".join(args), r.returncode))
    print(r.stdout, r.stderr)
    return r


r = run(None)
if r.returncode != 0:
    fail("exit status %d" % r.returncode)
out = json.loads(r.stdout)
for k in FIGURES:
    if not isinstance(out.get(k), (int, float)) or out[k] <= 0:
        fail("%s: expected a positive number, got %r" % (k, out.get(k)))
check_threads2(out, r.stderr, THREADS2_FIGURES, "--json")
if out.get("timed_segment_allocs") != 0:
    fail("timed_segment_allocs: expected 0, got %r" % out.get("timed_segment_allocs"))
maps = out.get("steady_maps_2streams")
if not isinstance(maps, int) or maps < 0:
    fail("steady_maps_2streams: expected a count >= 0, got %r" % maps)
if "mimalloc_pair_ns_tcache" in out:
    for k in MIMALLOC_FIGURES:
        if not isinstance(out.get(k), (int, float)) or out[k] <= 0:
            fail("%s: expected a positive number, got %r" % (k, out.get(k)))
    quotient = out["tcache_pair_ns"] / out["mimalloc_pair_ns_tcache"]
    if abs(out["ratio_tcache_mimalloc"] - quotient) > 0.01 * quotient + 0.001:
        fail("ratio_tcache_mimalloc %r is not tcache_pair_ns / mimalloc_pair_ns_tcache (%r)"
             % (out["ratio_tcache_mimalloc"], quotient))
elif "ratio_tcache_mimalloc" in out or "mimalloc" not in r.stderr:
    fail("without mimalloc: expected no ratio_tcache_mimalloc and a note naming mimalloc")
if "instructions_per_pair" in out:
    if not isinstance(out["instructions_per_pair"], (int, float)) or out["instructions_per_pair"] <= 0:
        fail("instructions_per_pair: expected a positive number, got %r" % out["instructions_per_pair"])
elif "instructions_per_pair" not in r.stderr:
    fail("instructions_per_pair absent without a note saying why")

r = run(None, args=())
if r.returncode != 0:
    fail("table: exit status %d" % r.returncode)
rows = [("threads2_speedup", ">= 1.8"), ("tensor_create_ns", "<= 100"),
        ("intern_256_sites_ns", "<= 15"), ("steady_maps_2streams", " 0 ")]
rows.append(("shipped vs. mimalloc", "<= 2.0" if "mimalloc_pair_ns_tcache" in out else "n/a"))
for row, target in rows:
    line = next((l for l in r.stdout.splitlines() if l.startswith(row)), None)
    if line is None or target not in line:
        fail("table: no row %r with its target %r" % (row, target))

r = run(None, args=("--threads2", "--json"))
if r.returncode != 0:
    fail("--threads2 --json: exit status %d" % r.returncode)
t2 = json.loads(r.stdout)
check_threads2(t2, r.stderr, THREADS2_ONLY_FIGURES, "--threads2 --json")
if t2.get("timed_segment_allocs") != 0 or "pair_ns_small" in t2:
    fail("--threads2: expected timed_segment_allocs 0 and no other figure, got %r" % t2)
r = run(None, args=("--threads2",))
if r.returncode != 0 or not any(l.startswith("threads2_speedup") and ">= 1.8" in l
                                for l in r.stdout.splitlines()):
    fail("--threads2: no threads2_speedup row with its target")

r = run(None, args=("--tensor",))
if r.returncode != 0:
    fail("--tensor: exit status %d" % r.returncode)
tc = json.loads(r.stdout)
if list(tc) != ["tensor_create_ns"] or not tc["tensor_create_ns"] > 0:
    fail("--tensor: expected only a positive tensor_create_ns, got %r" % tc)

r = run("expandable_recycle_threshold:0")
if r.returncode != 1:
    fail("segments allocated while timing: expected exit status 1, got %d" % r.returncode)
if json.loads(r.stdout)["timed_segment_allocs"] <= 0 or \
        "segments were allocated while timing" not in r.stderr:
    fail("segments allocated while timing: no count or no message")

r = run("bogus_key:1")
if r.returncode != 2 or "DEVMEM_CONF" not in r.stderr or "bogus_key" not in r.stderr:
    fail("malformed DEVMEM_CONF: expected exit status 2 naming DEVMEM_CONF and the key")
print("ok")
