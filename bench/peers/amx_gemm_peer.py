#!/usr/bin/env python3
"""What PyTorch's own CPU GEMM (oneDNN, AMX where the CPU has it) reaches per core on this
machine, as the practical ceiling the MoE tile kernels are measured against (bench/amx/amx_peak.c
gives the instruction-level ones): bf16 x bf16 -> bf16 matmuls of the MoE layer's shapes (one
expert's routes times its gate+up and down weights, and the backward's transposed products) and
one large square GEMM, with all of torch's threads. Prints one line per shape and a JSON file.

usage: amx_gemm_peer.py [--json FILE] [--reps N]
"""
import argparse
import json
import os
import statistics
import time

import torch

# (label, M, K, N): rows are an expert's routes (E64 k6 T4096: 384 on average)
SHAPES = [
    ("expert gate+up fwd  E64", 384, 2048, 2816),
    ("expert down fwd     E64", 384, 1408, 2048),
    ("expert dx bwd       E64", 384, 2816, 2048),
    ("square              ", 4096, 4096, 4096),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    nt = torch.get_num_threads()
    gen = torch.Generator().manual_seed(1)
    out = []
    for label, M, K, N in SHAPES:
        x = torch.rand(M, K, generator=gen).to(torch.bfloat16)
        w = torch.rand(K, N, generator=gen).to(torch.bfloat16)
        # independent GEMMs in a batch of 16 so every thread has one at the expert shapes, as
        # the MoE layer's experts run side by side
        batch = 16 if M < 1024 else 1
        xs = x.expand(batch, M, K).contiguous()
        ws = w.expand(batch, K, N).contiguous()
        for _ in range(3):
            torch.bmm(xs, ws)
        ts = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            torch.bmm(xs, ws)
            ts.append(time.perf_counter() - t0)
        med = statistics.median(ts)
        tf = 2.0 * batch * M * K * N / med * 1e-12
        out.append({"shape": label.strip(), "M": M, "K": K, "N": N, "batch": batch,
                    "median_ms": med * 1e3, "min_ms": min(ts) * 1e3, "tflops": tf,
                    "tflops_per_core": tf / nt, "threads": nt})
        print(f"torch bmm bf16 {label} x{batch}: {med * 1e3:8.3f} ms  {tf:6.2f} TFLOP/s "
              f"= {tf / nt:.3f} per core ({nt} threads; best {2.0 * batch * M * K * N / min(ts) * 1e-12 / nt:.3f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": nt, "cpus": os.cpu_count(),
                       "results": out}, f, indent=1)


if __name__ == "__main__":
    main()
