"""PyTorch references of docs/KERNELS.md (any dtype; the tests run them in float64)."""
import torch
import torch.nn.functional as F


def sinkhorn(logits, repeat=20, eps=1e-6):
    c = torch.softmax(logits, dim=-1) + eps
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
    return c


def mhc_pre(x, phi, gamma, alpha, bias, norm_eps=1e-6, hc_eps=1e-6, post_mult=2.0, repeat=20,
            sinkhorn_eps=1e-6):
    B, S, n, D = x.shape
    v = x.reshape(B, S, n * D)
    g = gamma if gamma is not None else torch.ones_like(v[0, 0])
    h_mix = (v * g) @ phi.t()
    inv_rms = torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + norm_eps)
    hm = h_mix * inv_rms
    h_pre = torch.sigmoid(alpha[0] * hm[..., :n] + bias[:n]) + hc_eps
    h_post = post_mult * torch.sigmoid(alpha[1] * hm[..., n:2 * n] + bias[n:2 * n])
    res = (alpha[2] * hm[..., 2 * n:] + bias[2 * n:]).reshape(B, S, n, n)
    h_in = (h_pre.unsqueeze(-1) * x).sum(2)
    return h_in, h_post, sinkhorn(res, repeat, sinkhorn_eps)


def mhc_post(x, comb, post, f):
    return post.unsqueeze(-1) * f.unsqueeze(2) + torch.einsum("bsio,bsid->bsod", comb, x)


def attention(q, k, v, scale=None, mask="none"):
    Hq, Hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(Hq // Hkv, dim=1)
    v = v.repeat_interleave(Hq // Hkv, dim=1)
    N, M = q.shape[2], k.shape[2]
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if mask != "none":
        i = torch.arange(N, device=q.device).unsqueeze(1)
        j = torch.arange(M, device=q.device).unsqueeze(0)
        vis = j <= i if mask == "causal" else j <= i + M - N
        s = s.masked_fill(~vis, float("-inf"))
    return torch.softmax(s, -1) @ v


def router_topk(sx, sy, k):
    T, N = sx.shape
    if sx.dtype != torch.float64:
        sx, sy = sx.float(), sy.float()
    s = (sx.unsqueeze(2) + sy.unsqueeze(1)).reshape(T, N * N)
    return torch.topk(s, k, dim=1, sorted=True)


def moe(x, ids, w, gate, up, down, lora=None, lora_scale=1.0):
    """bf16 operands counted as the kernels consume them: x and a rounded to bf16 (identity in
    the gradient, as the C backward counts them)."""
    def rnd(t):
        return t + (t.to(torch.bfloat16).to(t.dtype) - t).detach()

    xb = rnd(x)
    y = torch.zeros_like(x)
    for slot in range(ids.shape[1]):
        e = ids[:, slot].long()
        live = (e >= 0).to(x.dtype).unsqueeze(1)  # id -1 is padding
        e = e.clamp(min=0)
        g = torch.einsum("tih,th->ti", gate[e], xb)
        u = torch.einsum("tih,th->ti", up[e], xb)
        if lora is not None:
            ga, gb, ua, ub, da, db = lora
            g = g + lora_scale * torch.einsum("tir,trh,th->ti", gb[e], ga[e], xb)
            u = u + lora_scale * torch.einsum("tir,trh,th->ti", ub[e], ua[e], xb)
        a = rnd(F.silu(g) * u)
        z = torch.einsum("thi,ti->th", down[e], a)
        if lora is not None:
            z = z + lora_scale * torch.einsum("thr,tri,ti->th", db[e], da[e], a)
        y = y + live * w[:, slot:slot + 1] * z
    return y
