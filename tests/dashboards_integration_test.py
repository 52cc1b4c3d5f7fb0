#!/usr/bin/env python3
"""tests/dashboards_integration_test.py: every query of dashboards/devmem.json and every
rule of dashboards/alerts.yml, evaluated by a real Prometheus scraping a real devmem
process (Python standard library only).

    python3 tests/dashboards_integration_test.py PATH/TO/devmem-demo

1. Starts devmem-demo --serve 127.0.0.1:0 (a long training run, so that the counters
   move while the queries run) and reads the port it prints.
2. Starts Debian's prometheus (/usr/bin/prometheus, package `prometheus`) on a free
   127.0.0.1 port, with a temporary --storage.tsdb.path, scrape and rule evaluation
   intervals of 1 s, the demo as its only target, and dashboards/alerts.yml as its rule
   file; waits until the target is up and has RATE_INTERVAL_SAMPLES samples, and until
   the series of the demo's step arena have as many (the demo trains one epoch through
   the pool alone first, for its comparison; under load that takes longer than the
   first samples, and the arena panels were then empty).
3. Resolves the dashboard's variables as Grafana would ($instance and $device through
   their label_values() queries, multi-value "All" = a regex of every value;
   $__rate_interval = 4s, Grafana's value for a 1 s scrape interval) and runs every
   panel target through /api/v1/query: status success and a non-empty result with at
   least one finite value (while the demo still trains). Panels whose description
   starts with GPU_ONLY_MARK are filled only on GPU hosts with dcgm-exporter: their
   targets must succeed; the ones naming DCGM_FI_DEV_FB_USED are evaluated once more
   with a stand-in for it (series built from devmem_device_info's uuids, labelled as
   dcgm-exporter labels them), and must then be non-empty: the join works with the
   labels devmem really exports.
4. Every rule Prometheus loaded from alerts.yml (/api/v1/rules): health ok after its
   first evaluations, and its expression evaluated through /api/v1/query with success.
   A recording rule's expression and its recorded series must be non-empty. An alert's
   expression is legitimately empty while nothing is wrong, so each alert has a sibling
   expression in ALERT_SIBLINGS (the expression without its threshold) that must be
   non-empty; an alert without a sibling fails the test.
5. Stops both (SIGTERM, then SIGKILL after 5 s); prometheus must exit with status 0.
Missing prometheus fails the test with that reason (PROMETHEUS=path picks another
binary). Bounded: DEADLINE_S for the waits, plus at most 2 x 5 s to stop.
"""

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "dashboards", "devmem.json")
RULES = os.path.join(ROOT, "dashboards", "alerts.yml")
GPU_ONLY_MARK = "[GPU hosts only: needs dcgm-exporter]"
FINITE_WAIT_S = 15  # how long a NaN answer is asked again while the demo trains
RATE_INTERVAL = "4s"  # Grafana's $__rate_interval for a 1 s scrape interval: 4 x 1 s
RATE_INTERVAL_SAMPLES = 6  # samples per series before querying (rate() needs 2 in 4 s)
DEADLINE_S = 60.0
DEMO_ARGS = ["--serve", "127.0.0.1:0", "--epochs", "100000", "--linger", "120"]

# For each alert, its expression without the threshold: must be non-empty against the
# demo (proves the metric names, label matching and recording rules it builds on).
ALERT_SIBLINGS = {
    "DevmemOutOfMemory": "increase(devmem_ooms_total[5m])",
    "DevmemFragmentationHigh":
        "devmem_fragmentation_ratio and (devmem_cached_bytes - devmem_pending_bytes)",
    "DevmemReservedNearDeviceTotal": "devmem:reserved_over_device_total:ratio",
    "DevmemCloneBytesGrowing": "devmem:clone_bytes:rate5m",
}

# A stand-in for dcgm-exporter's DCGM_FI_DEV_FB_USED (MiB): one series per devmem GPU
# uuid, with the labels dcgm-exporter puts on it (UUID, gpu, device="nvidia0", its own
# instance and job), so that a join that matched on device or instance would come out
# empty.
DCGM_STANDIN = (
    'label_replace(label_replace(label_replace(label_replace(label_replace(label_replace('
    'max by (uuid) (devmem_device_info{uuid!=""}) * 4096, '
    '"UUID", "$1", "uuid", "(.+)"), "uuid", "", "", ""), '
    '"gpu", "0", "", ""), "device", "nvidia0", "", ""), '
    '"instance", "dcgm-exporter:9400", "", ""), "job", "dcgm", "", "")'
)


class Failure(Exception):
    pass


def deadline_left(start):
    return DEADLINE_S - (time.monotonic() - start)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def api(base, path, params=None, post=False):
    url = base + path
    data = None
    if params is not None and post:
        data = urllib.parse.urlencode(params).encode()
    elif params is not None:
        url += "?" + urllib.parse.urlencode(params, doseq=True)
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = json.loads(e.read() or b"{}")
    return body


def query(base, expr):
    body = api(base, "/api/v1/query", {"query": expr}, post=True)
    if body.get("status") != "success":
        raise Failure(f"query failed: {body.get('errorType')}: {body.get('error')}\n  {expr}")
    data = body["data"]
    if data["resultType"] == "vector":
        return data["result"]
    if data["resultType"] == "scalar":
        return [{"metric": {}, "value": data["result"]}]
    raise Failure(f"unexpected result type {data['resultType']} for {expr}")


def finite(result):
    return [r for r in result if math.isfinite(float(r["value"][1]))]


def wait_for(what, fn, start, step=0.25):
    last = None
    while deadline_left(start) > 0:
        try:
            value = fn()
            if value:
                return value
        except (OSError, ValueError, Failure) as e:  # not up yet
            last = e
        time.sleep(step)
    raise Failure(f"timed out waiting for {what}" + (f" (last error: {last})" if last else ""))


def regex_of(values):
    """Grafana's multi-value formatting for Prometheus: (v1|v2), regex-escaped; written
    into a PromQL double-quoted string, hence the doubled backslashes."""
    def esc(v):
        return "".join("\\\\" + c if c in r"\^$.|?*+()[]{}" else c for c in v)
    return "(" + "|".join(esc(v) for v in values) + ")"


def label_values(base, definition, variables):
    m = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", definition)
    if not m:
        raise Failure(f"variable query {definition!r} is not label_values(selector, label)")
    selector = substitute(m.group(1), variables)
    body = api(base, f"/api/v1/label/{m.group(2)}/values", {"match[]": selector})
    if body.get("status") != "success":
        raise Failure(f"label values for {definition!r}: {body.get('error')}")
    return body["data"]


def substitute(expr, variables):
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", variables[name]).replace("$" + name, variables[name])
    return expr


def stop(proc, name, log):
    if proc is None or proc.poll() is not None:
        return proc.returncode if proc is not None else None
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log(f"{name} did not stop within 5 s of SIGTERM: killing it")
        proc.kill()
        proc.wait(timeout=10)
        return None


def run(demo_path, tmp, start, log):
    prometheus = os.environ.get("PROMETHEUS") or shutil.which("prometheus") or "/usr/bin/prometheus"
    if not os.access(prometheus, os.X_OK):
        raise Failure(f"prometheus is not installed ({prometheus} not found; Debian package "
                      "`prometheus`, installed by scripts/setup.sh): this test needs it")
    if not os.access(demo_path, os.X_OK):
        raise Failure(f"{demo_path} is not an executable devmem-demo")
    with open(DASHBOARD, encoding="utf-8") as f:
        dashboard = json.load(f)

    procs = {}
    demo_log = os.path.join(tmp, "demo.log")
    prom_log = os.path.join(tmp, "prometheus.log")
    try:
        # 1. The demo, on an ephemeral loopback port.
        with open(demo_log, "wb") as out:
            procs["devmem-demo"] = subprocess.Popen([demo_path] + DEMO_ARGS, stdout=out,
                                                    stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL)

        def demo_port():
            if procs["devmem-demo"].poll() is not None:
                raise Failure(f"devmem-demo exited with {procs['devmem-demo'].returncode}")
            with open(demo_log, encoding="utf-8", errors="replace") as f:
                m = re.search(r"http://127\.0\.0\.1:(\d+)", f.read())
            return int(m.group(1)) if m else None
        try:
            port = wait_for("devmem-demo to print its port", demo_port, start)
        except Failure as e:
            if "exited" in str(e):
                raise
            raise Failure(f"{e}") from None
        target = f"127.0.0.1:{port}"
        status, body = http_get(f"http://{target}/metrics")
        if status != 200 or b"devmem_device_info" not in body:
            raise Failure(f"http://{target}/metrics: status {status}, no devmem_device_info")
        log(f"devmem-demo serves http://{target}/metrics")

        # 2. Prometheus.
        prom_port = free_port()
        base = f"http://127.0.0.1:{prom_port}"
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(
                "global:\n"
                "  scrape_interval: 1s\n"
                "  scrape_timeout: 1s\n"
                "  evaluation_interval: 1s\n"
                f"rule_files:\n  - {json.dumps(RULES)}\n"
                "scrape_configs:\n"
                "  - job_name: devmem\n"
                "    static_configs:\n"
                f"      - targets: [{json.dumps(target)}]\n")
        with open(prom_log, "wb") as out:
            procs["prometheus"] = subprocess.Popen(
                [prometheus, f"--config.file={config}",
                 f"--storage.tsdb.path={os.path.join(tmp, 'data')}",
                 f"--web.listen-address=127.0.0.1:{prom_port}",
                 "--web.console.templates=" + os.path.join(tmp, "consoles"),
                 "--web.console.libraries=" + os.path.join(tmp, "console_libraries")],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp)

        def ready():
            if procs["prometheus"].poll() is not None:
                raise SystemExit(f"prometheus exited with {procs['prometheus'].returncode}")
            return http_get(base + "/-/ready", timeout=2)[0] == 200
        try:
            wait_for("prometheus to be ready", ready, start)
        except SystemExit as e:
            raise Failure(str(e)) from None
        log(f"prometheus {prometheus} ready on {base}")

        def target_up():
            active = api(base, "/api/v1/targets", {"state": "active"})["data"]["activeTargets"]
            ups = [t for t in active if t["scrapeUrl"] == f"http://{target}/metrics"
                   and t["health"] == "up"]
            return ups
        wait_for(f"target {target} to be up", target_up, start)
        log(f"target {target} up")

        def enough_samples():
            r = query(base, f"count_over_time(devmem_device_info[1m])")
            return r and min(float(s["value"][1]) for s in r) >= RATE_INTERVAL_SAMPLES
        wait_for(f"{RATE_INTERVAL_SAMPLES} samples of every series", enough_samples, start)
        log(f"{RATE_INTERVAL_SAMPLES} scrapes stored ({time.monotonic() - start:.1f} s)")

        # The arena families have series once the demo's first step scope opened, after
        # its epoch through the pool alone.
        def arena_samples():
            r = query(base, "count_over_time(devmem_arena_scopes_total[1m])")
            return r and min(float(s["value"][1]) for s in r) >= RATE_INTERVAL_SAMPLES
        wait_for(f"{RATE_INTERVAL_SAMPLES} samples of the demo's step arena", arena_samples,
                 start)
        log(f"the step arena's series have {RATE_INTERVAL_SAMPLES} samples "
            f"({time.monotonic() - start:.1f} s)")

        # 3. The dashboard's variables, then its panels.
        problems = []
        variables = {"__rate_interval": RATE_INTERVAL, "datasource": "prometheus"}
        for var in dashboard["templating"]["list"]:
            if var["type"] != "query":
                continue
            definition = var.get("definition") or var["query"]["query"]
            values = label_values(base, definition, variables)
            if not values:
                raise Failure(f"variable {var['name']}: {definition} has no values")
            variables[var["name"]] = regex_of(values)
            log(f"${var['name']} = {variables[var['name']]}  ({definition})")

        def training():
            with open(demo_log, encoding="utf-8", errors="replace") as f:
                return "memory summary" not in f.read()

        checked = 0
        for panel in dashboard["panels"]:
            gpu_only = str(panel.get("description", "")).startswith(GPU_ONLY_MARK)
            for t in panel.get("targets", []):
                expr = substitute(t["expr"], variables)
                where = f"panel {panel['title']!r} target {t['refId']}"
                try:
                    result = query(base, expr)
                except Failure as e:
                    problems.append(f"{where}: {e}")
                    continue
                checked += 1
                uses_dcgm = "DCGM_FI_DEV_FB_USED" in expr
                if gpu_only and uses_dcgm:
                    standin = expr.replace("DCGM_FI_DEV_FB_USED", DCGM_STANDIN)
                    try:
                        result = query(base, standin)
                    except Failure as e:
                        problems.append(f"{where} (DCGM stand-in): {e}")
                        continue
                    note = "GPU hosts only; with a DCGM stand-in"
                else:
                    note = "GPU hosts only; devmem side" if gpu_only else ""
                # A ratio of rates over 4 s is 0/0 (NaN) whenever the demo allocated
                # nothing in those 4 s: a stall of the demo on a loaded machine (seen
                # with the load at 17 on 2 cores), not a broken panel. Asked again, for
                # up to FINITE_WAIT_S, before it counts as a problem.
                asked = standin if gpu_only and uses_dcgm else expr
                retry_until = time.monotonic() + FINITE_WAIT_S
                while (result and not finite(result) and training()
                       and time.monotonic() < retry_until and deadline_left(start) > 0):
                    time.sleep(0.5)
                    try:
                        result = query(base, asked)
                    except Failure:
                        break  # keep the last answer; it is judged below
                if not result:
                    problems.append(f"{where}: empty result{' (' + note + ')' if note else ''}\n"
                                    f"  {expr}")
                elif not finite(result) and training():
                    problems.append(f"{where}: no finite value while the demo trains: {result}")
                else:
                    log(f"ok {where}: {len(result)} series, e.g. "
                        f"{result[0]['metric']} = {result[0]['value'][1]}"
                        + (f" ({note})" if note else ""))
        if not training():
            log("note: the demo finished training before the panels were checked; finite "
                "values were not required")

        # 4. The rules Prometheus loaded from alerts.yml.
        def evaluated_rules():
            groups = api(base, "/api/v1/rules")["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            # lastEvaluation is Go's zero time (0001-01-01...) until the first one.
            if rules and all(not r.get("lastEvaluation", "0001").startswith("0001")
                             for r in rules):
                return rules
            return None
        rules = wait_for("every rule to be evaluated", evaluated_rules, start)
        alerts = set()
        for r in rules:
            where = f"{r['type']} rule {r['name']}"
            if r.get("health") != "ok":
                problems.append(f"{where}: health {r.get('health')}: {r.get('lastError')}")
            try:
                result = query(base, r["query"])
            except Failure as e:
                problems.append(f"{where}: {e}")
                continue
            checked += 1
            if r["type"] == "recording":
                recorded = query(base, r["name"])
                if not result or not recorded:
                    problems.append(f"{where}: empty (expression: {len(result)} series, "
                                    f"recorded: {len(recorded)})\n  {r['query']}")
                else:
                    log(f"ok {where}: {len(result)} series, recorded {len(recorded)}")
            else:
                alerts.add(r["name"])
                sibling = ALERT_SIBLINGS.get(r["name"])
                if sibling is None:
                    problems.append(f"{where}: no sibling expression in ALERT_SIBLINGS")
                    continue
                try:
                    sib = query(base, sibling)
                except Failure as e:
                    problems.append(f"{where} sibling: {e}")
                    continue
                checked += 1
                if not sib:
                    problems.append(f"{where}: sibling expression is empty\n  {sibling}")
                else:
                    log(f"ok {where}: {len(result)} series now ({r['state']}); sibling "
                        f"{sibling!r}: {len(sib)} series")
        for name in sorted(set(ALERT_SIBLINGS) - alerts):
            problems.append(f"ALERT_SIBLINGS names {name}, which alerts.yml does not define")
        if problems:
            raise Failure(f"{len(problems)} problem(s):\n" + "\n".join(problems))
        log(f"{checked} expressions checked")
    finally:
        # 5. Both down: prometheus first (it scrapes the demo).
        rc = stop(procs.get("prometheus"), "prometheus", log)
        stop(procs.get("devmem-demo"), "devmem-demo", log)
        if procs.get("prometheus") is not None and rc not in (0, None):
            log(f"prometheus exited with status {rc}")
        if sys.exc_info()[0] is not None or (procs.get("prometheus") is not None and rc != 0):
            for name, path in (("prometheus", prom_log), ("devmem-demo", demo_log)):
                if os.path.exists(path):
                    with open(path, encoding="utf-8", errors="replace") as f:
                        tail = f.read().splitlines()[-25:]
                    log(f"--- last lines of the {name} log:\n" + "\n".join(tail))
    if rc != 0:
        raise Failure(f"prometheus exited with status {rc} after SIGTERM (expected 0)")


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    start = time.monotonic()

    def log(msg):
        print(f"[{time.monotonic() - start:5.1f}s] {msg}", flush=True)

    with tempfile.TemporaryDirectory(prefix="devmem-dash-") as tmp:
        try:
            run(os.path.abspath(argv[1]), tmp, start, log)
        except Failure as e:
            log(f"FAIL: {e}")
            return 1
    log("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
