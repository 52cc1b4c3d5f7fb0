#!/usr/bin/env python3
"""tests/bench_test.py: devmem-bench as a user runs it (tools/devmem_bench.cc).

  bench_test.py DEVMEM_BENCH

  - `--json`: exit status 0, one JSON object whose figures are positive numbers and
    timed_segment_allocs 0 (every timed pair a cache hit);
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
           "arena_pair_ns", "arena_pool_pair_ns", "arena_step_ns", "pool_step_ns"]


def fail(why):
    print("FAILED:", why)
    sys.exit(1)


def run(conf):
    env = dict(os.environ)
    env.pop("DEVMEM_CONF", None)
    if conf is not None:
        env["DEVMEM_CONF"] = conf
    r = subprocess.run([bench, "--json"], capture_output=True, text=True, env=env, timeout=300)
    print("$ DEVMEM_CONF=%r devmem-bench --json -> %d" % (conf, r.returncode))
    print(r.stdout, r.stderr)
    return r


r = run(None)
if r.returncode != 0:
    fail("exit status %d" % r.returncode)
out = json.loads(r.stdout)
for k in FIGURES:
    if not isinstance(out.get(k), (int, float)) or out[k] <= 0:
        fail("%s: expected a positive number, got %r" % (k, out.get(k)))
if out.get("timed_segment_allocs") != 0:
    fail("timed_segment_allocs: expected 0, got %r" % out.get("timed_segment_allocs"))

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
