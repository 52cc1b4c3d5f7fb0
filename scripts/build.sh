#!/usr/bin/env bash
# scripts/build.sh [BUILD_DIR] [cmake args...]: configures and builds devmem.
# BUILD_DIR is configured when it is new, and again when the cmake args differ from
# the ones it was last given here (kept in BUILD_DIR/.build-args): scripts/test.sh's
# settings for its sanitizer builds reach a directory an earlier run made, too.
# The default build directory is build/; executables land in BUILD_DIR/bin/.
# DEVMEM_BUILD_TARGETS="a b" builds only those targets (scripts/demo.sh builds the demo
# first that way).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
jobs=${DEVMEM_JOBS:-$(nproc)}
# ccache (installed by setup.sh) makes a rebuild in a fresh clone, a second build
# directory or a worktree cost seconds: BASEDIR and NOHASHDIR key objects by paths
# relative to the build directory, so two checkouts share the cache. Sites are named
# relative to the repository (-ffile-prefix-map), so cached objects are identical.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
if [[ ! -f "$dir/build.ninja" ]]; then
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" "$@"
  printf '%s\n' "$@" >"$dir/.build-args"
elif [[ $# -gt 0 && "$(printf '%s\n' "$@")" != "$(cat "$dir/.build-args" 2>/dev/null)" ]]; then
  cmake -S . -B "$dir" "${launcher[@]}" "$@" >/dev/null
  printf '%s\n' "$@" >"$dir/.build-args"
fi
targets=()
for t in ${DEVMEM_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$dir" -j "$jobs" "${targets[@]}"
