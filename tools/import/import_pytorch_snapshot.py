#!/usr/bin/env python3
"""tools/import/import_pytorch_snapshot.py: PyTorch memory snapshot -> devmem trace.

Converts the pickle written by torch.cuda.memory._dump_snapshot() (the dict returned by
torch.cuda.memory._snapshot()) into a devmem trace (docs/formats.md, devmem.trace/1), so
that `memtrace replay` can run the recorded workload through devmem's allocator.
`memtrace import --from pytorch-snapshot` runs this script; it needs only Python's
standard library (no torch).

What is read: snapshot["device_traces"], a list (one per device) of lists of entries
{"action", "addr", "size", "stream", "time_us" (PyTorch >= 2.1), "frames"}. Actions:
  alloc                                -> alloc
  free_requested (or "free", older)    -> free   (the program's free)
  free_completed                       -> free_completed (or free, when the trace has no
                                          free_requested: then it is the only free)
  segment_alloc/free, segment_map/unmap -> the same names (memtrace timeline reads them)
  oom                                  -> oom
  snapshot and unknown actions         -> skipped
Sites: the first frame outside torch's own files (else the innermost one) becomes a site
of the header's site table. Times: time_us * 1000, made relative to the first event;
without time_us the event's index stands in (order is all replay needs). Device: each
entry's list index becomes "cuda:N"; --device N keeps one device (replay puts every
event on one simulated device, so use it for multi-GPU snapshots).

Safety: a snapshot is plain dicts, lists, strings and numbers, so the pickle is read by
an Unpickler that refuses every global except builtins.set and builtins.frozenset, whose
results are no larger than the list they are built from (bytearray, range, int, str, ...
were allowed, and bytearray(2**31) took 2.1 GB from a 36-byte pickle). Size and work are
bounded too:
  - memory: at most 1 GiB + 64 x the pickle's size (RLIMIT_AS, set by main()); more is
    refused as malformed input, so a length prefix that asks for gigabytes (BYTEARRAY8
    allocates before reading) is an error, not a 2 GB allocation;
  - work: a pickle can share one object many times (memo references), so a few KB can
    describe 4e8 entries; the entries and frames visited are limited to one per byte of
    the pickle (a real entry takes tens of bytes), beyond which it is refused.
Strings: frame file and function names, and the input's name, are written as valid UTF-8
(a lone surrogate, which pickles can hold and non-UTF-8 file names decode to, becomes
U+FFFD: json.dumps would write it as an escape that memtrace's reader rejects).

Exit status: 0 converted; 2 unreadable or malformed input (the message names the file
and the entry: "snap.pickle: device_traces[0][12]: 'addr': expected an integer").

Usage: import_pytorch_snapshot.py -o TRACE.jsonl [--device N] [--] SNAPSHOT.pickle
(memtrace passes `--output=TRACE -- SNAPSHOT`, so any file name is a file name.)
"""
import argparse
import io
import json
import pickle
import sys

# Constructors whose result is bounded by their (already built) argument.
ALLOWED_BUILTINS = {"set", "frozenset"}
MEMORY_BASE = 1 << 30
MEMORY_PER_BYTE = 64
ACTIONS = {"alloc": "alloc", "free_requested": "free", "free": "free",
           "free_completed": "free_completed", "segment_alloc": "segment_alloc",
           "segment_free": "segment_free", "segment_map": "segment_map",
           "segment_unmap": "segment_unmap", "oom": "oom"}


class InputError(Exception):
    pass


class RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module == "builtins" and name in ALLOWED_BUILTINS:
            return super().find_class(module, name)
        raise InputError(f"refuses the pickle global {module}.{name}: a memory snapshot "
                         "holds only dicts, lists, strings and numbers")


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InputError(f"cannot read ({e.strerror})")


def loads(data):
    """Unpickles `data` with the restricted Unpickler; every failure is InputError."""
    try:
        return RestrictedUnpickler(io.BytesIO(data)).load()
    except InputError:
        raise
    except MemoryError:
        raise InputError("the pickle asks for more memory than this importer allows "
                         f"({MEMORY_BASE >> 20} MiB + {MEMORY_PER_BYTE} x its size)")
    except RecursionError:
        raise InputError("the pickle nests too deeply")
    except Exception as e:  # noqa: BLE001 -- any unpickling failure is malformed input
        raise InputError(f"not a pickle ({type(e).__name__}: {str(e)[:200]})")


def limit_memory(input_bytes):
    """Caps this process's address space (see Safety); best effort where unsupported."""
    try:
        import resource
        cap = MEMORY_BASE + MEMORY_PER_BYTE * input_bytes
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        if soft == resource.RLIM_INFINITY or soft > cap:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, ValueError, OSError):
        pass


class Budget:
    """Entries and frames visited, at most one per byte of the pickle (see Safety)."""

    def __init__(self, input_bytes):
        self.left = max(int(input_bytes), 1000)
        self.limit = self.left

    def spend(self, n, where):
        self.left -= n
        if self.left < 0:
            raise InputError(f"{where}: the pickle describes more than {self.limit} entries "
                             "and frames, more than its size can hold unless objects are "
                             "shared many times over (refused: a shared-reference bomb)")


def text(value):
    """A name as valid UTF-8 text: surrogate pairs joined, lone surrogates U+FFFD. Only
    strings and numbers are names; anything else (a list nested 10^5 deep would make
    str() recurse) is no name."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return ""
    s = value if isinstance(value, str) else repr(value)
    return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def uint(entry, key, where, default=None):
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 2**64:
        raise InputError(f"{where}: '{key}': expected a non-negative integer, "
                         f"got {type(value).__name__}")
    return value


def site_of(frames, sites, budget, where):
    if not isinstance(frames, list) or not frames:
        return 0
    frame = frames[0]
    for f in frames:
        budget.spend(1, where)
        if isinstance(f, dict) and "/torch/" not in text(f.get("filename", "")):
            frame = f
            break
    if not isinstance(frame, dict):
        return 0
    key = (text(frame.get("filename", "")), frame.get("line", 0), text(frame.get("name", "")))
    if isinstance(key[1], bool) or not isinstance(key[1], int) or not 0 <= key[1] < 2**32:
        key = (key[0], 0, key[2])
    if key not in sites:
        sites[key] = len(sites) + 1
    return sites[key]


def convert(snapshot, device_filter, budget):
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise InputError("expected a dict with 'device_traces' "
                         "(the pickle of torch.cuda.memory._dump_snapshot)")
    traces = snapshot["device_traces"]
    if not isinstance(traces, list):
        raise InputError("device_traces: expected a list (one per device)")
    # Counted before anything is scanned: len() is free, a walk over 4e8 shared entries
    # is not.
    budget.spend(len(traces) + sum(len(t) for t in traces if isinstance(t, list)),
                 "device_traces")
    has_free_requested = any(isinstance(e, dict) and e.get("action") == "free_requested"
                             for t in traces if isinstance(t, list) for e in t)
    sites, events = {}, []
    for dev, trace in enumerate(traces):
        if device_filter is not None and dev != device_filter:
            continue
        if not isinstance(trace, list):
            raise InputError(f"device_traces[{dev}]: expected a list of entries")
        for i, entry in enumerate(trace):
            where = f"device_traces[{dev}][{i}]"
            if not isinstance(entry, dict):
                raise InputError(f"{where}: expected a dict")
            action = entry.get("action")
            if not isinstance(action, str):
                raise InputError(f"{where}: 'action': expected a string")
            mapped = ACTIONS.get(action)
            if mapped is None:
                continue
            if action == "free_completed" and not has_free_requested:
                mapped = "free"
            addr = uint(entry, "addr", where, 0 if action == "oom" else None)
            size = uint(entry, "size", where)
            stream = uint(entry, "stream", where, 0)
            if "time_us" in entry:
                time_ns = uint(entry, "time_us", where) * 1000
                if time_ns >= 2**63:
                    raise InputError(f"{where}: 'time_us': expected at most (2^63 - 1) / 1000")
            else:
                time_ns = len(events)
            site = (site_of(entry.get("frames"), sites, budget, where)
                    if mapped in ("alloc", "oom") else 0)
            events.append((time_ns, mapped, dev, stream, addr, size, site))
    return sites, events


def write(path, source, sites, events):
    """Writes the trace to `path`; "-" is stdout (memtrace import -o -)."""
    if path == "-":
        write_to(sys.stdout, source, sites, events)
        sys.stdout.flush()
        return
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        write_to(out, source, sites, events)


def write_to(out, source, sites, events):
    """Writes the trace to the text stream `out` (the fuzz harness passes a StringIO)."""
    first = min((e[0] for e in events), default=0)
    live = {}
    table = [{"id": i, "file": f, "line": ln, "function": fn, "tag": "", "kind": "alloc"}
             for (f, ln, fn), i in sites.items()]
    out.write(json.dumps({"schema": "devmem.trace/1", "sites": table,
                          "source": "pytorch-snapshot:" + text(source)},
                         separators=(",", ":")) + "\n")
    for seq, (time_ns, action, dev, stream, addr, size, site) in enumerate(events, 1):
        if action == "alloc":
            live[addr] = (size, site)
        requested = size if action in ("alloc", "free", "oom") else 0
        if action == "free":
            size, site = live.pop(addr, (size, 0))
            requested = size
        out.write(json.dumps(
            {"seq": seq, "time_ns": time_ns - first, "action": action,
             "device": f"cuda:{dev}", "stream": stream, "addr": addr, "size": size,
             "requested": requested, "site": site, "thread": 0},
            separators=(",", ":")) + "\n")


def main():
    parser = argparse.ArgumentParser(description="PyTorch memory snapshot -> devmem trace")
    parser.add_argument("snapshot")
    parser.add_argument("-o", "--output", required=True)
    parser.add_argument("--json", action="store_true",
                        help="print the summary as one JSON object (memtrace import --json)")
    parser.add_argument("--device", type=int, default=None,
                        help="keep only this device's events (default: all)")
    args = parser.parse_args()
    try:
        data = read(args.snapshot)
        size = len(data)
        limit_memory(size)
        snapshot = loads(data)
        del data
        sites, events = convert(snapshot, args.device, Budget(size))
    except InputError as e:
        print(f"{args.snapshot}: {e}", file=sys.stderr)
        return 2
    try:
        write(args.output, args.snapshot, sites, events)
    except OSError as e:
        print(f"{args.output}: cannot write ({e.strerror})", file=sys.stderr)
        return 2
    count = {a: sum(1 for e in events if e[1] == a) for a in ("alloc", "free", "oom")}
    live, unmatched = set(), 0  # frees of addresses the snapshot never showed allocated
    for e in events:
        if e[1] == "alloc":
            live.add(e[4])
        elif e[1] == "free":
            if e[4] in live:
                live.discard(e[4])
            else:
                unmatched += 1
    # The summary goes where memtrace's own importers put theirs: stdout, or stderr when
    # the trace itself is on stdout.
    report = sys.stderr if args.output == "-" else sys.stdout
    if args.json:
        print(json.dumps({"from": "pytorch-snapshot", "input": args.snapshot,
                          "output": args.output, "allocs": count["alloc"],
                          "frees": count["free"], "unmatched_frees": unmatched,
                          "ooms": count["oom"], "events": len(events)}), file=report)
    else:
        print(f"{args.snapshot}: {len(events)} events ({count['alloc']} allocations) -> "
              f"{args.output}", file=report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
