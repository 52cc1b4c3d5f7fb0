#!/usr/bin/env bash
# scripts/gpu-check.sh: the one check a session runs on a borrowed GPU machine.
#
# The GPU machine (an H200 with the CUDA driver, PyTorch and CuPy, but none of the
# Debian packages devmem builds against, and no network) cannot build devmem. So the
# work is split in two:
#
#   scripts/gpu-check.sh --prepare [BUILD_DIR]
#       HERE, on a development machine (scripts/setup.sh done, CUDA toolkit in
#       /usr/local/cuda). Configures BUILD_DIR (default build-cuda/, configured as
#       scripts/build.sh does: Ninja, RelWithDebInfo) if it is not yet, builds
#       devmem_tests, devmem-demo and devmem_ipc_peer_check, and writes a self-contained
#       bundle to build-gpu/ (ignored by .gitignore's /build-*/): bin/ (the three
#       executables, debug info stripped), lib/ (libdevmem.so, its SONAME in
#       libdevmem.soname, and every shared library they load except glibc's, found with
#       ldd: abseil, jemalloc, prometheus-cpp, civetweb, simdjson, curl, libstdc++...),
#       glibc/ (glibc and its loader, used only if the GPU machine's glibc is too old
#       for the binaries) and MANIFEST.txt. libcuda is never bundled: the binaries do
#       not link it, the CUDA runtime (linked statically) loads the machine's own.
#
#   scripts/gpu-check.sh
#       THERE, from the repository root, with build-gpu/ carried along: through the
#       device tool, `run` with carry ["build-gpu"] and command
#       `bash scripts/gpu-check.sh` (timeout_s 330: the budget below and the copy of
#       the logs; a machine without a GPU is done in seconds).
#       Time: the device lease is 15 minutes for every try together, the machine's
#       start (minutes) included, so one run must leave room for a second. The whole
#       run is capped at GPU_CHECK_BUDGET_S (default 300 s: a start and two capped runs
#       take about 13 of the 15 minutes): each step's timeout is its own bound (the
#       table `bound` below, 925 s in all: each at least 30 s and 3x the step's expected
#       time) or what is left of the budget, whichever is less, and a step reached with under 10 s
#       left is not run and fails the check, by name. Expected on an H200 machine:
#       about 190 s in all (estimates from the CPU-side cost of each step measured on
#       a development machine plus CUDA and PyTorch start-up; no GPU run has timed it
#       yet: summary.txt's `times:` line does, per step). Should a GPU run come near
#       the budget, trim first replay-bench (one trace instead of two),
#       tensor-cuda-nocublas and demo-cuda-expandable.
#       Steps, each logged under $OUT (build-gpu/out/ when OUT is unset):
#         nvidia-smi.txt            nvidia-smi and the machine (glibc, libcuda found)
#         gtest-cuda.log / .xml     devmem_tests --gtest_filter=
#                                   AllBackends/BackendConformanceTest.*:BackendFactoryTest.*
#                                   (the conformance suite on cpu, sim and cuda:
#                                   segments, streams, events, and the VirtualMemory* and
#                                   ExpandableSegments* cases on the GPU's VMM)
#         policy-cuda.log / .xml    DEVMEM_TEST_BACKEND=cuda devmem_tests with the
#                                   allocator policy suite's filter
#                                   (tests/caching_allocator_policy_test.cc: its
#                                   allocators on cuda:0, each test's sim_capacity its
#                                   memory limit, tests/test_backend.h; the sim-specific
#                                   cases skip, saying why)
#         tensor-cuda.log / .xml    devmem_tests --gtest_filter=TensorCudaTest.*: every
#                                   tensor op on cuda:0 against the host kernels within
#                                   the bounds of cuda/cuda_kernels.cc, and the training
#                                   loop on cuda:0 against sim (cuBLAS from PyTorch's
#                                   wheel when found: DEVMEM_CUBLAS_LIBRARY)
#         tensor-cuda-nocublas.log  the matmul and loop cases again with
#                                   DEVMEM_CUBLAS_LIBRARY=none (devmem's own matmul kernel)
#         demo-cuda.log             DEVMEM_CONF=backend:cuda devmem-demo --epochs 2
#         demo-cuda-expandable.log  DEVMEM_CONF=backend:cuda,expandable_segments:true
#         demo-sim.log              DEVMEM_CONF=backend:sim devmem-demo --epochs 2: every
#                                   epoch's loss of both cuda runs must be within 1e-4 of
#                                   it (the printed losses have 5 decimals; float32
#                                   cuBLAS sums vs double sums differ by about 1e-6)
#         torch.log, cupy.log       tests/gpu/torch_pluggable.py and cupy_allocator.py:
#                                   PyTorch and CuPy allocating through the bundle's
#                                   libdevmem.so (each skips when its framework is
#                                   missing)
#         torch-package.log         tests/gpu/torch_package.py: the Python package
#                                   (python/devmem) with devmem.torch.use(), its
#                                   torch.cuda-style stats, tags, snapshot, resets,
#                                   and Tensor.record_stream reaching devmem (hook or
#                                   wrapper): no early reuse under a busy side stream
#         torch-step.log            tests/gpu/torch_training_step.py: a small CNN trained
#                                   8 steps (fixed seed, deterministic algorithms) with
#                                   PyTorch's allocator and with devmem as
#                                   CUDAPluggableAllocator: every loss bit-for-bit equal
#         torch-graphs.log          tests/gpu/torch_graphs.py: torch.cuda.graph captures
#                                   and replays a graph with devmem as the allocator
#                                   (its private pool: output equal to eager, eager
#                                   tensors untouched by replays, the pool given back)
#         peer.log                  tests/gpu/ipc_peer_check.c's `peer`: device 1 copies
#                                   (cudaMemcpyPeer) into and out of expandable blocks of
#                                   device 0 allocated before and after
#                                   devmem_enable_peer_access (SKIP, with the reason,
#                                   below two devices or without peer access)
#         ipc.log                   its `ipc`: one process exports an expandable block of
#                                   three granules (devmem_ipc_export, the descriptors
#                                   by SCM_RIGHTS), another imports it; each reads the
#                                   other's bytes (SKIP where the driver has no POSIX
#                                   file-descriptor handles). ctest
#                                   fake_cuda.ipc_peer_check.* runs both on the fake
#         replay-bench.log / .json  tests/gpu/replay_bench.py: tests/data/traces/
#                                   training_loop.jsonl and real/resnet18_train.jsonl.gz
#                                   replayed through devmem's C ABI, PyTorch's
#                                   caching_allocator_alloc/delete, cudaMallocAsync (default
#                                   pool, release threshold) and cudaMalloc/cudaFree: ns per
#                                   alloc+free pair (p50, p99), peak reserved bytes, and
#                                   devmem's driver call counts; one table and one JSON
#         summary.txt               one line per step and the verdict
#       The other allocator tests (tests/caching_allocator_{errors,fault,random,...})
#       build sim allocators only (tests/test_util.h, MakeSimAllocator).
#       Exit status: 0 when every CUDA case passed, or when there is no usable GPU (the
#       CUDA cases then skip, and summary.txt says so and why); 1 on any failure; 2 when
#       the bundle is missing.
#
#   What runs without a GPU, here: --prepare itself; `bash -n` of this script,
#   py_compile of tests/gpu/*.py, and replay_bench.py's devmem column on the simulated
#   device (ctest gpu_check.offline, tests/gpu_check_offline_test.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=build-gpu

die() {
  echo "gpu-check: $*" >&2
  exit 2
}

# --- here: build and bundle ------------------------------------------------------------
prepare() {
  set -e
  local dir=${1:-build-cuda}
  if [[ ! -f "$dir/CMakeCache.txt" ]]; then
    cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  fi
  cmake --build "$dir" -j "${DEVMEM_JOBS:-$(nproc)}" --target devmem_tests devmem-demo devmem_capi \
    devmem_ipc_peer_check
  [[ -f "$dir/lib/libdevmem_cuda_kernels.a" ]] ||
    echo "gpu-check: warning: $dir has no CUDA tensor kernels (no nvcc?): the tensor and demo steps will fail" >&2
  [[ -f "$dir/lib/libdevmem_cuda.a" ]] ||
    die "$dir was built without the CUDA backend (no CUDA toolkit in /usr/local/cuda, or -DDEVMEM_WITH_CUDA=OFF); the GPU check would test nothing"

  rm -rf "$bundle"
  mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/glibc"
  local exe lib name
  for exe in devmem_tests devmem-demo devmem_ipc_peer_check; do
    strip --strip-debug -o "$bundle/bin/$exe" "$dir/bin/$exe"
  done
  strip --strip-debug -o "$bundle/lib/libdevmem.so" "$dir/lib/libdevmem.so"
  # devmem_ipc_peer_check needs it by its SONAME (libdevmem.so.MAJOR.MINOR): not a
  # second copy in the carry, nor a link (which may not travel), but the name, to be
  # linked there before the step runs.
  objdump -p "$dir/lib/libdevmem.so" | awk '$1 == "SONAME" {print $2}' >"$bundle/lib/libdevmem.soname"
  [[ -s "$bundle/lib/libdevmem.soname" ]] || die "libdevmem.so in $dir has no SONAME"
  # Every library the loader resolves for them; glibc's own apart (a newer libc than
  # the machine's must not be forced on it, nor on the driver the runtime loads).
  for lib in $(ldd "$dir/bin/devmem_tests" "$dir/bin/devmem-demo" "$dir/lib/libdevmem.so" \
      "$dir/bin/devmem_ipc_peer_check" |
      awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' | sort -u); do
    name=$(basename "$lib")
    case "$name" in
      libcuda.so* | libnvidia*) die "$name is linked, but the driver must come from the GPU machine" ;;
      libdevmem.so*) ;;  # bundled above, stripped
      ld-linux* | libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | \
      libresolv.so.* | libutil.so.* | libmvec.so.*)
        cp -L "$lib" "$bundle/glibc/$name" ;;
      *) cp -L "$lib" "$bundle/lib/$name" ;;
    esac
  done
  {
    echo "devmem GPU bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm)"
    echo "source: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
      "($(git status --porcelain 2>/dev/null | wc -l) files changed in the working tree)"
    echo "build dir: $dir; CUDA toolkit: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -1)"
    echo "glibc here: $(ldd --version | head -1)"
    (cd "$bundle" && find bin lib glibc -type f -printf '%s\t%p\n' | sort -k2)
  } >"$bundle/MANIFEST.txt"
  echo "gpu-check: bundle ready in $bundle/ ($(du -sh "$bundle" | cut -f1)); on the GPU machine run" \
    "'bash scripts/gpu-check.sh' with carry [\"$bundle\"]"
}

if [[ "${1:-}" == "--prepare" ]]; then
  shift
  prepare "$@"
  exit 0
fi
[[ $# -eq 0 ]] || die "usage: scripts/gpu-check.sh [--prepare [BUILD_DIR]]"

# --- there: run from the bundle ----------------------------------------------------------
[[ -x "$bundle/bin/devmem_tests" && -x "$bundle/bin/devmem-demo" ]] ||
  die "no bundle in $bundle/: run 'scripts/gpu-check.sh --prepare' on the build machine first and carry $bundle"
out=${OUT:-$bundle/out}
mkdir -p "$out"
ulimit -c 0  # a demo that aborts should not leave a core dump
summary=$out/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
failed=0
root=$(pwd)

# Each step's bound in seconds (at least 30 s and 3x its expected time on an H200
# machine, in the comment: estimates until a GPU run's `times:` line says otherwise),
# and the budget
# that caps the whole run (the header says why). tests/gpu_check_offline_test.sh checks
# that the header's sum is this table's.
declare -A bound=(
  [nvidia-smi]=40            # its two calls, half each; expect 2 s
  [loader]=30                # the bundle's programs start here; expect 1 s
  [gtest-cuda]=60            # expect 10 s (its cpu and sim cases: 4 s on a dev machine)
  [policy-cuda]=60           # expect 15 s (51 cases on cuda:0)
  [tensor-cuda]=60           # expect 20 s (the 3-epoch training loop twice)
  [tensor-cuda-nocublas]=45  # expect 10 s
  [demo-sim]=45              # expect 5 s (3.3 s of CPU on a dev machine)
  [demo-cuda]=45             # expect 5 s
  [demo-cuda-expandable]=45  # expect 5 s
  [torch]=60                 # expect 10 s (import torch, CUDA start)
  [cupy]=45                  # expect 10 s (2 s when CuPy is missing)
  [torch-package]=60         # expect 15 s
  [torch-step]=90            # expect 20 s (two processes: PyTorch's allocator, devmem)
  [torch-graphs]=60          # expect 15 s
  [peer]=30                  # expect 2 s
  [ipc]=30                   # expect 3 s
  [replay-bench]=120         # expect 40 s (2 traces x 4 allocators, a process each)
)
budget=${GPU_CHECK_BUDGET_S:-300}
# At least 120 s, so that the first three steps (70 s at most before gtest-cuda) always
# run and the verdict says whether there is a GPU.
[[ $budget =~ ^[0-9]+$ ]] && ((budget >= 120)) ||
  die "GPU_CHECK_BUDGET_S=$budget is not a whole number of seconds, at least 120"
times=()
# start_step NAME: sets $limit, the timeout for step NAME (its bound, or what is left
# of the budget if less), and returns 0; or, with under 10 s left, notes that NAME is
# not run, fails the check and returns 1. end_step records how long it took.
start_step() {
  step=$1
  step_t0=$SECONDS
  local left=$((budget - SECONDS))
  if ((left < 10)); then
    failed=1
    note "$step: NOT RUN: $((left < 0 ? 0 : left)) s of the ${budget} s budget left (GPU_CHECK_BUDGET_S)"
    return 1
  fi
  limit=${bound[$step]:-}
  [[ -n $limit ]] || die "step $step has no bound in the table"
  ((left < limit)) && limit=$left
  return 0
}
end_step() { times+=("$step $((SECONDS - step_t0)) s"); }

note "devmem gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ), on $(hostname)"
sed -n '1,3p' "$bundle/MANIFEST.txt" | sed 's/^/  bundle: /' | tee -a "$summary"

# 1. The machine.
start_step nvidia-smi
{
  echo "== nvidia-smi"
  if command -v nvidia-smi >/dev/null; then timeout $((limit / 2)) nvidia-smi 2>&1; else echo "not found"; fi
  echo "== nvidia-smi --query-gpu"
  command -v nvidia-smi >/dev/null &&
    timeout $((limit / 2)) nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
  echo "== uname: $(uname -a)"
  echo "== glibc: $(ldd --version 2>&1 | head -1)"
  echo "== libcuda as the loader sees it"
  ldconfig -p 2>/dev/null | grep -E 'libcuda\.so' || echo "(not in ldconfig's cache)"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} >"$out/nvidia-smi.txt" 2>&1
gpu_line=$(grep -m1 -E 'NVIDIA|No devices|not found|failed' "$out/nvidia-smi.txt" || true)
note "nvidia-smi: ${gpu_line:-see nvidia-smi.txt}"
end_step

# 2. How to start the bundle's programs: with the machine's glibc when it is new enough
#    (the usual case), else through the bundled glibc's loader.
start_step loader
lib_path="$root/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
runner=(env "LD_LIBRARY_PATH=$lib_path")
if ! probe=$(timeout "$limit" "${runner[@]}" "$bundle/bin/devmem_tests" --gtest_list_tests 2>&1 >/dev/null); then
  loader=$(find "$bundle/glibc" -name "ld-linux*" -print -quit)
  [[ -n "$loader" ]] || die "the bundle's programs do not start here and it has no loader: $probe"
  note "loader: the machine's glibc cannot run the bundle ($(echo "$probe" | head -1)); using the bundled glibc"
  runner=("$root/$loader" --library-path "$root/$bundle/lib:$root/$bundle/glibc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
else
  note "loader: the machine's glibc, LD_LIBRARY_PATH=$bundle/lib"
fi
end_step

# 3. The CUDA backend's conformance cases (and cpu/sim's, as a control).
filter='AllBackends/BackendConformanceTest.*:BackendFactoryTest.*'
start_step gtest-cuda  # always runs: see the budget's minimum
timeout "$limit" "${runner[@]}" "$bundle/bin/devmem_tests" --gtest_filter="$filter" \
  --gtest_output="xml:$out/gtest-cuda.xml" >"$out/gtest-cuda.log" 2>&1
rc=$?
cuda_ran=$(grep -cE '^\[       OK \] .*/cuda ' "$out/gtest-cuda.log")
cuda_skipped=$(grep -cE '^\[  SKIPPED \] .*/cuda ' "$out/gtest-cuda.log")
vm_skipped=$(grep -cE '^\[  SKIPPED \] .*(VirtualMemory|ExpandableSegments).*/cuda ' "$out/gtest-cuda.log")
no_device=0
if [[ $rc -ne 0 ]]; then
  failed=1
  note "gtest: FAILED (exit status $rc); failing cases:"
  grep -E '^\[  FAILED  \] .*\(' "$out/gtest-cuda.log" | sed 's/^/  /' | tee -a "$summary"
  [[ $rc -eq 124 ]] && note "  (timed out after $limit s)"
elif [[ $cuda_ran -eq 0 ]]; then
  no_device=1
  note "gtest: passed, but every cuda case was SKIPPED ($cuda_skipped): $(grep -m1 -A1 ': Skipped$' "$out/gtest-cuda.log" | tail -1)"
else
  note "gtest: passed; cuda cases: $cuda_ran ran, $cuda_skipped skipped"
  if [[ $vm_skipped -gt 0 ]]; then
    note "  the virtual-memory cases were SKIPPED on this GPU: $(grep -A1 ': Skipped$' "$out/gtest-cuda.log" | grep -m1 'virtual memory')"
  else
    note "  the virtual-memory cases (VirtualMemory*, ExpandableSegments*) ran on the GPU"
  fi
fi
end_step

# 3a. The allocator policy suite on cuda:0 (tests/test_backend.h): the same cases as on
#     the sim and the fake CUDA runtime (ctest fake_cuda.policy.*), on the GPU's driver.
policy_filter='CachingAllocatorPolicyTest.*:CachingAllocatorStreamTest.*:CachingAllocatorOomTest.*'
policy_filter+=':CachingAllocatorGcTest.*:CachingAllocatorFractionTest.*:CachingAllocatorCacheTest.*'
policy_filter+=':CachingAllocatorStatsTest.*:CachingAllocatorObserverTest.*:CachingAllocatorExpandableTest.*'
if [[ $no_device -eq 1 ]]; then
  note "policy-cuda: not run (no usable GPU: the conformance cases skipped)"
elif start_step policy-cuda; then
  DEVMEM_TEST_BACKEND=cuda timeout "$limit" "${runner[@]}" "$bundle/bin/devmem_tests" \
    --gtest_filter="$policy_filter" --gtest_output="xml:$out/policy-cuda.xml" \
    >"$out/policy-cuda.log" 2>&1
  rc=$?
  ran=$(grep -cE '^\[       OK \] CachingAllocator' "$out/policy-cuda.log")
  skipped=$(grep -cE '^\[  SKIPPED \] CachingAllocator' "$out/policy-cuda.log")
  if [[ $rc -ne 0 ]]; then
    failed=1
    note "policy-cuda: FAILED (exit status $rc); failing cases:"
    grep -E '^\[  FAILED  \] .*\(' "$out/policy-cuda.log" | sed 's/^/  /' | tee -a "$summary"
    [[ $rc -eq 124 ]] && note "  (timed out after $limit s)"
  else
    note "policy-cuda: passed; $ran cases ran on cuda:0, $skipped skipped (sim-specific)"
  fi
  end_step
fi

# 3b. Every tensor op on cuda:0 against the host kernels, and the training loop on
#     cuda:0 against sim. cuBLAS comes from PyTorch's wheel when there is one (the
#     bundle carries none: cuda/cuda_kernels.cc says why).
if [[ -z "${DEVMEM_CUBLAS_LIBRARY:-}" ]] && command -v python3 >/dev/null; then
  cublas=$(python3 -c 'import glob, os, sys
hits = [h for b in sys.path for h in sorted(glob.glob(os.path.join(b, "nvidia", "cublas", "lib", "libcublas.so*")))]
print(hits[0] if hits else "")' 2>/dev/null)
  [[ -n "$cublas" ]] && export DEVMEM_CUBLAS_LIBRARY=$cublas
fi
note "cuBLAS for the tensor kernels: ${DEVMEM_CUBLAS_LIBRARY:-none found in a wheel; libcublas.so.13 or .12 through the loader, if any}"
run_tensor() {
  local log=$1 filter=$2
  shift 2
  local rc=0
  start_step "${log%.log}" || return 0
  env "$@" timeout "$limit" "${runner[@]}" "$bundle/bin/devmem_tests" --gtest_filter="$filter" \
    --gtest_output="xml:$out/${log%.log}.xml" >"$out/$log" 2>&1
  rc=$?
  local ran skipped
  ran=$(grep -cE '^\[       OK \] TensorCudaTest' "$out/$log")
  skipped=$(grep -cE '^\[  SKIPPED \] TensorCudaTest' "$out/$log")
  if [[ $rc -ne 0 ]]; then
    failed=1
    note "$log: FAILED (exit status $rc); failing cases:"
    grep -E '^\[  FAILED  \] .*\(' "$out/$log" | sed 's/^/  /' | tee -a "$summary"
    grep -m3 -E 'Failure|bound|differ' "$out/$log" | sed 's/^/  /' | tee -a "$summary"
    [[ $rc -eq 124 ]] && note "  (timed out after $limit s)"
  elif [[ $ran -eq 0 ]]; then
    note "$log: every case SKIPPED ($skipped): $(grep -m1 -A1 ': Skipped$' "$out/$log" | tail -1)"
    [[ $no_device -eq 1 ]] || { failed=1; note "  (but the backend's cuda cases ran: the kernels must too)"; }
  else
    note "$log: passed; $ran cases ran on the GPU, $skipped skipped"
  fi
  grep -m2 -E '^devmem: ' "$out/$log" | sed 's/^/  stderr: /' | tee -a "$summary"
  end_step
}
run_tensor tensor-cuda.log 'TensorCudaTest.*'
run_tensor tensor-cuda-nocublas.log 'TensorCudaTest.Matmul*:TensorCudaTest.TheTrainingLoop*' \
  DEVMEM_CUBLAS_LIBRARY=none

# 4. The demo on the CUDA device, with regular and with expandable segments, and on sim
#    for the losses to compare against.
run_demo() {
  local log=$1 conf=$2
  local rc=0
  start_step "${log%.log}" || return 0
  # (The braces keep bash's "Aborted" job notice out of the output: the demo aborts on
  # an uncaught exception, and its exit status says so.)
  {
    DEVMEM_CONF=$conf timeout "$limit" "${runner[@]}" "$bundle/bin/devmem-demo" --epochs 2 \
      >"$out/$log" 2>&1
    rc=$?
  } 2>/dev/null
  if [[ $rc -eq 0 ]]; then
    note "demo ($conf): passed"
  elif [[ $no_device -eq 1 ]] && grep -qiE 'cudaGetDeviceCount|no cuda|CUDA driver' "$out/$log"; then
    note "demo ($conf): no usable GPU here (exit status $rc): $(grep -m1 -iE 'cuda' "$out/$log")"
  else
    failed=1
    note "demo ($conf): FAILED (exit status $rc$([[ $rc -eq 124 ]] && echo ", timed out after $limit s")): $(tail -1 "$out/$log")"
  fi
  if grep -q 'needs virtual memory management' "$out/$log"; then
    note "  the allocator fell back to regular segments: $(grep -m1 'needs virtual memory management' "$out/$log")"
  fi
  grep -m3 -E '^devmem: ' "$out/$log" | sed 's/^/  stderr: /' | tee -a "$summary"
  end_step
}
run_demo demo-sim.log backend:sim
run_demo demo-cuda.log backend:cuda
run_demo demo-cuda-expandable.log backend:cuda,expandable_segments:true
# The epoch table's rows: "epoch loss best ...". Each cuda run's losses against sim's.
compare_losses() {
  local log=$1
  [[ -s "$out/$log" && -s "$out/demo-sim.log" ]] || return 0
  grep -q '^ *[0-9]\+ \+[0-9.]\+ ' "$out/$log" || return 0  # the run stopped early
  local verdict
  verdict=$(awk 'NR == FNR { if ($1 ~ /^[0-9]+$/ && $2 ~ /^[0-9.]+$/) sim[$1] = $2; next }
    $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9.]+$/ {
      n++; d = $2 - sim[$1]; if (d < 0) d = -d; if (!($1 in sim) || d > 1e-4) bad++
      if (d > worst) worst = d }
    END { if (n == 0) print "no epochs"; else if (bad) printf "FAILED: %d of %d epochs differ by more than 1e-4 (largest %.2g)\n", bad, n, worst;
          else printf "ok: %d epochs, largest difference %.2g\n", n, worst }' \
    "$out/demo-sim.log" "$out/$log")
  [[ $verdict == ok* ]] || failed=1
  note "  loss of $log vs demo-sim.log: $verdict"
}
compare_losses demo-cuda.log
compare_losses demo-cuda-expandable.log

# 5. PyTorch and CuPy with libdevmem.so as their allocator (the machine's own Python;
#    only libdevmem.so's dependencies come from the bundle).
run_framework() {
  local log=$1 script=$2
  local rc=0
  if ! command -v python3 >/dev/null; then
    note "$script: no python3 here"
    return
  fi
  start_step "${log%.log}" || return 0
  LD_LIBRARY_PATH=$lib_path timeout "$limit" python3 "tests/gpu/$script" \
    "$root/$bundle/lib/libdevmem.so" >"$out/$log" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]]; then
    note "$script: $(grep -m1 -E '^(SKIP|ok)' "$out/$log" || echo passed)"
  else
    failed=1
    note "$script: FAILED (exit status $rc$([[ $rc -eq 124 ]] && echo ", timed out after $limit s")): $(tail -1 "$out/$log")"
  fi
  end_step
}
run_framework torch.log torch_pluggable.py
run_framework cupy.log cupy_allocator.py
run_framework torch-package.log torch_package.py
run_framework torch-step.log torch_training_step.py
run_framework torch-graphs.log torch_graphs.py

# 5a. Peer access and IPC of expandable segments through the C ABI
#     (tests/gpu/ipc_peer_check.c; the program says SKIP and why where the machine
#     cannot: one GPU, no peer access, no POSIX file-descriptor handles).
run_ipc_peer() {
  local mode=$1
  local rc=0
  if [[ $no_device -eq 1 ]]; then
    note "ipc_peer_check $mode: not run (no usable GPU: the conformance cases skipped)"
    return
  fi
  if [[ ! -x "$bundle/bin/devmem_ipc_peer_check" || ! -s "$bundle/lib/libdevmem.soname" ]]; then
    failed=1
    note "ipc_peer_check $mode: FAILED: not in the bundle (made before it was added? run --prepare again)"
    return
  fi
  ln -sf libdevmem.so "$bundle/lib/$(cat "$bundle/lib/libdevmem.soname")"
  start_step "$mode" || return 0
  timeout "$limit" "${runner[@]}" "$bundle/bin/devmem_ipc_peer_check" "$mode" >"$out/$mode.log" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]] && grep -qE '^(ok|SKIP): ' "$out/$mode.log"; then
    note "ipc_peer_check $mode: $(grep -m1 -E '^(ok|SKIP): ' "$out/$mode.log")"
  else
    failed=1
    note "ipc_peer_check $mode: FAILED (exit status $rc$([[ $rc -eq 124 ]] && echo ", timed out after $limit s")): $(grep -m1 '^FAIL' "$out/$mode.log" || tail -1 "$out/$mode.log")"
  fi
  end_step
}
run_ipc_peer peer
run_ipc_peer ipc

# 6. The side-by-side replay benchmark: one synthetic and one real training trace,
#    four allocators, one table (replay-bench.log) and one JSON.
if command -v python3 >/dev/null && start_step replay-bench; then
  # devmem on the GPU where there is one (backend:auto would fall back to sim quietly).
  bench_conf=${DEVMEM_CONF:-}
  [[ $no_device -eq 0 && -z "$bench_conf" ]] && bench_conf=backend:cuda
  DEVMEM_CONF=$bench_conf LD_LIBRARY_PATH=$lib_path timeout "$limit" python3 tests/gpu/replay_bench.py \
    --lib "$root/$bundle/lib/libdevmem.so" --json "$out/replay-bench.json" \
    tests/data/traces/training_loop.jsonl tests/data/traces/real/resnet18_train.jsonl.gz \
    >"$out/replay-bench.log" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]]; then
    note "replay_bench.py: done (table below; JSON in replay-bench.json)"
  else
    failed=1
    note "replay_bench.py: FAILED (exit status $rc$([[ $rc -eq 124 ]] && echo ", timed out after $limit s")): $(tail -1 "$out/replay-bench.log")"
  fi
  sed 's/^/  /' "$out/replay-bench.log" | tee -a "$summary" >/dev/null
  cat "$out/replay-bench.log"
  end_step
fi

note "times: ${times[*]/%/,} ${SECONDS} s in all, of the ${budget} s budget"

if [[ $failed -ne 0 ]]; then
  note "verdict: FAILED (logs in $out)"
  exit 1
fi
if [[ $no_device -eq 1 ]]; then
  note "verdict: SKIPPED, no usable GPU on this machine, so nothing of the CUDA backend ran (logs in $out)"
  exit 0
fi
note "verdict: PASSED (logs in $out)"
