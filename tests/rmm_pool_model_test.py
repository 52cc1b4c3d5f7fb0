#!/usr/bin/env python3
"""tools/replay/rmm_pool_model.py on traces small enough to work out by hand: best fit (not
first fit), coalescing, and "fits from" when a hole is too small for a request."""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tools", "replay", "rmm_pool_model.py")
MIB = 1 << 20


def fit(events):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for action, addr, size in events:
            e = {"action": action, "addr": addr}
            if action == "alloc":
                e["size"] = size
            f.write(json.dumps(e) + "\n")
        path = f.name
    try:
        out = subprocess.run([sys.executable, MODEL, path, "--json"], check=True,
                             capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    return json.loads(out)


def main():
    failures = []
    # A 1 MiB hole cannot take a 2 MiB request: the pool needs 4 MiB for a 3 MiB peak.
    d = fit([("alloc", 1, MIB), ("alloc", 2, MIB), ("free", 1, 0), ("alloc", 3, 2 * MIB),
             ("free", 2, 0), ("free", 3, 0)])
    if (d["peak_requested_bytes"], d["min_capacity_bytes"]) != (3 * MIB, 4 * MIB):
        failures.append("hole too small: %s" % d)
    # Holes of 2 MiB (at 0) and 1 MiB (at 3 MiB): best fit puts the 1 MiB request in the
    # 1 MiB hole, leaving 2 MiB for the next request, so 5 MiB suffices (first fit
    # would split the 2 MiB hole and need 6 MiB).
    d = fit([("alloc", 1, 2 * MIB), ("alloc", 2, MIB), ("alloc", 3, MIB), ("alloc", 4, MIB),
             ("free", 1, 0), ("free", 3, 0), ("alloc", 5, MIB), ("alloc", 6, 2 * MIB)])
    if d["min_capacity_bytes"] != 5 * MIB:
        failures.append("best fit: %s" % d)
    # Freed neighbours coalesce: two 1 MiB frees next to each other serve 2 MiB.
    d = fit([("alloc", 1, MIB), ("alloc", 2, MIB), ("alloc", 3, MIB), ("free", 1, 0),
             ("free", 2, 0), ("alloc", 4, 2 * MIB)])
    if d["min_capacity_bytes"] != 3 * MIB:
        failures.append("coalescing: %s" % d)
    for f in failures:
        print("FAIL: " + f)
    print("ok" if not failures else "%d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
