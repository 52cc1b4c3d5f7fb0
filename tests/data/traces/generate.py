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
  serving_varbatch.jsonl
                        LLM inference serving with a batch size that varies from
                        request to request: weights live throughout; batches of 1-32
                        sequences with their own prompt (32-512 tokens) and output
                        length arrive while up to 6 are in flight; prefill allocates
                        activations that scale with batch x prompt (attention with
                        batch x prompt^2) and die layer by layer; every decoded token
                        regrows each layer's KV cache by one position (allocate the
                        longer keys and values, free the old: torch.cat, as Hugging
                        Face's DynamicCache does), so long-lived buffers of ever
                        changing sizes interleave with short-lived ones.
  training_varseq.jsonl transformer training whose sequence length changes from step
                        to step (batches padded to their longest sequence, 128-1024
                        tokens): saved activations scale with the length, attention
                        scores with its square; parameters and Adam's moments live on,
                        gradients live until the step; each layer's gradients are
                        all-reduced through a bucket on a communication stream (1).
  finetune_eval.jsonl   the two mixed: fine-tuning with a varying sequence length and,
                        every third step, an evaluation pass without gradients over a
                        batch of varying size (1-64 sequences) while the optimizer
                        state lives; inputs arrive on a loader stream (1).

Each file is a devmem trace (docs/formats.md, `devmem.trace/1`): a header line with
the site table (the synthetic "program" locations that allocate, so `memtrace
timeline` can stack by site), then one event per line with every field the runtime's
reader requires (seq, time_ns, action, device, stream, addr, size, requested, site,
thread). `size` equals `requested` (no allocator has rounded them: these are the
program's requests); addresses are made-up, unique while live.

Determinism: every random choice comes from random.Random(seed) (one generator per
trace, seeded by the seed and the trace's name), and output is written with fixed formatting, so
running the script again reproduces the committed files byte for byte; the ctest
`traces.generated_match` checks that.

Usage: python3 generate.py [--out-dir DIR] [--seed N] [--only NAME ...]
(default: every trace, into the script's own folder, from SEED). Another --seed gives
the same workloads with other random choices (batch sizes, lengths, jitter): new
workloads to check a policy on (tools/replay/fit_sweep.py does that), not the committed ones.
"""
import argparse
import json
import os
import random
import zlib

SEED = 20240605   # the committed traces' seed
seed = SEED       # the seed in use (main() sets it from --seed)
KiB = 1024
MiB = 1024 * KiB


class TraceWriter:
    """Collects events of one trace; addresses are a bump pointer (never reused)."""

    def __init__(self, name, sites):
        # One generator per trace: changing one workload leaves the others unchanged.
        self.rng = random.Random(seed ^ zlib.crc32(name.encode()))
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


def start_trace(name, file, entries):
    """A TraceWriter for trace `name` with the site table of `entries` (as site_table
    takes them), and the map from each site's tag to its id."""
    sites = site_table(file, entries)
    return TraceWriter(name, sites), {row[4]: row[0] for row in sites}


def training_loop(path):
    # tensor/training_loop.cc at scale: float32, batch 512, 2048 features, hidden 4096.
    t, s = start_trace("training_loop", "train.cc", [
        ("MakeData", "data", "to_device"), ("init", "params", "alloc"),
        ("linear", "forward", "alloc"), ("relu", "forward", "alloc"),
        ("loss", "loss", "alloc"), ("matmul", "backward", "alloc"),
        ("sum", "grad_bias", "alloc"), ("clone", "best_params", "clone")])
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
    t, s = start_trace("transformer", "model.py", [
        ("init", "params", "alloc"), ("embed", "activations", "alloc"),
        ("attention", "attn_scores", "alloc"), ("mlp", "mlp", "alloc"),
        ("backward", "grad_tmp", "alloc"), ("backward", "grads", "alloc"),
        ("adam", "optimizer_state", "alloc"), ("layernorm", "ln_stats", "alloc")])
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
    t, s = start_trace("fragmentation", "adversary.cc", [
        ("small", "16MiB", "alloc"), ("large", "32MiB", "alloc"),
        ("survivor", "survivor", "alloc")])
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
    t, s = start_trace("multistream", "pipeline.cc", [
        ("load", "loader", "alloc"), ("compute", "work", "alloc"),
        ("compute", "output", "alloc"), ("init", "weights", "alloc")])
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


def serving_varbatch(path):
    # An inference server for a decoder-only model (fp16, width 1024, 16 heads, 3
    # layers, vocabulary 32000) that batches requests as they come: every batch has its
    # own size (1-32 sequences), prompt length (32-512 tokens) and number of tokens to
    # generate (4-10), and up to 6 batches are in flight at once, each decoding one
    # token per tick. The KV cache grows the way Hugging Face's DynamicCache grows it
    # (torch.cat): every new token allocates each layer's keys and values one position
    # longer and frees the old ones.
    t, s = start_trace("serving_varbatch", "serve.py", [
        ("load", "weights", "alloc"), ("kv_cache", "kv_cache", "alloc"),
        ("prefill", "activations", "alloc"), ("attention", "attn_scores", "alloc"),
        ("mlp", "mlp", "alloc"), ("decode", "decode_tmp", "alloc"),
        ("lm_head", "logits", "alloc")])
    d, heads, layers, vocab, f16, f32 = 1024, 16, 3, 32000, 2, 4
    # Weights load once and live throughout: embedding, per layer qkv, proj, MLP up and
    # down, two layernorms.
    layer_weights = [3 * d * d, d * d, 4 * d * d, 4 * d * d, 2 * d, 2 * d]
    weights = [t.alloc(vocab * d * f16, s["weights"])]
    weights += [t.alloc(w * f16, s["weights"]) for _ in range(layers) for w in layer_weights]
    in_flight = []  # per batch: [batch size, context length, tokens left, kv buffers]
    admitted, batches, max_in_flight = 0, 20, 6
    while admitted < batches or in_flight:
        while len(in_flight) < max_in_flight and admitted < batches:
            admitted += 1
            b = t.rng.choice([1, 2, 4, 6, 8, 12, 16, 24, 32])
            prompt = t.rng.randint(2, 32) * 16
            new_tokens = t.rng.randint(4, 10)
            # Prefill: the prompt's activations, each layer's temporaries dying with it;
            # the layer's keys and values stay in the cache.
            x = t.alloc(b * prompt * d * f16, s["activations"])
            kv = []
            for _ in range(layers):
                ln = t.alloc(b * prompt * d * f16, s["activations"])
                qkv = t.alloc(b * prompt * 3 * d * f16, s["activations"])
                kv += [t.alloc(b * prompt * d * f16, s["kv_cache"]),
                       t.alloc(b * prompt * d * f16, s["kv_cache"])]
                scores = t.alloc(b * heads * prompt * prompt * f16, s["attn_scores"])
                attn = t.alloc(b * prompt * d * f16, s["activations"])
                t.free_all([scores, qkv, ln])
                up = t.alloc(b * prompt * 4 * d * f16, s["mlp"])
                y = t.alloc(b * prompt * d * f16, s["activations"])
                t.free_all([up, attn, x])
                x = y
            logits = t.alloc(b * vocab * f32, s["logits"])  # the last position only
            t.free_all([logits, x])
            in_flight.append([b, prompt, new_tokens, kv])
        # One decode tick: each batch in flight generates one token.
        for batch in in_flight:
            b, ctx, kv = batch[0], batch[1], batch[3]
            for layer in range(layers):
                qkv = t.alloc(b * 3 * d * f16, s["decode_tmp"])
                k = t.alloc(b * (ctx + 1) * d * f16, s["kv_cache"])
                v = t.alloc(b * (ctx + 1) * d * f16, s["kv_cache"])
                t.free_all(kv[2 * layer:2 * layer + 2])
                kv[2 * layer:2 * layer + 2] = [k, v]
                scores = t.alloc(b * heads * (ctx + 1) * f32, s["attn_scores"])
                t.free_all([scores, qkv])
            t.free(t.alloc(b * vocab * f32, s["logits"]))
            batch[1] += 1
            batch[2] -= 1
        for batch in [x for x in in_flight if x[2] == 0]:
            in_flight.remove(batch)
            t.free_all(batch[3])
    t.free_all(weights)
    t.write(path)


def training_varseq(path):
    # Transformer training (fp32, batch 8, width 768, 12 heads, 6 layers, Adam) whose
    # batches are padded to their longest sequence, so the sequence length changes
    # every step (128-1024 tokens, multiples of 64): activations scale with it,
    # attention scores with its square. Gradients are bucketed and all-reduced on a
    # communication stream (1), as data-parallel training does.
    t, s = start_trace("training_varseq", "train_lm.py", [
        ("init", "params", "alloc"), ("embed", "activations", "alloc"),
        ("attention", "attn_scores", "alloc"), ("mlp", "mlp", "alloc"),
        ("backward", "grad_tmp", "alloc"), ("backward", "grads", "alloc"),
        ("adam", "optimizer_state", "alloc"), ("allreduce", "comm_bucket", "alloc")])
    b, d, heads, layers, steps, vocab, f32 = 8, 768, 12, 6, 9, 32000, 4
    comm = 1
    layer_params = [3 * d * d, 3 * d, d * d, d, 4 * d * d, 4 * d, 4 * d * d, d, 2 * d, 2 * d]
    param_sizes = [vocab * d] + [p for _ in range(layers) for p in layer_params] + [2 * d]
    params = [t.alloc(p * f32, s["params"]) for p in param_sizes]
    opt_state = []
    for _ in range(steps):
        seq = t.rng.randint(2, 16) * 64
        tok = b * seq
        x = t.alloc(tok * d * f32, s["activations"])
        saved = []
        for _layer in range(layers):
            acts = [t.alloc(tok * d * f32, s["activations"]),             # ln1 out
                    t.alloc(tok * 3 * d * f32, s["activations"]),         # qkv
                    t.alloc(b * heads * seq * seq * f32, s["attn_scores"]),  # softmax
                    t.alloc(tok * d * f32, s["activations"]),             # attn out
                    t.alloc(tok * d * f32, s["activations"]),             # ln2 out
                    t.alloc(tok * 4 * d * f32, s["mlp"]),                 # up
                    t.alloc(tok * 4 * d * f32, s["mlp"]),                 # gelu
                    t.alloc(tok * d * f32, s["activations"])]             # residual
            # The raw scores die once the softmax has them.
            t.free(t.alloc(b * heads * seq * seq * f32, s["attn_scores"]))
            saved.append(acts)
        logits = t.alloc(tok * vocab * f32 // 16, s["activations"])  # a chunked head
        dlogits = t.alloc(tok * vocab * f32 // 16, s["grad_tmp"])
        t.free(logits)
        grads = [None] * len(params)
        grads[-1] = t.alloc(param_sizes[-1] * f32, s["grads"])
        dx = t.alloc(tok * d * f32, s["grad_tmp"])
        t.free(dlogits)
        for layer in reversed(range(layers)):
            acts = saved.pop()
            tmp = [t.alloc(tok * 4 * d * f32, s["grad_tmp"]),
                   t.alloc(b * heads * seq * seq * f32, s["grad_tmp"]),
                   t.alloc(tok * 3 * d * f32, s["grad_tmp"])]
            base = 1 + layer * len(layer_params)
            for i, p in enumerate(layer_params):
                grads[base + i] = t.alloc(p * f32, s["grads"])
            new_dx = t.alloc(tok * d * f32, s["grad_tmp"])
            t.free_all(list(reversed(tmp)) + [dx] + list(reversed(acts)))
            dx = new_dx
            # This layer's gradients are ready: all-reduce them through a bucket on
            # the communication stream (freed there once the reduction is done).
            bucket = sum(layer_params) * f32
            t.free(t.alloc(bucket, s["comm_bucket"], comm))
        grads[0] = t.alloc(param_sizes[0] * f32, s["grads"])
        t.free_all([dx, x])
        if not opt_state:
            for p in param_sizes:
                opt_state += [t.alloc(p * f32, s["optimizer_state"]),
                              t.alloc(p * f32, s["optimizer_state"])]
        t.free_all(grads)
    t.free_all(opt_state + params)
    t.write(path)


def finetune_eval(path):
    # Fine-tuning with evaluation in between (a mix of the two shapes above): a
    # transformer (fp32, width 1024, 16 heads, 4 layers, Adam) trains on batches of 4
    # sequences whose padded length changes every step (64-768 tokens); every third
    # step is followed by an evaluation pass without gradients over a batch of varying
    # size (1-64 sequences of 256 tokens), whose activations die layer by layer. Input
    # batches are copied in on a loader stream (1) and freed when the step is done.
    t, s = start_trace("finetune_eval", "finetune.py", [
        ("init", "params", "alloc"), ("loader", "inputs", "alloc"),
        ("forward", "activations", "alloc"), ("attention", "attn_scores", "alloc"),
        ("backward", "grad_tmp", "alloc"), ("backward", "grads", "alloc"),
        ("adam", "optimizer_state", "alloc"), ("evaluate", "eval", "alloc")])
    d, heads, layers, vocab, steps, f32 = 1024, 16, 4, 32000, 12, 4
    loader = 1
    layer_params = [3 * d * d, d * d, 4 * d * d, 4 * d * d, 4 * d]
    param_sizes = [vocab * d] + [p for _ in range(layers) for p in layer_params]
    params = [t.alloc(p * f32, s["params"]) for p in param_sizes]
    opt_state = []
    for step in range(steps):
        b, seq = 4, t.rng.randint(1, 12) * 64
        tok = b * seq
        inputs = t.alloc(tok * 8, s["inputs"], loader)
        x = t.alloc(tok * d * f32, s["activations"])
        saved = []
        for _ in range(layers):
            saved.append([t.alloc(tok * 3 * d * f32, s["activations"]),
                          t.alloc(b * heads * seq * seq * f32, s["attn_scores"]),
                          t.alloc(tok * d * f32, s["activations"]),
                          t.alloc(tok * 4 * d * f32, s["activations"]),
                          t.alloc(tok * d * f32, s["activations"])])
        grads = []
        dx = t.alloc(tok * d * f32, s["grad_tmp"])
        for layer in reversed(range(layers)):
            tmp = [t.alloc(tok * 4 * d * f32, s["grad_tmp"]),
                   t.alloc(b * heads * seq * seq * f32, s["grad_tmp"])]
            grads += [t.alloc(p * f32, s["grads"]) for p in layer_params]
            new_dx = t.alloc(tok * d * f32, s["grad_tmp"])
            t.free_all(list(reversed(tmp)) + [dx] + list(reversed(saved.pop())))
            dx = new_dx
        grads.append(t.alloc(param_sizes[0] * f32, s["grads"]))
        t.free_all([dx, x, inputs])
        if not opt_state:
            opt_state = [t.alloc(p * f32, s["optimizer_state"])
                         for p in param_sizes for _ in range(2)]
        t.free_all(grads)
        if step % 3 == 2:
            eb, eseq = t.rng.choice([1, 2, 4, 8, 16, 32, 48, 64]), 256
            etok = eb * eseq
            einputs = t.alloc(etok * 8, s["inputs"], loader)
            x = t.alloc(etok * d * f32, s["eval"])
            for _ in range(layers):
                qkv = t.alloc(etok * 3 * d * f32, s["eval"])
                scores = t.alloc(eb * heads * eseq * eseq * f32, s["eval"])
                attn = t.alloc(etok * d * f32, s["eval"])
                t.free_all([scores, qkv])
                up = t.alloc(etok * 4 * d * f32, s["eval"])
                y = t.alloc(etok * d * f32, s["eval"])
                t.free_all([up, attn, x])
                x = y
            t.free(t.alloc(eb * vocab * f32, s["eval"]))
            t.free_all([x, einputs])
    t.free_all(opt_state + params)
    t.write(path)


WORKLOADS = {
    "training_loop.jsonl": training_loop,
    "transformer.jsonl": transformer,
    "fragmentation.jsonl": fragmentation,
    "multistream.jsonl": multistream,
    "serving_varbatch.jsonl": serving_varbatch,
    "training_varseq.jsonl": training_varseq,
    "finetune_eval.jsonl": finetune_eval,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--seed", type=int, default=SEED,
                        help="seed of the random choices (default: the committed traces')")
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS),
                        help="write only this trace (repeatable)")
    args = parser.parse_args()
    global seed
    seed = args.seed
    os.makedirs(args.out_dir, exist_ok=True)
    for name, make in WORKLOADS.items():
        if args.only is None or name in args.only:
            make(os.path.join(args.out_dir, name))


if __name__ == "__main__":
    main()
