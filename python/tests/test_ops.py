"""Every op against a float64 PyTorch reference (values and gradients), torch.autograd.gradcheck
(f32 inputs, tolerances for f32 finite differences) and torch.library.opcheck."""
import pytest
import torch
from torch.library import opcheck

import ompk.torch as ot
import reference as R

B, S, n, D = 2, 3, 2, 32
M, K = 2 * n + n * n, n * D


def mhc_inputs(dev, gamma=True):
    x = torch.randn(B, S, n, D, device=dev)
    phi = torch.randn(M, K, device=dev) * 0.2
    g = torch.rand(K, device=dev) + 0.5 if gamma else None
    alpha = torch.tensor([0.8, 0.9, 1.1], device=dev)
    bias = torch.randn(M, device=dev) * 0.1
    return [x, phi, g, alpha, bias]


def attn_inputs(dev, N=5, Mk=7):
    return [torch.randn(1, 4, N, 32, device=dev), torch.randn(1, 2, Mk, 32, device=dev),
            torch.randn(1, 2, Mk, 32, device=dev)]


def router_inputs(dev, T=6, N=5):
    # a permutation keeps every pair sum apart, so no tie flips under gradcheck's perturbation
    sx = torch.randperm(T * N).reshape(T, N).float().to(dev) * 0.37
    sy = torch.randperm(T * N).reshape(T, N).float().to(dev) * 0.011
    return [sx, sy]


def compare(fo, fr, inputs, rtol):
    """Values and input gradients of fo (ompk, f32, on the inputs' device) against fr (reference,
    float64 on the CPU). GPU kernels may sum in other orders and on tensor cores: 1e-4 there."""
    if any(t is not None and t.is_cuda for t in inputs):
        rtol = max(rtol, 1e-4)
    a = [None if t is None else t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    b = [None if t is None else t.detach().double().cpu().requires_grad_(t.is_floating_point())
         for t in inputs]
    oa, ob = fo(*a), fr(*b)
    oa = oa if isinstance(oa, tuple) else (oa,)
    ob = ob if isinstance(ob, tuple) else (ob,)
    ws = [torch.randn_like(o) for o in ob]
    for x, y in zip(oa, ob):
        torch.testing.assert_close(x.double().cpu(), y, rtol=rtol,
                                   atol=rtol * y.abs().max().item())
    sum((x.double() * w.to(x.device)).sum() for x, w in zip(oa, ws)).backward()
    sum((y * w).sum() for y, w in zip(ob, ws)).backward()
    for i, (x, y) in enumerate(zip(a, b)):
        if x is not None and x.requires_grad:
            scale = y.grad.abs().max().item()
            torch.testing.assert_close(x.grad.double().cpu(), y.grad, rtol=rtol,
                                       atol=rtol * scale, msg=lambda m: f"input {i}: {m}")


def gradcheck(fn, inputs):
    inputs = [None if t is None else t.detach().clone().requires_grad_(t.is_floating_point())
              for t in inputs]
    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(fn, inputs, eps=1e-3, atol=2e-2, rtol=2e-2,
                                        fast_mode=True)


# ---- mHC ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [True, False])
def test_mhc_pre_matches_reference(device, gamma):
    compare(ot.mhc_pre, R.mhc_pre, mhc_inputs(device, gamma), 2e-5)


def test_mhc_pre_bf16(device):
    x, phi, g, alpha, bias = mhc_inputs(device)
    xb = x.bfloat16()
    out = ot.mhc_pre(xb, phi, g, alpha, bias)
    ref = R.mhc_pre(xb.double(), phi.double(), g.double(), alpha.double(), bias.double())
    assert out[0].dtype == torch.bfloat16
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.double(), r, rtol=1e-2, atol=1e-2 * r.abs().max().item())


def test_mhc_pre_gradcheck(device):
    x, phi, g, alpha, bias = mhc_inputs(device)
    gradcheck(lambda *a: ot.mhc_pre(*a), [x[:1, :2], phi, g, alpha, bias])


def test_mhc_post_matches_reference(device):
    x = torch.randn(B, S, n, D, device=device)
    comb = torch.rand(B, S, n, n, device=device)
    post = torch.rand(B, S, n, device=device)
    f = torch.randn(B, S, D, device=device)
    compare(ot.mhc_post, R.mhc_post, [x, comb, post, f], 2e-5)


def test_mhc_post_gradcheck(device):
    gradcheck(ot.mhc_post, [torch.randn(1, 2, n, D, device=device),
                            torch.rand(1, 2, n, n, device=device), torch.rand(1, 2, n, device=device),
                            torch.randn(1, 2, D, device=device)])


def test_mhc_opcheck(device):
    x, phi, g, alpha, bias = [t.requires_grad_() for t in mhc_inputs(device)]
    opcheck(ot.mhc_pre_op, (x, phi, g, alpha, bias, 1e-6, 1e-6, 2.0, 20, 1e-6))
    h_in, h_post, comb, res, h_mix, inv_rms, h_pre = ot.mhc_pre_op(
        *(t.detach() for t in (x, phi, g, alpha, bias)), 1e-6, 1e-6, 2.0, 20, 1e-6)
    opcheck(ot.sinkhorn_bwd_op, (res, torch.randn_like(comb), 20, 1e-6))
    opcheck(ot.mhc_pre_bwd_op, (x.detach(), phi.detach(), g.detach(), alpha.detach(),
                                torch.randn_like(h_in), torch.randn_like(h_post),
                                torch.randn_like(res), h_mix, inv_rms, h_pre, h_post, 1e-6, 2.0))
    f = torch.randn(B, S, D, device=device, requires_grad=True)
    args = (x, comb.requires_grad_(), h_post.requires_grad_(), f)
    opcheck(ot.mhc_post_op, args)
    opcheck(ot.mhc_post_bwd_op, tuple(a.detach() for a in args) + (torch.randn_like(x),))


def post_pre_inputs(dev, gamma=True):
    x, phi, g, alpha, bias = mhc_inputs(dev, gamma)
    post_in = [x, torch.rand(B, S, n, n, device=dev), torch.rand(B, S, n, device=dev),
               torch.randn(B, S, D, device=dev)]
    return post_in + [phi, g, alpha, bias]


def post_pre_reference(x, comb, post, f, *pre):
    x_out = R.mhc_post(x, comb, post, f)
    return (x_out,) + R.mhc_pre(x_out, *pre)


@pytest.mark.parametrize("gamma", [True, False])
def test_mhc_post_pre_matches_reference(device, gamma):
    compare(ot.mhc_post_pre, post_pre_reference, post_pre_inputs(device, gamma), 2e-5)


def test_mhc_post_pre_bf16(device):
    x, comb, post, f, phi, g, alpha, bias = post_pre_inputs(device)
    xb, fb = x.bfloat16(), f.bfloat16()
    out = ot.mhc_post_pre(xb, comb, post, fb, phi, g, alpha, bias)
    ref = post_pre_reference(*(t.double() for t in (xb, comb, post, fb, phi, g, alpha, bias)))
    assert out[0].dtype == torch.bfloat16 and out[1].dtype == torch.bfloat16
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.double(), r, rtol=1e-2, atol=1e-2 * r.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mhc_post_pre_equals_post_then_pre(device, dtype):
    """Values and every input's gradient bit for bit those of ot.mhc_post followed by ot.mhc_pre,
    x_out's gradient from outside included."""
    inputs = post_pre_inputs(device)
    inputs[0], inputs[3] = inputs[0].to(dtype), inputs[3].to(dtype)
    a = [t.clone().requires_grad_() for t in inputs]
    b = [t.clone().requires_grad_() for t in inputs]
    fused = ot.mhc_post_pre(*a)
    x_out = ot.mhc_post(*b[:4])
    apart = (x_out,) + ot.mhc_pre(x_out, *b[4:])
    ws = [torch.randn_like(o) for o in fused]
    for o, p in zip(fused, apart):
        assert o.dtype == p.dtype and torch.equal(o, p)
    sum((o * w).sum() for o, w in zip(fused, ws)).backward()
    sum((o * w).sum() for o, w in zip(apart, ws)).backward()
    for i, (u, v) in enumerate(zip(a, b)):
        assert u.grad is not None and torch.equal(u.grad, v.grad), f"input {i}"


def test_mhc_post_pre_gradcheck(device):
    inputs = post_pre_inputs(device)
    for i in range(4):
        inputs[i] = inputs[i][:1, :2]
    gradcheck(lambda *a: ot.mhc_post_pre(*a), inputs)


def test_mhc_post_pre_opcheck(device):
    inputs = [t.requires_grad_() for t in post_pre_inputs(device)]
    opcheck(ot.mhc_post_pre_op, tuple(inputs) + (1e-6, 1e-6, 2.0, 20, 1e-6))
    opcheck(ot.mhc_post_pre_op, tuple(inputs[:5]) + (None,) + tuple(inputs[6:])
            + (1e-6, 1e-6, 2.0, 20, 1e-6))


# ---- attention ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mask", ["none", "causal", "causal_bottom_right"])
def test_attention_matches_reference(device, mask):
    compare(lambda q, k, v: ot.attention(q, k, v, mask=mask),
            lambda q, k, v: R.attention(q, k, v, mask=mask), attn_inputs(device), 2e-5)


def test_attention_bf16_and_scale(device):
    q, k, v = (t.bfloat16() for t in attn_inputs(device))
    out = ot.attention(q, k, v, scale=0.3, mask="causal")
    ref = R.attention(q.double().cpu(), k.double().cpu(), v.double().cpu(), scale=0.3,
                      mask="causal")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double().cpu(), ref, rtol=2e-2, atol=2e-2)


def test_attention_gradcheck(device):
    q, k, v = attn_inputs(device, N=3, Mk=4)
    gradcheck(lambda q, k, v: ot.attention(q, k, v, mask="causal_bottom_right"), [q, k, v])


def test_attention_opcheck(device):
    q, k, v = [t.requires_grad_() for t in attn_inputs(device)]
    opcheck(ot.attention_op, (q, k, v, 0.0, 1))
    out, lse = ot.attention_op(q.detach(), k.detach(), v.detach(), 0.0, 1)
    opcheck(ot.attention_bwd_op, (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out,
                                  lse, 0.0, 1))


# ---- router -------------------------------------------------------------------------------------


def test_router_matches_reference(device):
    sx, sy = router_inputs(device)
    s, i = ot.router_topk(sx, sy, 4)
    rs, ri = R.router_topk(sx.cpu(), sy.cpu(), 4)
    assert i.dtype == torch.int32 and torch.equal(i.cpu().long(), ri)
    compare(lambda a, b: ot.router_topk(a, b, 4)[0], lambda a, b: R.router_topk(a, b, 4)[0],
            [sx, sy], 2e-6)


def test_router_bf16_gradient_dtype():
    sx, sy = (t.bfloat16().requires_grad_() for t in router_inputs("cpu"))
    s, _ = ot.router_topk(sx, sy, 3)
    s.sum().backward()
    assert sx.grad.dtype == torch.bfloat16 and sx.grad.sum().item() == 3 * sx.shape[0]


def test_router_gradcheck(device):
    gradcheck(lambda a, b: ot.router_topk(a, b, 4)[0], router_inputs(device))


def test_router_opcheck(device):
    sx, sy = [t.requires_grad_() for t in router_inputs(device)]
    opcheck(ot.router_topk_op, (sx, sy, 4))
    s, i = ot.router_topk_op(sx.detach(), sy.detach(), 4)
    opcheck(ot.router_topk_bwd_op, (torch.randn_like(s), i, 5))


# ---- MoE ----------------------------------------------------------------------------------------

E, H, I, TOPK, T = 4, 32, 16, 2, 6


def moe_layer(rank=4, depth=8):
    bf = lambda t: t.bfloat16().float()  # noqa: E731
    gate, up = bf(torch.randn(E, I, H) / H**0.5), bf(torch.randn(E, I, H) / H**0.5)
    down = bf(torch.randn(E, H, I) / I**0.5)
    layer = ot.MoE(gate, up, down, TOPK, T, lora_rank=rank, lora_alpha=8.0, cache_depth=depth,
                   threads=2)
    with torch.no_grad():
        for p in layer.lora():
            if p is not None:
                p.normal_(0, 0.3)
    return layer, (gate, up, down)


def moe_inputs(device):
    ids = torch.randint(-1, E, (T, TOPK), dtype=torch.int32, device=device)
    return torch.randn(T, H, device=device), ids, torch.rand(T, TOPK, device=device)


@pytest.mark.parametrize("rank", [0, 4])
def test_moe_matches_reference(device, rank):
    layer, w3 = moe_layer(rank)
    x, ids, w = moe_inputs(device)
    lora = layer.lora() if rank else None
    scale = layer.lora_alpha / rank if rank else 1.0
    with torch.no_grad():
        y = layer(x, ids, w)
    ref = R.moe(x.double().cpu(), ids.cpu(), w.double().cpu(), *(t.double() for t in w3),
                None if lora is None else [p.detach().double() for p in lora], scale)
    torch.testing.assert_close(y.double().cpu(), ref, rtol=1e-4, atol=1e-4)
    # the training forward and backward: x, routing weights and the adapters
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = layer(xa, ids, wa)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    xb, wb = x.double().cpu().requires_grad_(), w.double().cpu().requires_grad_()
    lb = None if lora is None else [p.detach().double().requires_grad_() for p in lora]
    yb = R.moe(xb, ids.cpu(), wb, *(t.double() for t in w3), lb, scale)
    (yb * dy.double().cpu()).sum().backward()
    torch.testing.assert_close(xa.grad.double().cpu(), xb.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(wa.grad.double().cpu(), wb.grad, rtol=1e-4, atol=1e-4)
    for p, q in zip(lora or [], lb or []):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-4)


def test_moe_grad_operands_bf16(device):
    # bf16 operands for the backward's data-gradient products: within a few bf16 roundings of the
    # default's gradients, and not the same numbers (the option took effect)
    layer, (gate, up, down) = moe_layer(4)
    fast = ot.MoE(gate, up, down, TOPK, T, lora_rank=4, lora_alpha=8.0, threads=2,
                  grad_operands="bf16")
    with torch.no_grad():
        for p, q in zip(fast.lora(), layer.lora()):
            p.copy_(q)
    x, ids, w = moe_inputs(device)
    dy = torch.randn(T, H, device=device)
    gx = []
    for m in (layer, fast):
        xa = x.clone().requires_grad_()
        (m(xa, ids, w) * dy).sum().backward()
        gx.append(xa.grad.double().cpu())
    torch.testing.assert_close(gx[1], gx[0], rtol=3e-2, atol=3e-2 * gx[0].abs().max().item())
    assert not torch.equal(gx[1], gx[0])
    with pytest.raises(KeyError):
        ot.MoE(gate, up, down, TOPK, T, grad_operands="fp8")


def test_moe_gradcheck(device):
    # x and a pass through bf16 roundings (piecewise constant), so finite differences can only
    # see the routing weights and B_down, which enter after them; the adapters live on the host
    layer, _ = moe_layer()
    x, ids, w = moe_inputs(device)
    base = [p.detach().clone() for p in layer.lora()]

    w = w.requires_grad_()
    db = base[5].clone().requires_grad_()

    def wrapped(w, db):
        # down_b reaches the op as the layer's parameter; gradients flow back through it
        with torch.no_grad():
            layer.down_b.copy_(db)
        return _MoeDownB.apply(w, db, layer, x, ids, base)

    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(wrapped, [w, db], eps=1e-3, atol=2e-2, rtol=2e-2,
                                        fast_mode=True)


class _MoeDownB(torch.autograd.Function):
    """y(w, B_down) through the ompk ops, for gradcheck's finite differences."""

    @staticmethod
    def forward(ctx, w, db, layer, x, ids, base):
        lora = base[:5] + [layer.down_b]
        ctx.layer, ctx.x, ctx.w, ctx.lora = layer, x, w, lora
        return ot.moe_forward_train_op(layer._h, x, ids, w, lora)

    @staticmethod
    def backward(ctx, dy):
        g = ot.moe_backward_op(ctx.layer._h, dy, ctx.x, ctx.w, ctx.lora)
        return g[1], g[7], None, None, None, None


def test_moe_opcheck(device):
    layer, _ = moe_layer()
    x, ids, w = moe_inputs(device)
    opcheck(ot.moe_forward_op, (layer._h, x, ids, w, [p.detach() for p in layer.lora()]))
    # opcheck clones its inputs, and adapters cannot be re-attached while forwards are saved:
    # the training ops are checked on a layer without LoRA (its LoRA path is tested above)
    layer, _ = moe_layer(rank=0, depth=64)
    lora = [None] * 6
    opcheck(ot.moe_forward_train_op, (layer._h, x.requires_grad_(), ids, w.requires_grad_(), lora))
    for _ in range(16):  # saved forwards for opcheck's calls of the backward
        ot.moe_forward_train_op(layer._h, x.detach(), ids, w.detach(), lora)
    opcheck(ot.moe_backward_op, (layer._h, torch.randn_like(x), x.detach(), w.detach(), lora))


def test_moe_backward_without_forward_raises():
    layer, _ = moe_layer()
    x, ids, w = moe_inputs("cpu")
    import ompk

    with pytest.raises(ompk.OmpkError, match="OMPK_ERR_CACHE_EMPTY"):
        ot.moe_backward_op(layer._h, x, x, w, layer.lora())


# ---- torch.compile / torch.export keep the ops ----------------------------------------------


def test_export_keeps_ops():
    class Block(torch.nn.Module):
        def forward(self, x, phi, g, alpha, bias, f):
            h_in, h_post, comb = ot.mhc_pre(x, phi, g, alpha, bias)
            return ot.mhc_post(x, comb, h_post, f + h_in)

    x, phi, g, alpha, bias = mhc_inputs("cpu")
    f = torch.randn(B, S, D)
    ep = torch.export.export(Block(), (x, phi, g, alpha, bias, f))
    targets = {str(nd.target) for nd in ep.graph.nodes if nd.op == "call_function"}
    assert "ompk.mhc_pre.default" in targets and "ompk.mhc_post.default" in targets
    torch.testing.assert_close(ep.module()(x, phi, g, alpha, bias, f),
                               Block()(x, phi, g, alpha, bias, f))


def test_bf16_gradients(device):
    x, phi, g, alpha, bias = mhc_inputs(device)
    compare(lambda x, *p: tuple(o.float() for o in ot.mhc_pre(x.bfloat16(), *p)),
            lambda x, *p: R.mhc_pre(x.bfloat16().double(), *p), [x, phi, g, alpha, bias], 3e-2)
    q, k, v = (t.bfloat16().float() for t in attn_inputs(device))
    compare(lambda *a: ot.attention(*(t.bfloat16() for t in a), mask="causal").float(),
            lambda *a: R.attention(*a, mask="causal"), [q, k, v], 3e-2)


def test_compile_keeps_ops_forward_and_backward():
    x, phi, g, alpha, bias = [t.requires_grad_() for t in mhc_inputs("cpu")]
    q, k, v = attn_inputs("cpu")

    def fn(x, phi, g, alpha, bias, q):
        h_in, h_post, comb = ot.mhc_pre(x, phi, g, alpha, bias)
        a = ot.attention(q * h_in.mean(), k, v, mask="causal")
        return ot.mhc_post(x, comb, h_post, h_in * a.mean()).square().sum()

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    args = (x, phi, g, alpha, bias, q)
    got = torch.autograd.grad(compiled(*args), (x, phi, g, alpha, bias))
    want = torch.autograd.grad(fn(*args), (x, phi, g, alpha, bias))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
