#!/usr/bin/env python3
"""PyTorch peers for ompk_router_topk_fwd (issue 6), same kernel/shape keys as ompk-bench.

Two variants, each on the GPU (when there is one) and on the CPU:
  torch_full  all N^2 sums (sx[:, :, None] + sy[:, None, :], fp32) then torch.topk over N^2
  torch_axis  the per-axis trick: topk of sx and of sy (min(k, N) each), the k'^2 sums of those,
              topk over them, indices mapped back to i*N + j
Both compute the sums in fp32 like ompk. torch.topk does not promise the lower index on ties,
so the check below compares scores only (the ompk tests pin the indices).

usage: router_peer.py [--json FILE] [--filter S] [--quick] [--reps N]
"""
import argparse
import json
import platform
import time

import torch

from peer_timing import timeit


def full(sx, sy, k):
    T, N = sx.shape
    s = (sx.float()[:, :, None] + sy.float()[:, None, :]).reshape(T, N * N)
    v, i = torch.topk(s, k, dim=1)
    return v, i.to(torch.int32)


def axis(sx, sy, k):
    T, N = sx.shape
    kk = min(k, N)
    vx, ix = torch.topk(sx.float(), kk, dim=1)
    vy, iy = torch.topk(sy.float(), kk, dim=1)
    s = (vx[:, :, None] + vy[:, None, :]).reshape(T, kk * kk)
    v, p = torch.topk(s, k, dim=1)
    i = torch.gather(ix, 1, p // kk) * N + torch.gather(iy, 1, p % kk)
    return v, i.to(torch.int32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--filter")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=0)
    args = ap.parse_args()
    if args.filter and args.filter not in "router_topk_fwd":
        return
    T = 2048 if args.quick else 16384
    devs = (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]
    records = []
    torch.manual_seed(0)
    for dev in devs:
        for dt in (torch.float32, torch.bfloat16):
            for N in (64, 256):
                for k in (8, 32):
                    sx = (torch.rand(T, N, device=dev) * 2 - 1).to(dt)
                    sy = (torch.rand(T, N, device=dev) * 2 - 1).to(dt)
                    ref = None
                    line = []
                    for name, fn in (("torch_full", full), ("torch_axis", axis)):
                        big = dev == "cpu" and name == "torch_full"
                        reps = args.reps or (2 if big else (5 if dev == "cpu" else 20))
                        warm = 0 if big else (1 if dev == "cpu" else 3)
                        ms, mn = timeit(lambda: fn(sx, sy, k), dev, reps, warm)
                        v, _ = fn(sx, sy, k)
                        if ref is None:
                            ref = v
                        elif not torch.equal(v, ref):
                            print(f"warning: {name} scores differ from torch_full")
                        shape = f"T{T} N{N} k{k}"
                        dname = "f32" if dt == torch.float32 else "bf16"
                        backend = "gpu" if dev == "cuda" else "host"
                        esz = 4 if dt == torch.float32 else 2
                        rec = {
                            "backend": backend,
                            "kernel": "router_topk_fwd",
                            "dtype": dname,
                            "shape": shape,
                            "variant": name,
                            "ms": ms,
                            "ms_min": mn,
                            "bytes": T * (2 * N * esz + 8 * k),
                        }
                        records.append(rec)
                        line.append(f"{name} {ms:9.4f} ms (min {mn:.4f})")
                    # one line per shape, so a 30-line log tail holds every figure
                    print(f"{backend:5s} router_topk_fwd {dname:5s} {shape:20s} " + "  ".join(line),
                          flush=True)
    out = {
        "tool": "router_peer.py",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "records": records,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
