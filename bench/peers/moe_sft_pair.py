#!/usr/bin/env python3
"""ompk's MoE fine-tuning step and PyTorch's, alternating step by step in one process, so that each
ratio compares two steps taken within about a second of each other. The lent Xeon's AMX rate per
vCPU moves by up to 2x from minute to minute (bench/results/2026-11-27-h200-xeon-moe-sft-rank1-s15),
so separate runs of ompk-bench and moe_sft_peer.py compare different machines.

ompk: the `ompk.torch.MoE` module (python/), the layer a PyTorch user trains with: y = moe(x, ids,
w); y.backward(dy) gives dx, dw and the LoRA gradients. PyTorch: moe_sft_peer.py's step (a
per-expert loop with LoRA through F.linear, autograd, bf16). Same base weights, routing, x, dy and
adapter values on both sides (alpha = 2r). The int8 base times PyTorch's bf16 step (it has no int8
training matmul on the CPU).

usage: moe_sft_pair.py [--shape E,H,I,k,T] [--rank R] [--format bf16|int8] [--grad split|bf16]
                       [--pairs N] [--warmup N] [--json FILE]
Needs the ompk Python package on PYTHONPATH (python/) and libompk (OMPK_LIBRARY or the loader).
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_sft_peer import make_layer, moe_sft_forward, rand, routing  # noqa: E402

import ompk.torch as ot  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="64,2048,1408,6,4096")
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--format", default="bf16", choices=["bf16", "int8"])
    ap.add_argument("--grad", default="split", choices=["split", "bf16"])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    E, H, I, k, T = (int(v) for v in a.shape.split(","))
    r, s = a.rank, 2.0
    gen = torch.Generator().manual_seed(0)
    ids, w = routing(T, E, k, gen)
    x, dy = rand(gen, T, H), rand(gen, T, H)
    base, lora = make_layer(E, H, I, r, gen)
    moe = ot.MoE(*base, top_k=k, max_tokens=T, format=a.format, lora_rank=r, lora_alpha=2.0 * r,
                 cache_depth=1, grad_operands=a.grad)
    with torch.no_grad():
        for name, t in zip(ot._LORA, lora):
            getattr(moe, name).copy_(t.float())
    ids32 = ids.to(torch.int32)

    def step_ompk():
        xs, ws = x.detach().requires_grad_(), w.detach().requires_grad_()
        for p in moe.lora():
            p.grad = None
        t0 = time.perf_counter()
        moe(xs, ids32, ws).backward(dy)
        return (time.perf_counter() - t0) * 1e3

    def step_torch():
        xs, ws = x.detach().requires_grad_(), w.detach().requires_grad_()
        for p in lora:
            p.grad = None
        t0 = time.perf_counter()
        moe_sft_forward(xs, ids, ws, base, lora, s).backward(dy)
        return (time.perf_counter() - t0) * 1e3

    om, pt = [], []
    for i in range(a.warmup + a.pairs):
        to, tt = step_ompk(), step_torch()
        if i >= a.warmup:
            om.append(to)
            pt.append(tt)
            print(f"pair {i - a.warmup + 1}: ompk {to:8.1f} ms  torch {tt:8.1f} ms  "
                  f"x{tt / to:5.2f}", flush=True)
    ratios = [p / o for o, p in zip(om, pt)]
    flops = 16 * T * k * H * I
    threads = torch.get_num_threads()
    shape = f"E{E} H{H} I{I} k{k} T{T} r{r}"
    res = {"tool": "moe_sft_pair.py", "torch": torch.__version__,
           "cpu": platform.processor() or platform.machine(), "threads": threads,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "shape": shape,
           "format": a.format, "grad_operands": a.grad, "ompk_ms": om, "torch_ms": pt,
           "ratios": ratios, "median_ratio": statistics.median(ratios),
           "ompk_median_ms": statistics.median(om), "torch_median_ms": statistics.median(pt),
           "ompk_tflop_per_s_per_thread": flops / (statistics.median(om) * 1e9) / threads}
    print(f"{shape} {a.format} grad {a.grad}: ompk median {res['ompk_median_ms']:.1f} ms, torch "
          f"{res['torch_median_ms']:.1f} ms, x torch per pair median {res['median_ratio']:.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}), ompk "
          f"{res['ompk_tflop_per_s_per_thread']:.3f} TFLOP/s per thread ({threads})", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
