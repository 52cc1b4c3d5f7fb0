#!/usr/bin/env bash
# Times snapshots at their target sizes:
# - served live: devmem-bench-snapshot fills sim:0 with 10^5 live buffers and 10^5 trace
#   entries, GETs /debug/snapshot over loopback HTTP and prints the median served time
#   (target <= 50 ms) with the server's and the client's CPU time per GET (the
#   load-independent figures: wall time on a loaded machine is mostly waiting for a
#   core), and the device-lock hold (target <= 1 ms), median and longest, in wall and
#   CPU time; then it runs it $SNAPSHOT_RUNS more times (default 5) with --gets 7 --json
#   and prints both figures over the runs: the served time (median GET of each run) and
#   the hold (median, longest, and how many of all the holds were over 1 ms), under
#   `chrt -f 1` where allowed (a hold is then not preempted: its wall time is its own);
# - read back: memtrace's readers on a snapshot with 10^6 live buffers (`buffers` and
#   `diff` in <= 2 s each): generates two snapshots (tests/data/snapshots/generate.py
#   --big; the second with a few sites grown), then prints the wall time of `memtrace
#   buffers`, `buffers --list`, and `diff`.
#   scripts/bench_snapshot.sh [MEMTRACE] [N]     defaults: build/bin/memtrace, 1000000
# (devmem-bench-snapshot is looked for beside MEMTRACE; without it that part is skipped.)
# Timing is reported, not asserted: machines differ, and the tests stay deterministic.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
memtrace=${1:-$here/build/bin/memtrace}
n=${2:-1000000}
served=$(dirname "$memtrace")/devmem-bench-snapshot
runs=${SNAPSHOT_RUNS:-5}
if [ -x "$served" ]; then
  rt=()
  if chrt -f 1 true 2>/dev/null; then rt=(chrt -f 1); fi
  "${rt[@]}" "$served"
  echo "$runs runs of --gets 7${rt:+ under chrt -f 1}:"
  for _ in $(seq "$runs"); do "${rt[@]}" "$served" --gets 7 --json 2>/dev/null; done |
    python3 -c '
import json, sys
runs = [json.loads(line) for line in sys.stdin if line.startswith("{")]
if not runs:
    sys.exit("devmem-bench-snapshot --json printed nothing")
served = [r["served_ms"] for r in runs]
median = [r["lock_hold_median_ms"] for r in runs]
longest = [r["lock_hold_ms"] for r in runs]
holds = [h for r in runs for h in r["lock_holds_ms"]]
faults = max(r["lock_hold_faults"] for r in runs)
span = lambda v, f: (f % min(v)) + " .. " + (f % max(v))
print("  served (median GET)      %s ms   target <= 50 ms" % span(served, "%.1f"))
print("  lock held, median        %s ms" % span(median, "%.3f"))
print("  lock held, longest       %s ms   target <= 1 ms" % span(longest, "%.3f"))
print("  holds over 1 ms          %d of %d (page faults in a hold: at most %d)"
      % (sum(h > 1 for h in holds), len(holds), faults))
'
else
  echo "($served not built: the served snapshot is not timed)"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 "$here/tests/data/snapshots/generate.py" --big "$n" "$tmp/a.json"
python3 "$here/tests/data/snapshots/generate.py" --big "$n" "$tmp/b.json" --grow
echo "snapshots: $n live buffers, $(du -m "$tmp/a.json" | cut -f1) MiB and $(du -m "$tmp/b.json" | cut -f1) MiB"
# time_it LABEL CMD...: prints LABEL and the seconds CMD took (its output discarded).
time_it() {
  local label=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  "$@" > /dev/null || [ $? -eq 1 ]
  t1=$(date +%s.%N)
  printf '%-28s %6.2f s\n' "$label" "$(echo "$t1 - $t0" | bc)"
}
time_it "buffers (by site)" "$memtrace" buffers "$tmp/a.json"
time_it "buffers --list --top 20" "$memtrace" buffers "$tmp/a.json" --list
time_it "buffers --json" "$memtrace" buffers "$tmp/a.json" --json
time_it "diff a b" "$memtrace" diff "$tmp/a.json" "$tmp/b.json"
echo "target: <= 2 s each for buffers and diff"
