#!/usr/bin/env bash
# memtrace's inspect commands (buffers, snapshot, diff, oom, watch) run as a user runs
# them; one case per ctest test (tests/CMakeLists.txt):
#   tests/memtrace_inspect_cli_test.sh CASE MEMTRACE DEVMEM_DEMO
# Fixtures and golden outputs: tests/data/snapshots/ (generate.py, update_golden.sh).
set -uo pipefail
case_name=$1
memtrace=$(realpath "$2")
demo=$(realpath "$3")
data=$(cd "$(dirname "$0")/data/snapshots" && pwd)
tmp=$(mktemp -d)
demo_pid=
cleanup() {
  [ -n "$demo_pid" ] && kill "$demo_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; exit 1; }

# expect_rc WANT CMD...: runs CMD, captures its output in $out, checks the status.
expect_rc() {
  local want=$1; shift
  out=$("$@" 2>&1); local rc=$?
  echo "$ $* -> $rc"; echo "$out" | head -40
  [ "$rc" -eq "$want" ] || fail "expected exit status $want, got $rc"
}

# Starts devmem-demo serving on an ephemeral loopback port with a bearer token; sets $url.
start_demo() {
  echo "s3cret-$$" > "$tmp/token"
  DEVMEM_CONF="http_token_file:$tmp/token" "$demo" --epochs 1 --serve 127.0.0.1:0 \
    --linger 60 > "$tmp/demo.out" 2>&1 &
  demo_pid=$!
  for _ in $(seq 300); do
    # The linger line is printed after training: the process is in its final state.
    url=$(grep -o 'serving http://127.0.0.1:[0-9]* for' "$tmp/demo.out" | grep -o 'http://[^ ]*')
    [ -n "$url" ] && return 0
    sleep 0.1
  done
  cat "$tmp/demo.out"; fail "devmem-demo did not start serving"
}

case $case_name in
  golden)
    cd "$data" || exit 1
    while IFS='|' read -r name args; do
      [ -z "$name" ] && continue
      # shellcheck disable=SC2086
      "$memtrace" $args > "$tmp/$name.txt" 2>&1
      rc=$?
      [ "$rc" -le 1 ] || fail "$args: exit status $rc"
      diff -u "golden/$name.txt" "$tmp/$name.txt" || fail "$args: output differs from golden/$name.txt"
      echo "ok $name"
    done < golden/cases.txt ;;
  help)
    for c in buffers snapshot diff oom watch; do
      expect_rc 0 "$memtrace" "$c" --help
      grep -q -- "--json" <<<"$out" || fail "$c --help does not mention --json"
    done ;;
  diff_exit)
    cd "$data" || exit 1
    expect_rc 0 "$memtrace" diff a.json b.json
    expect_rc 1 "$memtrace" diff a.json b.json --fail-on-growth 8MiB
    grep -q "FAIL: growth 12.0 MiB exceeds the limit 8.00 MiB" <<<"$out" || fail "no FAIL line"
    expect_rc 0 "$memtrace" diff a.json b.json --fail-on-growth 12MiB
    # Growth is the sum of the sites that grew: from b back to a, 6 MiB grew even
    # though the total fell by 6 MiB.
    expect_rc 1 "$memtrace" diff b.json a.json --fail-on-growth 5MiB
    expect_rc 0 "$memtrace" diff a.json a.json --fail-on-growth 0
    grep -q "no site changed" <<<"$out" || fail "identical snapshots"
    expect_rc 1 "$memtrace" diff a.json b.json --json --fail-on-growth 1KiB
    grep -q '"failed": true' <<<"$out" || fail "json failed flag"
    expect_rc 2 "$memtrace" diff a.json b.json --fail-on-growth much ;;
  malformed)
    cd "$data" || exit 1
    check() {  # FILE NEEDLE: exit status 2 and a message naming the file and NEEDLE
      for cmd in buffers diff oom; do
        if [ $cmd = diff ]; then expect_rc 2 "$memtrace" diff a.json "$1"; else expect_rc 2 "$memtrace" $cmd "$1"; fi
        grep -qF "$1" <<<"$out" || fail "$cmd $1: message does not name the file"
        grep -qF -- "$2" <<<"$out" || fail "$cmd $1: message lacks \"$2\""
      done
    }
    check bad_truncated.json "not valid JSON, at byte 6022"
    check bad_garbage.json "at byte 0"
    check bad_schema_major.json 'schema "devmem.snapshot/2" is not supported (this reader reads "devmem.snapshot/1"'
    check bad_type.json "devices[0].segments[1].blocks[2].size: expected a non-negative integer, got string"
    check bad_absurd_size.json "devices[0].segments[0].blocks[0]: expected a block inside its segment"
    check bad_float_size.json "blocks[0].size: expected a non-negative integer"
    check bad_negative.json "devices[0].segments[0].blocks[0].addr: expected a non-negative integer, got negative integer"
    check bad_huge_line.json "devices[0].info.name: expected a string, got integer"
    check no_such_file.json "cannot read"
    check bad_block_past_segment.json "devices[0].segments[0].blocks[2]: expected a block inside its segment"
    check bad_overlap.json "devices[0].segments[0].blocks[1]: overlaps the block before it"
    # A segment of nearly 2^64 bytes: a bounded map, not an abort.
    expect_rc 0 "$memtrace" oom hostile_huge_segment.json
    grep -q "one character = 64.0 PiB" <<<"$out" || fail "huge segment: cell size"
    expect_rc 0 "$memtrace" buffers minor_version.json
    expect_rc 2 "$memtrace" oom a.json
    grep -q "not an OOM dump" <<<"$out" || fail "oom on a snapshot"
    head -c 100000 /dev/urandom > "$tmp/random.bin"
    expect_rc 2 "$memtrace" buffers "$tmp/random.bin"
    : > "$tmp/empty.json"
    expect_rc 2 "$memtrace" buffers "$tmp/empty.json"
    grep -q "empty" <<<"$out" || fail "empty file"
    # A directory: said so (simdjson's load error alone said "Error reading the file").
    expect_rc 2 "$memtrace" buffers "$tmp"
    grep -qF "cannot read $tmp: a directory, not a snapshot file" <<<"$out" || fail "directory: $out"
    expect_rc 2 "$memtrace" buffers a.json --min-bytes lots
    expect_rc 2 "$memtrace" buffers a.json --device cuda:7
    grep -q "it has: sim:0, cpu" <<<"$out" || fail "--device message" ;;
  live)
    start_demo
    # Without the token: 401, exit status 3, a message naming the URL.
    expect_rc 3 "$memtrace" buffers "$url"
    grep -qF "GET $url/debug/snapshot: HTTP 401" <<<"$out" || fail "401 message"
    echo wrong > "$tmp/wrong"
    expect_rc 3 "$memtrace" buffers "$url" --token-file "$tmp/wrong"
    expect_rc 2 "$memtrace" buffers "$url" --token-file /dev/null  # an empty token file
    expect_rc 0 "$memtrace" buffers "$url" --token-file "$tmp/token"
    grep -q "training_loop.cc:[0-9]* (clone)" <<<"$out" || fail "live buffers lack the clone site"
    expect_rc 0 "$memtrace" buffers "$url" --token-file "$tmp/token" --list --json
    grep -q '"refcount": [0-9]' <<<"$out" || fail "no tensor refcount in the live list"
    expect_rc 0 "$memtrace" snapshot "$url" --token-file "$tmp/token" -o "$tmp/s.json"
    grep -q '"schema":"devmem.snapshot/1"' "$tmp/s.json" || fail "snapshot file"
    expect_rc 0 "$memtrace" buffers "$tmp/s.json"
    expect_rc 0 "$memtrace" diff "$tmp/s.json" "$url" --token-file "$tmp/token" --fail-on-growth 1MiB
    expect_rc 0 "$memtrace" watch "$url" --token-file "$tmp/token" --iterations 2 --interval 0.1 </dev/null
    [ "$(grep -c '^DEVICE  *TOTAL' <<<"$out")" -eq 2 ] || fail "watch: expected two frames"
    expect_rc 0 "$memtrace" watch "$url" --token-file "$tmp/token" --iterations 1 --json </dev/null
    grep -q '"devices":\[{"device":"sim:0"' <<<"$out" || fail "watch --json"
    expect_rc 3 "$memtrace" watch "$url" --iterations 1 </dev/null
    # A port nobody listens on (the demo's, after it is gone).
    kill "$demo_pid"; wait "$demo_pid" 2>/dev/null; demo_pid=
    expect_rc 3 "$memtrace" snapshot "$url" -o "$tmp/t.json"
    grep -qF "GET $url/debug/snapshot: cannot connect" <<<"$out" || fail "connect message"
    [ ! -e "$tmp/t.json" ] || fail "a failed snapshot left a file" ;;
  oom_demo)
    mkdir "$tmp/dumps"
    DEVMEM_CONF="oom_dump_dir:$tmp/dumps" "$demo" --epochs 1 > /dev/null 2>&1 || fail "demo failed"
    dump=$(ls "$tmp"/dumps/devmem-oom-*.json | head -1)
    [ -n "$dump" ] || fail "no dump written"
    expect_rc 0 "$memtrace" oom "$dump"
    grep -q "cause          real_use" <<<"$out" || fail "cause"
    grep -q "devmem_demo.cc:[0-9]* (clone)" <<<"$out" || fail "top site"
    grep -q '|####' <<<"$out" || fail "segment map"
    grep -q "^remedy" <<<"$out" || fail "remedy"
    expect_rc 0 "$memtrace" oom "$dump" --json
    grep -q '"cause": "real_use"' <<<"$out" || fail "json cause" ;;
  *) fail "unknown case $case_name" ;;
esac
echo PASS
