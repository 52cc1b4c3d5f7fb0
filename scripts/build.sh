#!/usr/bin/env bash
# scripts/build.sh [BUILD_DIR] [cmake args...]: configures (once) and builds devmem.
# The default build directory is build/; executables land in BUILD_DIR/bin/.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
jobs=${DEVMEM_JOBS:-$(nproc)}
if [[ ! -f "$dir/build.ninja" ]]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
cmake --build "$dir" -j "$jobs"
