#!/usr/bin/env bash
# scripts/demo.sh: sets up, builds and runs the demo workload (build/bin/devmem-demo)
# on the default device: a GPU when there is one, else the simulated device.
# Arguments are passed to devmem-demo (see devmem-demo --help). Without any, the demo
# also writes its snapshot and event trace to build/demo-snapshot.json and
# build/demo-trace.jsonl (docs/formats.md), for memtrace and for reading, and the
# script ends with the memtrace commands to try on them.
#
# Order: what the demo needs (devmem-demo, memtrace) is built first, with the build's
# own progress lines, so that the demo runs minutes earlier on a fresh clone; the rest
# (tests, bench, libdevmem.so) is built after it. DEVMEM_DEMO_ONLY=1 skips the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n== demo.sh: %s\n' "$*" >&2; }
step "checking the packages devmem needs (scripts/setup.sh)"
bash scripts/setup.sh
step "building devmem-demo and memtrace first (build/)"
DEVMEM_BUILD_TARGETS="devmem-demo memtrace" bash scripts/build.sh build
defaults=0
if [[ $# -eq 0 ]]; then
  defaults=1
  set -- --snapshot build/demo-snapshot.json --trace build/demo-trace.jsonl
fi
step "running build/bin/devmem-demo $*"
build/bin/devmem-demo "$@"
if [[ ${DEVMEM_DEMO_ONLY:-0} != 1 ]]; then
  step "building the rest (tests, bench, libdevmem.so); DEVMEM_DEMO_ONLY=1 skips this"
  if ! bash scripts/build.sh build; then
    echo "demo.sh: the rest of the build failed (above); the demo itself ran" >&2
  fi
fi
if [[ $defaults -eq 1 ]]; then
  cat <<'NEXT'

Next, on the files the demo wrote:
  build/bin/memtrace buffers build/demo-snapshot.json          # who holds the memory, by site
  build/bin/memtrace buffers build/demo-snapshot.json --list   # one row per buffer
  build/bin/memtrace timeline build/demo-trace.jsonl -o build/demo-timeline.html
  build/bin/memtrace replay build/demo-trace.jsonl --min-capacity   # the smallest device it fits on
  build/bin/memtrace replay build/demo-trace.jsonl --conf expandable_segments:false
  build/bin/memtrace export --to pytorch-snapshot build/demo-snapshot.json -o build/demo.pickle
                                                               # for pytorch.org/memory_viz
NEXT
fi
