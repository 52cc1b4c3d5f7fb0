#!/usr/bin/env python3
"""The seed corpus of tools/fuzz/fuzz_flight_record.cc, from generate.py's record
(version 3, two lanes, checkpointed entries):

    python3 tests/data/flight/make_fuzz_seeds.py tools/fuzz/corpus/flight_record

whole.flight     generate.py's record as it is
truncated.flight cut inside lane 1's ring
corrupted.flight a ring slot and a name changed, a live-site copy marked busy (torn)
tsc_clock.flight the TSC flag set and the clock anchor at the bottom of the int64
                 range, its header check fixed (the reader's tick-to-ns path, where the
                 fuzzer's UBSan build once found signed overflows)
Deterministic: the same bytes every run.
"""
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import generate  # noqa: E402  (the layout's constants)


def main():
    out = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "whole.flight")
        subprocess.run([sys.executable, os.path.join(HERE, "generate.py"), path], check=True)
        with open(path, "rb") as f:
            whole = f.read()
    ring1 = generate.lane_off(1) + 4096 + generate.SITES * 64
    seeds = {"whole.flight": whole, "truncated.flight": whole[:ring1 + 100]}
    bad = bytearray(whole)
    bad[generate.lane_off(0) + 4096 + generate.SITES * 64 + 64 * 2 + 40] ^= 0x01  # size
    bad[generate.NAMES_OFF + 1 * generate.NAME_BYTES + 32] ^= 0x20                 # a name
    site1 = generate.lane_off(0) + 4096 + 64 * 1
    bad[site1 + 7] |= 0x80                                                         # busy
    seeds["corrupted.flight"] = bytes(bad)
    tsc = bytearray(whole)
    struct.pack_into("<I", tsc, 44, 1)                   # flags: TSC ticks
    struct.pack_into("<q", tsc, 64, -(1 << 63) + 1)      # tick0
    struct.pack_into("<Q", tsc, 96, generate.fnv(0, bytes(tsc[0:96])))
    seeds["tsc_clock.flight"] = bytes(tsc)
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
