#!/usr/bin/env python3
"""tests/dashboards_lint_test.py: dashboards/lint.py accepts dashboards/devmem.json and
catches broken copies of it (each one a single mistake; Python standard library only).

    python3 tests/dashboards_lint_test.py
"""

import copy
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT = os.path.join(ROOT, "dashboards", "lint.py")
DASHBOARD = os.path.join(ROOT, "dashboards", "devmem.json")


def run_lint(dashboard):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "dashboard.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dashboard, f)
        r = subprocess.run([sys.executable, LINT, path], capture_output=True, text=True,
                           timeout=60)
        return r.returncode, r.stdout + r.stderr


def panel(d, title):
    return next(p for p in d["panels"] if p["title"] == title)


def replace_expr(title, old, new):
    def mutate(d):
        t = panel(d, title)["targets"][0]
        assert old in t["expr"], (old, t["expr"])
        t["expr"] = t["expr"].replace(old, new)
    return mutate


def set_key(title, keys, value):
    def mutate(d):
        obj = panel(d, title)
        for k in keys[:-1]:
            obj = obj[k]
        if value is None:
            del obj[keys[-1]]
        else:
            obj[keys[-1]] = value
    return mutate


SEL = 'instance=~"$instance", device=~"$device"'
# (name, mutation, text the lint's output must contain)
CASES = [
    ("counter outside rate()",
     replace_expr("Allocation rate",
                  f"rate(devmem_allocations_total{{{SEL}}}[$__rate_interval])",
                  f"devmem_allocations_total{{{SEL}}}"),
     "counter devmem_allocations_total is not directly inside rate() or increase()"),
    ("counter inside sum() only",
     replace_expr("OOMs and retries",
                  f"increase(devmem_ooms_total{{{SEL}}}[$__rate_interval])",
                  f"devmem_ooms_total{{{SEL}}}"),
     "counter devmem_ooms_total is not directly inside rate() or increase()"),
    ("counter with a fixed range",
     replace_expr("Allocation rate", "[$__rate_interval]", "[5m]"),
     "has range '[5m]', not [$__rate_interval]"),
    ("unknown metric",
     replace_expr("Fragmentation ratio", "devmem_fragmentation_ratio", "devmem_fragmentation"),
     "metric 'devmem_fragmentation' is neither in docs/metrics.md"),
    ("selector without $device",
     replace_expr("Fragmentation ratio", ', device=~"$device"', ""),
     'does not filter on instance=~"$instance" and device=~"$device"'),
    ("no unit", set_key("Cache-hit ratio", ["fieldConfig", "defaults", "unit"], None),
     "no unit"),
    ("no title", set_key("Cache-hit ratio", ["title"], ""), "no title"),
    ("fixed data source", set_key("Cache-hit ratio", ["datasource"],
                                  {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}),
     "datasource is"),
    ("no device variable",
     lambda d: d["templating"].__setitem__(
         "list", [v for v in d["templating"]["list"] if v["name"] != "device"]),
     "no query variable 'device'"),
]


def main():
    with open(DASHBOARD, encoding="utf-8") as f:
        good = json.load(f)
    failures = []
    rc, out = run_lint(good)
    if rc != 0:
        failures.append(f"the dashboard itself: exit {rc}\n{out}")
    for name, mutate, needle in CASES:
        d = copy.deepcopy(good)
        mutate(d)
        rc, out = run_lint(d)
        if rc != 1 or needle not in out:
            failures.append(f"{name}: expected exit 1 and {needle!r}, got exit {rc}:\n{out}")
        else:
            print(f"ok: {name}: {out.strip().splitlines()[0]}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
