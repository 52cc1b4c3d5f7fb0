#!/usr/bin/env python3
"""A small flight record (docs/formats.md, "Flight record"), written from the format's
description alone: a second writer, so that the C++ reader is checked against the
documented layout and not only against its own writer. Deterministic (no clock).

    python3 tests/data/flight/generate.py OUT.flight

One region (sim:0), a ring of 64 slots, 16 site slots, 64-byte names, clock ticks in
nanoseconds (no TSC). Three sites: 1 "model.py:10 forward" tag "attn", 2 "model.py:20
backward" (clone), 3 "data.py:5 load"; twelve events; at the end site 1 holds 3 MiB in
2 buffers, site 2 1 MiB in 1, site 3 nothing. Used by tests/memtrace_flags_test.py and
as the seed of tools/fuzz/fuzz_flight_record.cc (tools/fuzz/corpus/flight_record/).
"""
import struct
import sys

M = (1 << 64) - 1
BUSY = 1 << 63
SEED_RING, SEED_SITE, SEED_HOT, SEED_COLD = 0x72696E67, 0x73697465, 0x686F74, 0x636F6C64
SEED_CLOCK, SEED_IDENT, SEED_NAME = 0x636C6B, 0x6964, 0x6E616D65
DEVICES, RING, SITES, NAME_BYTES = 1, 64, 16, 64
MIB = 1 << 20
START_NS = 5_000_000_000


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def check(seed, *w):
    w = list(w) + [0] * (7 - len(w))
    h = (seed ^ w[0]) ^ rotl(w[1], 7) ^ rotl(w[2], 14) ^ rotl(w[3], 21) ^ rotl(w[4], 28) \
        ^ rotl(w[5], 35) ^ rotl(w[6], 42)
    h = (h * 0x9E3779B97F4A7C15) & M
    return h ^ (h >> 31)


def fnv(seed, data):
    h = 0xCBF29CE484222325 ^ seed
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & M
    return h


def page(n):
    return (n + 4095) // 4096 * 4096


NAMES_OFF = 4096
DEVICES_OFF = page(NAMES_OFF + SITES * NAME_BYTES)
DEVICE_BYTES = 4096 + (SITES + RING) * 64
FILE_BYTES = DEVICES_OFF + DEVICES * DEVICE_BYTES
SITES_OFF = DEVICES_OFF + 4096
RING_OFF = SITES_OFF + SITES * 64


def put(buf, at, fmt, *values):
    struct.pack_into("<" + fmt, buf, at, *values)


def main():
    buf = bytearray(FILE_BYTES)
    put(buf, 8, "IIQIIIIIIqqqqQ", 1, 4096, FILE_BYTES, DEVICES, RING, SITES, NAME_BYTES,
        4242, 0, 1_700_000_000_000_000_000, START_NS, 0, 0, 0x0102030405060708)
    buf[0:8] = b"DMFLIGHT"
    put(buf, 88, "Q", fnv(0, bytes(buf[0:88])))
    # Names: id -> (file, line, function, tag, kind).
    names = {1: ("model.py", 10, "forward", "attn", 0), 2: ("model.py", 20, "backward", "", 1),
             3: ("data.py", 5, "load", "", 0)}
    for sid, (file, line, function, tag, kind) in names.items():
        at = NAMES_OFF + sid * NAME_BYTES
        text = (file + function + tag).encode()
        put(buf, at + 8, "QQ", sid | line << 32,
            len(file) | len(function) << 16 | len(tag) << 32 | kind << 48)
        buf[at + 32:at + 32 + len(text)] = text
        put(buf, at + 24, "Q", fnv(SEED_NAME, bytes(buf[at + 8:at + 24])) ^ fnv(SEED_NAME, text))
        put(buf, at, "Q", 2)
    # Events: (action, addr, size, site); actions: 0 alloc, 1 free, 5 segment_map.
    events = [(5, 0x10000000, 8 * MIB, 0), (0, 0x10000000, 2 * MIB, 1),
              (0, 0x10200000, 1 * MIB, 1), (0, 0x10300000, 1 * MIB, 2),
              (0, 0x10400000, 512 * 1024, 3), (1, 0x10400000, 512 * 1024, 3),
              (0, 0x10400000, 1 * MIB, 2), (1, 0x10300000, 1 * MIB, 2),
              (0, 0x10500000, 256 * 1024, 3), (1, 0x10500000, 256 * 1024, 3),
              (0, 0x10600000, 4096, 0), (1, 0x10600000, 4096, 0)]
    base = DEVICES_OFF
    ident = 1 << 63 | 1 << 16 | 0  # sim:0
    put(buf, base + 8, "Q", check(SEED_IDENT, ident, 0))
    put(buf, base, "Q", ident)
    live, copies = {}, {}
    allocated = peak = allocations = allocs = frees = reserved = mapped = maps = 0
    hot_copy = cold_copy = 0
    for seq, (action, addr, size, site) in enumerate(events, 1):
        tick = START_NS + 1000 * seq
        packed = action | 1 << 8 | 0 << 16 | 1 << 32
        slot = RING_OFF + 64 * ((seq - 1) % RING)
        words = [seq, tick, packed, 0, addr, size, size]
        c = check(SEED_RING ^ site, *words) >> 32
        put(buf, slot, "8Q", *words, site | c << 32)
        if action in (0, 1):
            sign = 1 if action == 0 else -1
            b, n = live.get(site, (0, 0))
            b, n = b + sign * size, n + sign
            live[site] = (b, n)
            k = copies.get(site, 0)
            copies[site] = k ^ 1
            at = SITES_OFF + 64 * site + 24 * k
            c = check(SEED_SITE ^ (site << 8) ^ k, seq, b & M, n & 0xFFFFFFFF) >> 32
            put(buf, at, "QQQ", seq, b & M, (n & 0xFFFFFFFF) | c << 32)
            allocated += sign * size
            peak = max(peak, allocated)
            allocations += sign
            allocs += action == 0
            frees += action == 1
            hot = [seq, tick, allocated, peak, allocations, allocs, frees]
            put(buf, base + 128 + 64 * hot_copy, "8Q", *hot, check(SEED_HOT ^ hot_copy, *hot))
            hot_copy ^= 1
        else:
            reserved += size
            mapped += size
            maps += 1
            cold = [seq, reserved, reserved, 0, mapped, maps, 0]
            put(buf, base + 256 + 64 * cold_copy, "8Q", *cold,
                check(SEED_COLD ^ cold_copy, *cold))
            cold_copy ^= 1
    put(buf, base + 64, "Q", len(events) + 1)
    clock = [1, START_NS + 100_000, START_NS + 100_000]
    put(buf, base + 384, "8Q", *clock, 0, 0, 0, 0, check(SEED_CLOCK, *clock))
    with open(sys.argv[1], "wb") as f:
        f.write(buf)


if __name__ == "__main__":
    main()
