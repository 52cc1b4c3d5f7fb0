#!/usr/bin/env bash
# Times snapshots at their target sizes:
# - served live: devmem-bench-snapshot fills sim:0 with 10^5 live buffers and 10^5 trace
#   entries, GETs /debug/snapshot over loopback HTTP and prints the median served time
#   (target <= 50 ms) with the server's and the client's CPU time per GET (the
#   load-independent figures: wall time on a loaded machine is mostly waiting for a
#   core), and the longest device-lock hold (target <= 1 ms), in wall and CPU time;
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
if [ -x "$served" ]; then
  "$served"
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
