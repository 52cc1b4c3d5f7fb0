#!/usr/bin/env python3
"""Prints the README's replay table: every workload trace under several policies.

    tools/replay/replay_table.py [--memtrace build/bin/memtrace] [--conf C ...] [--no-rmm]

Runs `memtrace replay TRACE --min-capacity --json [--conf C]` for the seven synthetic
traces in tests/data/traces/ and the two real PyTorch traces in tests/data/traces/real/
(gzip; a missing trace is an error), and prints one Markdown row per (trace, configuration) with
the replay targets: peak reserved / peak requested <= 1.3 and the smallest safe
capacity / peak requested <= 1.05 (the fragmentation adversary: 1.07, see
CAPACITY_EXCEPTIONS). tests/replay_targets_test.py holds the default configuration to
the same targets (it imports them from here). After each trace's rows comes one for a
model of RMM's pool allocator (tools/replay/rmm_pool_model.py: best fit, coalescing, one pool
of the whole device; an optimistic model), so the fit figures compare with both
PyTorch's policies (`expandable_segments:false`, `expandable_recycle_threshold:none`)
and RMM's. Replays are deterministic, so the table
is too (only ns/op, which it leaves out, varies).

    tools/replay/replay_table.py --recycle [--threshold T ...]

prints instead the memory/time trade-off of `expandable_recycle_threshold`: for each
trace and threshold (default 0, 0.125, 0.25, 0.5, none) the peak reserved bytes, the
smallest safe capacity, the maps/unmaps, and the driver time the sim's driver cost
model estimates for them on a GPU (`sim_driver_cost`, A100 figures by default; the
`driver_ns` of `memtrace replay --json`), with the cuMemCreate calls behind it.
"""
import argparse
import json
import os
import subprocess
import sys

import rmm_pool_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACES = [
    ("training loop", os.path.join(ROOT, "tests/data/traces/training_loop.jsonl")),
    ("transformer step", os.path.join(ROOT, "tests/data/traces/transformer.jsonl")),
    ("fragmentation adversary", os.path.join(ROOT, "tests/data/traces/fragmentation.jsonl")),
    ("multi-stream producer/consumer", os.path.join(ROOT, "tests/data/traces/multistream.jsonl")),
    ("serving, batch varies", os.path.join(ROOT, "tests/data/traces/serving_varbatch.jsonl")),
    ("training, sequence varies", os.path.join(ROOT, "tests/data/traces/training_varseq.jsonl")),
    ("fine-tuning + evaluation", os.path.join(ROOT, "tests/data/traces/finetune_eval.jsonl")),
    ("ResNet-18", os.path.join(ROOT, "tests/data/traces/real/resnet18_train.jsonl.gz")),
    ("MobileNetV2", os.path.join(ROOT, "tests/data/traces/real/mobilenet_v2_train.jsonl.gz")),
]
CONFS = [
    ("", "default"),
    ("expandable_recycle_threshold:none", "`expandable_recycle_threshold:none`"),
    ("expandable_segments:false", "`expandable_segments:false`"),
]
MIB = 1 << 20

RESERVED_TARGET = 1.3
CAPACITY_TARGET = 1.05
# Trace file name -> its capacity target where 1.05 cannot be met. fragmentation.jsonl:
# at its peak eight survivors of 16 MiB + a few KiB each sit between holes and pin a
# partly used 2 MiB granule that no placement can share, so an allocator that never
# moves a live buffer needs about 1.06 x (docs/architecture.md, "Fit").
CAPACITY_EXCEPTIONS = {"fragmentation.jsonl": 1.07}


def capacity_target(trace):
    return CAPACITY_EXCEPTIONS.get(os.path.basename(trace), CAPACITY_TARGET)


def replay(memtrace, trace, conf):
    cmd = [memtrace, "replay", trace, "--min-capacity", "--json"]
    if conf:
        cmd += ["--conf", conf]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


RECYCLE_THRESHOLDS = ["0", "0.125", "0.25", "0.5", "none"]


def recycle_table(memtrace, thresholds):
    """The memory/time trade-off of expandable_recycle_threshold, one row per setting."""
    print("| trace | `expandable_recycle_threshold` | peak reserved (/ requested) "
          "| fits from (/ peak requested) | maps / unmaps | cuMemCreate "
          "| est. driver time |")
    print("|---|---|---|---|---|---|---|")
    for name, path in TRACES:
        if not os.path.exists(path):
            sys.exit("%s: %s is missing" % (name, path))
        for t in thresholds:
            d = replay(memtrace, path, "expandable_recycle_threshold:%s" % t)
            print("| %s | %s | %.1f MiB (%.3f) | %.1f MiB (%.3f) | %d / %d | %d | %.2f ms |" % (
                name, t, d["peak_reserved_bytes"] / MIB, d["reserved_over_requested"],
                d["min_capacity_bytes"] / MIB, d["min_capacity_over_peak_requested"],
                d["device_allocs"], d["device_frees"], d["driver_calls"]["create"],
                d["driver_ns"] / 1e6))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memtrace", default=os.path.join(ROOT, "build/bin/memtrace"))
    parser.add_argument("--conf", action="append",
                        help="configurations to compare (default: the three of the README)")
    parser.add_argument("--no-rmm", action="store_true",
                        help="leave out the RMM-like pool rows (tools/replay/rmm_pool_model.py)")
    parser.add_argument("--recycle", action="store_true",
                        help="print the memory/driver-time trade-off of "
                             "expandable_recycle_threshold instead")
    parser.add_argument("--threshold", action="append",
                        help="with --recycle: the thresholds (default: %s)"
                             % ", ".join(RECYCLE_THRESHOLDS))
    args = parser.parse_args()
    if args.recycle:
        recycle_table(args.memtrace, args.threshold or RECYCLE_THRESHOLDS)
        return
    confs = [(c, "default" if not c else "`%s`" % c) for c in args.conf] if args.conf else CONFS
    print("| trace (peak requested) | configuration | peak reserved (/ requested) "
          "| maps / unmaps | fits from (/ peak requested) | targets met (reserved / fits) |")
    print("|---|---|---|---|---|---|")
    for name, path in TRACES:
        if not os.path.exists(path):
            sys.exit("%s: %s is missing" % (name, path))
        for i, (conf, label) in enumerate(confs):
            d = replay(args.memtrace, path, conf)
            res = d["reserved_over_requested"]
            fit = d["min_capacity_over_peak_requested"]
            shown = os.path.relpath(path, os.path.join(ROOT, "tests", "data", "traces"))
            first = "%s (`%s`, %.1f MiB)" % (name, shown,
                                              d["peak_requested_bytes"] / MIB)
            mark = "" if d["min_capacity_monotonic"] else " ¹"
            print("| %s | %s | %.1f MiB (%.3f) | %d / %d | %.1f MiB (%.3f)%s | %s / %s |" % (
                first if i == 0 else name, label, d["peak_reserved_bytes"] / MIB, res,
                d["device_allocs"], d["device_frees"], d["min_capacity_bytes"] / MIB, fit, mark,
                "yes" if res <= RESERVED_TARGET else "no",
                "yes" if fit <= capacity_target(path) else "no"))
        if not args.no_rmm:
            # RMM's pool for comparison (a model: tools/replay/rmm_pool_model.py); it takes
            # the whole device up front, so only its fit is comparable.
            lo, cap = rmm_pool_model.min_capacity(rmm_pool_model.read_ops(path))
            print("| %s | RMM-like pool (model) | whole device | 1 / 0 | %.1f MiB (%.3f) "
                  "| — / %s |" % (name, cap / MIB, cap / lo,
                                  "yes" if cap / lo <= capacity_target(path) else "no"))


if __name__ == "__main__":
    main()
