#!/usr/bin/env bash
# scripts/demo.sh: sets up, builds and runs the demo workload (build/bin/devmem-demo)
# on the default device: a GPU when there is one, else the simulated device.
# Arguments are passed to devmem-demo (see devmem-demo --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build >/dev/null
exec build/bin/devmem-demo "$@"
