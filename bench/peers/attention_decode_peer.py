"""PyTorch peer of ompk-bench's attention_decode entry: F.scaled_dot_product_attention with
enable_gqa on the same decode shapes (32 query heads on 8 kv heads, dh 128, bf16), on the GPU.
The record's bytes are K and V read once plus q and out, as ompk-bench counts them."""
import argparse
import json

import torch
import torch.nn.functional as F

from peer_timing import timeit

SHAPES = [(4, 1, 32768), (4, 4, 32768), (4, 16, 32768), (1, 1, 32768), (4, 1, 4096), (1, 16, 8192)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--filter")
    args = ap.parse_args()
    if args.filter and args.filter not in "attention_decode":
        return
    records = []
    torch.manual_seed(0)
    Hq, Hkv, dh = 32, 8, 128
    for B, N, M in SHAPES:
        q = torch.randn(B, Hq, N, dh, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, Hkv, M, dh, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)

        def fn():
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        ms, mn = timeit(fn, "cuda", args.reps, 5)
        nbytes = 2 * k.numel() * 2 + 2 * q.numel() * 2
        shape = f"B{B} Hq{Hq} Hkv{Hkv} N{N} M{M} dh{dh}"
        rec = {"backend": "gpu", "kernel": "attention_decode", "dtype": "bf16", "shape": shape,
               "variant": "torch_sdpa_gqa", "ms": ms, "ms_min": mn, "bytes": nbytes,
               "gb_per_s": nbytes / ms / 1e6, "flops": 4.0 * B * Hq * N * M * dh}
        records.append(rec)
        print(f"gpu  attention_decode bf16 {shape:36s} sdpa {ms * 1e3:9.1f} us "
              f"{rec['gb_per_s']:8.0f} GB/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__},
                       "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
