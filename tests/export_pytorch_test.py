"""tests/export_pytorch_test.py MODE MEMTRACE DEMO TRACES_DIR: `memtrace export --to
pytorch-snapshot` (docs/formats.md, "PyTorch snapshot export").

  structure  exports what devmem-demo writes (a snapshot, a trace, an OOM dump), a live
             demo (its URL), the synthetic multistream trace (no segment events) and a
             snapshot with sampled stacks (their frames after the site's),
             loads each pickle and checks PyTorch 2.x's fields and types, that every
             segment's blocks tile it, that the entries match the trace's events, that
             the state rebuilt from a trace equals the snapshot taken at the same point,
             and that memory_viz's backwards replay (a port of MemoryViz.js's
             simulate_memory) finds every block inside a segment at every step; and
             that bad input exits 2 naming it.
  torch      runs PyTorch's own reader, torch.cuda._memory_viz (stats, which asserts
             that each segment's blocks add up to its size; segments; memory; and
             trace/trace_plot where this PyTorch has them), on the exports, with the
             first interpreter that has torch (Debian's python3-torch:
             scripts/setup.sh). Prints "SKIP: ..." and exits 0 where none has it.
"""
import collections
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time

ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot"}
STATES = {"active_allocated", "active_pending_free", "inactive"}


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def export(memtrace, source, out, *extra):
    r = run([memtrace, "export", "--to", "pytorch-snapshot", source, "-o", out, *extra])
    check(r.returncode == 0, f"export {source}: exit {r.returncode}: {r.stderr}")
    with open(out, "rb") as f:
        return pickle.load(f)


def check_frames(frames, where):
    check(isinstance(frames, list), f"{where}: frames is not a list")
    for f in frames:
        check(set(f) == {"filename", "line", "name"}, f"{where}: frame keys {sorted(f)}")
        check(isinstance(f["filename"], str) and isinstance(f["line"], int) and
              isinstance(f["name"], str), f"{where}: frame types {f}")


def check_structure(snap, name):
    check(isinstance(snap, dict) and {"segments", "device_traces"} <= set(snap),
          f"{name}: top-level keys {list(snap)}")
    for i, seg in enumerate(snap["segments"]):
        where = f"{name}: segments[{i}]"
        for k, t in (("device", int), ("address", int), ("total_size", int),
                     ("allocated_size", int), ("active_size", int), ("requested_size", int),
                     ("stream", int), ("segment_type", str), ("segment_pool_id", tuple),
                     ("is_expandable", bool), ("frames", list), ("blocks", list)):
            check(isinstance(seg.get(k), t), f"{where}.{k}: {seg.get(k)!r} is not {t.__name__}")
        check(seg["segment_type"] in ("small", "large"), f"{where}.segment_type")
        addr = seg["address"]
        for j, b in enumerate(seg["blocks"]):
            bw = f"{where}.blocks[{j}]"
            check(b["address"] == addr, f"{bw}: address {b['address']:#x}, expected {addr:#x}")
            check(b["state"] in STATES, f"{bw}: state {b['state']}")
            check(b["size"] > 0 and 0 <= b["requested_size"] <= b["size"], f"{bw}: sizes {b}")
            check_frames(b["frames"], bw)
            addr += b["size"]
        check(addr == seg["address"] + seg["total_size"], f"{where}: blocks do not tile it")
        active = sum(b["size"] for b in seg["blocks"] if b["state"] != "inactive")
        allocated = sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        check(seg["active_size"] == active and seg["allocated_size"] == allocated,
              f"{where}: active_size/allocated_size disagree with its blocks")
    check(isinstance(snap["device_traces"], list), f"{name}: device_traces")
    devices = {s["device"] for s in snap["segments"]}
    check(all(d < len(snap["device_traces"]) for d in devices),
          f"{name}: a segment's device has no trace list")
    for d, trace in enumerate(snap["device_traces"]):
        last = None
        for i, e in enumerate(trace):
            where = f"{name}: device_traces[{d}][{i}]"
            check(e["action"] in ACTIONS, f"{where}: action {e['action']}")
            for k in ("addr", "size", "stream", "time_us"):
                check(isinstance(e.get(k), int), f"{where}.{k}: {e.get(k)!r}")
            check_frames(e["frames"], where)
            if e["action"] == "oom":
                check(isinstance(e.get("device_free"), int), f"{where}: oom without device_free")
            check(last is None or e["time_us"] >= last, f"{where}: time goes back")
            last = e["time_us"]


def check_replay(snap, name):
    """MemoryViz.js's simulate_memory, backwards from the state: every block must be
    inside a segment at every step, every free_requested must find its block, and
    every segment_alloc/segment_map its segment (the page throws otherwise)."""
    for device, trace in enumerate(snap["device_traces"]):
        segs = []  # [addr, size, stream]
        blocks = {}
        for s in snap["segments"]:
            if s["device"] != device:
                continue
            segs.append([s["address"], s["total_size"], s["stream"]])
            for b in s["blocks"]:
                if b["state"] != "inactive":
                    blocks[b["address"]] = b["size"]
        # annotate_snapshot: free_requested directly followed by free_completed of the
        # same address is one "free".
        events = []
        for e in trace:
            if (e["action"] == "free_completed" and events and
                    events[-1]["action"] == "free_requested" and events[-1]["addr"] == e["addr"]):
                events[-1] = dict(events[-1], action="free")
                continue
            events.append(e)

        def inside(addr, size):
            return any(a <= addr and addr + size <= a + n for a, n, _ in segs)

        for i in range(len(events) - 1, -1, -1):
            e = events[i]
            where = f"{name}: device {device}, event {i} ({e['action']} {e['addr']:#x})"
            act = e["action"]
            if act in ("free", "free_completed"):
                blocks[e["addr"]] = e["size"]
            elif act == "free_requested":
                check(e["addr"] in blocks, where + ": no block to un-free")
            elif act == "alloc":
                blocks.pop(e["addr"], None)
            elif act in ("segment_free", "segment_unmap"):
                segs.append([e["addr"], e["size"], e["stream"]])
                if act == "segment_unmap":  # merge with adjacent runs of the stream
                    segs.sort()
                    merged = []
                    for s in segs:
                        if merged and merged[-1][0] + merged[-1][1] == s[0] and merged[-1][2] == s[2]:
                            merged[-1][1] += s[1]
                        else:
                            merged.append(s)
                    segs = merged
            elif act in ("segment_alloc", "segment_map"):
                if act == "segment_alloc":
                    idx = [k for k, s in enumerate(segs) if s[0] == e["addr"]]
                    check(idx, where + ": no segment to un-allocate")
                    segs.pop(idx[0])
                else:
                    end = e["addr"] + e["size"]
                    idx = [k for k, s in enumerate(segs) if s[0] <= e["addr"] and end <= s[0] + s[1]]
                    check(idx, where + ": no mapped run to un-map")
                    a, n, st = segs.pop(idx[0])
                    if a < e["addr"]:
                        segs.append([a, e["addr"] - a, st])
                    if end < a + n:
                        segs.append([end, a + n - end, st])
            for addr, size in blocks.items():
                # requested_size is drawn; the block's extent starts at addr.
                check(inside(addr, 1), f"{where}: block {addr:#x} is in no segment")


def actions(snap, device):
    return collections.Counter(e["action"] for e in snap["device_traces"][device])


def trace_events(path):
    out = []
    with open(path) as f:
        for line in f:
            if '"action"' in line:
                out.append(line)
    return out


def count(lines, device, action):
    return sum(1 for l in lines if f'"action":"{action}"' in l and f'"device":"{device}"' in l)


def start_live_demo(demo, tmp):
    log = open(os.path.join(tmp, "live.out"), "w")
    p = subprocess.Popen([demo, "--epochs", "1", "--serve", "127.0.0.1:0", "--linger", "60"],
                         stdout=log, stderr=subprocess.STDOUT,
                         env={**os.environ, "DEVMEM_CONF": "trace_entries:100000"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with open(os.path.join(tmp, "live.out")) as f:
            m = re.search(r"serving (http://127\.0\.0\.1:\d+) for", f.read())
        if m:
            return p, m.group(1)
        if p.poll() is not None:
            break
        time.sleep(0.1)
    p.kill()
    fail("devmem-demo did not start serving: " + open(os.path.join(tmp, "live.out")).read())


def make_inputs(memtrace, demo, tmp):
    r = run([demo, "--epochs", "1", "--snapshot", f"{tmp}/s.json", "--trace", f"{tmp}/t.jsonl"],
            env={**os.environ, "DEVMEM_CONF": f"oom_dump_dir:{tmp},trace_entries:100000"})
    check(r.returncode == 0, "devmem-demo: " + r.stderr)
    dumps = [f for f in os.listdir(tmp) if f.startswith("devmem-oom-")]
    check(len(dumps) >= 1, "devmem-demo wrote no OOM dump")
    return f"{tmp}/s.json", f"{tmp}/t.jsonl", f"{tmp}/{dumps[0]}"


def structure(memtrace, demo, traces):
    with tempfile.TemporaryDirectory() as tmp:
        s_json, t_jsonl, dump = make_inputs(memtrace, demo, tmp)
        snap = export(memtrace, s_json, f"{tmp}/s.pickle")
        trace = export(memtrace, t_jsonl, f"{tmp}/t.pickle")
        oom = export(memtrace, dump, f"{tmp}/oom.pickle")
        multi = export(memtrace, os.path.join(traces, "multistream.jsonl"), f"{tmp}/m.pickle")
        for name, x in (("snapshot", snap), ("trace", trace), ("oom dump", oom),
                        ("multistream", multi)):
            check_structure(x, name)
            check_replay(x, name)

        # The trace's events, one for one (each free: free_requested, and free_completed
        # at once unless it waited for other streams).
        lines = trace_events(t_jsonl)
        a = actions(trace, 0)
        for ours, theirs in (("alloc", "alloc"), ("free", "free_requested"),
                             ("segment_map", "segment_map"), ("segment_alloc", "segment_alloc")):
            check(a[theirs] == count(lines, "sim:0", ours),
                  f"trace: {a[theirs]} {theirs} entries for {count(lines, 'sim:0', ours)} {ours} events")
        check(a["free_completed"] == a["free_requested"], "trace: frees not completed")
        check(actions(trace, 1)["oom"] == count(lines, "sim:1", "oom") >= 1, "trace: oom entries")

        # The state rebuilt from the trace is the snapshot's (the demo wrote both at the
        # end), block for block.
        def live(x):
            return sorted((s["device"], b["address"], b["size"], b["requested_size"])
                          for s in x["segments"] for b in s["blocks"]
                          if b["state"] == "active_allocated")
        check(live(trace) == live(snap), "the state rebuilt from the trace differs from the snapshot's")

        # Sites as frames: the demo's training loop and its clone.
        frames = [f for s in snap["segments"] for b in s["blocks"] for f in b["frames"]]
        check(any(f["filename"].endswith("training_loop.cc") and f["line"] > 0 for f in frames),
              "no block names tensor/training_loop.cc")
        ooms = [e for e in oom["device_traces"][1] if e["action"] == "oom"]
        check(len(ooms) == 1 and ooms[0]["frames"] and
              ooms[0]["frames"][0]["name"].endswith("(clone)") and
              ooms[0]["frames"][0]["filename"].endswith("devmem_demo.cc"),
              f"oom dump: the oom entry does not name the demo's clone: {ooms}")
        # Tags become a frame of their own (multistream's sites are tagged).
        tagged = [f for e in multi["device_traces"][0] for f in e["frames"]
                  if f["filename"] == "devmem tag"]
        check({f["name"] for f in tagged} >= {"loader", "work"}, "multistream: no tag frames")
        check(actions(multi, 0)["segment_alloc"] == actions(multi, 0)["alloc"],
              "multistream: a trace without segments gets one per block")

        # Live: the URL source.
        p, url = start_live_demo(demo, tmp)
        try:
            live_snap = export(memtrace, url, f"{tmp}/live.pickle")
        finally:
            p.kill()
            p.wait()
        check_structure(live_snap, "live")
        check_replay(live_snap, "live")
        check(actions(live_snap, 0)["alloc"] > 0, "live: no events from /debug/trace")

        # -o - is the same bytes; bad input exits 2 and names it.
        r = subprocess.run([memtrace, "export", "--to", "pytorch-snapshot", s_json, "-o", "-"],
                           capture_output=True, timeout=60)
        check(r.returncode == 0 and r.stdout == open(f"{tmp}/s.pickle", "rb").read(),
              "-o - differs from the file")
        with open(f"{tmp}/bad.json", "w") as f:
            f.write('{"schema": "devmem.snapshot/1", "devices": "x"}')
        # An OOM dump's "oom" object is read by the snapshot reader too: a field it lacks
        # is named with its path (it was a second parse's bare exception text).
        with open(dump) as f:
            broken = json.load(f)
        del broken["oom"]["requested_bytes"]
        with open(f"{tmp}/bad_oom.json", "w") as f:
            json.dump(broken, f)
        for args, needle in (([s_json, "--to", "chrome"], "--to chrome: unknown format"),
                             ([f"{tmp}/bad.json"], "bad.json"),
                             ([f"{tmp}/bad_oom.json"],
                              "bad_oom.json: oom.requested_bytes: missing (expected a field"),
                             ([f"{tmp}/missing.json"], "missing.json: cannot open"),
                             ([s_json, "--device", "cuda:3"], "device cuda:3 is not in the input (it has sim:0, sim:1)")):
            cmd = [memtrace, "export", "--to", "pytorch-snapshot", *args, "-o", f"{tmp}/x.pickle"]
            if "--to" in args[1:]:
                cmd = [memtrace, "export", *args, "-o", f"{tmp}/x.pickle"]
            r = run(cmd)
            check(r.returncode == 2 and needle in r.stderr,
                  f"{args}: exit {r.returncode}, stderr {r.stderr!r}, expected {needle!r}")
        crafted(memtrace, tmp)
        stacks(memtrace, traces, tmp)
        one = export(memtrace, s_json, f"{tmp}/one.pickle", "--device", "sim:1")
        check({s["device"] for s in one["segments"]} == {1}, "--device sim:1 kept other devices")
    print("ok: pytorch-snapshot exports of a snapshot, a trace, an OOM dump, a live process")


MiB = 1 << 20
HIGH = 0xFFFF800000000000  # above 2^63: pickled as a 9-byte long


def crafted(memtrace, tmp):
    """A trace with what the demo does not do: a free that waits for another stream
    (free, later free_completed), expandable runs that merge and shrink, an address
    above 2^63; and devices that collide in PyTorch's numbering."""
    import json
    ev = [("segment_alloc", 0x1000000, 2 * MiB, 0, 0), ("alloc", 0x1000000, 1024, 1000, 1),
          ("alloc", 0x1000400, 512, 500, 1), ("free", 0x1000000, 1024, 1000, 1),
          ("free", 0x1000400, 512, 500, 1), ("free_completed", 0x1000000, 1024, 0, 0),
          ("segment_map", 0x4000000, 2 * MiB, 0, 0), ("segment_map", 0x4200000, 2 * MiB, 0, 0),
          ("alloc", 0x4000000, 3 * MiB, 3 * MiB, 1), ("segment_unmap", 0x4300000, MiB, 0, 0),
          ("segment_alloc", HIGH, 2 * MiB, 0, 0), ("alloc", HIGH, 512, 512, 1)]
    path = f"{tmp}/crafted.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps({"schema": "devmem.trace/1", "sites": [
            {"id": 1, "file": "a.cc", "line": 5, "function": "f", "tag": "", "kind": "alloc"}]}) + "\n")
        for i, (action, addr, size, req, site) in enumerate(ev):
            f.write(json.dumps({"seq": i + 1, "time_ns": 1000 * (i + 1), "action": action,
                                "device": "sim:0", "stream": 0, "addr": addr, "size": size,
                                "requested": req, "site": site, "thread": 1}) + "\n")
    x = export(memtrace, path, f"{tmp}/crafted.pickle")
    check_structure(x, "crafted")
    check_replay(x, "crafted")
    got = [(e["action"], e["addr"], e["size"]) for e in x["device_traces"][0]]
    want = [("segment_alloc", 0x1000000, 2 * MiB), ("alloc", 0x1000000, 1000),
            ("alloc", 0x1000400, 500), ("free_requested", 0x1000000, 1000),
            ("free_requested", 0x1000400, 500), ("free_completed", 0x1000400, 500),
            ("free_completed", 0x1000000, 1000), ("segment_map", 0x4000000, 2 * MiB),
            ("segment_map", 0x4200000, 2 * MiB), ("alloc", 0x4000000, 3 * MiB),
            ("segment_unmap", 0x4300000, MiB), ("segment_alloc", HIGH, 2 * MiB),
            ("alloc", HIGH, 512)]
    check(got == want, f"crafted: entries\n{got}\nexpected\n{want}")
    segs = [(s["address"], s["total_size"], s["is_expandable"],
             [(b["state"], b["size"]) for b in s["blocks"]]) for s in x["segments"]]
    want_segs = [(0x1000000, 2 * MiB, False, [("inactive", 2 * MiB)]),
                 (0x4000000, 3 * MiB, True, [("active_allocated", 3 * MiB)]),
                 (HIGH, 2 * MiB, False, [("active_allocated", 512), ("inactive", 2 * MiB - 512)])]
    check(segs == want_segs, f"crafted: segments\n{segs}\nexpected\n{want_segs}")
    check(x["segments"][2]["blocks"][0]["frames"] ==
          [{"filename": "a.cc", "line": 5, "name": "f"}], "crafted: frames of site 1")

    # cpu and sim:0 are both PyTorch's device 0: refused unless --device picks one.
    with open(f"{tmp}/two.jsonl", "w") as f:
        for i, d in enumerate(("cpu", "sim:0")):
            f.write(json.dumps({"seq": i + 1, "time_ns": i, "action": "alloc", "device": d,
                                "stream": 0, "addr": 4096 * (i + 1), "size": 512,
                                "requested": 512, "site": 0, "thread": 1}) + "\n")
    r = run([memtrace, "export", "--to", "pytorch-snapshot", f"{tmp}/two.jsonl", "-o", f"{tmp}/x.pickle"])
    check(r.returncode == 2 and "cpu and sim:0 are both device 0" in r.stderr,
          f"two devices at index 0: exit {r.returncode}, {r.stderr!r}")
    export(memtrace, f"{tmp}/two.jsonl", f"{tmp}/x.pickle", "--device", "sim:0")


def stacks(memtrace, traces, tmp):
    """A snapshot with sampled stacks (tests/data/snapshots/stacks.json, device sim:0):
    each block with a "stack" has its site's frames, then that stack's frames as
    {"filename": "??", "line": 0, "name": FRAME}; every other block its site's only."""
    import json
    src = os.path.join(traces, "..", "snapshots", "stacks.json")
    with open(src) as f:
        dev = next(d for d in json.load(f)["devices"] if d["device"] == "sim:0")
    x = export(memtrace, src, f"{tmp}/stacks.pickle", "--device", "sim:0")
    check_structure(x, "stacks")
    frames = {g["stack"]: g["frames"] for g in dev["sampled_stacks"]}
    want = {b["addr"]: [{"filename": "??", "line": 0, "name": f} for f in frames[b["stack"]]]
            for s in dev["segments"] for b in s["blocks"] if "stack" in b}
    check(len(want) >= 2, f"stacks.json: {len(want)} sampled blocks")
    seen = 0
    for seg in x["segments"]:
        for b in seg["blocks"]:
            got = [f for f in b["frames"] if f["filename"] == "??"]
            check(got == want.get(b["address"], []),
                  f"stacks: block {b['address']:#x}: stack frames {got}, want {want.get(b['address'], [])}")
            if got:
                seen += 1
                # After the site's frames, which come first and are the site's own.
                n = len(b["frames"]) - len(got)
                check(n >= 1 and b["frames"][n:] == got,
                      f"stacks: block {b['address']:#x}: frames {b['frames']}")
    check(seen == len(want), f"stacks: {seen} blocks with stack frames, {len(want)} sampled")


TORCH_CHECK = r'''
import io, pickle, sys, contextlib
import torch
from torch.cuda import _memory_viz as mv

def call(fn, snap):
    # PyTorch 2.x's functions take the snapshot dict; 1.13's took its list of segments.
    try:
        return fn(snap)
    except (TypeError, KeyError):
        return fn(snap["segments"])

for path in sys.argv[1:]:
    with open(path, "rb") as f:
        snap = pickle.load(f)
    ran = []
    with contextlib.redirect_stdout(io.StringIO()):
        for name in ("stats", "segsum"):  # both assert that blocks add up to segments
            if hasattr(mv, name):
                ran.append((name, call(getattr(mv, name), snap)))
        for name in ("segments", "memory"):
            call(lambda x: getattr(mv, name)(x, format_flamegraph=lambda t: t), snap)
            ran.append((name, "ok"))
        for name in ("trace", "trace_plot", "segment_plot"):  # 2.x
            if hasattr(mv, name):
                getattr(mv, name)(snap)
                ran.append((name, "ok"))
    print(path.rsplit("/", 1)[-1], "torch", torch.__version__,
          ", ".join(n if r == "ok" else f"{n}: {r}" for n, r in ran))
'''


def torch_reader(memtrace, demo, traces):
    have = "import torch.cuda._memory_viz"
    python = next((p for p in (sys.executable, "/usr/bin/python3") if os.path.exists(p) and
                   run([p, "-c", have]).returncode == 0), None)
    if python is None:
        print("SKIP: no interpreter with torch.cuda._memory_viz (Debian: python3-torch, "
              "scripts/setup.sh)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        s_json, t_jsonl, dump = make_inputs(memtrace, demo, tmp)
        outs = []
        stacks_json = os.path.join(traces, "..", "snapshots", "stacks.json")
        for src, out, *extra in ((s_json, "s.pickle"), (t_jsonl, "t.pickle"),
                                 (dump, "oom.pickle"),
                                 (os.path.join(traces, "multistream.jsonl"), "m.pickle"),
                                 (stacks_json, "stacks.pickle", "--device", "sim:0")):
            export(memtrace, src, f"{tmp}/{out}", *extra)
            outs.append(f"{tmp}/{out}")
        r = run([python, "-c", TORCH_CHECK, *outs])
        check(r.returncode == 0, f"torch.cuda._memory_viz rejects the export:\n{r.stdout}{r.stderr}")
        print(r.stdout, end="")
    print("ok: PyTorch's torch.cuda._memory_viz reads every export")


if __name__ == "__main__":
    mode, memtrace, demo, traces = sys.argv[1:5]
    {"structure": structure, "torch": torch_reader}[mode](memtrace, demo, traces)
