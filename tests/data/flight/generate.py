#!/usr/bin/env python3
"""A small flight record (docs/formats.md, "Flight record"), written from the format's
description alone: a second writer, so that the C++ reader is checked against the
documented layout and not only against its own writer. Deterministic (no clock).

    python3 tests/data/flight/generate.py OUT.flight

Version 3: one region (sim:0) of two lanes, rings of 64 slots, 16 site slots, 64-byte
names, clock ticks in nanoseconds (no TSC). The live-site entries are checkpoints, as
the format says: written after every fourth event of a lane (the writer's period may
be anything the ring covers; devmem's is CheckpointEvents), and not at the end (the
record of a killed process), so the reader must add the ring's later events to them. Three sites: 1 "model.py:10 forward" tag
"attn", 2 "model.py:20 backward" (clone), 3 "data.py:5 load"; twelve events, three of
them on lane 1 (a second thread, which frees a block lane 0 allocated); at the end site
1 holds 3 MiB in 2 buffers, site 2 1 MiB in 1, site 3 nothing. Used by tests/memtrace_flags_test.py and
as the seed of tools/fuzz/fuzz_flight_record.cc (tools/fuzz/corpus/flight_record/).
"""
import struct
import sys

M = (1 << 64) - 1
BUSY = 1 << 63
SEED_RING, SEED_SITE, SEED_PEAK, SEED_COLD = 0x72696E67, 0x73697465, 0x7065616B, 0x636F6C64
SEED_CLOCK, SEED_IDENT, SEED_NAME = 0x636C6B, 0x6964, 0x6E616D65
DEVICES, LANES, RING, SITES, NAME_BYTES = 1, 2, 64, 16, 64
CHECKPOINT = 4  # events of a lane between its checkpoints (the ring holds 2 x 4 or more)
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
LANE_BYTES = 4096 + (SITES + RING) * 64
DEVICE_BYTES = 4096 + LANES * LANE_BYTES
FILE_BYTES = DEVICES_OFF + DEVICES * DEVICE_BYTES


def lane_off(lane):
    return DEVICES_OFF + 4096 + lane * LANE_BYTES


def put(buf, at, fmt, *values):
    struct.pack_into("<" + fmt, buf, at, *values)


def main():
    buf = bytearray(FILE_BYTES)
    put(buf, 8, "IIQIIIIIIqqqqQII", 3, 4096, FILE_BYTES, DEVICES, RING, SITES, NAME_BYTES,
        4242, 0, 1_700_000_000_000_000_000, START_NS, 0, 0, 0x0102030405060708, LANES, 0)
    buf[0:8] = b"DMFLIGHT"
    put(buf, 96, "Q", fnv(0, bytes(buf[0:96])))
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
    # Events: (lane, action, addr, size, site); actions: 0 alloc, 1 free, 5 segment_map.
    # Lane 1 (a second thread) frees a block lane 0 allocated: a negative share.
    events = [(0, 5, 0x10000000, 8 * MIB, 0), (0, 0, 0x10000000, 2 * MIB, 1),
              (0, 0, 0x10200000, 1 * MIB, 1), (0, 0, 0x10300000, 1 * MIB, 2),
              (1, 0, 0x10400000, 512 * 1024, 3), (1, 1, 0x10400000, 512 * 1024, 3),
              (0, 0, 0x10400000, 1 * MIB, 2), (1, 1, 0x10300000, 1 * MIB, 2),
              (0, 0, 0x10500000, 256 * 1024, 3), (0, 1, 0x10500000, 256 * 1024, 3),
              (0, 0, 0x10600000, 4096, 0), (0, 1, 0x10600000, 4096, 0)]
    base = DEVICES_OFF
    ident = 1 << 63 | 1 << 16 | 0  # sim:0
    put(buf, base + 8, "Q", check(SEED_IDENT, ident, 0))
    put(buf, base, "Q", ident)
    lanes = [{"seq": 0, "live": {}, "copies": {}, "dirty": set(), "share": 0, "peak": 0,
              "peak_copy": 0} for _ in range(LANES)]
    reserved = mapped = maps = cold_seq = cold_copy = 0
    for n, (lane, action, addr, size, site) in enumerate(events, 1):
        L = lanes[lane]
        L["seq"] += 1
        seq = L["seq"]
        tick = START_NS + 1000 * n
        packed = action | 1 << 8 | 0 << 16 | (1 + lane) << 32
        slot = lane_off(lane) + 4096 + SITES * 64 + 64 * ((seq - 1) % RING)
        words = [seq, tick, packed, 0, addr, size, size]
        c = check(SEED_RING ^ site, *words) >> 32
        put(buf, slot, "8Q", *words, site | c << 32)
        if action in (0, 1):
            sign = 1 if action == 0 else -1
            b, k, allocs = L["live"].get(site, (0, 0, 0))
            b, k, allocs = b + sign * size, k + sign, allocs + (action == 0)
            L["live"][site] = (b, k, allocs)
            L["dirty"].add(site)
            L["share"] += sign * size
            if L["share"] > L["peak"]:
                L["peak"] = L["share"]
                pc = L["peak_copy"]
                L["peak_copy"] ^= 1
                at = lane_off(lane) + 64 * pc
                put(buf, at, "8Q", seq, L["peak"], 0, 0, 0, 0, 0,
                    check(SEED_PEAK ^ pc, seq, L["peak"]))
        else:
            reserved += size
            mapped += size
            maps += 1
            cold_seq += 1
            cold = [cold_seq, reserved, reserved, 0, mapped, maps, 0]
            put(buf, base + 256 + 64 * cold_copy, "8Q", *cold,
                check(SEED_COLD ^ cold_copy, *cold))
            cold_copy ^= 1
        if seq % CHECKPOINT == 0:  # the lane's checkpoint: its changed shares, as of seq
            for site in sorted(L["dirty"]):
                b, k, allocs = L["live"][site]
                cp = L["copies"].get(site, 0)
                L["copies"][site] = cp ^ 1
                at = lane_off(lane) + 4096 + 64 * site + 32 * cp
                c = check(SEED_SITE ^ (site << 8) ^ cp, seq, b & M, k & 0xFFFFFFFF,
                          allocs) >> 32
                put(buf, at, "QQQQ", seq, b & M, (k & 0xFFFFFFFF) | c << 32, allocs)
            L["dirty"].clear()
    clock = [1, START_NS + 100_000, START_NS + 100_000]
    put(buf, base + 384, "8Q", *clock, 0, 0, 0, 0, check(SEED_CLOCK, *clock))
    with open(sys.argv[1], "wb") as f:
        f.write(buf)


if __name__ == "__main__":
    main()
