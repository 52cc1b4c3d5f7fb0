#!/usr/bin/env python3
"""tools/fuzz/fuzz_import_pytorch.py: a mutation fuzzer for the PyTorch snapshot importer
(tools/import/import_pytorch_snapshot.py), in Python because the importer is: libFuzzer cannot
drive it. Each round mutates a seed from tools/fuzz/corpus/import_pytorch/ (byte flips,
inserted and deleted ranges, repeated ranges, pickle opcodes, splices of two seeds) and
runs what the importer runs on it: the restricted unpickling, the conversion with its
budget, and the writing of the trace. Anything but InputError (the importer's "malformed
input", exit status 2) is a failure: the input is saved to --crash-dir and the harness
exits 1. The memory cap the importer sets for itself applies to the whole run.

  fuzz_import_pytorch.py [--rounds N | --seconds S] [--seed K] [--crash-dir DIR]

ctest runs a fixed number of rounds with a fixed seed (deterministic, about 2 s);
scripts/test.sh and manual runs use --seconds.
"""
import argparse
import importlib.util
import io
import os
import random
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "import_pytorch_snapshot", os.path.join(HERE, "..", "import", "import_pytorch_snapshot.py"))
imp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(imp)

# Opcodes worth inserting: globals, reduce, memo and container ones, big length prefixes.
OPCODES = [b"c", b"\x93", b"R", b"b", b"(", b"t", b"l", b"d", b"]", b"}", b"a", b"e", b"s",
           b"u", b"h\x00", b"q\x00", b"j\x00\x00\x00\x00", b"\x94", b"0", b"2", b"\x96",
           b"\x8e\xff\xff\xff\xff\xff\xff\xff\x7f", b"X\xff\xff\xff\x7f", b"\x8f", b"\x90",
           b"cbuiltins\nbytearray\n", b"cos\nsystem\n", b"\x8c\x08builtins\x8c\x03set\x93",
           b"J\xff\xff\xff\x7f", b"\x8a\x08" + b"\xff" * 8, b"."]


def mutate(rng, data, seeds):
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        pos = rng.randint(0, len(data))
        if op == 0 and data:
            data[min(pos, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and data:
            del data[pos:pos + rng.randint(1, 16)]
        elif op == 3 and data:
            start = rng.randrange(len(data))
            chunk = data[start:start + rng.randint(1, 64)]
            data[pos:pos] = chunk * rng.randint(1, 8)
        elif op == 4:
            data[pos:pos] = rng.choice(OPCODES)
        else:
            other = rng.choice(seeds)
            cut = rng.randint(0, len(other))
            data = data[:pos] + other[cut:]
    return bytes(data)


def run_one(data):
    """What main() does with a file's bytes; raises anything but InputError on a bug."""
    try:
        snapshot = imp.loads(data)
        sites, events = imp.convert(snapshot, None, imp.Budget(len(data)))
        imp.write_to(io.StringIO(), "fuzz", sites, events)
    except imp.InputError:
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--crash-dir", default=".")
    args = ap.parse_args()
    corpus = os.path.join(HERE, "corpus", "import_pytorch")
    seeds = [open(os.path.join(corpus, n), "rb").read() for n in sorted(os.listdir(corpus))]
    if not seeds:
        sys.exit("no seeds in " + corpus)
    imp.limit_memory(max(len(s) for s in seeds) * 4)
    rng = random.Random(args.seed)
    rounds = args.rounds if args.rounds is not None else (None if args.seconds else 3000)
    deadline = time.monotonic() + args.seconds if args.seconds else None
    for s in seeds:
        run_one(s)
    done = 0
    while (rounds is None or done < rounds) and (deadline is None or time.monotonic() < deadline):
        data = mutate(rng, rng.choice(seeds), seeds)
        try:
            run_one(data)
        except Exception:  # noqa: BLE001 -- any other exception is a finding
            path = os.path.join(args.crash_dir, "crash-import-pytorch-%d" % done)
            with open(path, "wb") as f:
                f.write(data)
            traceback.print_exc()
            print("FAILED: round %d: the input is in %s" % (done, path))
            return 1
        done += 1
    print("ok: %d rounds from %d seeds, no failure" % (done, len(seeds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
