#!/usr/bin/env python3
"""tests/import_pytorch_test.py: `memtrace import --from pytorch-snapshot` end to end.

Builds tiny snapshots the way torch.cuda.memory._dump_snapshot writes them (a pickle of
plain dicts and lists; no torch needed), converts them with memtrace, and checks that the
trace replays, that sites come from the frames, and that a malformed snapshot or a pickle
asking for a global is refused with exit status 2 and a message naming the file and the
entry. Usage (ctest): import_pytorch_test.py MEMTRACE
"""
import json
import os
import pickle
import subprocess
import sys
import tempfile

MEMTRACE = sys.argv[1]
MiB = 1 << 20


def entry(action, addr, size, stream=0, t=None, frames=None):
    e = {"action": action, "addr": addr, "size": size, "stream": stream,
         "frames": frames or [{"filename": "/usr/lib/python3/torch/nn/functional.py",
                               "line": 1, "name": "linear"},
                              {"filename": "train.py", "line": 42, "name": "forward"}]}
    if t is not None:
        e["time_us"] = t
    return e


def run(*args):
    return subprocess.run([MEMTRACE, *args], capture_output=True, text=True)


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


with tempfile.TemporaryDirectory() as d:
    snap = {
        "segments": [],
        "device_traces": [[
            entry("segment_alloc", 0x7000000000, 20 * MiB, t=10),
            entry("alloc", 0x7000000000, 4 * MiB, t=11),
            entry("alloc", 0x7000400000, 8 * MiB, t=12),
            entry("free_requested", 0x7000000000, 4 * MiB, t=13),
            entry("free_completed", 0x7000000000, 4 * MiB, t=14),
            entry("snapshot", 0, 0, t=15),
            entry("oom", 0, 64 * MiB, t=16),
            entry("free_requested", 0x7000400000, 8 * MiB, t=17),
            entry("free_completed", 0x7000400000, 8 * MiB, t=18),
        ]],
    }
    path = os.path.join(d, "snap.pickle")
    with open(path, "wb") as f:
        pickle.dump(snap, f)
    out = os.path.join(d, "t.jsonl")
    r = run("import", "--from", "pytorch-snapshot", path, "-o", out)
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "import exit status 0")
    lines = [json.loads(l) for l in open(out)]
    check(lines[0]["schema"] == "devmem.trace/1", "header line")
    check(lines[0]["sites"][0]["file"] == "train.py" and lines[0]["sites"][0]["line"] == 42,
          "site from the first frame outside torch")
    actions = [l["action"] for l in lines[1:]]
    check(actions == ["segment_alloc", "alloc", "alloc", "free", "free_completed", "oom",
                      "free", "free_completed"], f"actions {actions}")
    check(lines[2]["time_ns"] == 1000 and lines[2]["device"] == "cuda:0", "time and device")
    r = run("replay", out, "--json")
    print(r.stdout, r.stderr)
    check(r.returncode == 0, "replay exit status 0")
    res = json.loads(r.stdout)
    check(res["peak_requested_bytes"] == 12 * MiB and res["ooms"] == 0, "replayed figures")

    # -o - writes the same trace to stdout (the summary to stderr); --json is the summary
    # as one object, counted from the snapshot.
    r = run("import", "--from", "pytorch-snapshot", path, "-o", "-", "--json")
    check(r.returncode == 0 and r.stdout == open(out).read(), "import -o -: the trace on stdout")
    summary = json.loads(r.stderr)
    check((summary["allocs"], summary["frees"], summary["ooms"], summary["output"])
          == (2, 2, 1, "-"), f"import --json with -o -: {summary}")
    r = run("import", "--from", "pytorch-snapshot", path, "-o", out, "--json")
    check(r.returncode == 0 and json.loads(r.stdout)["events"] == 8, "import --json on stdout")

    # Malformed: an entry without 'addr' -> the file and the entry are named.
    bad = {"device_traces": [[{"action": "alloc", "size": 5}]]}
    with open(path, "wb") as f:
        pickle.dump(bad, f)
    r = run("import", "--from", "pytorch-snapshot", path, "-o", out)
    print(r.stderr)
    check(r.returncode == 2 and "snap.pickle: device_traces[0][0]: 'addr'" in r.stderr,
          "malformed entry named")

    # A pickle that asks for a global (os.system) is refused, not executed.
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + os.path.join(d, "pwned"),))
    with open(path, "wb") as f:
        pickle.dump({"device_traces": [Evil()]}, f)
    r = run("import", "--from", "pytorch-snapshot", path, "-o", out)
    print(r.stderr)
    check(r.returncode == 2 and "refuses the pickle global" in r.stderr, "global refused")
    check(not os.path.exists(os.path.join(d, "pwned")), "nothing executed")

    # Garbage and a missing file.
    with open(path, "wb") as f:
        f.write(b"\x80\x04garbage")
    r = run("import", "--from", "pytorch-snapshot", path, "-o", out)
    check(r.returncode == 2 and "not a pickle" in r.stderr, "garbage refused")
    r = run("import", "--from", "pytorch-snapshot", os.path.join(d, "nope"), "-o", out)
    check(r.returncode == 2 and "cannot read" in r.stderr, "missing file")

    def refused(data, needle, what):
        with open(path, "wb") as f:
            f.write(data)
        r = subprocess.run([MEMTRACE, "import", "--from", "pytorch-snapshot", path, "-o", out],
                           capture_output=True, text=True, timeout=60)
        print(what, "->", r.returncode, r.stderr.strip()[:300])
        check(r.returncode == 2 and needle in r.stderr, what)

    # Resource bombs: a 36-byte bytearray(2**31) (the builtin was allowed), a BYTEARRAY8
    # opcode claiming 2 GiB (allocated before it is read: no global involved), and an
    # 80 KB pickle of shared references describing 4e8 entries.
    refused(b"\x80\x04cbuiltins\nbytearray\nJ\x00\x00\x00\x80\x85R.",
            "refuses the pickle global builtins.bytearray", "bytearray(2**31)")
    refused(b"\x80\x05\x96" + (2**31).to_bytes(8, "little") + b".",
            "asks for more memory than this importer allows", "BYTEARRAY8 of 2 GiB")
    e = entry("alloc", 0x1000, 512)
    trace = [e] * 20000
    refused(pickle.dumps({"device_traces": [trace] * 20000}, protocol=4),
            "shared-reference bomb", "4e8 shared entries")
    # Frames shared the same way: few entries, each scanning 10^5 torch frames.
    frames = [{"filename": "/x/torch/f.py", "line": 1, "name": "f"}] * 100000
    refused(pickle.dumps({"device_traces": [[entry("alloc", 0x1000 * i, 512, frames=frames)
                                             for i in range(1, 2000)]]}, protocol=4),
            "shared-reference bomb", "shared frames")

    # Names: an input named "--help" is a file name, not an option (it exited 0 with the
    # usage and no trace), and a lone surrogate in a frame's file name gives a trace
    # memtrace reads (json.dumps wrote "\udc80", which it rejected).
    weird = {"device_traces": [[entry("alloc", 0x1000, 512, t=1,
                                      frames=[{"filename": "tr\udc80ain.py", "line": 3,
                                               "name": "f\ud800"}]),
                                entry("free_requested", 0x1000, 512, t=2)]]}
    cwd = os.getcwd()
    os.chdir(d)
    try:
        with open("--help", "wb") as f:
            pickle.dump(weird, f)
        r = run("import", "--from", "pytorch-snapshot", "-o", "weird.jsonl", "--", "--help")
        print(r.stdout, r.stderr)
        check(r.returncode == 0 and os.path.exists("weird.jsonl"),
              "an input named --help is converted")
        r = run("replay", "weird.jsonl", "--json")
        print(r.stdout, r.stderr)
        check(r.returncode == 0 and json.loads(r.stdout)["peak_requested_bytes"] == 512,
              "the trace with a lone surrogate replays")
        r = run("timeline", "weird.jsonl", "-o", "weird.svg")
        check(r.returncode == 0, "the trace with a lone surrogate draws")
        header = json.loads(open("weird.jsonl", encoding="utf-8").readline())
        check(header["sites"][0]["file"] == "tr\ufffdain.py", "U+FFFD for the lone surrogate")
    finally:
        os.chdir(cwd)
print("ok")
