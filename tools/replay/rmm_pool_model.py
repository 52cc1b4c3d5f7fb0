#!/usr/bin/env python3
"""A model of RMM's pool allocator, for comparing fit figures with devmem's replay.

    tools/replay/rmm_pool_model.py TRACE [--json]

RMM's `pool_memory_resource` carves allocations out of a pool taken from the device
up front: its free list is ordered by address, coalesces a freed block with free
neighbours (`coalescing_free_list::insert`), and serves a request from the smallest
free block that fits (`get_block`, best fit), at the block's start, sizes rounded up
to 256 bytes. The model gives it the most favourable setup for fitting: one pool of
the whole device, and one free list for all streams (RMM keeps one per stream and
takes from the others only when a stream's own list fails, which can only fit worse).
So its answer is a lower bound on what RMM's pool needs.

"Fits from" is found like `memtrace replay --min-capacity` finds it: the unbounded run
gives the high end (the pool's high-water mark), then a scan down from there in steps
of max(1 MiB, (hi - lo) / 256) to the first capacity that fails; the answer is the
last one that fit. Deterministic: no randomness, traces read in order.

Input: the JSON Lines traces of docs/formats.md (plain or gzip); only alloc and free
events are used, and a free of an address that is not live is skipped.
"""
import argparse
import bisect
import gzip
import json
import sys

ALIGN = 256
MIB = 1 << 20


def read_ops(path):
    """(is_alloc, id, size rounded to ALIGN, size) ops; allocations numbered densely."""
    opener = gzip.open if path.endswith(".gz") else open
    ops, live, next_id = [], {}, 0
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            d = json.loads(line)
            action = d.get("action")
            key = (d.get("device", ""), d.get("addr"))
            if action == "alloc":
                live[key] = next_id
                ops.append((True, next_id, (d["size"] + ALIGN - 1) // ALIGN * ALIGN, d["size"]))
                next_id += 1
            elif action == "free" and key in live:
                ops.append((False, live.pop(key), 0, 0))
    return ops


def fits(ops, capacity):
    """True when the trace runs in one pool of `capacity` bytes; else False.
    Also returns the pool's high-water mark (highest address end handed out)."""
    by_size = [(capacity, 0)]      # free blocks as (size, addr), sorted: best fit
    start_of = {0: capacity}       # free block addr -> size
    end_of = {capacity: 0}         # free block end -> addr
    blocks = {}                    # allocation id -> (addr, size)
    high = 0

    def remove(addr, size):
        del by_size[bisect.bisect_left(by_size, (size, addr))]
        del start_of[addr]
        del end_of[addr + size]

    def add(addr, size):
        bisect.insort(by_size, (size, addr))
        start_of[addr] = size
        end_of[addr + size] = addr

    for is_alloc, ident, size, _ in ops:
        if is_alloc:
            if size == 0:
                blocks[ident] = (0, 0)
                continue
            i = bisect.bisect_left(by_size, (size, -1))
            if i == len(by_size):
                return False, high
            bsize, addr = by_size[i]
            remove(addr, bsize)
            if bsize > size:
                add(addr + size, bsize - size)
            blocks[ident] = (addr, size)
            high = max(high, addr + size)
        else:
            addr, size = blocks.pop(ident)
            if size == 0:
                continue
            if addr + size in start_of:          # coalesce with the block above
                above = start_of[addr + size]
                remove(addr + size, above)
                size += above
            if addr in end_of:                   # and with the block below
                below = end_of[addr]
                bsize = start_of[below]
                remove(below, bsize)
                addr, size = below, size + bsize
            add(addr, size)
    return True, high


def peak_requested(ops):
    """The peak of live requested (unrounded) bytes, as memtrace reports it."""
    live, peak, sizes = 0, 0, {}
    for is_alloc, ident, _, size in ops:
        if is_alloc:
            sizes[ident] = size
            live += size
            peak = max(peak, live)
        else:
            live -= sizes.pop(ident)
    return peak


def min_capacity(ops, max_scan=256):
    lo = peak_requested(ops)
    if lo == 0:
        return 0, 0
    ok, hi = fits(ops, 1 << 50)
    assert ok
    hi = max(hi, lo)
    step = max(MIB, (hi - lo) // max_scan)
    safe = hi
    while safe >= lo + step and fits(ops, safe - step)[0]:
        safe -= step
    return lo, safe


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        ops = read_ops(args.trace)
    except (OSError, ValueError, KeyError) as e:
        sys.exit("rmm_pool_model.py: %s: %s" % (args.trace, e))
    lo, cap = min_capacity(ops)
    ratio = cap / lo if lo else 0.0
    if args.json:
        print(json.dumps({"trace": args.trace, "peak_requested_bytes": lo,
                          "min_capacity_bytes": cap,
                          "min_capacity_over_peak_requested": round(ratio, 4)}))
    else:
        print("%s: peak requested %.1f MiB, fits from %.1f MiB (%.3f x)" % (
            args.trace, lo / MIB, cap / MIB, ratio))


if __name__ == "__main__":
    main()
