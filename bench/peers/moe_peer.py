#!/usr/bin/env python3
"""PyTorch CPU peer for the moe_fwd entries of bench/bench_moe.c (same kernel/dtype/shape keys):
a per-expert loop (gather the expert's tokens, gate/up matmuls, SiLU*up, down, weighted
index_add), bf16 weights and activations, on the CPU with all of torch's threads (oneDNN uses AMX
where the CPU has it). Prefill: 1024 tokens; decode: 1 token, round-robin over 8 layers so the
weights come from memory, as in ompk-bench.

usage: moe_peer.py [--json FILE] [--filter S] [--reps N] [--quick]
"""
import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F


def make_layer(E, H, I, gen):
    s = 1.0
    g = ((torch.rand(E, I, H, generator=gen) * 2 - 1) * s).to(torch.bfloat16)
    u = ((torch.rand(E, I, H, generator=gen) * 2 - 1) * s).to(torch.bfloat16)
    d = ((torch.rand(E, H, I, generator=gen) * 2 - 1) * s).to(torch.bfloat16)
    return g, u, d


def moe_forward(x, ids, w, layer):
    g, u, d = layer
    y = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=g.shape[0]).tolist()
    tok = order // ids.shape[1]
    wt = w.reshape(-1)[order]
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        t = tok[start:start + c]
        xe = x[t]
        a = F.silu(xe @ g[e].t()) * (xe @ u[e].t())
        o = (a @ d[e].t()).float() * wt[start:start + c, None]
        y.index_add_(0, t, o)
        start += c
    return y.to(torch.bfloat16)


def routing(T, E, k, gen):
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    w = 0.05 + 0.2 * torch.rand(T, k, generator=gen)
    return ids, w


def timeit(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), min(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--filter")
    ap.add_argument("--reps", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.filter and args.filter not in "moe_fwd":
        return
    E, H, I, k = (16, 512, 256, 4) if args.quick else (128, 2048, 768, 8)
    Tp = 64 if args.quick else 1024
    gen = torch.Generator().manual_seed(0)
    layers = [make_layer(E, H, I, gen) for _ in range(8)]
    records = []
    wbytes = 3 * H * I * 2
    for T, nl in ((Tp, 1), (1, 8)):
        ids, w = routing(T, E, k, gen)
        x = (torch.rand(T, H, generator=gen) * 2 - 1).to(torch.bfloat16)
        state = {"i": 0}

        def call():
            with torch.no_grad():
                moe_forward(x, ids, w, layers[state["i"]])
            state["i"] = (state["i"] + 1) % nl

        reps = args.reps or (10 if T > 1 else 50)
        ms, mn = timeit(call, reps, 3)
        nused = len(set(ids.reshape(-1).tolist()))
        flops = 6.0 * H * I * T * k
        byts = wbytes * nused + 4.0 * T * H
        shape = f"E{E} H{H} I{I} k{k} T{T}" + (" L8rr" if nl > 1 else "")
        rec = {"backend": "host", "kernel": "moe_fwd", "dtype": "bf16", "shape": shape,
               "variant": "torch_expert_loop", "ms": ms, "ms_min": mn, "bytes": byts,
               "flops": flops, "gb_per_s": byts / (ms * 1e6), "tflop_per_s": flops / (ms * 1e9)}
        records.append(rec)
        print(f"host  moe_fwd bf16 {shape:28s} torch_expert_loop {ms:10.4f} ms (min {mn:.4f})"
              f"  {rec['tflop_per_s']:.3f} TFLOP/s  {rec['gb_per_s']:.1f} GB/s", flush=True)
    out = {
        "tool": "moe_peer.py",
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "records": records,
    }
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
