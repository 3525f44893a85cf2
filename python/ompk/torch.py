"""PyTorch ops over libompk: torch.library.custom_op ops with fake (meta) implementations, so
torch.compile and torch.export keep them in the graph, and autograd formulas registered with
register_autograd whose backward passes are ops of their own.

Stream ordering on CUDA: every op first waits for PyTorch's current stream on the tensors' device
(torch.cuda.current_stream().synchronize()); ompk's calls return only when their GPU work is done.
So work PyTorch queued before an op is finished before ompk reads its inputs, and work it queues
after reads finished outputs. The cost is one stream synchronisation per op (the host waits for
what PyTorch had queued, and the GPU idles while ompk's call is issued). SYNC = False turns the
wait off (for a caller that has synchronised already; the race test uses it as its control)."""
import ctypes
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _lib
from ._core import call, view

SYNC = True
MASKS = {"none": 0, "causal": 1, "causal_top_left": 1, "causal_bottom_right": 2}


def _sync(*tensors):
    if not SYNC:
        return
    for t in tensors:
        if t is not None and t.device.type == "cuda":
            torch.cuda.current_stream(t.device).synchronize()
            return


def _run(name, *args):
    """Calls `name` with tensors (or None) as descriptors and other arguments as they are."""
    views = [view(a) if (a is None or isinstance(a, Tensor)) else a for a in args]
    refs = [None if v is None else (v.ref if hasattr(v, "ref") else v) for v in views]
    call(name, *refs)


def _run_args(name, struct, params, *tensors):
    """Calls `name` with an argument struct of the tensors (or None), in its field order."""
    views = [None if t is None else view(t) for t in tensors]
    args = struct(*[None if v is None else ctypes.pointer(v.t) for v in views])
    call(name, ctypes.byref(args), params)


def _mhc_params(norm_eps, hc_eps, post_mult, repeat, sk_eps, fuse):
    return ctypes.byref(_lib.MhcParams(norm_eps, hc_eps, post_mult, repeat, sk_eps, fuse))


def _f32(ref, *shape):
    return torch.empty(shape, dtype=torch.float32, device=ref.device)


# ---- mHC pre (with Sinkhorn) ------------------------------------------------------------------


@torch.library.custom_op("ompk::mhc_pre", mutates_args=())
def mhc_pre_op(x: Tensor, phi: Tensor, gamma: Optional[Tensor], alpha: Tensor, bias: Tensor,
               norm_eps: float, hc_eps: float, post_mult: float, repeat: int,
               sinkhorn_eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                             Tensor]:
    """(h_in, h_post, comb, res_logits, h_mix, inv_rms, h_pre); the last four feed the backward."""
    x = x.contiguous()
    B, S, n, D = x.shape
    M, T = 2 * n + n * n, B * S
    h_in = torch.empty((B, S, D), dtype=x.dtype, device=x.device)
    h_post, comb, res = _f32(x, B, S, n), _f32(x, B, S, n, n), _f32(x, B, S, n, n)
    h_mix, inv_rms, h_pre = _f32(x, T, M), _f32(x, T), _f32(x, T, n)
    _sync(x)
    p = _mhc_params(norm_eps, hc_eps, post_mult, repeat, sinkhorn_eps, 1)
    _run_args("ompk_mhc_pre_fwd", _lib.MhcPreFwdArgs, p, x, phi.contiguous(), gamma, alpha, bias,
              h_in, h_post, res, comb, h_mix, inv_rms, h_pre)
    return h_in, h_post, comb, res, h_mix, inv_rms, h_pre


@mhc_pre_op.register_fake
def _mhc_pre_fake(x, phi, gamma, alpha, bias, norm_eps, hc_eps, post_mult, repeat, sinkhorn_eps):
    B, S, n, D = x.shape
    M, T = 2 * n + n * n, B * S
    f = lambda *s: x.new_empty(s, dtype=torch.float32)  # noqa: E731
    return (x.new_empty((B, S, D)), f(B, S, n), f(B, S, n, n), f(B, S, n, n), f(T, M), f(T),
            f(T, n))


@torch.library.custom_op("ompk::sinkhorn_bwd", mutates_args=())
def sinkhorn_bwd_op(logits: Tensor, dcomb: Tensor, repeat: int, eps: float) -> Tensor:
    dlogits = torch.empty_like(logits, memory_format=torch.contiguous_format)
    _sync(logits)
    p = _mhc_params(1e-6, 1e-6, 2.0, repeat, eps, 1)
    _run("ompk_mhc_sinkhorn_bwd", logits, dcomb.contiguous(), dlogits, p)
    return dlogits


@sinkhorn_bwd_op.register_fake
def _(logits, dcomb, repeat, eps):
    return torch.empty_like(logits)


@torch.library.custom_op("ompk::mhc_pre_bwd", mutates_args=())
def mhc_pre_bwd_op(x: Tensor, phi: Tensor, gamma: Optional[Tensor], alpha: Tensor, dh_in: Tensor,
                   dh_post: Tensor, dh_res: Tensor, h_mix: Tensor, inv_rms: Tensor, h_pre: Tensor,
                   h_post: Tensor, hc_eps: float,
                   post_mult: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, dphi, dalpha, dbias, dgamma); dgamma is empty when gamma is None."""
    x = x.contiguous()
    M = phi.shape[0]
    dx = torch.empty_like(x)
    dphi, dalpha, dbias = torch.empty_like(phi), _f32(x, 3), _f32(x, M)
    dgamma = torch.empty_like(gamma) if gamma is not None else _f32(x, 0)
    _sync(x)
    p = _mhc_params(1e-6, hc_eps, post_mult, 20, 1e-6, 1)
    _run_args("ompk_mhc_pre_bwd", _lib.MhcPreBwdArgs, p, x, phi.contiguous(), gamma, alpha,
              dh_in.contiguous(), dh_post.contiguous(), dh_res.contiguous(), None, h_mix, inv_rms,
              h_pre, h_post, dx, dphi, dalpha, dbias, dgamma if gamma is not None else None)
    return dx, dphi, dalpha, dbias, dgamma


@mhc_pre_bwd_op.register_fake
def _(x, phi, gamma, alpha, dh_in, dh_post, dh_res, h_mix, inv_rms, h_pre, h_post, hc_eps,
      post_mult):
    dg = torch.empty_like(gamma) if gamma is not None else x.new_empty((0,), dtype=torch.float32)
    return (torch.empty_like(x), torch.empty_like(phi), x.new_empty((3,), dtype=torch.float32),
            x.new_empty((phi.shape[0],), dtype=torch.float32), dg)


def _mhc_pre_setup(ctx, inputs, output):
    x, phi, gamma, alpha, bias, norm_eps, hc_eps, post_mult, repeat, sk_eps = inputs
    h_in, h_post, comb, res, h_mix, inv_rms, h_pre = output
    ctx.save_for_backward(x, phi, gamma, alpha, res, h_mix, inv_rms, h_pre, h_post)
    ctx.p = (hc_eps, post_mult, repeat, sk_eps)


def _zero_if_none(g, like):
    return torch.zeros_like(like) if g is None else g


def _pre_grads(saved, p, dh_in, dh_post, dcomb, dres):
    """The pre's backward (Sinkhorn, then the pre) -> (dx, dphi, dgamma, dalpha, dbias)."""
    x, phi, gamma, alpha, res, h_mix, inv_rms, h_pre, h_post = saved
    hc_eps, post_mult, repeat, sk_eps = p
    dh_res = sinkhorn_bwd_op(res, _zero_if_none(dcomb, res), repeat, sk_eps)
    if dres is not None:
        dh_res = dh_res + dres
    dx, dphi, dalpha, dbias, dgamma = mhc_pre_bwd_op(
        x, phi, gamma, alpha, _zero_if_none(dh_in, x[:, :, 0]).to(x.dtype),
        _zero_if_none(dh_post, h_post), dh_res, h_mix, inv_rms, h_pre, h_post, hc_eps, post_mult)
    return dx, dphi, dgamma if gamma is not None else None, dalpha, dbias


def _mhc_pre_backward(ctx, dh_in, dh_post, dcomb, dres, *unused):
    return _pre_grads(ctx.saved_tensors, ctx.p, dh_in, dh_post, dcomb, dres) + (None,) * 5


mhc_pre_op.register_autograd(_mhc_pre_backward, setup_context=_mhc_pre_setup)


def mhc_pre(x, phi, gamma, alpha, bias, *, norm_eps=1e-6, hc_eps=1e-6, post_mult=2.0, repeat=20,
            sinkhorn_eps=1e-6):
    """mHC pre + Sinkhorn (docs/KERNELS.md 1.1, 1.3): x [B,S,n,D] -> (h_in [B,S,D], h_post [B,S,n],
    comb [B,S,n,n]). phi [2n+n^2, n*D], gamma [n*D] or None, alpha [3], bias [2n+n^2] f32."""
    out = mhc_pre_op(x, phi, gamma, alpha, bias, norm_eps, hc_eps, post_mult, repeat,
                     sinkhorn_eps)
    return out[0], out[1], out[2]


# ---- mHC post ---------------------------------------------------------------------------------


@torch.library.custom_op("ompk::mhc_post", mutates_args=())
def mhc_post_op(x: Tensor, comb: Tensor, post: Tensor, f: Tensor) -> Tensor:
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _sync(x)
    _run("ompk_mhc_post_fwd", x, comb, post, f, out)
    return out


@mhc_post_op.register_fake
def _(x, comb, post, f):
    return torch.empty_like(x)


@torch.library.custom_op("ompk::mhc_post_bwd", mutates_args=())
def mhc_post_bwd_op(x: Tensor, comb: Tensor, post: Tensor, f: Tensor,
                    dout: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    x, f = x.contiguous(), f.contiguous()
    dx, df = torch.empty_like(x), torch.empty_like(f)
    dpost = torch.empty(post.shape, dtype=torch.float32, device=x.device)
    dcomb = torch.empty(comb.shape, dtype=torch.float32, device=x.device)
    _sync(x)
    _run("ompk_mhc_post_bwd", x, comb, post, f, dout.to(x.dtype).contiguous(), dx, df, dpost,
         dcomb)
    return dx, df, dpost, dcomb


@mhc_post_bwd_op.register_fake
def _(x, comb, post, f, dout):
    return torch.empty_like(x), torch.empty_like(f), torch.empty_like(post), torch.empty_like(comb)


def _mhc_post_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _mhc_post_backward(ctx, dout):
    dx, df, dpost, dcomb = mhc_post_bwd_op(*ctx.saved_tensors, dout)
    return dx, dcomb, dpost, df


mhc_post_op.register_autograd(_mhc_post_backward, setup_context=_mhc_post_setup)


def mhc_post(x, comb, post, f):
    """mHC post (docs/KERNELS.md 1.2): out[b,s,o,d] = post[b,s,o]*f[b,s,d] + sum_i comb[b,s,i,o]*x."""
    return mhc_post_op(x, comb, post, f)


# ---- mHC post(l) + pre(l+1) -------------------------------------------------------------------


@torch.library.custom_op("ompk::mhc_post_pre", mutates_args=())
def mhc_post_pre_op(x: Tensor, comb: Tensor, post: Tensor, f: Tensor, phi: Tensor,
                    gamma: Optional[Tensor], alpha: Tensor, bias: Tensor, norm_eps: float,
                    hc_eps: float, post_mult: float, repeat: int,
                    sinkhorn_eps: float) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                                  Tensor, Tensor]:
    """(x_out, h_in, h_post, comb, res_logits, h_mix, inv_rms, h_pre): mhc_post's x_out, then
    mhc_pre's outputs on x_out."""
    B, S, n, D = x.shape
    M, T = 2 * n + n * n, B * S
    x_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    h_in = torch.empty((B, S, D), dtype=x.dtype, device=x.device)
    h_post, comb_next, res = _f32(x, B, S, n), _f32(x, B, S, n, n), _f32(x, B, S, n, n)
    h_mix, inv_rms, h_pre = _f32(x, T, M), _f32(x, T), _f32(x, T, n)
    _sync(x)
    p = _mhc_params(norm_eps, hc_eps, post_mult, repeat, sinkhorn_eps, 1)
    views = [None if t is None else view(t)
             for t in (x, comb, post, f, x_out, phi.contiguous(), gamma, alpha, bias, h_in,
                       h_post, res, comb_next, h_mix, inv_rms, h_pre)]
    ptrs = [None if v is None else ctypes.pointer(v.t) for v in views]
    # the pre's x is x_out (NULL here)
    args = _lib.MhcPostPreFwdArgs(*ptrs[:5], _lib.MhcPreFwdArgs(None, *ptrs[5:]))
    call("ompk_mhc_post_pre_fwd", ctypes.byref(args), p)
    return x_out, h_in, h_post, comb_next, res, h_mix, inv_rms, h_pre


@mhc_post_pre_op.register_fake
def _(x, comb, post, f, phi, gamma, alpha, bias, *params):
    x_out = x.new_empty(x.shape)
    return (x_out,) + _mhc_pre_fake(x_out, phi, gamma, alpha, bias, *params)


def _mhc_post_pre_setup(ctx, inputs, output):
    x, comb, post, f, phi, gamma, alpha, bias, norm_eps, hc_eps, post_mult, repeat, sk_eps = inputs
    x_out, h_in, h_post, comb_next, res, h_mix, inv_rms, h_pre = output
    ctx.save_for_backward(x, comb, post, f, x_out, phi, gamma, alpha, res, h_mix, inv_rms, h_pre,
                          h_post)
    ctx.p = (hc_eps, post_mult, repeat, sk_eps)


def _mhc_post_pre_backward(ctx, dx_out, dh_in, dh_post, dcomb_next, dres, *unused):
    x, comb, post, f, *pre_saved = ctx.saved_tensors
    # x_out's gradient: what its other uses send plus the pre's, then through the post
    dx_pre, dphi, dgamma, dalpha, dbias = _pre_grads(pre_saved, ctx.p, dh_in, dh_post, dcomb_next,
                                                     dres)
    if dx_out is not None:
        dx_pre = dx_pre + dx_out
    dx, df, dpost, dcomb = mhc_post_bwd_op(x, comb, post, f, dx_pre)
    return (dx, dcomb, dpost, df, dphi, dgamma, dalpha, dbias) + (None,) * 5


mhc_post_pre_op.register_autograd(_mhc_post_pre_backward, setup_context=_mhc_post_pre_setup)


def mhc_post_pre(x, comb, post, f, phi, gamma, alpha, bias, *, norm_eps=1e-6, hc_eps=1e-6,
                 post_mult=2.0, repeat=20, sinkhorn_eps=1e-6):
    """Layer l's mHC post, then layer l+1's pre on its output, in one call (docs/KERNELS.md 1.7):
    x_out = mhc_post(x, comb, post, f) and (h_in, h_post, comb_next) = mhc_pre(x_out, phi, gamma,
    alpha, bias, ...) -> (x_out, h_in, h_post, comb_next), bit for bit those two ops' values and
    gradients."""
    out = mhc_post_pre_op(x, comb, post, f, phi, gamma, alpha, bias, norm_eps, hc_eps, post_mult,
                          repeat, sinkhorn_eps)
    return out[0], out[1], out[2], out[3]


# ---- attention --------------------------------------------------------------------------------


def _attn_params(scale, mask):
    return ctypes.byref(_lib.AttentionParams(scale, mask))


@torch.library.custom_op("ompk::attention", mutates_args=())
def attention_op(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: int) -> Tuple[Tensor, Tensor]:
    """(out, lse): lse [B,Hq,N] f32 feeds the backward."""
    q = q.contiguous()
    out = torch.empty_like(q)
    lse = _f32(q, *q.shape[:3])
    _sync(q)
    _run("ompk_attention_fwd", q, k.contiguous(), v.contiguous(), out, lse,
         _attn_params(scale, mask))
    return out, lse


@attention_op.register_fake
def _(q, k, v, scale, mask):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("ompk::attention_bwd", mutates_args=())
def attention_bwd_op(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                     scale: float, mask: int) -> Tuple[Tensor, Tensor, Tensor]:
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    _sync(q)
    _run("ompk_attention_bwd", dout.to(q.dtype).contiguous(), q, k, v, out.contiguous(), lse, dq,
         dk, dv, _attn_params(scale, mask))
    return dq, dk, dv


@attention_bwd_op.register_fake
def _(dout, q, k, v, out, lse, scale, mask):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attention_setup(ctx, inputs, output):
    q, k, v, scale, mask = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.p = (scale, mask)


def _attention_backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_bwd_op(dout, q, k, v, out, lse, *ctx.p)
    return dq, dk, dv, None, None


attention_op.register_autograd(_attention_backward, setup_context=_attention_setup)


def attention(q, k, v, *, scale=None, mask="none"):
    """Scaled dot-product attention (docs/KERNELS.md 2): q [B,Hq,N,dh], k, v [B,Hkv,M,dh] (GQA when
    Hkv < Hq), f32 or bf16, dh in {32,64,80,96,128,256}; mask "none", "causal" (top-left, as
    PyTorch's is_causal) or "causal_bottom_right"; scale None = 1/sqrt(dh)."""
    return attention_op(q, k, v, 0.0 if scale is None else float(scale), MASKS[mask])[0]


# ---- product-key router -----------------------------------------------------------------------


@torch.library.custom_op("ompk::router_topk", mutates_args=())
def router_topk_op(sx: Tensor, sy: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    T = sx.shape[0]
    scores = _f32(sx, T, k)
    indices = torch.empty((T, k), dtype=torch.int32, device=sx.device)
    _sync(sx)
    _run("ompk_router_topk_fwd", sx, sy, k, scores, indices)
    return scores, indices


@router_topk_op.register_fake
def _(sx, sy, k):
    T = sx.shape[0]
    return sx.new_empty((T, k), dtype=torch.float32), sx.new_empty((T, k), dtype=torch.int32)


@torch.library.custom_op("ompk::router_topk_bwd", mutates_args=())
def router_topk_bwd_op(dscores: Tensor, indices: Tensor, n: int) -> Tuple[Tensor, Tensor]:
    T = dscores.shape[0]
    dsx, dsy = _f32(dscores, T, n), _f32(dscores, T, n)
    _sync(dscores)
    _run("ompk_router_topk_bwd", dscores.float().contiguous(), indices, n, dsx, dsy)
    return dsx, dsy


@router_topk_bwd_op.register_fake
def _(dscores, indices, n):
    T = dscores.shape[0]
    return (dscores.new_empty((T, n), dtype=torch.float32),
            dscores.new_empty((T, n), dtype=torch.float32))


def _router_setup(ctx, inputs, output):
    sx, sy, k = inputs
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.n, ctx.dtype = sx.shape[1], sx.dtype


def _router_backward(ctx, dscores, dindices):
    (indices,) = ctx.saved_tensors
    dsx, dsy = router_topk_bwd_op(dscores, indices, ctx.n)
    return dsx.to(ctx.dtype), dsy.to(ctx.dtype), None


router_topk_op.register_autograd(_router_backward, setup_context=_router_setup)


def router_topk(sx, sy, k):
    """Product-key top-k (docs/KERNELS.md 4): sx, sy [T,N] -> (scores [T,k] f32, indices [T,k] int32
    = i*N + j), descending, ties to the lower index. Differentiable in sx and sy."""
    return router_topk_op(sx, sy, int(k))


# ---- MoE experts ------------------------------------------------------------------------------
# The ops name their layer by its handle (an int): a layer object holds packed weights and the
# stack of saved forwards, which no tensor can carry. The training forward pushes one entry and
# its backward pops it, so the backward of a layer's forwards must run in reverse order (as
# autograd runs a sequential model's backward).

_layers = {}
_LORA = ("gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b")


def _moe_attach(layer, lora):
    """Attaches the adapters when their storage changed (an optimizer's in-place update keeps it,
    and the layer reads them at every call)."""
    key = tuple(t.data_ptr() for t in lora) if lora[0] is not None else None
    if key == layer._attached:
        return
    if key is None:
        call("ompk_moe_set_lora", layer._h, None)
    else:
        layer._lora_views = [view(t) for t in lora]
        r = lora[0].shape[1]
        p = [ctypes.pointer(v.t) for v in layer._lora_views]
        lo = _lib.MoeLora(r, layer.lora_alpha, *p, 0.0, 0)
        call("ompk_moe_set_lora", layer._h, ctypes.byref(lo))
    layer._attached = key


def _moe_run_forward(fn, handle, x, ids, w, lora, *mode):
    """The MoE forward entry `fn` on the layer `handle` with its adapters attached: y [T,H]."""
    layer = _layers[handle]
    _moe_attach(layer, lora)
    x = x.contiguous()
    y = torch.empty_like(x)
    _sync(x)
    _run(fn, layer._h, x, ids.contiguous(), w.contiguous(), y, *mode)
    return y


@torch.library.custom_op("ompk::moe_forward", mutates_args=())
def moe_forward_op(handle: int, x: Tensor, ids: Tensor, w: Tensor,
                   lora: List[Optional[Tensor]]) -> Tensor:
    """y [T,H], the inference forward (nothing saved, not differentiable)."""
    return _moe_run_forward("ompk_moe_fwd", handle, x, ids, w, lora)


@moe_forward_op.register_fake
def _(handle, x, ids, w, lora):
    return torch.empty_like(x)


@torch.library.custom_op("ompk::moe_forward_train", mutates_args=())
def moe_forward_train_op(handle: int, x: Tensor, ids: Tensor, w: Tensor,
                         lora: List[Optional[Tensor]]) -> Tensor:
    """y [T,H]; pushes the forward on the layer's stack for ompk::moe_backward."""
    return _moe_run_forward("ompk_moe_fwd_train", handle, x, ids, w, lora, 1)


@moe_forward_train_op.register_fake
def _(handle, x, ids, w, lora):
    return torch.empty_like(x)


@torch.library.custom_op("ompk::moe_backward", mutates_args=())
def moe_backward_op(handle: int, dy: Tensor, x: Tensor, w: Tensor,
                    lora: List[Optional[Tensor]]) -> List[Tensor]:
    """[dx, dw, dA_gate, dB_gate, dA_up, dB_up, dA_down, dB_down] (LoRA gradients f32, on the
    host with the adapters; empty without LoRA). Pops the layer's top saved forward."""
    layer = _layers[handle]
    dx = torch.empty(x.shape, dtype=x.dtype, device=dy.device)
    dw = torch.empty(w.shape, dtype=torch.float32, device=dy.device)
    if lora[0] is not None:
        dl = [torch.empty(t.shape, dtype=torch.float32, device=t.device) for t in lora]
    else:
        dl = [torch.empty(0, device=dy.device) for _ in _LORA]
    views = [view(t) for t in [dx, dw] + (dl if lora[0] is not None else [])]
    ptrs = [ctypes.pointer(v.t) for v in views] + [None] * (8 - len(views))
    g = _lib.MoeGrads(*ptrs, None, None, None, 0)
    _sync(dy)
    dyv = view(dy.to(x.dtype).contiguous())
    call("ompk_moe_bwd", layer._h, dyv.ref, ctypes.byref(g))
    return [dx, dw] + dl


@moe_backward_op.register_fake
def _(handle, dy, x, w, lora):
    dl = [t.new_empty(t.shape, dtype=torch.float32) if t is not None else dy.new_empty(0)
          for t in lora]
    return [torch.empty_like(x), w.new_empty(w.shape, dtype=torch.float32)] + dl


def _moe_setup(ctx, inputs, output):
    handle, x, ids, w, lora = inputs
    ctx.save_for_backward(x, w, *lora) if lora[0] is not None else ctx.save_for_backward(x, w)
    ctx.handle, ctx.has_lora = handle, lora[0] is not None


def _moe_backward(ctx, dy):
    x, w, *lora = ctx.saved_tensors
    lora = lora if ctx.has_lora else [None] * 6
    g = moe_backward_op(ctx.handle, dy, x, w, lora)
    dl = [gi.to(t.dtype) for gi, t in zip(g[2:], lora)] if ctx.has_lora else None
    return None, g[0], None, g[1].to(w.dtype), dl


moe_forward_train_op.register_autograd(_moe_backward, setup_context=_moe_setup)


class MoE(torch.nn.Module):
    """SwiGLU MoE experts on ompk's host path (docs/KERNELS.md 3). gate, up [E,I,H] and down [E,H,I]
    are the frozen base weights, packed once (format "bf16", "int8", "int4", "int4_zp");
    lora_rank > 0 adds trainable adapters (f32, on the host: the layer borrows them). forward(x
    [T,H], expert_ids [T,k], weights [T,k]) -> y [T,H], differentiable in x, the routing weights
    and the adapters (the training forward runs when any of them requires grad). grad_operands
    "bf16" gives the backward's data-gradient products bf16 operands (about twice as fast, one
    more bf16 rounding) instead of "split" bf16 hi + lo pairs."""

    FORMATS = {"bf16": 0, "int8": 1, "int4": 2, "int4_zp": 3}
    GRAD_OPERANDS = {"split": 0, "bf16": 1}

    def __init__(self, gate, up, down, top_k, max_tokens, *, format="bf16", lora_rank=0,
                 lora_alpha=None, cache_depth=8, threads=0, isa=0, grad_operands="split"):
        super().__init__()
        E, I, H = gate.shape
        cfg = _lib.MoeConfig()
        cfg.experts, cfg.hidden, cfg.intermediate, cfg.top_k = E, H, I, top_k
        cfg.max_tokens, cfg.format, cfg.threads, cfg.isa = max_tokens, self.FORMATS[format], \
            threads, isa
        cfg.cache_depth, cfg.lora_max_rank = cache_depth, lora_rank
        cfg.grad_operands = self.GRAD_OPERANDS[grad_operands]
        h = ctypes.c_void_p()
        call("ompk_moe_create", ctypes.byref(cfg), ctypes.byref(h))
        self._h, self._attached, self.top_k, self.dims = h.value, None, top_k, (E, H, I)
        _layers[self._h] = self
        _run("ompk_moe_load_weights", self._h, gate.detach().cpu().contiguous(),
             up.detach().cpu().contiguous(), down.detach().cpu().contiguous())
        self.lora_rank = lora_rank
        self.lora_alpha = float(lora_alpha if lora_alpha is not None else lora_rank)
        if lora_rank:
            g = torch.Generator().manual_seed(0)
            shapes = {"gate_a": (E, lora_rank, H), "gate_b": (E, I, lora_rank),
                      "up_a": (E, lora_rank, H), "up_b": (E, I, lora_rank),
                      "down_a": (E, lora_rank, I), "down_b": (E, H, lora_rank)}
            for name, s in shapes.items():
                init = (torch.randn(s, generator=g) / s[2] ** 0.5 if name.endswith("_a")
                        else torch.zeros(s))
                self.register_parameter(name, torch.nn.Parameter(init))

    def _apply(self, fn, recurse=True):
        # the adapters stay host f32 tensors, where the layer reads them, whatever .to() asks
        return self

    def lora(self):
        return [getattr(self, n) for n in _LORA] if self.lora_rank else [None] * 6

    def forward(self, x, expert_ids, weights):
        lora = self.lora()
        train = torch.is_grad_enabled() and (
            x.requires_grad or weights.requires_grad or any(
                t is not None and t.requires_grad for t in lora))
        op = moe_forward_train_op if train else moe_forward_op
        return op(self._h, x, expert_ids, weights, lora)

    def base_weights(self, which):
        """The dequantized weights the kernels use (0 gate [E,I,H], 1 up, 2 down [E,H,I]), f32."""
        E, H, I = self.dims
        out = torch.empty((E, I, H) if which < 2 else (E, H, I), dtype=torch.float32)
        _run("ompk_moe_get_weights", self._h, which, out)
        return out

    def __del__(self, _destroy=_lib.lib.ompk_moe_destroy, _registry=_layers):
        h = getattr(self, "_h", None)
        if h:
            _destroy(h)
            _registry.pop(h, None)
            self._h = None
