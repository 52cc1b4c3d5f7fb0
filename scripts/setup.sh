#!/usr/bin/env bash
# scripts/setup.sh: installs what devmem needs to build and test, and nothing twice.
#
# Idempotent: checks each Debian package with dpkg and runs apt-get only for the
# missing ones (apt-get update first, once). Needs root or sudo for installs. The CUDA
# toolkit is not a Debian package here: when /usr/local/cuda exists the build picks it
# up, otherwise the build goes on without the cuda/ backend.
#
# What each package is for (scripts/demo.sh and scripts/test.sh run this first, so a
# fresh Debian 12 machine needs nothing else but root or sudo):
#   the build: build-essential (gcc/g++, make, binutils), cmake, ninja-build,
#     pkg-config (jemalloc is found with it), ccache (scripts/build.sh uses it when
#     present), libabsl-dev, libjemalloc-dev, prometheus-cpp-dev, libcivetweb-dev (the
#     HTTP listener), libsimdjson-dev, nlohmann-json3-dev, zlib1g-dev (gzipped traces),
#     libcli11-dev (the tools' command lines), libgtest-dev, libgmock-dev and
#     googletest (the tests); libmimalloc-dev is devmem-bench's host reference for the
#     shipped path (optional to the build: without it the bench leaves out those
#     figures);
#   the tests: python3 (the script tests), git (tests/paths_test.py lists the tracked
#     files), chromium (the memtrace timeline HTML tests open the page headless),
#     prometheus (its server for dashboards.integration, promtool for
#     dashboards.rules), python3-pytest (ctest python.package runs python/devmem's
#     tests), python3-pip, python3-setuptools and python3-wheel (the same test does
#     `pip install ./python` offline), python3-torch (PyTorch 1.13, CPU only, about
#     30 s to install: torch.cuda._memory_viz, PyTorch's own reader that checks
#     memtrace export --to pytorch-snapshot), all for /usr/bin/python3;
#   the fuzz build of scripts/test.sh: clang-16 and its runtime libclang-rt-16-dev
#     (libFuzzer); Debian's default clang (14) lacks __builtin_source_location, which
#     <source_location> (allocator/site.h) needs;
#   the demo: nothing beyond the build;
#   libbenchmark-dev (Google Benchmark): installed as one of the project's declared
#     dependencies; no target builds against it today (devmem-bench and
#     tensor/bench_kernels.cc time their loops themselves).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3 ccache
  libjemalloc-dev libmimalloc-dev libabsl-dev prometheus-cpp-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  nlohmann-json3-dev libsimdjson-dev libcli11-dev zlib1g-dev
  libcivetweb-dev prometheus
  chromium clang-16 libclang-rt-16-dev
  python3-pytest python3-pip python3-setuptools python3-wheel python3-torch
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "setup: missing packages (${missing[*]}) and not root; install them and rerun" >&2
    exit 1
  fi
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
