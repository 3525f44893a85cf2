#!/usr/bin/env python3
"""PyTorch peers for the mHC entries of bench/bench_mhc_pre.c and bench/bench_mhc.c, with the
same kernel/dtype/shape keys as ompk-bench. Each is timed eagerly and under torch.compile, on the
GPU (B4 S4096 n4 D4096, n8 D2048 with the same bytes of x, and n = 1, 2, 6 at D2048) and on the
CPU (B1 S1024 n4 D2048), bf16 x. fp32 math throughout, like ompk. The backward peers are the
same explicit formulas the kernels implement (docs/KERNELS.md 1.4-1.6), so eager and compiled
versions time the same math; `mhc_pre_fwd_sinkhorn_bwd` is the training step (pre forward with
Sinkhorn, then autograd backward through both).

usage: mhc_peer.py [--json FILE] [--filter S] [--reps N] [--devs cuda,cpu]
                   [--compile-devs cuda,cpu]
The JSON file is rewritten after every record, so a run cut short keeps what it measured.
"""
import argparse
import json
import platform
import time
import traceback

import torch

from peer_timing import timeit

NORM_EPS, HC_EPS, POST_MULT, REPEAT, SK_EPS = 1e-6, 1e-6, 2.0, 20, 1e-6


def sinkhorn(lg):
    c = torch.softmax(lg, dim=-1) + SK_EPS
    c = c / (c.sum(dim=-2, keepdim=True) + SK_EPS)
    for _ in range(REPEAT - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + SK_EPS)
        c = c / (c.sum(dim=-2, keepdim=True) + SK_EPS)
    return c


def sinkhorn_bwd(lg, g):
    p = torch.softmax(lg, dim=-1)
    zs = []
    c = p + SK_EPS
    for r in range(REPEAT):
        if r > 0:
            zs.append((c, -1))
            c = c / (c.sum(dim=-1, keepdim=True) + SK_EPS)
        zs.append((c, -2))
        c = c / (c.sum(dim=-2, keepdim=True) + SK_EPS)
    for z, ax in reversed(zs):
        den = z.sum(dim=ax, keepdim=True) + SK_EPS
        g = (g - (g * z).sum(dim=ax, keepdim=True) / den) / den
    return (g - (g * p).sum(dim=-1, keepdim=True)) * p


def pre_fwd(x, phi, gamma, alpha, bias):
    B, S, n, D = x.shape
    T, K = B * S, n * D
    v = x.reshape(T, K).float()
    h_mix = (v * gamma) @ phi.t()
    inv = torch.rsqrt(v.square().mean(dim=-1, keepdim=True) + NORM_EPS)
    hm = h_mix * inv
    h_pre = torch.sigmoid(alpha[0] * hm[:, :n] + bias[:n]) + HC_EPS
    h_post = POST_MULT * torch.sigmoid(alpha[1] * hm[:, n:2 * n] + bias[n:2 * n])
    res = (alpha[2] * hm[:, 2 * n:] + bias[2 * n:]).reshape(T, n, n)
    h_in = (h_pre.unsqueeze(-1) * v.reshape(T, n, D)).sum(dim=1).to(x.dtype)
    return h_in, h_post, res, h_mix, inv, h_pre


def pre_fwd_fused(x, phi, gamma, alpha, bias):
    h_in, h_post, res, h_mix, inv, h_pre = pre_fwd(x, phi, gamma, alpha, bias)
    return h_in, h_post, sinkhorn(res), res, h_mix, inv, h_pre


def pre_bwd(x, phi, gamma, alpha, dh_in, dh_post, dh_res, h_mix, inv, h_pre, h_post):
    B, S, n, D = x.shape
    T, K = B * S, n * D
    v = x.reshape(T, K).float()
    dh_pre = torch.einsum("td,tid->ti", dh_in.float(), v.reshape(T, n, D))
    s = h_pre - HC_EPS
    dz = torch.cat([dh_pre * s * (1 - s), dh_post * h_post * (1 - h_post / POST_MULT),
                    dh_res.reshape(T, n * n)], dim=1)
    scale = torch.cat([alpha[0].expand(n), alpha[1].expand(n), alpha[2].expand(n * n)])
    hm = h_mix * inv
    dhm = dz * scale
    dh_mix = dhm * inv
    g = dz * hm
    dalpha = torch.stack([g[:, :n].sum(), g[:, n:2 * n].sum(), g[:, 2 * n:].sum()])
    dbias = dz.sum(dim=0)
    dinv = (dhm * h_mix).sum(dim=1, keepdim=True)
    dW = dh_mix.t() @ v
    dphi = dW * gamma
    dgamma = (dW * phi).sum(dim=0)
    dx = (dh_mix @ phi) * gamma - dinv * inv.pow(3) / K * v
    dx = dx.reshape(T, n, D) + h_pre.unsqueeze(-1) * dh_in.float().unsqueeze(1)
    return dx.to(x.dtype), dphi, dalpha, dbias, dgamma


def post_fwd(x, comb, post, f):
    return (post.unsqueeze(-1) * f.float().unsqueeze(-2) +
            torch.einsum("bsio,bsid->bsod", comb, x.float())).to(x.dtype)


def post_bwd(x, comb, post, f, dout):
    g = dout.float()
    dx = torch.einsum("bsio,bsod->bsid", comb, g).to(x.dtype)
    df = torch.einsum("bso,bsod->bsd", post, g).to(x.dtype)
    dpost = torch.einsum("bsod,bsd->bso", g, f.float())
    dcomb = torch.einsum("bsid,bsod->bsio", x.float(), g)
    return dx, df, dpost, dcomb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--filter")
    ap.add_argument("--reps", type=int, default=0)
    ap.add_argument("--devs", default="cuda,cpu")
    ap.add_argument("--compile-devs", default="cuda,cpu")
    args = ap.parse_args()
    if args.filter and "mhc" not in args.filter:
        return
    devs = [d for d in args.devs.split(",") if d == "cpu" or torch.cuda.is_available()]
    records = []
    out = {
        "tool": "mhc_peer.py",
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "",
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "records": records,
    }

    def save():
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=1)
    # the GPU shapes are ompk-bench's: the n4, an n8 with the same bytes of x, and n = 1,
    # 2, 6 at the n8 shape's D
    runs = [(dev, shp) for dev in devs
            for shp in ([(4, 4096, 4, 4096)] + [(4, 4096, n, 2048) for n in (8, 1, 2, 6)]
                        if dev == "cuda"
                        else [(1, 1024, 4, 2048)])]
    for dev, (B, S, n, D) in runs:
        T, K, M = B * S, n * D, 2 * n + n * n
        torch.manual_seed(0)
        kw = dict(device=dev)
        x = (torch.rand(B, S, n, D, **kw) * 2 - 1).to(torch.bfloat16)
        phi = (torch.rand(M, K, **kw) * 2 - 1) / K ** 0.5
        gamma = 1 + 0.1 * torch.rand(K, **kw)
        alpha = torch.tensor([0.8, 1.1, 1.3], **kw)
        bias = 0.3 * torch.rand(M, **kw)
        f = (torch.rand(B, S, D, **kw) * 2 - 1).to(torch.bfloat16)
        dout = (torch.rand(B, S, n, D, **kw) * 2 - 1).to(torch.bfloat16)
        dh_in = (torch.rand(B * S, D, **kw) * 2 - 1).to(torch.bfloat16)
        dh_post = torch.rand(T, n, **kw)
        dcomb = torch.rand(T, n, n, **kw)
        with torch.no_grad():
            h_in, h_post, comb, res, h_mix, inv, h_pre = pre_fwd_fused(x, phi, gamma, alpha, bias)
        dh_res = sinkhorn_bwd(res, dcomb)
        post = h_post.reshape(B, S, n)
        comb4 = comb.reshape(B, S, n, n)

        def train():
            xs = x.detach().requires_grad_()
            ps = [t.detach().requires_grad_() for t in (phi, gamma, alpha, bias)]
            o = fwd_fn(xs, *ps)
            loss = (o[0].float() * dh_in).sum() + (o[1] * dh_post).sum() + (o[2] * dcomb).sum()
            loss.backward()
            return xs.grad

        cases = {
            "mhc_pre_fwd": lambda fn: (lambda: fn(x, phi, gamma, alpha, bias)),
            "mhc_sinkhorn_fwd": lambda fn: (lambda: fn(res)),
            "mhc_sinkhorn_bwd": lambda fn: (lambda: fn(res, dcomb)),
            "mhc_pre_bwd": lambda fn: (lambda: fn(x, phi, gamma, alpha, dh_in, dh_post, dh_res,
                                                  h_mix, inv, h_pre, h_post)),
            "mhc_pre_fwd_sinkhorn_bwd": None,
            "mhc_post_fwd": lambda fn: (lambda: fn(x, comb4, post, f)),
            "mhc_post_bwd": lambda fn: (lambda: fn(x, comb4, post, f, dout)),
        }
        fns = {"mhc_pre_fwd": pre_fwd_fused, "mhc_sinkhorn_fwd": sinkhorn,
               "mhc_sinkhorn_bwd": sinkhorn_bwd, "mhc_pre_bwd": pre_bwd,
               "mhc_pre_fwd_sinkhorn_bwd": pre_fwd_fused, "mhc_post_fwd": post_fwd,
               "mhc_post_bwd": post_bwd}
        variants = ["torch_eager"] + (["torch_compile"] if dev in args.compile_devs else [])
        for kernel, mk in cases.items():
            if args.filter and args.filter not in kernel and args.filter != "mhc":
                continue
            for var in variants:
                try:
                    fn = fns[kernel]
                    if var == "torch_compile":
                        torch._dynamo.reset()
                        fn = torch.compile(fn)
                    if mk is None:
                        fwd_fn = fn
                        call = train
                    else:
                        inner = mk(fn)

                        def call(inner=inner):
                            with torch.no_grad():
                                return inner()
                    reps = args.reps or (20 if dev == "cuda" else 5)
                    ms, mn = timeit(call, dev, reps, 3 if dev == "cuda" else 1)
                except Exception as e:  # a failed compile is a result too
                    print(f"{dev} {kernel} {var}: {type(e).__name__}: {e}")
                    traceback.print_exc(limit=2)
                    continue
                backend = "gpu" if dev == "cuda" else "host"
                shape = f"B{B} S{S} n{n} D{D}"
                records.append({"backend": backend, "kernel": kernel, "dtype": "bf16",
                                "shape": shape, "variant": var, "ms": ms, "ms_min": mn})
                print(f"{backend:5s} {kernel:26s} bf16 {shape:22s} {var:14s} {ms:10.4f} ms"
                      f" (min {mn:.4f})", flush=True)
                save()
        del x, dout, f
        if dev == "cuda":
            torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    main()
