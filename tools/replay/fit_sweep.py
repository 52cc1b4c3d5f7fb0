#!/usr/bin/env python3
"""Fit figures on workloads nobody committed: the synthetic traces regenerated from
other seeds.

    tools/replay/fit_sweep.py [--seeds N] [--first S] [--conf C ...] [--only NAME ...]
                       [--memtrace build/bin/memtrace] [--rmm]

tests/data/traces/generate.py --seed S makes each synthetic workload again with other
random choices (batch sizes, prompt and sequence lengths, jitter); this runs it for
seeds S .. S+N-1 (default 1..10) into a temporary folder, replays every trace with
`memtrace replay --min-capacity --json` under each configuration (default: the
default policy only), and prints per (workload, configuration) the worst and the
median "fits from" / peak requested over the seeds, the worst seed, and how many
seeds meet the capacity target of tools/replay/replay_table.py. A policy tuned on the
committed traces should hold its target here too. --rmm adds the model of RMM's pool
(tools/replay/rmm_pool_model.py) as a configuration.

Deterministic (generation and replay are), so a figure here is reproducible by seed:
`generate.py --seed S --only NAME --out-dir D`, then `memtrace replay D/NAME ...`.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import replay_table
import rmm_pool_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATE = os.path.join(ROOT, "tests", "data", "traces", "generate.py")
RMM = "RMM-like pool (model)"


def fit(memtrace, path, conf):
    if conf == RMM:
        lo, cap = rmm_pool_model.min_capacity(rmm_pool_model.read_ops(path))
        return cap / lo if lo else 0.0
    return replay_table.replay(memtrace, path, conf)["min_capacity_over_peak_requested"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--conf", action="append", help="configurations (default: \"\")")
    parser.add_argument("--only", action="append", help="workloads (file names) to sweep")
    parser.add_argument("--memtrace", default=os.path.join(ROOT, "build/bin/memtrace"))
    parser.add_argument("--rmm", action="store_true", help="add the RMM-like pool model")
    args = parser.parse_args()
    if args.seeds < 1:
        sys.exit("fit_sweep.py: --seeds must be at least 1")
    if not os.path.exists(args.memtrace):
        sys.exit("fit_sweep.py: %s does not exist (build memtrace, or pass --memtrace)"
                 % args.memtrace)
    confs = args.conf or [""]
    if args.rmm:
        confs.append(RMM)
    figures = {}  # (workload, conf) -> [(fit, seed)]
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.first, args.first + args.seeds):
            out = os.path.join(tmp, str(seed))
            cmd = [sys.executable, GENERATE, "--out-dir", out, "--seed", str(seed)]
            for name in args.only or []:
                cmd += ["--only", name]
            subprocess.run(cmd, check=True)
            for name in sorted(os.listdir(out)):
                for conf in confs:
                    figures.setdefault((name, conf), []).append(
                        (fit(args.memtrace, os.path.join(out, name), conf), seed))
    print("| workload | configuration | worst fit (seed) | median fit | seeds within target |")
    print("|---|---|---|---|---|")
    for (name, conf), runs in sorted(figures.items()):
        worst, worst_seed = max(runs)
        target = replay_table.capacity_target(name)
        within = sum(1 for f, _ in runs if f <= target)
        label = conf if conf == RMM else ("default" if not conf else "`%s`" % conf)
        print("| %s | %s | %.3f (%d) | %.3f | %d / %d (<= %.2f) |" % (
            name, label, worst, worst_seed, statistics.median(f for f, _ in runs), within,
            len(runs), target))


if __name__ == "__main__":
    main()
