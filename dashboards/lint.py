#!/usr/bin/env python3
"""dashboards/lint.py: checks a devmem Grafana dashboard (Python standard library only).

    python3 dashboards/lint.py [DASHBOARD.json] [--metrics docs/metrics.md]

Checks, for every panel (rows' nested panels included):
  - it has a title, a description, a unit (fieldConfig.defaults.unit) and the data source
    variable ({"type": "prometheus", "uid": "${datasource}"}, on the panel and on each
    target that names one), and at least one target with an expression;
  - every counter (a devmem counter family, i.e. a name ending in _total, and a
    histogram's _bucket/_count/_sum series) appears only as `name{...}[$__rate_interval]`
    directly inside rate() or increase();
  - every metric name it uses is one devmem exports (the tables of docs/metrics.md) or a
    documented external one (EXTERNAL_METRICS below);
  - every devmem selector filters on the dashboard's variables
    (instance=~"$instance" and device=~"$device").
And for the dashboard: the templating variables datasource, instance and device.
Exits 1 and prints one line per problem when something is wrong, 0 otherwise.
"""

import json
import os
import re
import sys

# Metrics a panel may use that devmem does not export, with who exports them.
EXTERNAL_METRICS = {
    "DCGM_FI_DEV_FB_USED": "dcgm-exporter (framebuffer memory used, MiB)",
}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE_INTERVAL = "$__rate_interval"
COUNTER_FUNCTIONS = ("rate", "increase")

# PromQL words that look like identifiers but are not metric names.
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "offset", "bool", "inf", "nan", "atan2",
}
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def parse_metrics_doc(path):
    """Returns {series name: type} from the tables of docs/metrics.md."""
    row = re.compile(r"^\|\s*`([a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|\s*(gauge|counter|histogram|summary)\s*\|")
    names = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = row.match(line)
            if not m:
                continue
            name, kind = m.groups()
            if kind == "histogram":
                for suffix in ("_bucket", "_count", "_sum"):
                    names[name + suffix] = "counter"
            elif kind == "summary":
                names[name + "_count"] = "counter"
                names[name + "_sum"] = "counter"
                names[name] = "gauge"
            else:
                names[name] = kind
    return names


def _skip_string(expr, i):
    quote = expr[i]
    i += 1
    while i < len(expr) and expr[i] != quote:
        i += 2 if expr[i] == "\\" else 1
    return i + 1


def tokens(expr):
    """Yields (kind, text, start, end) for identifiers, punctuation, strings, braces and
    ranges of a PromQL expression; {...} and [...] come whole."""
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c.isspace():
            i += 1
        elif c in "\"'`":
            j = _skip_string(expr, i)
            yield ("string", expr[i:j], i, j)
            i = j
        elif c == "{":
            j = i + 1
            while j < n and expr[j] != "}":
                j = _skip_string(expr, j) if expr[j] in "\"'`" else j + 1
            yield ("braces", expr[i:j + 1], i, j + 1)
            i = j + 1
        elif c == "[":
            j = expr.find("]", i)
            j = n - 1 if j < 0 else j
            yield ("range", expr[i:j + 1], i, j + 1)
            i = j + 1
        elif c.isdigit() or (c == "." and i + 1 < n and expr[i + 1].isdigit()):
            m = re.compile(r"[0-9.]+(e[+-]?[0-9]+)?([smhdwy]|ms)?").match(expr, i)
            yield ("number", m.group(0), i, m.end())
            i = m.end()
        elif IDENT.match(expr, i):
            m = IDENT.match(expr, i)
            yield ("ident", m.group(0), i, m.end())
            i = m.end()
        else:
            yield ("punct", c, i, i + 1)
            i += 1


def metric_uses(expr):
    """Returns a list of (name, matchers or None, range or None, function or None) for
    every metric selector in expr: the function whose parentheses hold the selector
    directly (or, for a selector in plain parentheses, the nearest one around them).
    Strings (label_replace's arguments) and label lists (by, on, group_left ...) are
    not metric names."""
    toks = list(tokens(expr))
    uses = []
    # Stack of the function (or None) each open parenthesis belongs to.
    stack = []
    skip_label_list = False
    for k, (kind, text, _, _) in enumerate(toks):
        prev = toks[k - 1] if k > 0 else None
        nxt = toks[k + 1] if k + 1 < len(toks) else None
        if kind == "punct" and text == "(":
            fn = prev[1] if prev is not None and prev[0] == "ident" else None
            if fn in ("by", "without", "on", "ignoring", "group_left", "group_right"):
                stack.append("#labels")
            else:
                stack.append(fn)
            continue
        if kind == "punct" and text == ")":
            if stack:
                stack.pop()
            continue
        if kind != "ident":
            continue
        if stack and stack[-1] == "#labels":
            continue  # a label name in by (...) / on (...)
        if text.lower() in KEYWORDS:
            continue
        if nxt is not None and nxt[0] == "punct" and nxt[1] == "(":
            continue  # a function or an aggregation: sum (...)
        if nxt is not None and nxt[0] == "ident" and nxt[1] in ("by", "without"):
            continue  # an aggregation: sum by (...) (...)
        matchers = rng = None
        j = k + 1
        if j < len(toks) and toks[j][0] == "braces":
            matchers = toks[j][1]
            j += 1
        if j < len(toks) and toks[j][0] == "range":
            rng = toks[j][1]
        enclosing = next((f for f in reversed(stack) if f is not None), None) if stack else None
        direct = stack[-1] if stack else None
        uses.append((text, matchers, rng, direct if direct is not None else enclosing))
    return uses


def iter_panels(panels):
    for p in panels or []:
        yield p
        yield from iter_panels(p.get("panels"))


def lint(dashboard, metrics):
    problems = []
    names = {v.get("name"): v for v in dashboard.get("templating", {}).get("list", [])}
    ds = names.get("datasource")
    if ds is None or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("templating: no datasource variable of type datasource (query prometheus)")
    for var in ("instance", "device"):
        v = names.get(var)
        if v is None or v.get("type") != "query":
            problems.append(f"templating: no query variable {var!r}")
        elif v.get("datasource") != DATASOURCE:
            problems.append(f"templating: variable {var!r} does not use ${{datasource}}")
    if not isinstance(dashboard.get("schemaVersion"), int) or dashboard["schemaVersion"] < 36:
        problems.append("schemaVersion missing or below 36")

    panels = [p for p in iter_panels(dashboard.get("panels")) if p.get("type") != "row"]
    if not panels:
        problems.append("dashboard has no panels")
    for p in panels:
        where = f"panel {p.get('id')} {p.get('title')!r}"
        if not str(p.get("title", "")).strip():
            problems.append(f"{where}: no title")
        if not str(p.get("description", "")).strip():
            problems.append(f"{where}: no description")
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if not unit:
            problems.append(f"{where}: no unit (fieldConfig.defaults.unit)")
        if p.get("datasource") != DATASOURCE:
            problems.append(f"{where}: datasource is {p.get('datasource')!r}, not {DATASOURCE!r}")
        targets = [t for t in p.get("targets", []) if str(t.get("expr", "")).strip()]
        if not targets:
            problems.append(f"{where}: no target with an expression")
        for t in p.get("targets", []):
            tw = f"{where} target {t.get('refId')}"
            if "datasource" in t and t["datasource"] != DATASOURCE:
                problems.append(f"{tw}: datasource is {t['datasource']!r}, not {DATASOURCE!r}")
            expr = str(t.get("expr", ""))
            for name, matchers, rng, fn in metric_uses(expr):
                kind = metrics.get(name)
                if kind is None and name not in EXTERNAL_METRICS:
                    problems.append(f"{tw}: metric {name!r} is neither in docs/metrics.md nor a "
                                    f"documented external metric")
                    continue
                if kind is not None:
                    m = matchers or ""
                    if 'instance=~"$instance"' not in m or 'device=~"$device"' not in m:
                        problems.append(f"{tw}: {name} does not filter on instance=~\"$instance\" "
                                        f"and device=~\"$device\"")
                counter = kind == "counter" or name.endswith(("_total", "_bucket", "_count", "_sum"))
                if counter:
                    if fn not in COUNTER_FUNCTIONS:
                        problems.append(f"{tw}: counter {name} is not directly inside rate() or "
                                        f"increase()")
                    if rng is None or rng.replace(" ", "") != f"[{RATE_INTERVAL}]":
                        problems.append(f"{tw}: counter {name} has range {rng!r}, not "
                                        f"[{RATE_INTERVAL}]")
                elif rng is not None and fn in COUNTER_FUNCTIONS:
                    problems.append(f"{tw}: gauge {name} inside {fn}()")
    return problems


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    dashboard_path = os.path.join(here, "devmem.json")
    metrics_path = os.path.join(here, "..", "docs", "metrics.md")
    args = list(argv[1:])
    while args:
        a = args.pop(0)
        if a == "--metrics" and args:
            metrics_path = args.pop(0)
        elif a.startswith("-"):
            print(__doc__, file=sys.stderr)
            return 2
        else:
            dashboard_path = a
    try:
        metrics = parse_metrics_doc(metrics_path)
    except OSError as e:
        print(f"lint: {metrics_path}: {e}", file=sys.stderr)
        return 2
    if not metrics:
        print(f"lint: {metrics_path}: no metric table found", file=sys.stderr)
        return 2
    try:
        with open(dashboard_path, encoding="utf-8") as f:
            dashboard = json.load(f)
    except (OSError, ValueError) as e:
        print(f"lint: {dashboard_path}: {e}", file=sys.stderr)
        return 1
    problems = lint(dashboard, metrics)
    for p in problems:
        print(f"{dashboard_path}: {p}")
    if problems:
        return 1
    print(f"{dashboard_path}: ok ({len(list(iter_panels(dashboard.get('panels'))))} panels, "
          f"{len(metrics)} devmem series names known)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
