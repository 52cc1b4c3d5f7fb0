#!/usr/bin/env bash
# Rewrites golden/*.txt: memtrace's output on the fixtures beside this script (made by
# generate.py). Review the diff by hand before keeping it.
#   tests/data/snapshots/update_golden.sh build/bin/memtrace
set -euo pipefail
memtrace=$(realpath "$1")
cd "$(dirname "$0")"
# name | arguments (run from this folder, so paths in the output are relative)
while IFS='|' read -r name args; do
  [ -z "$name" ] && continue
  # shellcheck disable=SC2086
  "$memtrace" $args > "golden/$name.txt" || [ $? -eq 1 ]
done < golden/cases.txt
