#!/usr/bin/env bash
# tests/consumer_test.sh MODE SOURCE_DIR BUILD_DIR [LAUNCHER]: builds and runs
# tests/consumer/ (one C++ program on the sim device, one C program on the C ABI) the
# way another project would use devmem (README.md, "Using devmem from another build").
#
#   installed  `cmake --install BUILD_DIR` into a temporary prefix, then the consumer
#              (copied out of the repository) finds it with find_package(devmem
#              CONFIG), and the C program is built again with pkg-config's flags after
#              the prefix was moved. No installed CMake, pkg-config or header file may
#              name the source or build tree: the prefix must stand on its own.
#   subdir     the consumer adds the source tree with add_subdirectory, in a build
#              directory kept beside BUILD_DIR (BUILD_DIR-consumer-subdir/), so that
#              reruns are incremental; only the consumer's targets (and the libraries
#              they need) are built. LAUNCHER (ccache) is passed on when the main build
#              has one. Beside, not under: at the same depth as BUILD_DIR, the sources'
#              paths relative to the build directory ("../allocator/x.cc") and with
#              them the preprocessed text are the main build's, so ccache hands back
#              the objects the main build just compiled (under BUILD_DIR,
#              "../../allocator/x.cc" missed every one of them, and every change to a
#              header compiled the libraries a second time: minutes on a loaded
#              machine, past the test's timeout). The libraries' compile lines are
#              then the main build's word for word (their include paths leave out the
#              binary directory: top-level CMakeLists.txt), so ccache's direct mode
#              hits without running the preprocessor; only the consumer's two sources
#              and capi/devmem.cc (it includes the generated devmem_version.h, whose
#              path differs) compile when they changed. CCACHE_BASEDIR and
#              CCACHE_NOHASHDIR default to scripts/build.sh's (the source tree, and
#              no working directory in the hash), so that a plain `ctest` finds the
#              objects too: with absolute paths every one missed.
set -euo pipefail
mode=$1 src=$2 build=$3 launcher=${4:-}
export DEVMEM_CONF=backend:sim,sim_capacity:64MiB
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$src} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
launch=()
[[ -n "$launcher" ]] && launch=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher"
  -DCMAKE_C_COMPILER_LAUNCHER="$launcher")

run_programs() {
  "$1/consumer_cxx"
  "$1/consumer_c"
}

case "$mode" in
  installed)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
    soname=$(readelf -dW "$tmp/prefix/lib/libdevmem.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    [[ "$soname" =~ ^libdevmem\.so\.[0-9]+\.[0-9]+$ ]] ||
      { echo "FAIL: libdevmem.so's SONAME is '$soname', not libdevmem.so.MAJOR.MINOR"; exit 1; }
    if leaks=$(grep -rlF -e "$src" -e "$(cd "$build" && pwd)" "$tmp/prefix/lib/cmake" \
                 "$tmp/prefix/lib/pkgconfig" "$tmp/prefix/include"); then
      echo "FAIL: installed files name the source or build tree:"; echo "$leaks"; exit 1
    fi
    cp -r "$src/tests/consumer" "$tmp/src"
    cmake -S "$tmp/src" -B "$tmp/b" "${gen[@]}" "${launch[@]}" \
      -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$tmp/b" >/dev/null
    run_programs "$tmp/b"
    # pkg-config, from a prefix that moved: devmem.pc finds itself (${pcfiledir}).
    mv "$tmp/prefix" "$tmp/moved"
    flags=$(PKG_CONFIG_PATH="$tmp/moved/lib/pkgconfig" pkg-config --cflags --libs devmem)
    cc -std=c99 -pedantic -Werror -o "$tmp/c_pkgconfig" "$tmp/src/consumer.c" $flags \
      -Wl,-rpath,"$tmp/moved/lib"
    "$tmp/c_pkgconfig"
    echo "ok: installed prefix, find_package(devmem) and pkg-config ($soname)"
    ;;
  subdir)
    dir="${build%/}-consumer-subdir"
    cmake -S "$src/tests/consumer" -B "$dir" "${gen[@]}" "${launch[@]}" \
      -DDEVMEM_SUBDIR="$src" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$dir" --target consumer_cxx consumer_c >/dev/null
    run_programs "$dir"
    echo "ok: add_subdirectory"
    ;;
  *) echo "usage: $0 installed|subdir SOURCE_DIR BUILD_DIR [LAUNCHER]" >&2; exit 2 ;;
esac
