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
#                    size histogram's per-thread shards, the tests' backend hooks
#                    (a clear waits for a call in flight on another thread), and
#                    the HTTP server, whose scrapes race a two-thread allocation storm)
#   5. build-fuzz/ : the libFuzzer targets of the parsers (tools/fuzz/: trace, config
#                    string, RMM and Umpire imports, timeline, snapshot), built with
#                    clang-16 and nothing else, each run for DEVMEM_FUZZ_SECONDS (10)
#                    seconds from the seeds in tools/fuzz/corpus/, one per core at once
# Exits non-zero on the first failure. DEVMEM_SKIP_ASAN=1 skips step 3,
# DEVMEM_SKIP_TSAN=1 step 4 and DEVMEM_SKIP_FUZZ=1 step 5 (for quick local iterations;
# CI sets none).
#
# Time: each stage's line is followed by what it took ("-- 3 min 05 s: build
# (build-asan/)"), and the end (or a failure) prints every stage's time and the total,
# so a slow CI run says where its time went. Every build goes through ccache: one cache
# (ccache's default directory, ~/.cache/ccache, unless CCACHE_DIR says otherwise) with
# paths relative to the checkout (scripts/build.sh), so a second clone hits it. A hang
# fails a sanitizer stage within 3 minutes, naming the test (DEVMEM_TEST_TIMEOUT in
# tests/CMakeLists.txt; --timeout here for the tests outside devmem_tests).
# DEVMEM_JOBS (default: the core count) is the build and ctest parallelism.
set -euo pipefail
cd "$(dirname "$0")/.."
# For every ccache call, the builds' (scripts/build.sh) and those of tests that build
# (consumer.subdir compiles the libraries again beside build/ and finds the main
# build's objects only with the same relative paths: without these it compiled them
# cold, past its timeout on a loaded machine).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
jobs=${DEVMEM_JOBS:-$(nproc)}
sanitizer_timeout=180  # seconds; the slowest TSan test takes about 32 s on 2 cores
# The sanitizer and fuzz builds' compile flags: line tables only (-g1: a report still
# names each frame's function, file and line), and -O1 for ASan+UBSan, the level ASan
# is made for. Measured against RelWithDebInfo's -O2 -g: under ASan+UBSan (-O1 -g1)
# allocator/arena.cc compiles in 40% less CPU time and tests/arena_test.cc in 60% less;
# under TSan (-g1) arena.cc in 23% less, in clang-16's fuzz build 10% less. The ASan
# build was over half of a fresh clone's CI time (17.6 of 31.6 min). The same tests run.
asan_flags='-O1 -g1 -DNDEBUG'
line_tables_flags='-O2 -g1 -DNDEBUG'

# stage NAME: ends the stage that is running (printing its time) and starts NAME.
stage_name=""
stage_start=$SECONDS
run_start=$SECONDS
stage_times=()
stage() {
  local now=$SECONDS
  if [[ -n $stage_name ]]; then
    local took=$((now - stage_start))
    stage_times+=("$(printf '%3d min %02d s  %s' $((took / 60)) $((took % 60)) "$stage_name")")
    echo "-- $((took / 60)) min $(printf %02d $((took % 60))) s: $stage_name"
  fi
  stage_name=$1
  stage_start=$now
  [[ -n $1 ]] && echo "== $1"
  return 0
}
# At the end, or at the first failure: every stage's time, then the total.
summary() {
  local status=$?
  stage ""
  local total=$((SECONDS - run_start))
  echo "== time per stage$([[ $status -ne 0 ]] && echo " (stopped by a failure, exit status $status)"):"
  printf '%s\n' "${stage_times[@]}"
  printf '%3d min %02d s  total\n' $((total / 60)) $((total % 60))
}
trap summary EXIT

stage "setup (scripts/setup.sh)"
bash scripts/setup.sh

stage "build (build/)"
bash scripts/build.sh build
stage "tests (build/)"
ctest --test-dir build --output-on-failure -j "$jobs"

if [[ "${DEVMEM_SKIP_ASAN:-0}" != 1 ]]; then
  stage "build (build-asan/: AddressSanitizer + UndefinedBehaviorSanitizer)"
  # Everything: ctest runs every test registered here (the C API's too).
  bash scripts/build.sh build-asan -DDEVMEM_SANITIZE=address,undefined \
    -DDEVMEM_WITH_CUDA=OFF -DDEVMEM_BUILD_TOOLS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$asan_flags" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$asan_flags"
  stage "tests (build-asan/)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$jobs" --timeout "$sanitizer_timeout"
fi
if [[ "${DEVMEM_SKIP_TSAN:-0}" != 1 ]]; then
  stage "build (build-tsan/: ThreadSanitizer, concurrency tests)"
  # Only these test files are compiled (tests/CMakeLists.txt, DEVMEM_TEST_FILES), and
  # only devmem_tests is built: every test the -R below picks is one of its (the C
  # API's library and test program, and the flight recorder's child, run nothing here).
  tsan_files='/(arena|caching_allocator_(random|fault|errors|recycle|unlocked_driver)|unlocked_driver_window|backend_conformance|site|thread_cache|tensor_(storage|live_buffers)|runtime_(trace|http|metrics)|trace_clock|flight_recorder|hooked_backend)_test\.cc$'
  DEVMEM_BUILD_TARGETS=devmem_tests \
    bash scripts/build.sh build-tsan -DDEVMEM_SANITIZE=thread -DDEVMEM_WITH_CUDA=OFF \
    -DDEVMEM_BUILD_TOOLS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$line_tables_flags" \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$line_tables_flags" \
    "-DDEVMEM_TEST_FILES=${tsan_files}"
  stage "tests (build-tsan/)"
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout "$sanitizer_timeout" \
    -R 'Arena|TwoThreads|Concurrent|Racing|AcrossThreads|PerThread|EachStreamHasItsOwnWorker|HttpServerTest|ExpandableRecycleTest|UnlockedDriver|FlightRecorderTest|HookGuardTest'
fi
if [[ "${DEVMEM_SKIP_FUZZ:-0}" != 1 ]]; then
  stage "build (build-fuzz/: libFuzzer targets only)"
  # Through ccache as the other builds (scripts/build.sh), and with the same job count.
  fuzz_launcher=()
  if command -v ccache >/dev/null; then
    export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
    fuzz_launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  fi
  CC=clang-16 CXX=clang++-16 cmake -S . -B build-fuzz -G Ninja -DDEVMEM_FUZZ=ON \
    -DDEVMEM_BUILD_TESTS=OFF -DDEVMEM_BUILD_TOOLS=OFF -DDEVMEM_WITH_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "${fuzz_launcher[@]}" \
    "-DCMAKE_C_FLAGS_RELWITHDEBINFO=$line_tables_flags" \
    "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=$line_tables_flags" \
    >/dev/null
  cmake --build build-fuzz -j "$jobs" --target devmem_fuzzers
  stage "fuzz (build-fuzz/, ${DEVMEM_FUZZ_SECONDS:-10} s per target, $jobs at a time)"
  # Each target is one process on one core for its DEVMEM_FUZZ_SECONDS of wall time, so
  # running $jobs at once gives each the runs it had alone, in 1/$jobs of the time.
  # fuzz NAME: runs build-fuzz/bin/NAME; its log is build-fuzz/NAME.log, a crashing
  # input build-fuzz/NAME-crash-*.
  fuzz() {
    local name=$1 corpus
    corpus=$(mktemp -d)  # new inputs go here; the committed seeds stay as they are
    local status=0
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "build-fuzz/bin/$name" \
      -max_total_time="${DEVMEM_FUZZ_SECONDS:-10}" -max_len=65536 -rss_limit_mb=4096 \
      -print_final_stats=1 -artifact_prefix="build-fuzz/$name-" \
      "$corpus" "tools/fuzz/corpus/${name#fuzz_}" >"build-fuzz/$name.log" 2>&1 || status=$?
    rm -rf "$corpus"
    return $status
  }
  names=()
  for target in build-fuzz/bin/fuzz_*; do names+=("$(basename "$target")"); done
  for ((i = 0; i < ${#names[@]}; i += jobs)); do
    batch=("${names[@]:i:jobs}")
    pids=()
    for name in "${batch[@]}"; do
      fuzz "$name" &
      pids+=($!)
    done
    failed=()
    for k in "${!batch[@]}"; do
      status=0
      wait "${pids[$k]}" || status=$?
      name=${batch[$k]}
      echo "-- $name"
      if [[ $status -ne 0 ]]; then
        tail -60 "build-fuzz/$name.log"
        echo "$name failed (exit status $status): the crashing input is build-fuzz/$name-crash-*"
        failed+=("$name")
      else
        grep -E '^(Done|stat::number_of_executed_units)' "build-fuzz/$name.log" || true
      fi
    done
    [[ ${#failed[@]} -eq 0 ]] || exit 1
  done
fi
stage ""
echo "== all tests passed"
