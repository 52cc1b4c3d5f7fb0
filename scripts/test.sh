#!/usr/bin/env bash
# scripts/test.sh: sets up, builds and runs every test of devmem.
#
#   1. scripts/setup.sh (installs missing Debian packages)
#   2. build/      : optimized build with debug info; ctest runs every test
#   3. build-asan/ : the same tests under AddressSanitizer + UndefinedBehaviorSanitizer
#                    (without the CUDA backend: the CUDA runtime is not ASan-clean, and
#                    with no GPU its code paths are the same as in build/)
# Exits non-zero on the first failure. DEVMEM_SKIP_ASAN=1 skips step 3 (for quick
# local iterations; CI never sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

echo "== build (build/)"
bash scripts/build.sh build
echo "== tests (build/)"
ctest --test-dir build --output-on-failure -j "$(nproc)"

if [[ "${DEVMEM_SKIP_ASAN:-0}" != 1 ]]; then
  echo "== build (build-asan/: AddressSanitizer + UndefinedBehaviorSanitizer)"
  bash scripts/build.sh build-asan -DDEVMEM_SANITIZE=address,undefined \
    -DDEVMEM_WITH_CUDA=OFF -DDEVMEM_BUILD_TOOLS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
  echo "== tests (build-asan/)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$(nproc)"
fi
echo "== all tests passed"
