#!/usr/bin/env python3
"""memtrace buffers shows which buffers sit in which scoped arena (allocator/arena.h):
the `arena_buffers` of a snapshot, as a table after the sites and as `arena_buffers` in
--json, filtered by --device, --site and --min-bytes like the other rows.

    memtrace_buffers_arena_test.py MEMTRACE SOURCE_DIR

The snapshot is tests/data/snapshots/a.json with one arena chunk added to sim:0 (an
allocated block of a kind-`arena` site, as the runtime writes chunks) holding two
arena buffers, one of which escaped its scope.
"""
import json
import os
import subprocess
import sys
import tempfile

memtrace, src = sys.argv[1], sys.argv[2]
failures = []


def expect(cond, what):
    if not cond:
        print("FAILED:", what)
        failures.append(what)


with open(os.path.join(src, "tests", "data", "snapshots", "a.json")) as f:
    snap = json.load(f)
dev = next(d for d in snap["devices"] if d["device"] == "sim:0")
# The second segment ends in a free block: its first 64 KiB become the chunk.
seg = dev["segments"][1]
free = seg["blocks"][-1]
assert free["state"] == "free" and free["size"] > 65536, free
chunk = free["addr"]
seg["blocks"][-1:] = [
    {"addr": chunk, "size": 65536, "requested": 65536, "state": "allocated", "stream": 0,
     "site": 9},
    {"addr": chunk + 65536, "size": free["size"] - 65536, "requested": 0, "state": "free",
     "stream": 0, "site": 0},
]
dev["live_buffers"].append({"addr": chunk, "size": 65536, "requested": 65536, "stream": 0,
                            "site": 9})
for key in ("allocated_bytes", "active_bytes", "requested_bytes"):
    dev["stats"][key]["all"]["current"] += 65536
for key in ("allocation", "active"):
    dev["stats"][key]["all"]["current"] += 1
snap["sites"].append({"id": 9, "file": "<arena>", "line": 0, "function": "", "tag": "step",
                      "kind": "arena"})
dev["arena_buffers"] = [
    {"addr": chunk, "size": 4096, "site": 1, "arena": "step", "chunk": chunk,
     "escaped": True},
    {"addr": chunk + 4096, "size": 1024, "site": 3, "arena": "step", "chunk": chunk,
     "escaped": False},
]
path = os.path.join(tempfile.mkdtemp(), "arena.json")
with open(path, "w") as f:
    json.dump(snap, f)


def run(*args):
    r = subprocess.run([memtrace, "buffers", path, *args], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=60)
    expect(r.returncode == 0, "memtrace buffers %s: exit status %d\n%s" % (
        " ".join(args), r.returncode, r.stderr))
    return r.stdout


text = run()
print(text)
expect("arena buffers (inside the arena chunks above), largest first: 2 of 2 "
       "(5.00 KiB; 4.00 KiB escaped their scope)" in text, "the arena table's heading")
# DEVICE ARENA ADDRESS SIZE (2 words) ESCAPED SITE...
rows = [l.split() for l in text.splitlines() if l.split()[1:2] == ["step"]]
expect(len(rows) == 2 and rows[0][5] == "yes" and "model/train.cc:40" in rows[0] and
       rows[1][5] == "no" and "model/embed.cc:12" in rows[1],
       "the arena rows, largest first: %r" % rows)
expect("step @ <arena>" in text, "the chunk's site among the sites: %s" % text)

d = json.loads(run("--json"))
ab = d.get("arena_buffers", [])
expect([(b["arena"], b["size"], b["escaped"], b["chunk"]) for b in ab] ==
       [("step", 4096, True, chunk), ("step", 1024, False, chunk)],
       "--json arena_buffers: %r" % ab)
expect(ab and "model/train.cc:40" in ab[0]["where"] and ab[0]["device"] == "sim:0",
       "--json arena_buffers: where/device %r" % ab[:1])
# The filters of the other rows apply.
expect([b["size"] for b in json.loads(run("--json", "--site", "embed.cc"))["arena_buffers"]]
       == [1024], "--site embed.cc")
expect([b["size"] for b in json.loads(run("--json", "--min-bytes", "2KiB"))["arena_buffers"]]
       == [4096], "--min-bytes 2KiB")
expect(json.loads(run("--json", "--device", "cpu"))["arena_buffers"] == [], "--device cpu")
expect(len(json.loads(run("--json", "--top", "1"))["arena_buffers"]) == 1, "--top 1")
expect("arena buffers" not in run("--device", "cpu"), "--device cpu: no arena table")

if failures:
    print("%d failure(s)" % len(failures))
    sys.exit(1)
print("ok: memtrace buffers shows the arenas' buffers")
