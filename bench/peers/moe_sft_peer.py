#!/usr/bin/env python3
"""PyTorch CPU peer for the moe_sft_fwd / moe_sft_bwd / moe_sft_step entries of
bench/bench_moe_sft.c (same kernel/dtype/shape keys): an autograd training step of the MoE layer
with LoRA on gate, up and down (docs/KERNELS.md section 3): a per-expert loop (gather the expert's
tokens, g = x W_g^T + s (x A_g^T) B_g^T through torch.nn.functional.linear, the same for up,
a = silu(g) u, z = a W_d^T + s (a A_d^T) B_d^T, y += w z by index_add), frozen bf16 base weights,
bf16 LoRA A and B that require grad (s = alpha / r, alpha = 2r as in ompk-bench), x and the
routing weights requiring grad too (ompk's backward gives dx and dw), loss gradient dy. Each rep
times the forward, the backward and the two together (median and minimum over reps), with all of
torch's threads (oneDNN uses AMX where the CPU has it). PyTorch has no int8 training matmul on the
CPU: the int8 keys time the same bf16 step (variant torch_expert_loop_bf16), the peer a team
would fall back to. 16*T*k*H*I FLOPs a step, 6 forward, 10 backward, as in ompk-bench.

usage: moe_sft_peer.py [--json FILE] [--filter S] [--reps N] [--quick]
"""
import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

KERNELS = ("moe_sft_fwd", "moe_sft_bwd", "moe_sft_step")
FLOPS = {"moe_sft_fwd": 6, "moe_sft_bwd": 10, "moe_sft_step": 16}


def rand(gen, *shape, req=False):
    t = (torch.rand(*shape, generator=gen) * 2 - 1).to(torch.bfloat16)
    return t.requires_grad_(req)


def make_layer(E, H, I, r, gen):
    base = [rand(gen, E, I, H), rand(gen, E, I, H), rand(gen, E, H, I)]
    # A [E,r,in], B [E,out,r]; B random (a zero B would be a different amount of work for no one)
    lora = [rand(gen, E, r, H, req=True), rand(gen, E, I, r, req=True),
            rand(gen, E, r, H, req=True), rand(gen, E, I, r, req=True),
            rand(gen, E, r, I, req=True), rand(gen, E, H, r, req=True)]
    return base, lora


def moe_sft_forward(x, ids, w, base, lora, s):
    gw, uw, dw = base
    ga, gb, ua, ub, da, db = lora
    y = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=gw.shape[0]).tolist()
    tok = order // ids.shape[1]
    wt = w.reshape(-1)[order]
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        t = tok[start:start + c]
        xe = x[t]
        g = F.linear(xe, gw[e]) + s * F.linear(F.linear(xe, ga[e]), gb[e])
        u = F.linear(xe, uw[e]) + s * F.linear(F.linear(xe, ua[e]), ub[e])
        a = F.silu(g) * u
        z = F.linear(a, dw[e]) + s * F.linear(F.linear(a, da[e]), db[e])
        y = y.index_add(0, t, z.float() * wt[start:start + c, None])
        start += c
    return y.to(torch.bfloat16)


def routing(T, E, k, gen):
    ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    w = 0.05 + 0.2 * torch.rand(T, k, generator=gen)
    return ids, w


def time_steps(x, ids, w, dy, base, lora, s, reps, warmup):
    """Per rep: the forward, the backward, and both (one clock across the two), in ms."""
    ts = {k: [] for k in KERNELS}
    for i in range(warmup + reps):
        xs = x.detach().requires_grad_()
        ws = w.detach().requires_grad_()
        for p in lora:
            p.grad = None
        t0 = time.perf_counter()
        y = moe_sft_forward(xs, ids, ws, base, lora, s)
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        if i >= warmup:
            ts["moe_sft_fwd"].append((t1 - t0) * 1e3)
            ts["moe_sft_bwd"].append((t2 - t1) * 1e3)
            ts["moe_sft_step"].append((t2 - t0) * 1e3)
    return {k: (statistics.median(v), min(v)) for k, v in ts.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--filter")
    ap.add_argument("--reps", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    kernels = [k for k in KERNELS if not args.filter or args.filter in k]
    if not kernels:
        return
    shapes = [(16, 512, 256, 4, 128)] if args.quick else [(64, 2048, 1408, 6, 4096),
                                                          (128, 2048, 768, 8, 1024)]
    cases = [("bf16", 8), ("bf16", 32), ("int8", 8)]
    threads = torch.get_num_threads()
    records = []
    out = {
        "tool": "moe_sft_peer.py",
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": threads,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "records": records,
    }

    def save():  # after every case: a run cut short by its time limit keeps what it measured
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=1)
    gen = torch.Generator().manual_seed(0)
    for E, H, I, k, T in shapes:
        ids, w = routing(T, E, k, gen)
        x = rand(gen, T, H)
        dy = rand(gen, T, H)
        for dtype, r in cases:
            if args.quick and r == 32:
                continue
            base, lora = make_layer(E, H, I, r, gen)
            res = time_steps(x, ids, w, dy, base, lora, 2.0, args.reps or 5, 1)
            shape = f"E{E} H{H} I{I} k{k} T{T} r{r}"
            variant = "torch_expert_loop" if dtype == "bf16" else "torch_expert_loop_bf16"
            for kern in kernels:
                ms, mn = res[kern]
                flops = FLOPS[kern] * T * k * H * I
                tfs = flops / (ms * 1e9)
                records.append({"backend": "host", "kernel": kern, "dtype": dtype, "shape": shape,
                                "variant": variant, "ms": ms, "ms_min": mn, "flops": flops,
                                "tflop_per_s": tfs, "threads": threads,
                                "tflop_per_s_per_core": tfs / threads})
                print(f"host  {kern:13s} {dtype:4s} {shape:30s} {variant:22s} {ms:10.3f} ms "
                      f"(min {mn:.3f})  {tfs:.3f} TFLOP/s = {tfs / threads:.4f}/core "
                      f"({threads} threads)", flush=True)
            fwd, bwd = res["moe_sft_fwd"][0], res["moe_sft_bwd"][0]
            print(f"      bwd/fwd {bwd / fwd:.2f}", flush=True)
            save()
            del base, lora
    save()


if __name__ == "__main__":
    main()
