#!/usr/bin/env python3
"""tests/data/traces/generate.py: makes the synthetic workload traces beside it.

The traces are the allocation shapes users hit, small enough to keep in the
repository (each well under 1 MB) and to replay in a test:

  training_loop.jsonl   the seed's training loop (tensor/training_loop.cc) at a
                        realistic scale: a data set and a flat parameter buffer live
                        throughout; every batch allocates the same temporaries
                        (forward z1, n1, n2, loss; backward dn2, dw2, db2, dn1, dz1,
                        dw1, db1) and frees them at the end of the batch; each epoch
                        that improves clones the parameters (the previous best copy is
                        freed).
  transformer.jsonl     a transformer-like training step: parameters live throughout;
                        the forward pass allocates each layer's activations (inputs,
                        qkv, attention scores and probabilities, MLP up/activation/down)
                        and keeps them; the backward pass frees them in reverse order of
                        layers while it allocates short-lived gradient temporaries and
                        each layer's parameter gradients, which live until the optimizer
                        step; Adam's two moment buffers per parameter are allocated at
                        the first step and live on; gradients are freed after the step.
  fragmentation.jsonl   a fragmentation adversary: each round allocates 8 x 16 MiB,
                        frees every other one (a long-lived "survivor" pins each
                        remaining hole's neighbour), then asks for 4 x 32 MiB, which
                        fit in none of the 16 MiB holes; survivors of the round before
                        are freed late, so holes and survivors interleave across rounds.
                        Sizes carry a small seeded jitter (a few KiB), as real shapes do.
  multistream.jsonl     a multi-stream producer/consumer: a loader stream (1)
                        allocates input batches of varying size, a compute stream (2)
                        allocates work buffers and outputs for each batch and frees the
                        batch three batches later (a pipeline depth of 3); a copy-out
                        stream (3) frees outputs two batches later; model weights live
                        on the default stream (0).

Each file is a devmem trace (docs/formats.md, `devmem.trace/1`): a header line with
the site table (the synthetic "program" locations that allocate, so `memtrace
timeline` can stack by site), then one event per line with every field the runtime's
reader requires (seq, time_ns, action, device, stream, addr, size, requested, site,
thread). `size` equals `requested` (no allocator has rounded them: these are the
program's requests); addresses are made-up, unique while live.

Determinism: every random choice comes from random.Random(SEED) (one generator per
trace, seeded by the trace's name), and output is written with fixed formatting, so
running the script again reproduces the committed files byte for byte; the ctest
`traces.generated_match` checks that.

Usage: python3 generate.py [--out-dir DIR]   (default: the script's own folder)
"""
import argparse
import json
import os
import random
import zlib

SEED = 20240605
KiB = 1024
MiB = 1024 * KiB


class TraceWriter:
    """Collects events of one trace; addresses are a bump pointer (never reused)."""

    def __init__(self, name, sites):
        # One generator per trace: changing one workload leaves the others unchanged.
        self.rng = random.Random(SEED ^ zlib.crc32(name.encode()))
        self.sites = sites  # list of (id, file, line, function, tag, kind)
        self.lines = []
        self.seq = 0
        self.time_ns = 0
        self.next_addr = 0x7F0000000000
        self.live = {}  # addr -> (size, stream, site)

    def _event(self, action, addr, size, stream, site):
        self.seq += 1
        # Irregular but seeded gaps between events: 0.5-20 us, like a host launching ops.
        self.time_ns += self.rng.randint(500, 20000)
        self.lines.append(json.dumps(
            {"seq": self.seq, "time_ns": self.time_ns, "action": action, "device": "sim:0",
             "stream": stream, "addr": addr, "size": size, "requested": size,
             "site": site, "thread": 1},
            separators=(",", ":")))

    def alloc(self, size, site, stream=0):
        addr = self.next_addr
        self.next_addr += (size + 511) // 512 * 512 + 512
        self.live[addr] = (size, stream, site)
        self._event("alloc", addr, size, stream, site)
        return addr

    def free(self, addr):
        size, stream, site = self.live.pop(addr)
        self._event("free", addr, size, stream, site)

    def free_all(self, addrs):
        for a in addrs:
            self.free(a)

    def write(self, path):
        header = {"schema": "devmem.trace/1", "sites": [
            {"id": i, "file": f, "line": ln, "function": fn, "tag": tag, "kind": kind}
            for (i, f, ln, fn, tag, kind) in self.sites]}
        with open(path, "w", encoding="utf-8", newline="\n") as out:
            out.write(json.dumps(header, separators=(",", ":")) + "\n")
            for line in self.lines:
                out.write(line + "\n")


def site_table(file, entries):
    """(function, tag, kind) triples -> site table rows with ids 1.. and made-up lines."""
    return [(i + 1, file, 10 * (i + 1), fn, tag, kind)
            for i, (fn, tag, kind) in enumerate(entries)]


def training_loop(path):
    # tensor/training_loop.cc at scale: float32, batch 512, 2048 features, hidden 4096.
    sites = site_table("train.cc", [
        ("MakeData", "data", "to_device"), ("init", "params", "alloc"),
        ("linear", "forward", "alloc"), ("relu", "forward", "alloc"),
        ("loss", "loss", "alloc"), ("matmul", "backward", "alloc"),
        ("sum", "grad_bias", "alloc"), ("clone", "best_params", "clone")])
    t = TraceWriter("training_loop", sites)
    s = {row[4]: row[0] for row in sites}
    batch, features, hidden, batches, epochs = 512, 2048, 4096, 16, 6
    f32 = 4
    n = batch * batches
    data = [t.alloc(n * features * f32, s["data"]), t.alloc(n * f32, s["data"])]
    params = t.alloc((hidden * features + 2 * hidden + 1) * f32, s["params"])
    best = None
    losses = []
    for epoch in range(epochs):
        for _ in range(batches):
            z1 = t.alloc(batch * hidden * f32, s["forward"])
            n1 = t.alloc(batch * hidden * f32, s["forward"])
            n2 = t.alloc(batch * f32, s["forward"])
            loss = t.alloc(f32, s["loss"])
            dn2 = t.alloc(batch * f32, s["backward"])
            dw2 = t.alloc(hidden * f32, s["backward"])
            db2 = t.alloc(f32, s["grad_bias"])
            dn1 = t.alloc(batch * hidden * f32, s["backward"])
            dz1 = t.alloc(batch * hidden * f32, s["backward"])
            dw1 = t.alloc(hidden * features * f32, s["backward"])
            db1 = t.alloc(hidden * f32, s["grad_bias"])
            # Destructors run in reverse order of declaration at the end of the batch.
            t.free_all([db1, dw1, dz1, dn1, db2, dw2, dn2, loss, n2, n1, z1])
        # A seeded loss curve decides which epochs improve (and clone the parameters).
        losses.append(t.rng.random() / (epoch + 1))
        if losses[-1] == min(losses):
            new_best = t.alloc((hidden * features + 2 * hidden + 1) * f32, s["best_params"])
            if best is not None:
                t.free(best)
            best = new_best
    t.free_all([best, params] + data)
    t.write(path)


def transformer(path):
    # A GPT-like block stack: float32, batch 4, sequence 512, width 768, 12 heads, 6
    # layers, Adam; 3 steps (the first allocates the optimizer state).
    sites = site_table("model.py", [
        ("init", "params", "alloc"), ("embed", "activations", "alloc"),
        ("attention", "attn_scores", "alloc"), ("mlp", "mlp", "alloc"),
        ("backward", "grad_tmp", "alloc"), ("backward", "grads", "alloc"),
        ("adam", "optimizer_state", "alloc"), ("layernorm", "ln_stats", "alloc")])
    t = TraceWriter("transformer", sites)
    s = {row[4]: row[0] for row in sites}
    b, seq, d, heads, layers, steps = 4, 512, 768, 12, 6, 3
    f32 = 4
    vocab = 32000
    # Per layer parameters: qkv, proj, mlp up, mlp down, two layernorms (weights+bias).
    layer_params = [3 * d * d, 3 * d, d * d, d, 4 * d * d, 4 * d, 4 * d * d, d, 2 * d, 2 * d]
    param_sizes = [vocab * d] + [p for _ in range(layers) for p in layer_params] + [2 * d]
    params = [t.alloc(p * f32, s["params"]) for p in param_sizes]
    opt_state = []
    for _ in range(steps):
        tokens = t.alloc(b * seq * 8, s["activations"])
        x = t.alloc(b * seq * d * f32, s["activations"])
        saved = []  # per layer: the activations kept for backward
        for _layer in range(layers):
            acts = [
                t.alloc(b * seq * d * f32, s["activations"]),         # ln1 out
                t.alloc(b * seq * 2 * f32, s["ln_stats"]),            # mean/rstd
                t.alloc(b * seq * 3 * d * f32, s["activations"]),     # qkv
                t.alloc(b * heads * seq * seq * f32, s["attn_scores"]),  # scores
                t.alloc(b * heads * seq * seq * f32, s["attn_scores"]),  # softmax
                t.alloc(b * seq * d * f32, s["activations"]),         # attn out
                t.alloc(b * seq * d * f32, s["activations"]),         # residual 1
                t.alloc(b * seq * d * f32, s["activations"]),         # ln2 out
                t.alloc(b * seq * 2 * f32, s["ln_stats"]),
                t.alloc(b * seq * 4 * d * f32, s["mlp"]),             # up
                t.alloc(b * seq * 4 * d * f32, s["mlp"]),             # gelu
                t.alloc(b * seq * d * f32, s["activations"]),         # residual 2
            ]
            # A temporary of the softmax (max-subtracted scores) dies at once.
            t.free(t.alloc(b * heads * seq * seq * f32, s["attn_scores"]))
            saved.append(acts)
        logits = t.alloc(b * seq * vocab * f32 // 8, s["activations"])  # a chunked head
        loss = t.alloc(f32, s["activations"])
        # Backward: the head first, then the layers in reverse; each layer's gradient
        # temporaries live only while that layer runs, its activations die after it.
        dlogits = t.alloc(b * seq * vocab * f32 // 8, s["grad_tmp"])
        t.free_all([loss, logits])
        grads = [None] * len(params)
        grads[-1] = t.alloc(param_sizes[-1] * f32, s["grads"])
        dx = t.alloc(b * seq * d * f32, s["grad_tmp"])
        t.free(dlogits)
        for layer in reversed(range(layers)):
            acts = saved.pop()
            tmp = [t.alloc(b * seq * 4 * d * f32, s["grad_tmp"]),      # d gelu
                   t.alloc(b * heads * seq * seq * f32, s["grad_tmp"]),  # d softmax
                   t.alloc(b * seq * 3 * d * f32, s["grad_tmp"])]       # d qkv
            base = 1 + layer * len(layer_params)
            for i, p in enumerate(layer_params):
                grads[base + i] = t.alloc(p * f32, s["grads"])
            new_dx = t.alloc(b * seq * d * f32, s["grad_tmp"])
            t.free_all(list(reversed(tmp)) + [dx] + list(reversed(acts)))
            dx = new_dx
        grads[0] = t.alloc(param_sizes[0] * f32, s["grads"])
        t.free_all([dx, x, tokens])
        # Adam: moments allocated at the first step, kept; an update temporary per
        # parameter; then the gradients are freed (zero_grad(set_to_none=True)).
        if not opt_state:
            for p in param_sizes:
                opt_state.append(t.alloc(p * f32, s["optimizer_state"]))
                opt_state.append(t.alloc(p * f32, s["optimizer_state"]))
        for p in param_sizes:
            t.free(t.alloc(p * f32, s["grad_tmp"]))
        t.free_all(grads)
    t.free_all(opt_state + params)
    t.write(path)


def fragmentation(path):
    sites = site_table("adversary.cc", [
        ("small", "16MiB", "alloc"), ("large", "32MiB", "alloc"),
        ("survivor", "survivor", "alloc")])
    t = TraceWriter("fragmentation", sites)
    s = {row[4]: row[0] for row in sites}
    jitter = lambda: t.rng.randint(0, 8) * KiB  # noqa: E731
    survivors_prev = []
    for _ in range(40):
        small = [t.alloc(16 * MiB + jitter(), s["16MiB"]) for _ in range(8)]
        # Every other one dies; the rest become survivors that outlive the next round.
        keep = [a for i, a in enumerate(small) if i % 2 == 1]
        t.free_all([a for i, a in enumerate(small) if i % 2 == 0])
        large = [t.alloc(32 * MiB + jitter(), s["32MiB"]) for _ in range(4)]
        # A few long-lived small buffers between the large ones (the pinning pattern).
        pins = [t.alloc(t.rng.choice([1, 2, 4]) * MiB, s["survivor"]) for _ in range(2)]
        t.free_all(survivors_prev)
        order = list(range(4))
        t.rng.shuffle(order)
        t.free_all([large[i] for i in order])
        survivors_prev = keep + pins
    t.free_all(survivors_prev)
    t.write(path)


def multistream(path):
    sites = site_table("pipeline.cc", [
        ("load", "loader", "alloc"), ("compute", "work", "alloc"),
        ("compute", "output", "alloc"), ("init", "weights", "alloc")])
    t = TraceWriter("multistream", sites)
    s = {row[4]: row[0] for row in sites}
    loader, compute, copy_out = 1, 2, 3
    weights = [t.alloc(sz * MiB, s["weights"]) for sz in (64, 64, 32, 8)]
    inputs, outputs = [], []
    for _ in range(150):
        # Batches of varying size (variable-length inputs), seeded.
        batch = t.alloc(t.rng.choice([6, 8, 10, 12]) * MiB + t.rng.randint(0, 63) * 4 * KiB,
                        s["loader"], loader)
        inputs.append(batch)
        work = [t.alloc(t.rng.choice([2, 4, 8]) * MiB, s["work"], compute) for _ in range(3)]
        out = t.alloc(t.rng.choice([1, 2, 3]) * MiB, s["output"], compute)
        t.free_all(reversed(work))
        outputs.append(out)
        if len(inputs) > 3:
            t.free(inputs.pop(0))  # compute is done with the batch three batches ago
        if len(outputs) > 2:
            t.free(outputs.pop(0))  # copied out two batches later
    t.free_all(inputs + outputs + weights)
    t.write(path)


WORKLOADS = {
    "training_loop.jsonl": training_loop,
    "transformer.jsonl": transformer,
    "fragmentation.jsonl": fragmentation,
    "multistream.jsonl": multistream,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    for name, make in WORKLOADS.items():
        make(os.path.join(args.out_dir, name))


if __name__ == "__main__":
    main()
