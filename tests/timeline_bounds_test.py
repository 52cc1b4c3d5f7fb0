#!/usr/bin/env python3
"""tests/timeline_bounds_test.py: `memtrace timeline` on hostile traces stays bounded,
and follows the trace rule it shares with replay.

  timeline_bounds_test.py MEMTRACE

  - times that go back and forth: at most --points points (it made one per step back:
    16,000 points and 2 GB from a 1.2 MB trace);
  - 150,000 distinct sites: peak RSS well under what a dense [point][site] table takes
    (800 x 150,000 x 8 bytes = 960 MB; it took 969 MB);
  - frees of addresses never allocated: exit 0, a warning with their count;
  - an alloc of a live address: exit status 2 and the line.
"""
import json
import os
import resource
import subprocess
import sys
import tempfile

memtrace = sys.argv[1]
RSS_LIMIT_MIB = 300


def fail(why):
    print("FAILED:", why)
    sys.exit(1)


def run(trace, out, *extra):
    r = subprocess.run([memtrace, "timeline", trace, "-o", out, "--json", *extra],
                       capture_output=True, text=True, timeout=120)
    print("$ memtrace timeline", os.path.basename(trace), "->", r.returncode)
    print(r.stdout[-2000:], r.stderr[-2000:])
    return r


def header(n_sites):
    sites = [{"id": i, "file": "model/layer%d.py" % i, "line": i, "function": "f",
              "tag": "", "kind": "alloc"} for i in range(1, n_sites + 1)]
    return json.dumps({"schema": "devmem.trace/1", "sites": sites}) + "\n"


def ev(action, addr, size, site, t):
    return ('{"action":"%s","addr":%d,"size":%d,"site":%d,"time_ns":%d}\n'
            % (action, addr, size, site, t))


with tempfile.TemporaryDirectory() as d:
    svg = os.path.join(d, "t.svg")

    # Time going back and forth.
    path = os.path.join(d, "backwards.jsonl")
    with open(path, "w") as f:
        f.write(header(64))
        for i in range(16000):
            t = 10**9 - i if i % 2 else i
            f.write(ev("alloc", 4096 * (i + 1), 512, 1 + i % 64, t))
    r = run(path, svg)
    if r.returncode != 0:
        fail("backwards: exit status %d" % r.returncode)
    s = json.loads(r.stdout)
    if s["points"] > 800:
        fail("backwards: %d points, more than the 800 asked for" % s["points"])
    if s["time_backwards"] == 0:
        fail("backwards: time_backwards not counted")

    # 150,000 distinct sites, one allocation each, times increasing.
    n = 150000
    path = os.path.join(d, "sites.jsonl")
    with open(path, "w") as f:
        f.write(header(n))
        f.write("".join(ev("alloc", 4096 * i, 512, i, 1000 * i) for i in range(1, n + 1)))
    r = run(path, svg)
    if r.returncode != 0:
        fail("sites: exit status %d" % r.returncode)
    s = json.loads(r.stdout)
    if s["sites"] != 9:  # the top 8 and "other sites"
        fail("sites: expected 9 series, got %d" % s["sites"])
    rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print("peak RSS of memtrace timeline: %.0f MiB" % rss_mib)
    if rss_mib > RSS_LIMIT_MIB:
        fail("peak RSS %.0f MiB exceeds %d MiB" % (rss_mib, RSS_LIMIT_MIB))

    # Frees first (a trace cut from a ring): counted and said, not an error.
    path = os.path.join(d, "ring.jsonl")
    with open(path, "w") as f:
        f.write(header(1) + ev("free", 8, 0, 1, 1) + ev("free", 16, 0, 1, 2) +
                ev("alloc", 8, 512, 1, 3) + ev("free", 8, 0, 1, 4))
    r = run(path, svg)
    if r.returncode != 0 or json.loads(r.stdout)["unmatched_frees"] != 2:
        fail("ring: expected exit 0 and unmatched_frees 2")
    if "skipped 2 frees of addresses that were not live" not in r.stderr:
        fail("ring: no warning with the count on stderr")
    r = subprocess.run([memtrace, "replay", path], capture_output=True, text=True)
    if r.returncode != 0 or "skipped 2 frees of addresses that were not live" not in r.stderr:
        fail("replay: the same rule (exit 0, a warning with the count)")

    # An alloc of a live address: an error naming the line, in both commands.
    path = os.path.join(d, "double.jsonl")
    with open(path, "w") as f:
        f.write(header(1) + ev("alloc", 8, 512, 1, 1) + ev("alloc", 8, 512, 1, 2))
    for cmd in (["timeline", path, "-o", svg], ["replay", path]):
        r = subprocess.run([memtrace, *cmd], capture_output=True, text=True)
        print(r.stderr)
        if r.returncode != 2 or "double.jsonl:3: alloc of addr 8, which is already live" \
                not in r.stderr:
            fail("%s: a double alloc must give exit status 2 and the line" % cmd[0])
print("ok")
