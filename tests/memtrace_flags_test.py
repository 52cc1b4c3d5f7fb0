#!/usr/bin/env python3
"""tests/memtrace_flags_test.py: every memtrace option has a check that fails when the
option is ignored (a flag that parses but changes nothing is a bug a user sees: `diff
--device` and `replay --conf` were such bugs).

  memtrace_flags_test.py MEMTRACE SOURCE_DIR

Each check runs memtrace with and without the option (or with two values) and asserts
the difference the option must make. The option list comes from each subcommand's
--help: an option without a check here fails the test, so a new flag needs a check.
Live sources are a small HTTP server started here on 127.0.0.1 (port 0) that serves
tests/data/snapshots/a.json as /debug/snapshot and a workload trace as /debug/trace,
and requires `Authorization: Bearer tok`.
"""
import http.server
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

memtrace, src = sys.argv[1], sys.argv[2]
snaps = os.path.join(src, "tests", "data", "snapshots")
traces = os.path.join(src, "tests", "data", "traces")
A, B, OOM = (os.path.join(snaps, n) for n in ("a.json", "b.json", "oom.json"))
FRAG = os.path.join(traces, "fragmentation.jsonl")
TRANSFORMER = os.path.join(traces, "transformer.jsonl")
MIB = 1 << 20
tmp = tempfile.mkdtemp()
failures = []


def fail(why):
    print("FAILED:", why)
    failures.append(why)


def mt(*args, env=None, rc=0):
    e = dict(os.environ)
    e.pop("DEVMEM_CONF", None)
    e.update(env or {})
    r = subprocess.run([memtrace, *args], capture_output=True, text=True, env=e, timeout=120,
                       stdin=subprocess.DEVNULL)
    if rc is not None and r.returncode != rc:
        fail("memtrace %s: exit status %d, expected %d\n%s%s"
             % (" ".join(args), r.returncode, rc, r.stdout[-1500:], r.stderr[-1500:]))
    return r


def js(*args, env=None, rc=0):
    r = mt(*args, env=env, rc=rc)
    try:
        return json.loads(r.stdout)
    except ValueError:
        fail("memtrace %s: not one JSON document: %r" % (" ".join(args), r.stdout[:300]))
        return {}


def expect(cond, what):
    if not cond:
        fail(what)


# --- a live process stand-in -------------------------------------------------------
with open(A, "rb") as f:
    SNAPSHOT = f.read()
with open(TRANSFORMER, "rb") as f:
    TRACE = b"".join(l for l in f if b'"schema"' not in l)  # /debug/trace: events only


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.headers.get("Authorization") != "Bearer tok":
            body, code = b"unauthorized\n", 401
        elif self.path.startswith("/debug/snapshot"):
            body, code = SNAPSHOT, 200
        elif self.path.startswith("/debug/trace"):
            body, code = TRACE, 200
        else:
            body, code = b"not found\n", 404
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
URL = "http://127.0.0.1:%d" % server.server_address[1]
TOKEN = os.path.join(tmp, "token")
with open(TOKEN, "w") as f:
    f.write("tok\n")

# --- the checks, one per (subcommand, option) ----------------------------------------


def replay_conf():
    base = js("replay", FRAG, "--json")
    regular = js("replay", FRAG, "--json", "--conf", "expandable_segments:false")
    expect(regular.get("peak_reserved_bytes") != base.get("peak_reserved_bytes"),
           "replay --conf expandable_segments:false changed nothing")
    expect("expandable_segments:false" in regular.get("config", ""), "replay --conf: config")
    # DEVMEM_CONF is the base, --conf's keys win.
    env = {"DEVMEM_CONF": "expandable_segments:false"}
    expect(js("replay", FRAG, "--json", env=env).get("peak_reserved_bytes")
           == regular.get("peak_reserved_bytes"), "replay: DEVMEM_CONF not applied")
    expect(js("replay", FRAG, "--json", "--conf", "expandable_segments:true", env=env)
           .get("peak_reserved_bytes") == base.get("peak_reserved_bytes"),
           "replay: --conf does not override DEVMEM_CONF")


def replay_capacity():
    # OOMs at that capacity: the answer is "no", exit status 1 (README), fits false.
    r = js("replay", FRAG, "--json", "--capacity", "200MiB", rc=1)
    expect(r.get("capacity_bytes") == 200 * MIB and r.get("ooms", 0) > 0
           and r.get("fits") is False,
           "replay --capacity 200MiB: expected that capacity and OOMs, got %r" % r)
    expect("does not fit" in mt("replay", FRAG, "--capacity", "200MiB", rc=1).stdout,
           "replay --capacity: the table does not say it does not fit")
    r = js("replay", FRAG, "--json")
    expect(r.get("ooms") == 0 and r.get("fits") is True, "replay unbounded: OOMs")


def replay_min_capacity():
    expect("min_capacity_bytes" not in js("replay", FRAG, "--json"), "min capacity unasked")
    r = js("replay", FRAG, "--json", "--min-capacity")
    expect(r.get("min_capacity_bytes", 0) >= r.get("peak_requested_bytes", 1),
           "replay --min-capacity: no answer")


def replay_json():
    expect(mt("replay", FRAG).stdout.startswith("trace "), "replay: the table")
    r = js("replay", FRAG, "--json")
    expect(r.get("devices") == ["sim:0"] and r.get("devices_merged") is False
           and r.get("unknown_actions") == 0, "replay --json: devices %r" % r)
    # Two devices merged on the one sim device, and an unknown action: both said.
    two = os.path.join(tmp, "two_devices.jsonl")
    with open(two, "w") as f:
        for dev in ("cuda:0", "cuda:1"):
            f.write('{"action":"alloc","device":"%s","addr":4096,"size":1048576}\n' % dev)
        f.write('{"action":"prefetch","device":"cuda:0","addr":4096}\n')
    r = js("replay", two, "--json")
    expect(r.get("devices") == ["cuda:0", "cuda:1"] and r.get("devices_merged") is True
           and r.get("unknown_actions") == 1 and r.get("peak_requested_bytes") == 2 * MIB,
           "replay --json: two devices, one unknown action: %r" % r)
    r = mt("replay", two)
    expect("merged from cuda:0, cuda:1" in r.stdout and "merged on one sim device" in r.stderr
           and '"prefetch" at line 3' in r.stderr, "replay: merge or unknown action unsaid")


def replay_arenas():
    expect("arenas" not in js("replay", FRAG, "--json"), "replay: arenas unasked")
    r = js("replay", FRAG, "--json", "--arenas")
    a = r.get("arenas", {})
    expect(a.get("steps", 0) > 1 and a.get("bumps", 0) > 0 and
           a.get("free_list_ops_avoided") == 2 * a.get("bumps", -1) and
           a.get("peak_reserved_bytes", 0) > 0 and "min_capacity_bytes" not in a,
           "replay --arenas --json: %r" % a)
    a = js("replay", FRAG, "--json", "--arenas", "--min-capacity").get("arenas", {})
    expect(a.get("min_capacity_bytes", 0) > 0, "replay --arenas --min-capacity: %r" % a)
    t = mt("replay", FRAG, "--arenas").stdout
    expect("with arenas" in t and "free-list operations avoided" in t, "replay --arenas: %s" % t)


def replay_arena_chunk_size():
    small = js("replay", FRAG, "--json", "--arenas", "--arena-chunk-size", "64KiB")
    small = small.get("arenas", {})
    big = js("replay", FRAG, "--json", "--arenas").get("arenas", {})
    # 64 KiB chunks serve requests of at most 16 KiB: none of this trace's.
    expect(small.get("chunk_size") == 64 * 1024 and small.get("bumps") == 0 and
           big.get("bumps", 0) > 0, "replay --arena-chunk-size 64KiB: %r vs %r" % (small, big))
    r = mt("replay", FRAG, "--arenas", "--arena-chunk-size", "1000", rc=2)
    expect("--arena-chunk-size" in r.stderr and "1000" in r.stderr,
           "replay --arena-chunk-size 1000: %s" % r.stderr)
    r = mt("replay", FRAG, "--arena-chunk-size", "1MiB", rc=2)
    expect("needs --arenas" in r.stderr,
           "replay --arena-chunk-size without --arenas: %s" % r.stderr)


def replay_step_swing():
    a = js("replay", FRAG, "--json", "--arenas").get("arenas", {})
    b = js("replay", FRAG, "--json", "--arenas", "--step-swing", "0.5").get("arenas", {})
    expect(b.get("step_swing") == 0.5 and b.get("steps", 0) != a.get("steps", 0),
           "replay --step-swing 0.5: %r vs %r" % (b, a))
    for bad in ("0", "2", "lots"):
        r = mt("replay", FRAG, "--arenas", "--step-swing", bad, rc=2)
        expect("--step-swing" in r.stderr and bad in r.stderr,
               "replay --step-swing %s: %s" % (bad, r.stderr))
    r = mt("replay", FRAG, "--step-swing", "0.5", rc=2)
    expect("needs --arenas" in r.stderr, "replay --step-swing without --arenas: %s" % r.stderr)


def import_checks():
    csv = os.path.join(tmp, "r.csv")
    with open(csv, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n"
                "1,10:00:00.000001,allocate,0x7f0000000000,1048576,0x0\n"
                "1,10:00:00.000003,free,0x7f0000000000,1048576,0x0\n")
    out = os.path.join(tmp, "imported.jsonl")
    mt("import", "--from", "rmm-csv", csv, "-o", out)
    expect(os.path.exists(out) and '"alloc"' in open(out).read(), "import -o: no trace")
    # -o -: the same trace on stdout, the summary on stderr; nothing written elsewhere.
    r = mt("import", "--from", "rmm-csv", csv, "-o", "-")
    expect(r.stdout == open(out).read() and "-> -" in r.stderr, "import -o -: not on stdout")
    r = mt("import", "--from", "umpire", csv, "-o", os.path.join(tmp, "u.jsonl"), rc=2)
    expect("umpire" in (r.stderr + r.stdout).lower() or csv in r.stderr,
           "import --from umpire on a CSV: not refused as Umpire")


def import_json():
    csv = os.path.join(tmp, "rj.csv")
    with open(csv, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n"
                "1,10:00:00.000001,allocate,0x7f0000000000,1048576,0x0\n"
                "1,10:00:00.000002,free,0x7f0000000000,1048576,0x0\n"
                "1,10:00:00.000003,free,0x7f0000100000,4096,0x0\n")
    out = os.path.join(tmp, "rj.jsonl")
    expect(not mt("import", "--from", "rmm-csv", csv, "-o", out).stdout.startswith("{"),
           "import: a line by default")
    r = js("import", "--from", "rmm-csv", csv, "-o", out, "--json")
    expect((r.get("allocs"), r.get("frees"), r.get("unmatched_frees"), r.get("output"))
           == (1, 2, 1, out), "import --json: %r" % r)
    r = mt("import", "--from", "rmm-csv", csv, "-o", "-", "--json")
    expect(json.loads(r.stderr or "{}").get("allocs") == 1 and '"alloc"' in r.stdout,
           "import -o - --json: summary on stderr, trace on stdout")


def timeline_output():
    svg, html = os.path.join(tmp, "t.svg"), os.path.join(tmp, "t.html")
    mt("timeline", FRAG, "-o", svg)
    mt("timeline", FRAG, "-o", html)
    expect(open(svg).read().startswith("<svg") or "<svg" in open(svg).read()[:200], "-o .svg")
    expect("<html" in open(html).read()[:500].lower(), "-o .html: not a page")
    r = mt("timeline", FRAG, "-o", "-", "--format", "svg", "--json")
    expect("<svg" in r.stdout[:200] and json.loads(r.stderr or "{}").get("events", 0) > 0,
           "timeline -o - --format svg: picture on stdout, summary on stderr")
    r = mt("timeline", FRAG, "-o", "-", rc=2)
    expect("--format" in r.stderr, "timeline -o - without --format: %r" % r.stderr)


def timeline_format():
    out = os.path.join(tmp, "f.out")
    mt("timeline", FRAG, "-o", out, "--format", "html")
    expect("<html" in open(out).read()[:500].lower(), "--format html: not a page")
    mt("timeline", FRAG, "-o", out, "--format", "svg")
    expect("<svg" in open(out).read()[:200], "--format svg: not an SVG")
    r = mt("timeline", FRAG, "-o", out, "--format", "png", rc=2)
    expect("png" in r.stderr, "--format png: %r" % r.stderr)


def timeline_points():
    svg = os.path.join(tmp, "p.svg")
    a = js("timeline", TRANSFORMER, "-o", svg, "--json")
    b = js("timeline", TRANSFORMER, "-o", svg, "--json", "--points", "10")
    expect(b.get("points", 99) <= 10 < a.get("points", 0),
           "timeline --points 10: %r vs default %r" % (b.get("points"), a.get("points")))


def timeline_top():
    svg = os.path.join(tmp, "s.svg")
    a = js("timeline", TRANSFORMER, "-o", svg, "--json")
    b = js("timeline", TRANSFORMER, "-o", svg, "--json", "--top", "2")
    expect(b.get("sites") == 3 and a.get("sites", 0) > 3,
           "timeline --top 2: %r series vs default %r" % (b.get("sites"), a.get("sites")))


def timeline_conf():
    svg = os.path.join(tmp, "c.svg")
    a = js("timeline", FRAG, "-o", svg, "--json")
    b = js("timeline", FRAG, "-o", svg, "--json", "--conf", "expandable_segments:false")
    expect(a.get("reserved_from_replay") and
           a.get("peak_reserved_bytes") != b.get("peak_reserved_bytes"),
           "timeline --conf changed nothing")


def timeline_token_file():
    svg = os.path.join(tmp, "u.svg")
    mt("timeline", URL, "-o", svg, rc=3)
    expect(js("timeline", URL, "-o", svg, "--json", "--token-file", TOKEN).get("events", 0) > 0,
           "timeline --token-file: no events")


def timeline_json():
    svg = os.path.join(tmp, "j.svg")
    expect(not mt("timeline", FRAG, "-o", svg).stdout.startswith("{"), "timeline: text")
    js("timeline", FRAG, "-o", svg, "--json")


def buffers_list():
    expect("buffers" not in js("buffers", A, "--json"), "buffers: grouped by default")
    expect(len(js("buffers", A, "--json", "--list").get("buffers", [])) == 6, "buffers --list")


def buffers_device():
    devs = {s["device"] for s in js("buffers", A, "--json").get("sites", [])}
    only = {s["device"] for s in js("buffers", A, "--json", "--device", "cpu").get("sites", [])}
    expect(devs == {"sim:0", "cpu"} and only == {"cpu"}, "buffers --device cpu: %r" % only)


def buffers_site():
    r = js("buffers", A, "--json", "--site", "embed.cc")
    expect([s["where"] for s in r.get("sites", [])] == ["model/embed.cc:12 (alloc)"],
           "buffers --site embed.cc: %r" % r.get("sites"))


def buffers_min_bytes():
    a = js("buffers", A, "--json", "--list")
    b = js("buffers", A, "--json", "--list", "--min-bytes", "1MiB")
    expect(b.get("matched") == 3 and a.get("matched") == 6, "buffers --min-bytes 1MiB")


def buffers_top():
    r = js("buffers", A, "--json", "--top", "1")
    expect(r.get("returned") == 1 and js("buffers", A, "--json").get("returned") == 4,
           "buffers --top 1")


def buffers_token_file():
    mt("buffers", URL, rc=3)
    expect(js("buffers", URL, "--json", "--token-file", TOKEN).get("matched") == 6,
           "buffers --token-file")


def buffers_json():
    expect(not mt("buffers", A).stdout.startswith("{"), "buffers: text")
    js("buffers", A, "--json")


def buffers_stacks():
    stacks = os.path.join(snaps, "stacks.json")
    r = js("buffers", stacks, "--json", "--list", "--stacks")
    expect([g.get("stack") for g in r.get("stacks", [])] == [2, 3, 1]
           and "stack" in r.get("buffers", [{}])[0] and "stacks" not in js("buffers", stacks, "--json"),
           "buffers --stacks: %r" % r.get("stacks"))
    expect("sampled stacks by estimated live bytes" in mt("buffers", stacks, "--stacks").stdout,
           "buffers --stacks: text")


def snapshot_output():
    out = os.path.join(tmp, "saved.json")
    mt("snapshot", URL, "--token-file", TOKEN, "-o", out)
    expect(open(out, "rb").read() == SNAPSHOT, "snapshot -o: not the served snapshot")
    r = subprocess.run([memtrace, "snapshot", URL, "--token-file", TOKEN, "-o", "-", "--json"],
                       capture_output=True, stdin=subprocess.DEVNULL)
    expect(r.returncode == 0 and r.stdout.rstrip(b"\n") == SNAPSHOT.rstrip(b"\n")
           and b'"live_buffers"' in r.stderr, "snapshot -o -: stdout, summary on stderr")


def snapshot_token_file():
    mt("snapshot", URL, "-o", os.path.join(tmp, "x.json"), rc=3)
    expect(not os.path.exists(os.path.join(tmp, "x.json")), "snapshot: a failed save left a file")


def snapshot_json():
    out = os.path.join(tmp, "saved2.json")
    r = mt("snapshot", URL, "--token-file", TOKEN, "-o", out, "--json")
    expect(r.stdout.strip().startswith("{") and json.loads(r.stdout), "snapshot --json")
    expect(not mt("snapshot", URL, "--token-file", TOKEN, "-o", out).stdout.startswith("{"),
           "snapshot: text")


def diff_device():
    all_devs = {s["device"] for s in js("diff", A, B, "--json").get("sites", [])}
    sim = js("diff", A, B, "--json", "--device", "sim:0")
    expect(all_devs == {"sim:0", "cpu"} and
           {s["device"] for s in sim.get("sites", [])} == {"sim:0"} and
           sim.get("shrank_bytes") == 4 * MIB,
           "diff --device sim:0: %r" % {k: v for k, v in sim.items() if k != "sites"})


def diff_site():
    r = js("diff", A, B, "--json", "--site", "tensor.cc")
    expect([s["where"] for s in r.get("sites", [])] == ["tensor/tensor.cc:120 (clone)"],
           "diff --site tensor.cc")


def diff_top():
    expect(js("diff", A, B, "--json", "--top", "1").get("returned") == 1, "diff --top 1")


def diff_fail_on_growth():
    mt("diff", A, B, "--fail-on-growth", "8MiB", rc=1)
    mt("diff", A, B, "--fail-on-growth", "12MiB", rc=0)


def diff_token_file():
    mt("diff", A, URL, rc=3)
    expect(js("diff", A, URL, "--json", "--token-file", TOKEN).get("changed_sites") == 0,
           "diff against the served a.json")


def diff_json():
    expect(not mt("diff", A, B).stdout.startswith("{"), "diff: text")
    js("diff", A, B, "--json")


def oom_columns():
    widths = {len(l.strip()) for l in mt("oom", OOM, "--columns", "16").stdout.splitlines()
              if re.fullmatch(r"\s*\|[#.p ]+\|", l)}
    expect(max(widths, default=0) == 18, "oom --columns 16: map widths %r" % widths)


def oom_json():
    expect(js("oom", OOM, "--json").get("cause") == "fragmentation", "oom --json")
    expect(not mt("oom", OOM).stdout.startswith("{"), "oom: text")


def watch_iterations():
    r = mt("watch", URL, "--token-file", TOKEN, "--iterations", "3", "--interval", "0.05")
    expect(len(re.findall(r"^DEVICE +TOTAL", r.stdout, re.M)) == 3, "watch --iterations 3")


def watch_interval():
    # The default interval is 2 s: two frames at 0.05 s take well under 2 s, at 1 s at
    # least 1 s (the gap between the frames).
    t0 = time.monotonic()
    mt("watch", URL, "--token-file", TOKEN, "--iterations", "2", "--interval", "1")
    slow = time.monotonic() - t0
    t0 = time.monotonic()
    mt("watch", URL, "--token-file", TOKEN, "--iterations", "2", "--interval", "0.05")
    fast = time.monotonic() - t0
    expect(slow >= 1.0 and fast < slow, "watch --interval: 1 s took %.2f s, 0.05 s %.2f s"
           % (slow, fast))


def watch_top():
    def rows(*extra):
        out = mt("watch", URL, "--token-file", TOKEN, "--iterations", "1", "--json",
                 *extra).stdout
        return sum(len(d.get("sites", [])) for d in [json.loads(out.splitlines()[0])])
    expect(rows("--top", "1") == 1 and rows() > 1, "watch --top 1")


def watch_token_file():
    mt("watch", URL, "--iterations", "1", rc=3)


def watch_json():
    out = mt("watch", URL, "--token-file", TOKEN, "--iterations", "2", "--json",
             "--interval", "0.05").stdout.splitlines()
    expect(len(out) == 2 and all(json.loads(l) for l in out), "watch --json: two JSON lines")


def export_to():
    mt("export", "--to", "rmm-csv", A, "--device", "sim:0", "-o", os.path.join(tmp, "e0"), rc=2)
    expect(not os.path.exists(os.path.join(tmp, "e0")), "export --to rmm-csv left a file")


def export_output():
    import pickle
    out = os.path.join(tmp, "e1.pickle")
    mt("export", "--to", "pytorch-snapshot", A, "--device", "sim:0", "-o", out)
    with open(out, "rb") as f:
        d = pickle.load(f)  # devmem wrote it: plain dicts, lists, str and int
    expect(len(d.get("segments", [])) == 2, "export -o: %r" % d.keys())
    r = subprocess.run([memtrace, "export", "--to", "pytorch-snapshot", A, "--device",
                        "sim:0", "-o", "-"], capture_output=True, stdin=subprocess.DEVNULL)
    expect(r.returncode == 0 and r.stdout == open(out, "rb").read(), "export -o -: stdout")


def export_device():
    # a.json holds sim:0 and cpu, both index 0 in PyTorch's numbering: refused without
    # --device, and each device alone gives its own segments.
    mt("export", "--to", "pytorch-snapshot", A, "-o", os.path.join(tmp, "e2"), rc=2)
    sim = js("export", "--to", "pytorch-snapshot", A, "--device", "sim:0", "--json",
             "-o", os.path.join(tmp, "e3"))
    cpu = js("export", "--to", "pytorch-snapshot", A, "--device", "cpu", "--json",
             "-o", os.path.join(tmp, "e4"))
    expect(sim.get("devices") == ["sim:0"] and cpu.get("devices") == ["cpu"] and
           sim.get("segments") == 2 and cpu.get("segments") == 1,
           "export --device: %r / %r" % (sim, cpu))


def export_token_file():
    out = os.path.join(tmp, "e5.pickle")
    mt("export", "--to", "pytorch-snapshot", URL, "--device", "sim:0", "-o", out, rc=3)
    expect(not os.path.exists(out), "export: a refused URL left a file")
    expect(js("export", "--to", "pytorch-snapshot", URL, "--device", "sim:0", "--json",
              "--token-file", TOKEN, "-o", out).get("segments") == 2, "export --token-file")


def export_json():
    out = os.path.join(tmp, "e6.pickle")
    args = ("export", "--to", "pytorch-snapshot", A, "--device", "sim:0", "-o", out)
    expect(not mt(*args).stdout.startswith("{"), "export: text")
    expect(js(*args, "--json").get("blocks") == 7, "export --json")


FLIGHT = os.path.join(tmp, "small.flight")
subprocess.run([sys.executable, os.path.join(src, "tests", "data", "flight", "generate.py"),
                FLIGHT], check=True)


def postmortem_events():
    lines = lambda *a: [l for l in mt("postmortem", FLIGHT, *a).stdout.splitlines()
                        if "0x105" in l or "0x106" in l]
    expect(len(lines("--events", "4")) == 4 and len(lines("--events", "1")) == 1,
           "postmortem --events: %r" % lines("--events", "4"))
    expect(len(js("postmortem", FLIGHT, "--json", "--events", "2")
               .get("devices", [{}])[0].get("events", [])) == 2, "postmortem --events --json")


def postmortem_top():
    two = mt("postmortem", FLIGHT, "--top", "2").stdout
    one = mt("postmortem", FLIGHT, "--top", "1").stdout
    expect("model.py:20 (clone)" in two.split("  the last ")[0] and
           "model.py:20 (clone)" not in one.split("  the last ")[0] and "1 more sites" in one,
           "postmortem --top:\n%s" % one)


def postmortem_json():
    r = js("postmortem", FLIGHT, "--json")
    sites = r.get("devices", [{}])[0].get("sites", [])
    expect(r.get("schema") == "devmem.postmortem/2" and r.get("consistent") is True and
           [(s["site"], s["live_bytes"]) for s in sites] == [(1, 3 * MIB), (2, MIB)],
           "postmortem --json: %r" % r)
    # Version 2: two lanes, lane 1 freeing a block of lane 0's (generate.py), summed.
    d = r.get("devices", [{}])[0]
    expect([l["events_recorded"] for l in d.get("lanes", [])] == [9, 3] and
           d.get("stats", {}).get("alloc_count") == 7 and
           d.get("stats", {}).get("free_count") == 4, "postmortem --json lanes: %r" % d)
    expect(not mt("postmortem", FLIGHT).stdout.startswith("{"), "postmortem: text")


CHECKS = {
    ("replay", "--conf"): replay_conf, ("replay", "--capacity"): replay_capacity,
    ("replay", "--min-capacity"): replay_min_capacity, ("replay", "--json"): replay_json,
    ("replay", "--arenas"): replay_arenas,
    ("replay", "--arena-chunk-size"): replay_arena_chunk_size,
    ("replay", "--step-swing"): replay_step_swing,
    ("import", "--from"): import_checks, ("import", "--output"): import_checks,
    ("import", "--json"): import_json,
    ("timeline", "--output"): timeline_output, ("timeline", "--format"): timeline_format,
    ("timeline", "--points"): timeline_points,
    ("timeline", "--top"): timeline_top, ("timeline", "--conf"): timeline_conf,
    ("timeline", "--token-file"): timeline_token_file, ("timeline", "--json"): timeline_json,
    ("buffers", "--list"): buffers_list, ("buffers", "--device"): buffers_device,
    ("buffers", "--site"): buffers_site, ("buffers", "--min-bytes"): buffers_min_bytes,
    ("buffers", "--top"): buffers_top, ("buffers", "--token-file"): buffers_token_file,
    ("buffers", "--json"): buffers_json,
    ("buffers", "--stacks"): buffers_stacks,
    ("snapshot", "--output"): snapshot_output, ("snapshot", "--token-file"): snapshot_token_file,
    ("snapshot", "--json"): snapshot_json,
    ("diff", "--device"): diff_device, ("diff", "--site"): diff_site, ("diff", "--top"): diff_top,
    ("diff", "--fail-on-growth"): diff_fail_on_growth, ("diff", "--token-file"): diff_token_file,
    ("diff", "--json"): diff_json,
    ("oom", "--columns"): oom_columns, ("oom", "--json"): oom_json,
    ("watch", "--iterations"): watch_iterations, ("watch", "--interval"): watch_interval,
    ("watch", "--top"): watch_top, ("watch", "--token-file"): watch_token_file,
    ("watch", "--json"): watch_json,
    ("export", "--to"): export_to, ("export", "--output"): export_output,
    ("export", "--device"): export_device, ("export", "--token-file"): export_token_file,
    ("export", "--json"): export_json,
    ("postmortem", "--events"): postmortem_events, ("postmortem", "--top"): postmortem_top,
    ("postmortem", "--json"): postmortem_json,
}
# Options that do not change what a command computes.
EXEMPT = {"--help", "--version"}

# Every option of every subcommand, from --help.
top = mt("--help").stdout
subcommands = re.findall(r"^  ([a-z][a-z-]*) {2,}\S", top.split("Subcommands:")[1], re.M)
expect(subcommands, "no subcommands found in memtrace --help")
found = set()
for sub in subcommands:
    text = mt(sub, "--help").stdout
    options = text.split("Options:")[1] if "Options:" in text else ""
    for m in re.finditer(r"^  (?:-\w,)?(--[a-z][a-z-]*)", options, re.M):
        found.add((sub, m.group(1)))
        if m.group(1) not in EXEMPT and (sub, m.group(1)) not in CHECKS:
            fail("memtrace %s %s has no check in tests/memtrace_flags_test.py" % (sub, m.group(1)))

# The guard above is only as good as the --help parsing: every checked option must have
# been found there (a changed help format would otherwise pass silently), and a check
# for an option that no longer exists is stale.
for key in CHECKS:
    expect(key in found, "memtrace %s %s is checked here but not in its --help" % key)

done = set()
for (sub, opt), check in CHECKS.items():
    if check in done:
        continue
    done.add(check)
    before = len(failures)
    check()
    print("%s %s %s" % ("ok  " if len(failures) == before else "FAIL", sub, check.__name__))
server.shutdown()
if failures:
    print("%d failure(s)" % len(failures))
    sys.exit(1)
print("ok: every memtrace option changes what it must")
