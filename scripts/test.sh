#!/usr/bin/env bash
# scripts/test.sh: sets up, builds and runs every test of devmem.
#
#   1. scripts/setup.sh (installs missing Debian packages)
#   2. build/      : optimized build with debug info; ctest runs every test
#   3. build-asan/ : the same tests under AddressSanitizer + UndefinedBehaviorSanitizer
#                    (without the CUDA backend: the CUDA runtime is not ASan-clean, and
#                    with no GPU its code paths are the same as in build/)
#   4. build-tsan/ : ThreadSanitizer, the concurrency tests only (the test files that
#                    start threads are the only ones built; ctest runs the tests in them
#                    that use threads: two-thread allocator storms, backend and site
#                    concurrency, tensor storage races, the trace ring's writers, the
#                    size histogram's per-thread shards, and
#                    the HTTP server, whose scrapes race a two-thread allocation storm)
#   5. build-fuzz/ : the libFuzzer targets of the parsers (tools/fuzz/: trace, config
#                    string, RMM and Umpire imports, timeline, snapshot), built with
#                    clang-16 and nothing else, each run for DEVMEM_FUZZ_SECONDS (10)
#                    seconds from the seeds in tools/fuzz/corpus/
# Exits non-zero on the first failure. DEVMEM_SKIP_ASAN=1 skips step 3,
# DEVMEM_SKIP_TSAN=1 step 4 and DEVMEM_SKIP_FUZZ=1 step 5 (for quick local iterations;
# CI sets none).
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
if [[ "${DEVMEM_SKIP_TSAN:-0}" != 1 ]]; then
  echo "== build (build-tsan/: ThreadSanitizer, concurrency tests)"
  # Only these test files are compiled (tests/CMakeLists.txt, DEVMEM_TEST_FILES).
  tsan_files='/(arena|caching_allocator_(random|fault|errors|recycle|unlocked_driver)|unlocked_driver_window|backend_conformance|site|thread_cache|tensor_(storage|live_buffers)|runtime_(trace|http|metrics)|flight_recorder)_test\.cc$'
  bash scripts/build.sh build-tsan -DDEVMEM_SANITIZE=thread -DDEVMEM_WITH_CUDA=OFF \
    -DDEVMEM_BUILD_TOOLS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DDEVMEM_TEST_FILES=${tsan_files}"
  echo "== tests (build-tsan/)"
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure -j "$(nproc)" \
    -R 'Arena|TwoThreads|Concurrent|Racing|AcrossThreads|PerThread|EachStreamHasItsOwnWorker|HttpServerTest|ExpandableRecycleTest|UnlockedDriver|FlightRecorderTest'
fi
if [[ "${DEVMEM_SKIP_FUZZ:-0}" != 1 ]]; then
  echo "== build (build-fuzz/: libFuzzer targets only)"
  CC=clang-16 CXX=clang++-16 cmake -S . -B build-fuzz -G Ninja -DDEVMEM_FUZZ=ON \
    -DDEVMEM_BUILD_TESTS=OFF -DDEVMEM_BUILD_TOOLS=OFF -DDEVMEM_WITH_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build-fuzz --target devmem_fuzzers
  echo "== fuzz (build-fuzz/, ${DEVMEM_FUZZ_SECONDS:-10} s per target)"
  for target in build-fuzz/bin/fuzz_*; do
    name=$(basename "$target")
    corpus=$(mktemp -d)  # new inputs go here; the committed seeds stay as they are
    echo "-- $name"
    status=0
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$target" \
      -max_total_time="${DEVMEM_FUZZ_SECONDS:-10}" -max_len=65536 -rss_limit_mb=4096 \
      -print_final_stats=1 "$corpus" "tools/fuzz/corpus/${name#fuzz_}" >"$corpus.log" 2>&1 ||
      status=$?
    if [[ $status -ne 0 ]]; then
      tail -60 "$corpus.log"
      echo "$name failed (exit status $status): the crashing input is in crash-* here"
      exit 1
    fi
    grep -E '^(Done|stat::number_of_executed_units)' "$corpus.log" || true
    rm -rf "$corpus" "$corpus.log"
  done
fi
echo "== all tests passed"
