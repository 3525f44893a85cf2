#!/usr/bin/env python3
"""PyTorch peers for ompk_attention_fwd / ompk_attention_bwd: F.scaled_dot_product_attention on
the GPU (whatever backend PyTorch picks: FlashAttention / cuDNN / efficient for bf16, the math or
efficient kernel for f32) and on the CPU, with the kernel/dtype/shape keys of ompk-bench.

Backward is timed alone: one forward with autograd, then torch.autograd.grad(out, (q, k, v),
dout, retain_graph=True) per repetition. FLOPs follow the FlashAttention convention (forward
4*B*H*N*M*dh, half under a causal mask; backward 2.5x forward), as ompk-bench does.

usage: attention_peer.py [--json FILE] [--filter S] [--quick] [--reps N] [--device cpu|cuda]
                         [--threads N]
--device runs one device only (the host measurement on a machine that also has a GPU); --threads
sets torch.set_num_threads (default: PyTorch's own choice).
"""
import argparse
import json
import platform

import torch
import torch.nn.functional as F

from peer_timing import timeit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--filter")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=0)
    ap.add_argument("--device", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    records = []
    torch.manual_seed(0)
    devs = (["cuda"] if torch.cuda.is_available() else []) + ["cpu"]
    if args.device:
        devs = [d for d in devs if d == args.device]
    for dev in devs:
        if dev == "cuda":
            B, H, N, dh = 4, 16, 4096, 128
        elif args.quick:
            B, H, N, dh = 1, 4, 1024, 64
        else:
            B, H, N, dh = 1, 8, 2048, 128
        for kernel in ("attention_fwd", "attention_bwd"):
            if args.filter and args.filter not in kernel:
                continue
            for dt in (torch.bfloat16, torch.float32):
                for causal in (False, True):
                    q = torch.randn(B, H, N, dh, device=dev, dtype=dt)
                    k = torch.randn_like(q)
                    v = torch.randn_like(q)
                    if kernel == "attention_fwd":
                        def fn():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    else:
                        for t in (q, k, v):
                            t.requires_grad_()
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        dout = torch.randn_like(out)

                        def fn():
                            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
                    reps = args.reps or (20 if dev == "cuda" else 3)
                    warm = 3 if dev == "cuda" else 1
                    ms, mn = timeit(fn, dev, reps, warm)
                    fl = 4.0 * B * H * N * N * dh * (0.5 if causal else 1.0)
                    if kernel == "attention_bwd":
                        fl *= 2.5
                    shape = f"B{B} H{H} N{N} dh{dh}" + (" causal" if causal else "")
                    rec = {
                        "backend": "gpu" if dev == "cuda" else "host",
                        "kernel": kernel,
                        "dtype": "bf16" if dt == torch.bfloat16 else "f32",
                        "shape": shape,
                        "variant": "torch_sdpa",
                        "ms": ms,
                        "ms_min": mn,
                        "flops": fl,
                        "tflop_per_s": fl / ms / 1e9,
                        "threads": torch.get_num_threads() if dev == "cpu" else None,
                    }
                    records.append(rec)
                    print(f"{rec['backend']:4s} {kernel:14s} {rec['dtype']:4s} {shape:28s} "
                          f"sdpa {ms:9.3f} ms {rec['tflop_per_s']:8.2f} TFLOP/s", flush=True)
                    del q, k, v
                    if dev == "cuda":
                        torch.cuda.empty_cache()
    if args.json:
        meta = {
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "cpu": platform.processor() or platform.machine(),
        }
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
