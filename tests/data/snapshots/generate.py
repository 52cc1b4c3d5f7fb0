#!/usr/bin/env python3
"""Fixtures for memtrace's inspect commands (buffers, diff, oom): small hand-designed
snapshots and OOM dumps in devmem.snapshot/1 (docs/formats.md), plus malformed files,
written beside this script. Deterministic: no clock, no randomness.

    python3 tests/data/snapshots/generate.py            # rewrite the fixtures
    python3 tests/data/snapshots/generate.py --big N OUT [--grow]
        a snapshot with N live buffers (for scripts/bench_snapshot.sh); --grow makes a
        "later" one (a few sites hold more) to diff against.

The golden outputs in golden/ are memtrace's output on these files for the commands in
golden/cases.txt (rewrite them with update_golden.sh, review the diff by hand).
"""
import json
import os
import sys

MIB = 1 << 20
KIB = 1 << 10
HERE = os.path.dirname(os.path.abspath(__file__))

STAT_ARRAYS = ["allocation", "segment", "active", "inactive_split", "allocated_bytes",
               "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
               "pending_bytes"]
COUNTERS = ["num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
            "num_sync_all_streams", "cache_hits", "cache_misses", "num_frees"]


def stat(current):
    return {"current": current, "peak": current, "allocated": current, "freed": 0}


def stats(allocated, reserved, pending, allocs, segments, ooms=0):
    s = {}
    values = {"allocation": allocs, "segment": segments, "active": allocs,
              "inactive_split": 0, "allocated_bytes": allocated, "reserved_bytes": reserved,
              "active_bytes": allocated, "inactive_split_bytes": 0,
              "requested_bytes": allocated, "pending_bytes": pending}
    for name in STAT_ARRAYS:
        s[name] = {"all": stat(values[name]), "small": stat(0), "large": stat(values[name])}
    s["oversize_allocations"] = stat(0)
    s["oversize_segments"] = stat(0)
    for name in COUNTERS:
        s[name] = 0
    s["num_ooms"] = ooms
    s["max_split_size"] = 9223372036854775807
    return s


def device(name, total, free, segments, time_ns=10_000_000_000, ooms=0, tensors=None):
    """segments: [(addr, pool, [(size, state, site, age_ns or None)])]; tensors:
    {addr: (refcount, dtype, shape)} for live_buffers' "tensor" annotations."""
    tensors = tensors or {}
    segs, live = [], []
    allocated = reserved = pending = allocs = 0
    for addr, pool, blocks in segments:
        out, at = [], addr
        for size, state, site, age in blocks:
            b = {"addr": at, "size": size, "requested": size if state == "allocated" else 0,
                 "state": state, "stream": 0, "site": site if state != "free" else 0}
            if age is not None:
                b["age_ns"] = age
            out.append(b)
            if state == "allocated":
                allocated += size
                allocs += 1
                lb = {k: b[k] for k in ("addr", "size", "requested", "stream", "site")}
                if age is not None:
                    lb["age_ns"] = age
                if at in tensors:
                    rc, dtype, shape = tensors[at]
                    lb["tensor"] = {"refcount": rc, "dtype": dtype, "shape": shape}
                live.append(lb)
            if state == "pending":
                pending += size
            at += size
        reserved += at - addr
        segs.append({"addr": addr, "size": at - addr, "stream": 0, "pool": pool,
                     "expandable": False, "blocks": out})
    return {"device": name, "time_ns": time_ns,
            "info": {"name": "devmem simulated device", "uuid": "SIM-fixture",
                     "backend": "sim"},
            "mem_info": {"free_bytes": free, "total_bytes": total},
            "stats": stats(allocated, reserved, pending, allocs, len(segs), ooms),
            "segments": segs, "live_buffers": live}


SITES = [
    (1, "model/train.cc", 40, "activations", "alloc"),
    (2, "tensor/tensor.cc", 120, "", "clone"),
    (3, "model/embed.cc", 12, "", "alloc"),
    (4, "model/optim.cc", 88, "optimizer", "alloc"),
    (5, "tensor/ops.cc", 301, "", "contiguous"),
]


def site_table(ids):
    return [{"id": i, "file": f, "line": l, "function": "void f()", "tag": t, "kind": k}
            for (i, f, l, t, k) in SITES if i in ids]


def snapshot(devices, schema="devmem.snapshot/1", extra=None):
    ids = sorted({b["site"] for d in devices for s in d["segments"] for b in s["blocks"]
                  if b["site"]})
    snap = {"schema": schema, "time_ns": 10_000_000_000, "unix_time_ns": 1_700_000_000_000_000_000,
            "devices": devices, "sites": site_table(ids)}
    if extra:
        snap.update(extra)
        ids = sorted(set(ids) | set(extra.get("_sites", [])))
        snap.pop("_sites", None)
        snap["sites"] = site_table(ids)
    return snap


BASE = 0x7F0000000000


def fixture_a():
    return snapshot([
        device("sim:0", 1 << 30, (1 << 30) - 22 * MIB, [
            (BASE, "large", [(8 * MIB, "allocated", 1, 2_500_000_000),
                             (4 * MIB, "allocated", 2, 1_200_000_000),
                             (8 * MIB, "free", 0, None)]),
            (BASE + 64 * MIB, "small", [(512, "allocated", 3, 9_000_000_000),
                                        (512, "allocated", 3, 8_000_000_000),
                                        (1024, "allocated", 3, 300_000_000),
                                        (2 * MIB - 2048, "free", 0, None)]),
        ], tensors={BASE: (2, "float32", [2048, 1024]),
                    BASE + 8 * MIB: (1, "float32", [1024, 1024])}),
        device("cpu", 0, 0, [
            (0x10000, "large", [(2 * MIB, "allocated", 4, 500_000_000)]),
        ]),
    ])


def fixture_b():
    # Later: the clone site leaked two more 4 MiB copies, the activations shrank to
    # 4 MiB, the embedding site is unchanged, a new contiguous site appeared, and the
    # cpu optimizer state is gone.
    return snapshot([
        device("sim:0", 1 << 30, (1 << 30) - 26 * MIB, [
            (BASE, "large", [(4 * MIB, "allocated", 1, 500_000_000),
                             (4 * MIB, "allocated", 2, 3_200_000_000),
                             (4 * MIB, "allocated", 2, 2_000_000_000),
                             (4 * MIB, "allocated", 2, 1_000_000_000),
                             (4 * MIB, "allocated", 5, 100_000_000)]),
            (BASE + 64 * MIB, "small", [(512, "allocated", 3, 11_000_000_000),
                                        (512, "allocated", 3, 10_000_000_000),
                                        (1024, "allocated", 3, 2_300_000_000),
                                        (2 * MIB - 2048, "free", 0, None)]),
        ]),
        device("cpu", 0, 0, []),
    ])


def fixture_stacks():
    # b.json with sampled stacks (one sample per 4 MiB on average): the activation, the
    # three leaked clones and the new contiguous buffer were sampled; the clones from
    # two stacks (two helpers), the second of which also made the contiguous buffer, so
    # that one stack is shared by two sites. Weights as the sampler computes them: s / (1 - e^(-s/mean)).
    import math
    mean = 4 * MIB
    s = fixture_b()
    d = s["devices"][0]
    d["stack_sample_bytes"] = mean
    blocks = d["segments"][0]["blocks"]
    stack_of = {0: 1, 1: 2, 2: 2, 3: 3, 4: 3}  # block index -> stack id
    for i, stack in stack_of.items():
        blocks[i]["stack"] = stack
        for lb in d["live_buffers"]:
            if lb["addr"] == blocks[i]["addr"]:
                lb["stack"] = stack
    frames = {
        1: ["devmem::CachingAllocator::allocate(unsigned long, devmem::Stream, unsigned int)",
            "devmem::empty(...)", "model::Forward()", "train_step()", "main"],
        2: ["devmem::CachingAllocator::allocate(unsigned long, devmem::Stream, unsigned int)",
            "devmem::Tensor::clone(std::source_location) const", "lib::CopyFor()",
            "train_step()", "main"],
        3: ["devmem::CachingAllocator::allocate(unsigned long, devmem::Stream, unsigned int)",
            "devmem::Tensor::clone(std::source_location) const", "lib::PlainCopy()",
            "eval_step()", "main"],
    }
    groups = {}
    for i, stack in stack_of.items():
        key = (blocks[i]["site"], stack)
        g = groups.setdefault(key, {"stack": stack, "site": blocks[i]["site"], "samples": 0,
                                    "sampled_bytes": 0, "estimated_bytes": 0.0,
                                    "frames": frames[stack]})
        size = blocks[i]["requested"]
        g["samples"] += 1
        g["sampled_bytes"] += size
        g["estimated_bytes"] += size / -math.expm1(-size / mean)
    d["sampled_stacks"] = sorted(groups.values(),
                                 key=lambda g: (-g["estimated_bytes"], g["site"], g["stack"]))
    return s


def fixture_oom():
    # A 64 MiB device that failed a 12 MiB request: 18 MiB free in the cache, but in
    # pieces of at most 6 MiB (fragmentation), with a pending block on another stream.
    dev = device("sim:1", 64 * MIB, 0, [
        (BASE, "large", [(4 * MIB, "allocated", 2, 700_000_000),
                         (6 * MIB, "free", 0, None),
                         (4 * MIB, "allocated", 2, 600_000_000),
                         (6 * MIB, "free", 0, None)]),
        (BASE + 32 * MIB, "large", [(8 * MIB, "allocated", 1, 500_000_000),
                                    (2 * MIB, "pending", 1, 400_000_000),
                                    (4 * MIB, "free", 0, None),
                                    (6 * MIB, "allocated", 2, 100_000_000)]),
        (BASE + 96 * MIB, "small", [(1 * MIB, "allocated", 3, 50_000_000),
                                    (1 * MIB, "free", 0, None)]),
    ], ooms=1)
    oom = {
        "device": "sim:1", "stream": 0, "site": 4, "requested_bytes": 12 * MIB,
        "rounded_bytes": 12 * MIB, "segment_bytes": 12 * MIB, "device_total": 64 * MIB,
        "driver_free": 0, "memory_limit": 64 * MIB, "allocated": 27 * MIB,
        "reserved": 42 * MIB, "pending": 2 * MIB, "reserved_unallocated": 15 * MIB,
        "largest_free_block": 6 * MIB, "free_blocks": 4, "segment_count": 3,
        "fragmentation": 0.6470588235294118,
        "top_sites": [
            {"site": 2, "where": "tensor/tensor.cc:120 (clone)", "kind": "clone", "copy": True,
             "live_bytes": 14 * MIB, "live_count": 3},
            {"site": 1, "where": "activations @ model/train.cc:40 (alloc)", "kind": "alloc",
             "copy": False, "live_bytes": 8 * MIB, "live_count": 1},
            {"site": 3, "where": "model/embed.cc:12 (alloc)", "kind": "alloc", "copy": False,
             "live_bytes": 1 * MIB, "live_count": 1}],
        "copy_bytes": 14 * MIB, "copy_share": 14 / 27, "cause": "fragmentation",
        "remedy": "set max_split_size or expandable_segments:true so free pieces can serve "
                  "large requests",
        "message": "out of memory on sim:1: tried to allocate 12.0 MiB"}
    return snapshot([dev], extra={"oom": oom, "_sites": [4]})


def write(name, obj_or_text):
    path = os.path.join(HERE, name)
    with open(path, "w") as f:
        f.write(obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text, indent=1))
        if not isinstance(obj_or_text, str):
            f.write("\n")


def fixtures():
    a = fixture_a()
    write("a.json", a)
    write("b.json", fixture_b())
    write("oom.json", fixture_oom())
    write("stacks.json", fixture_stacks())
    # Malformed inputs: each must give exit status 2 and a message naming the file.
    newer = fixture_a()
    newer["schema"] = "devmem.snapshot/2"
    write("bad_schema_major.json", newer)
    minor = fixture_a()
    minor["schema"] = "devmem.snapshot/1.7"
    minor["devices"][0]["future_field"] = {"ignored": True}
    write("minor_version.json", minor)
    text = json.dumps(a, indent=1)
    write("bad_truncated.json", text[: len(text) // 2])
    write("bad_garbage.json", "\x00\x01garbage{{{ not json at all\n")
    wrong = fixture_a()
    wrong["devices"][0]["segments"][1]["blocks"][2]["size"] = "1024"
    write("bad_type.json", wrong)
    absurd = fixture_a()
    absurd["devices"][0]["segments"][0]["blocks"][0]["size"] = 18446744073709551615
    write("bad_absurd_size.json", absurd)
    # A block that starts after its segment ends (found by the snapshot fuzzer: the
    # bound wrapped and it was accepted, then segment maps read past their cells).
    past = fixture_a()
    past["devices"][0]["segments"][0]["blocks"][3 - 1]["addr"] += 100 * MIB
    write("bad_block_past_segment.json", past)
    # Two blocks covering the same bytes: counted twice by buffers, diff and oom if read.
    overlap = fixture_a()
    overlap["devices"][0]["segments"][0]["blocks"][1]["addr"] -= MIB
    write("bad_overlap.json", overlap)
    # An OOM dump whose segment is nearly 2^64 bytes: oom's segment map must stay
    # bounded (it aborted allocating ~2^55 cells).
    huge_seg = fixture_oom()
    seg = huge_seg["devices"][0]["segments"][0]
    huge_seg["devices"][0]["segments"] = [seg]
    huge_seg["devices"][0]["live_buffers"] = []
    seg["addr"] = 0
    seg["size"] = 18446744073709551615
    seg["blocks"] = [{"addr": 0, "size": 18446744073709551615, "requested": 0,
                      "state": "free", "stream": 0, "site": 0}]
    write("hostile_huge_segment.json", huge_seg)
    huge = fixture_a()
    huge["devices"][0]["segments"][0]["blocks"][0]["size"] = 1e300
    write("bad_float_size.json", huge)
    negative = fixture_a()
    negative["devices"][0]["time_ns"] = -5
    negative["devices"][0]["segments"][0]["blocks"][0]["addr"] = -1
    write("bad_negative.json", negative)
    long_line = fixture_a()
    long_line["sites"][0]["function"] = "x" * (256 * KIB)  # a 256 KiB line, still valid
    long_line["devices"][0]["info"]["name"] = 7
    write("bad_huge_line.json", json.dumps(long_line))


def big(n, out, grow):
    """n live buffers over 8 sites, 16 per segment with a free tail, written directly
    (json.dumps of a 10^6-block structure would be slow)."""
    n_sites = 8
    per_seg = 16
    sizes = [512, 4096, 65536, 1 * MIB, 2 * MIB, 512 * KIB, 8192, 1536]
    segs = []
    live = []
    addr = BASE
    allocated = reserved = 0
    i = 0
    while i < n:
        seg_addr = addr
        blocks = []
        for _ in range(min(per_seg, n - i)):
            site = (i % n_sites) + 1
            size = sizes[site - 1]
            if grow and site == 2 and i % 3 == 0:
                size *= 2
            blocks.append('{"addr":%d,"size":%d,"requested":%d,"state":"allocated",'
                          '"stream":0,"site":%d,"age_ns":%d}' % (addr, size, size, site, i))
            live.append('{"addr":%d,"size":%d,"requested":%d,"stream":0,"site":%d,'
                        '"age_ns":%d}' % (addr, size, size, site, i))
            addr += size
            allocated += size
            i += 1
        blocks.append('{"addr":%d,"size":%d,"requested":0,"state":"free","stream":0,"site":0}'
                      % (addr, MIB))
        addr += MIB
        segs.append('{"addr":%d,"size":%d,"stream":0,"pool":"large","expandable":false,'
                    '"blocks":[%s]}' % (seg_addr, addr - seg_addr, ",".join(blocks)))
        reserved += addr - seg_addr
    dev = device("sim:0", 1 << 50, (1 << 50) - reserved, [])
    dev["stats"] = stats(allocated, reserved, 0, n, len(segs))
    head = json.dumps({k: v for k, v in dev.items() if k not in ("segments", "live_buffers")})
    sites = [{"id": s, "file": "model/layer%d.cc" % s, "line": 10 * s, "function": "void f()",
              "tag": "", "kind": "clone" if s == 2 else "alloc"} for s in range(1, n_sites + 1)]
    with open(out, "w") as f:
        f.write('{"schema":"devmem.snapshot/1","time_ns":1,"unix_time_ns":1,"devices":[')
        f.write(head[:-1] + ',"segments":[')
        f.write(",".join(segs))
        f.write('],"live_buffers":[')
        f.write(",".join(live))
        f.write(']}],"sites":%s}\n' % json.dumps(sites))


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--big":
        big(int(sys.argv[2]), sys.argv[3], "--grow" in sys.argv[4:])
    else:
        fixtures()
