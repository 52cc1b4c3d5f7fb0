#!/usr/bin/env bash
# scripts/demo.sh: sets up, builds and runs the demo workload (build/bin/devmem-demo)
# on the default device: a GPU when there is one, else the simulated device.
# Arguments are passed to devmem-demo (see devmem-demo --help). Without any, the demo
# also writes its snapshot and event trace to build/demo-snapshot.json and
# build/demo-trace.jsonl (docs/formats.md), for memtrace and for reading.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build >/dev/null
if [[ $# -eq 0 ]]; then
  set -- --snapshot build/demo-snapshot.json --trace build/demo-trace.jsonl
fi
exec build/bin/devmem-demo "$@"
