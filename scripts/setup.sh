#!/usr/bin/env bash
# scripts/setup.sh: installs what devmem needs to build and test, and nothing twice.
#
# Idempotent: checks each Debian package with dpkg and runs apt-get only for the
# missing ones (apt-get update first, once). Needs root or sudo for installs. The CUDA
# toolkit is not a Debian package here: when /usr/local/cuda exists the build picks it
# up, otherwise the build goes on without the cuda/ backend.
#
# libmimalloc-dev: devmem-bench's host reference for the shipped path (optional to the
# build: without it the bench leaves out those figures). chromium: the memtrace timeline HTML test opens the page headless. clang-16 and its
# runtime (libFuzzer): the fuzz build of scripts/test.sh; Debian's default clang (14)
# lacks __builtin_source_location, which <source_location> (allocator/site.h) needs.
# python3-pytest runs python/devmem's tests (ctest python.package); pip, setuptools and
# wheel let that test `pip install ./python` offline. python3-torch (PyTorch 1.13, CPU
# only, about 30 s to install) gives torch.cuda._memory_viz, PyTorch's own reader that
# checks memtrace export --to pytorch-snapshot; all for /usr/bin/python3.
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
