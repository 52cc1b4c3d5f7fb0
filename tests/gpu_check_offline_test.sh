#!/usr/bin/env bash
# tests/gpu_check_offline_test.sh LIBDEVMEM_SO: what of scripts/gpu-check.sh can run
# without a GPU (ctest gpu_check.offline, a few seconds):
#   * the script parses (bash -n), and its GPU half refuses to start without a bundle
#     (exit status 2, naming --prepare);
#   * its header's time figures are its own (the sum of the step bounds, the budget
#     that caps a run) and fit the device lease with room for a rerun;
#   * every tests/gpu/*.py parses;
#   * replay_bench.py replays a workload trace through devmem's C ABI on the simulated
#     device (the devmem column of the GPU table) and writes its JSON: pair times, peak
#     reserved within the replay target (<= 1.3 x peak requested), driver call counts;
#     the GPU-only allocators are skipped with a reason, not failed;
#   * torch_training_step.py skips cleanly where PyTorch or a GPU is missing.
set -euo pipefail
lib=$1
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

bash -n "$root/scripts/gpu-check.sh" || fail "scripts/gpu-check.sh does not parse"
# The GPU half with no bundle: a copy of the script in an empty tree.
mkdir -p "$tmp/tree/scripts"
cp "$root/scripts/gpu-check.sh" "$tmp/tree/scripts/"
set +e
msg=$(bash "$tmp/tree/scripts/gpu-check.sh" 2>&1)
rc=$?
set -e
[[ $rc -eq 2 && $msg == *--prepare* ]] || fail "without a bundle: exit $rc, '$msg'"

# The time the header promises is the script's: the header's sum of the step bounds is
# the table's, its budget the default, every step has a bound and every bound a step,
# and a machine start (about 3 minutes) plus two capped runs fit the 15-minute lease.
python3 - "$root/scripts/gpu-check.sh" <<'PY' || fail "scripts/gpu-check.sh's time figures"
import re, sys
src = open(sys.argv[1]).read()
start = src.index("declare -A bound=(")
table = {k: int(v) for k, v in
         re.findall(r"^\s*\[([a-z0-9-]+)\]=(\d+)", src[start:src.index("\n)\n", start)], re.M)}
used = set(re.findall(r"\bstart_step ([a-z0-9-]+)", src))
used |= set(re.findall(r"^run_(?:tensor|demo|framework) ([a-z0-9-]+)\.log", src, re.M))
used |= set(re.findall(r"^run_ipc_peer ([a-z0-9-]+)$", src, re.M))
assert used == set(table), f"steps without a bound: {used - set(table)}, bounds without a step: {set(table) - used}"
header = " ".join(re.sub(r"^#", "", src[:src.index("set -uo pipefail")], flags=re.M).split())
said = int(re.search(r"table `bound` below, (\d+) s in all", header).group(1))
assert said == sum(table.values()), f"the header says {said} s, the bounds sum to {sum(table.values())} s"
budget = int(re.search(r"budget=\$\{GPU_CHECK_BUDGET_S:-(\d+)\}", src).group(1))
said_budget = int(re.search(r"GPU_CHECK_BUDGET_S \(default (\d+) s", header).group(1))
assert said_budget == budget, f"the header's budget {said_budget} s, the script's {budget} s"
assert 180 + 2 * budget <= 900, f"a start and two runs of {budget} s do not fit 15 minutes"
print(f"gpu-check: {len(table)} steps, bounds {sum(table.values())} s, budget {budget} s")
PY

python3 - "$root"/tests/gpu/*.py <<'PY' || fail "a tests/gpu script does not parse"
import ast, sys
for path in sys.argv[1:]:
    with open(path) as f:
        ast.parse(f.read(), path)
PY

DEVMEM_CONF=backend:sim python3 "$root/tests/gpu/replay_bench.py" --lib "$lib" \
  --allocators devmem,torch,async,malloc --json "$tmp/bench.json" \
  "$root/tests/data/traces/training_loop.jsonl" >"$tmp/table.txt" ||
  { cat "$tmp/table.txt"; fail "replay_bench.py failed"; }
cat "$tmp/table.txt"
python3 - "$tmp/bench.json" <<'PY' || fail "replay_bench.py's JSON"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["schema"] == "devmem.replay_bench/1", doc["schema"]
by = {r["allocator"]: r for r in doc["results"]}
d = by["devmem"]
assert "skipped" not in d and "failed" not in d, d
assert d["device"] == "sim:0", d["device"]
assert d["pairs"] > 1000 and 0 < d["pair_ns_p50"] <= d["pair_ns_p99"], d
assert d["peak_requested_bytes"] <= d["peak_reserved_bytes"] <= 1.3 * d["peak_requested_bytes"], d
calls = d["driver_calls"]
assert calls["num_device_alloc"] >= 1 and calls["cache_hits"] > calls["cache_misses"], calls
for name in ("torch", "async", "malloc"):
    r = by[name]
    assert "failed" not in r, r
    if "skipped" in r:
        assert r["skipped"], r
PY

out=$(python3 "$root/tests/gpu/torch_training_step.py" "$lib")
case $out in
  SKIP:* | *ok:*) ;;
  *) fail "torch_training_step.py: $out" ;;
esac
echo "ok"
