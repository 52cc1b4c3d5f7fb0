#!/usr/bin/env bash
# tools/memtrace/bench_memtrace.sh: how fast memtrace reads big traces (the target: a
# 10^7-event trace in <= 10 s for replay and timeline).
#
#   tools/memtrace/bench_memtrace.sh [MEMTRACE] [EVENTS]     (defaults: build/bin/memtrace, 10^7)
#
# Generates a trace of EVENTS events (a devmem trace: header, then alloc/free lines with
# the fields the runtime writes; a seeded mix of sizes from 512 B to 64 MiB with up to
# 4096 allocations live, so the replay exercises splitting and caching), then times
#   memtrace replay TRACE --json      reading + one replay (prints ns_per_op: the
#                                     replay alone, so reading = total - ops * ns_per_op)
#   memtrace timeline TRACE -o x.svg  reading + a replay for reserved bytes + drawing
# and prints one line per command: wall seconds and peak resident memory. The trace
# goes to a temporary folder (about 1.4 GB for 10^7 events), removed at the end.
set -euo pipefail
cd "$(dirname "$0")/../.."
memtrace=${1:-build/bin/memtrace}
events=${2:-10000000}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

echo "== generating $events events"
start=$(date +%s.%N)
python3 - "$events" > "$dir/big.jsonl" <<'PY'
import random, sys
n = int(sys.argv[1])
rng = random.Random(7)
out = sys.stdout
out.write('{"schema":"devmem.trace/1","sites":[{"id":1,"file":"bench.py","line":1,"function":"f","tag":"bench","kind":"alloc"}]}\n')
live, next_addr, lines = [], 1 << 40, []
sizes = [512 << rng.randrange(18) for _ in range(1024)]  # 512 B .. 64 MiB
for seq in range(1, n + 1):
    if live and (len(live) >= 4096 or rng.random() < 0.5):
        i = rng.randrange(len(live))
        live[i], live[-1] = live[-1], live[i]
        addr, size = live.pop()
        action = "free"
    else:
        addr, size = next_addr, sizes[rng.randrange(1024)] + rng.randrange(512)
        next_addr += 1 << 27
        live.append((addr, size))
        action = "alloc"
    lines.append('{"seq":%d,"time_ns":%d,"action":"%s","device":"sim:0","stream":0,'
                 '"addr":%d,"size":%d,"requested":%d,"site":1,"thread":1}\n'
                 % (seq, seq * 100, action, addr, size, size))
    if len(lines) == 100000:
        out.write("".join(lines))
        lines.clear()
out.write("".join(lines))
PY
end=$(date +%s.%N)
printf 'generated %s (%s bytes) in %.1f s\n' "$dir/big.jsonl" "$(stat -c %s "$dir/big.jsonl")" \
  "$(echo "$end - $start" | bc)"

run() {
  local name=$1
  shift
  /usr/bin/time -f "%e %M" -o "$dir/time" "$@" > "$dir/out" 2>&1 || { cat "$dir/out"; exit 1; }
  read -r secs kib < "$dir/time"
  printf '%-10s %6.2f s wall, %6d MiB peak RSS\n' "$name" "$secs" $((kib / 1024))
  cat "$dir/out"
}
run replay "$memtrace" replay "$dir/big.jsonl" --json
run timeline "$memtrace" timeline "$dir/big.jsonl" -o "$dir/big.svg" --json
