#!/usr/bin/env bash
# tests/capi_elf_test.sh LIBDEVMEM_SO: what libdevmem.so shows a process that dlopens it
# (capi/README.md): no dependency on jemalloc (unprefixed, it would bring its own malloc
# and operator new, and it needs static TLS), no initial-exec TLS of its own (STATIC_TLS:
# dlopen could fail with "cannot allocate memory in static TLS block"), and no exported
# symbol but the devmem_* functions of capi/devmem.h.
set -uo pipefail
lib=$1
status=0
if readelf -dW "$lib" | grep -E '\(NEEDED\)' | grep -q jemalloc; then
  echo "FAIL: $lib depends on jemalloc:"; readelf -dW "$lib" | grep -E '\(NEEDED\)'; status=1
fi
if readelf -dW "$lib" | grep -E '\(FLAGS\)' | grep -q STATIC_TLS; then
  echo "FAIL: $lib uses static (initial-exec) TLS"; status=1
fi
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^devmem_')
if [[ -n "$exported" ]]; then
  echo "FAIL: $lib exports more than devmem_*:"; echo "$exported" | head -20; status=1
fi
api=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -c '^devmem_')
header=$(grep -cE '^[a-z].*\bdevmem_[a-z_]+\(' "$(dirname "$0")/../capi/devmem.h")
if [[ "$api" -ne "$header" ]]; then
  echo "FAIL: $lib exports $api devmem_* functions, capi/devmem.h declares $header"; status=1
fi
[[ $status -eq 0 ]] && echo "ok: $api functions exported, no jemalloc, no static TLS"
exit $status
