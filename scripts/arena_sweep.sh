#!/usr/bin/env bash
# scripts/arena_sweep.sh: the measurements behind the scoped arenas' default chunk size
# (allocator/arena.h kDefaultArenaChunkSize; the table is in docs/architecture.md,
# "Scoped step arenas"). Needs build/bin/devmem-bench and build/bin/devmem-demo.
#   1. devmem-bench --arena-sweep: per chunk size, arena_pair_ns and arena_step_ns
#      beside the pool's, and the bench step's fragmentation (peak reserved / peak
#      requested) with and without scopes.
#   2. devmem-demo per chunk size, at its default size and at --batch 512 --width 1024:
#      the demo step's fragmentation with and without the arena.
set -euo pipefail
cd "$(dirname "$0")/.."
build/bin/devmem-bench --arena-sweep
printf '\n%-10s %-22s %s\n' "chunk" "demo" "fragmentation (peak reserved / peak requested)"
for chunk in 64KiB 256KiB 1MiB 4MiB 16MiB 64MiB; do
  for size in "" "--batch 512 --width 1024"; do
    # shellcheck disable=SC2086
    line=$(build/bin/devmem-demo --epochs 1 --arena-chunk-size "$chunk" $size 2>&1 |
           sed -n 's/^fragmentation (peak reserved \/ peak requested \(.*\)): \(.*\)$/\2 (requested \1)/p')
    printf '%-10s %-22s %s\n' "$chunk" "${size:-default}" "$line"
  done
done
