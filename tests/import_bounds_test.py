#!/usr/bin/env python3
"""tests/import_bounds_test.py: `memtrace import` (RMM, Umpire) on a large log holds
about one copy of it, and fails cleanly.

  import_bounds_test.py MEMTRACE

  - a 40 MB RMM CSV and a 40 MB Umpire log: peak RSS at most 1.5 x the input + 48 MiB
    (the input is mapped, the trace is written in 1 MiB pieces; it held 3-4 copies,
    e.g. 6 GB for a 2 GiB log);
  - under an address-space cap too small for the input: exit status 2 and a message
    naming the file (it aborted with std::bad_alloc, exit status 134);
  - a log with an error at its end: exit status 2, no output file, and an existing
    output left as it was.
"""
import os
import resource
import subprocess
import sys
import tempfile

memtrace = sys.argv[1]
MIB = 1 << 20


def fail(why):
    print("FAILED:", why)
    sys.exit(1)


def peak_rss_of(args, limit_as=None):
    """Runs args in a fresh child; returns (returncode, stderr, peak RSS in bytes)."""
    code = ("import resource,subprocess,sys\n"
            "lim=%r\n"
            "def pre():\n"
            "    if lim: resource.setrlimit(resource.RLIMIT_AS,(lim,lim))\n"
            "r=subprocess.run(%r,capture_output=True,text=True,preexec_fn=pre)\n"
            "sys.stderr.write(r.stderr)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss*1024)\n"
            "sys.exit(r.returncode)\n" % (limit_as, args))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    return r.returncode, r.stderr, int(r.stdout.strip() or 0)


with tempfile.TemporaryDirectory() as d:
    rmm = os.path.join(d, "big.csv")
    with open(rmm, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        lines = []
        for i in range(560000):
            us = i % 1000000
            lines.append("140202091583232,10:%02d:%02d.%06d,allocate,0x%x,%d,0x0\n"
                         % (i // 60000 % 60, i // 1000 % 60, us, 0x7f0000000000 + 4096 * i,
                            512 + i % 4096))
        f.write("".join(lines))
    umpire = os.path.join(d, "big.log")
    with open(umpire, "w") as f:
        f.write("".join(
            '{"kind":"replay","uid":1,"timestamp":%d,"event":"allocate","payload":'
            '{"allocator_ref":"0x1","size":%d},"result":{"memory_ptr":"0x%x"}}\n'
            % (1000 * i, 512 + i % 4096, 0x7f0000000000 + 4096 * i) for i in range(280000)))
    for fmt, path in (("rmm-csv", rmm), ("umpire", umpire)):
        size = os.path.getsize(path)
        out = os.path.join(d, "t.jsonl")
        rc, err, rss = peak_rss_of([memtrace, "import", "--from", fmt, path, "-o", out])
        print("%s: %.1f MiB input, exit %d, peak RSS %.1f MiB" % (fmt, size / MIB, rc, rss / MIB))
        if rc != 0:
            fail("%s: exit status %d: %s" % (fmt, rc, err))
        if rss > 1.5 * size + 48 * MIB:
            fail("%s: peak RSS %.1f MiB for a %.1f MiB input" % (fmt, rss / MIB, size / MIB))
        # An address-space cap smaller than the input: a clean error, not an abort.
        rc, err, _ = peak_rss_of([memtrace, "import", "--from", fmt, path, "-o", out],
                                 limit_as=size // 2 + 16 * MIB)
        print("  under a %d MiB cap: exit %d: %s" % ((size // 2 + 16 * MIB) // MIB, rc,
                                                    err.strip()[:200]))
        if rc != 2 or path not in err:
            fail("%s under a memory cap: expected exit status 2 naming the file" % fmt)

    # An error at the end: nothing written, an existing output untouched.
    bad = os.path.join(d, "bad.csv")
    with open(bad, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n"
                "1,10:00:00.000001,allocate,0x1000,512,0x0\n1,nonsense\n")
    out = os.path.join(d, "keep.jsonl")
    with open(out, "w") as f:
        f.write("old\n")
    r = subprocess.run([memtrace, "import", "--from", "rmm-csv", bad, "-o", out],
                       capture_output=True, text=True)
    if r.returncode != 2 or "bad.csv:3: Time" not in r.stderr:
        fail("bad log: expected exit status 2 naming line 3: %s" % r.stderr)
    if open(out).read() != "old\n" or [n for n in os.listdir(d) if ".tmp-" in n]:
        fail("bad log: the existing output was changed or a temporary file was left")
print("ok")
