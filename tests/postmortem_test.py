#!/usr/bin/env python3
"""memtrace postmortem on the flight record of a process killed with SIGKILL.

usage: postmortem_test.py MEMTRACE CHILD [SEEDS]

For each seed, tests/flight_recorder_child.cc runs with flight_recorder set, allocating
and freeing from two threads (on one device, or on two for odd seeds) and reporting on
a pipe, around every operation, "about to change site S by D bytes" and "site S now
holds L bytes". After a random number of reports it is killed with SIGKILL, the reports
it wrote before dying are drained, and `memtrace postmortem --json` must show, for every
site, its last reported bytes, or those plus the change of the one operation in flight
on its thread (a report "about to" with no "now" after it). The record must be
consistent (a torn write is allowed, and said). Then the errors: a truncated file and a
damaged header are exit status 2 naming the file and the offset; a damaged event is
skipped and listed with its offset (the record then inconsistent); and timeline and
export read the record.
"""
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile

REPORT = struct.Struct("<IIIIqq")  # thread, kind, site, device, value, op


def run(cmd, expect=0):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if p.returncode != expect:
        sys.exit(f"FAIL: {cmd}: exit {p.returncode} (expected {expect})\n{p.stdout}\n{p.stderr}")
    return p


def kill_and_check(memtrace, child, seed, workdir):
    rng = random.Random(seed)
    path = os.path.join(workdir, f"seed{seed}.flight")
    two = seed % 2
    proc = subprocess.Popen([child, path, str(seed), str(two)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    target = rng.randint(1, 4000)  # reports of "now" before the kill
    data = b""
    dones = 0
    parsed = 0  # bytes of `data` counted
    while dones < target:
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            sys.exit(f"FAIL seed {seed}: the child ended early: {proc.stderr.read().decode()}")
        data += chunk
        while parsed + REPORT.size <= len(data):
            dones += REPORT.unpack_from(data, parsed)[1] == 1
            parsed += REPORT.size
    os.kill(proc.pid, signal.SIGKILL)
    data += proc.stdout.read()  # what it wrote before it died
    proc.wait()
    if proc.returncode != -signal.SIGKILL:
        sys.exit(f"FAIL seed {seed}: exit {proc.returncode}: {proc.stderr.read().decode()}")
    last_done = {}     # (device, site) -> live bytes
    in_flight = {}     # thread -> (device, site, change) of an op with no "now" yet
    for i in range(0, len(data) - len(data) % REPORT.size, REPORT.size):
        thread, kind, site, device, value, _ = REPORT.unpack_from(data, i)
        if kind == 0:
            in_flight[thread] = (device, site, value)
            last_done.setdefault((device, site), 0)
        else:
            last_done[(device, site)] = value
            in_flight.pop(thread, None)
    out = run([memtrace, "postmortem", path, "--json", "--events", "3"]).stdout
    record = json.loads(out)
    if not record["consistent"] or record["damaged"] != 0:
        sys.exit(f"FAIL seed {seed}: inconsistent record: {record['problems']}")
    if record["process_running"]:
        sys.exit(f"FAIL seed {seed}: a dead process's record says it is running")
    # A death tears at most one record per lane (its one writer was inside at most one).
    for d in record["devices"]:
        for lane in d["lanes"]:
            if lane["torn"] > 1:
                sys.exit(f"FAIL seed {seed}: {d['device']} lane {lane['lane']}: "
                         f"{lane['torn']} torn records")
    held = {}
    names = {}
    for d in record["devices"]:
        index = int(d["device"].split(":")[1])
        for s in d["sites"]:
            key = (index, s["site"])
            held[key] = held.get(key, 0) + s["live_bytes"]
            names[key] = s["where"]
    pending = {(dev, site): change for dev, site, change in in_flight.values()}
    for key, expected in last_done.items():
        got = held.get(key, 0)
        allowed = {expected}
        if key in pending:
            allowed.add(expected + pending[key])
        if got not in allowed:
            sys.exit(f"FAIL seed {seed}: sim:{key[0]} site {key[1]}: the record holds {got} "
                     f"bytes, the process reported {expected} (in flight: {pending.get(key)})")
        if got and "child_t" not in names.get(key, ""):
            sys.exit(f"FAIL seed {seed}: site {key} is not named from the record: {names.get(key)}")
    for key, got in held.items():
        if key not in last_done and got != 0:
            sys.exit(f"FAIL seed {seed}: the record holds {got} bytes at {key}, never reported")
    # Every allocation the process reported is in a region's events or stats (a thread
    # killed before its first operation leaves an empty region: fine).
    reported_ops = sum(1 for v in last_done.values() if v)
    if reported_ops and not any(d["events"] for d in record["devices"]):
        sys.exit(f"FAIL seed {seed}: no events recorded: {record['devices']}")
    return path, record


def header_fields(path):
    with open(path, "rb") as f:
        head = f.read(104)
    devices, ring, sites, name_bytes = struct.unpack_from("<IIII", head, 24)
    (lanes,) = struct.unpack_from("<I", head, 88)
    return devices, ring, sites, name_bytes, lanes


def ring_offset(path, region, lane):
    """The offset of lane `lane`'s ring in region `region` (docs/formats.md, version 2)."""
    devices, ring, sites, name_bytes, lanes = header_fields(path)
    page = lambda n: (n + 4095) // 4096 * 4096
    devices_offset = page(4096 + sites * name_bytes)
    lane_bytes = 4096 + (sites + ring) * 64
    device_bytes = 4096 + lanes * lane_bytes
    return devices_offset + region * device_bytes + 4096 + lane * lane_bytes + 4096 + \
        sites * 64, ring


def errors(memtrace, path, record, workdir):
    with open(path, "rb") as f:
        clean = f.read()
    cut = os.path.join(workdir, "cut.flight")
    with open(cut, "wb") as f:
        f.write(clean[:5000])
    p = run([memtrace, "postmortem", cut], expect=2)
    if f"{cut}: offset 5000: truncated: 5000 bytes of the {len(clean)}" not in p.stderr:
        sys.exit(f"FAIL: truncated file: {p.stderr}")
    bad = os.path.join(workdir, "bad.flight")
    damaged = bytearray(clean)
    damaged[40] ^= 0xff  # the pid: the header's check no longer matches
    with open(bad, "wb") as f:
        f.write(damaged)
    p = run([memtrace, "postmortem", bad], expect=2)
    if f"{bad}: offset 96: field header_check" not in p.stderr:
        sys.exit(f"FAIL: damaged header: {p.stderr}")
    # The newest event of a lane damaged: skipped and listed; the rest is read.
    region = next(d for d in record["devices"] if d["events"])
    lane = next(l for l in region["lanes"] if l["last_seq"])
    base, ring = ring_offset(path, region["region"], lane["lane"])
    slot = base + ((lane["last_seq"] - 1) % ring) * 64
    damaged = bytearray(clean)
    damaged[slot + 40] ^= 0x01  # its size
    with open(bad, "wb") as f:
        f.write(damaged)
    p = run([memtrace, "postmortem", bad, "--json"])
    r = json.loads(p.stdout)
    if r["consistent"] or r["damaged"] != 1 or not any(
            q["offset"] == slot and "is damaged" in q["what"] for q in r["problems"]):
        sys.exit(f"FAIL: damaged event: {r['problems']}")
    if any(e["lane"] == lane["lane"] and e["seq"] == lane["last_seq"]
           for e in r["devices"][region["region"]]["events"]):
        sys.exit("FAIL: the damaged event was read")
    lanes = {l["lane"]: l for l in r["devices"][region["region"]]["lanes"]}
    if lanes[lane["lane"]]["last_seq"] == lane["last_seq"]:
        sys.exit(f"FAIL: the damaged event still counts as its lane's newest: {lanes}")
    if "warning: 1 damaged records were skipped" not in p.stderr:
        sys.exit(f"FAIL: no warning for the damaged record: {p.stderr}")
    text = run([memtrace, "postmortem", bad]).stdout
    if "INCONSISTENT" not in text or f"offset {slot}:" not in text:
        sys.exit(f"FAIL: the text output does not say so:\n{text}")


def readers(memtrace, path, record, workdir):
    svg = os.path.join(workdir, "t.svg")
    out = json.loads(run([memtrace, "timeline", path, "-o", svg, "--json"]).stdout)
    events = sum(len(d["events"]) for d in record["devices"])
    if out["events"] < 1 or not os.path.getsize(svg):
        sys.exit(f"FAIL: timeline of a flight record: {out}")
    pickle = os.path.join(workdir, "t.pickle")
    out = json.loads(run([memtrace, "export", "--to", "pytorch-snapshot", path, "-o", pickle,
                          "--json"]).stdout)
    if out["trace_entries"] < 1 or not out["state_from_trace"]:
        sys.exit(f"FAIL: export of a flight record: {out}")
    del events
    text = run([memtrace, "postmortem", path, "--events", "5", "--top", "2"]).stdout
    for needle in ("record: consistent", "held, by site:", "child_t", "the last 5 events:"):
        if needle not in text:
            sys.exit(f"FAIL: postmortem text lacks {needle!r}:\n{text}")


def main():
    memtrace, child = sys.argv[1], sys.argv[2]
    seeds = int(sys.argv[3]) if len(sys.argv) > 3 else 24
    with tempfile.TemporaryDirectory() as workdir:
        first = None
        for seed in range(1, seeds + 1):
            path, record = kill_and_check(memtrace, child, seed, workdir)
            if first is None:
                first = (path, record)
            else:
                os.unlink(path)
        errors(memtrace, first[0], first[1], workdir)
        readers(memtrace, first[0], first[1], workdir)
    print(f"ok: {seeds} processes killed at random moments; postmortem matched each")


if __name__ == "__main__":
    main()
