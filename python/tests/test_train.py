"""A small training step: an mHC + attention + MoE block (mHC pre/post around causal attention,
then around a product-key-routed MoE with LoRA adapters), a few Adam steps through the ompk ops,
against the same block in float64 PyTorch from the same initial parameters."""
import torch
import torch.nn.functional as F

import ompk.torch as ot
import reference as R

Bt, St, n, D, HEADS, N, TOPK, RANK, I = 2, 8, 2, 64, 2, 2, 2, 4, 32
M, E = 2 * n + n * n, N * N


class RefMoE(torch.nn.Module):
    def __init__(self, layer, gate, up, down):
        super().__init__()
        self.base = [gate, up, down]
        self.scale = layer.lora_alpha / layer.lora_rank
        for name, p in zip(ot._LORA, layer.lora()):
            self.register_parameter(name, torch.nn.Parameter(p.detach().clone()))

    def forward(self, x, ids, w):
        lora = [getattr(self, n) for n in ot._LORA]
        base = [t.to(x.dtype) for t in self.base]
        return R.moe(x, ids, w, *base, [p.to(x.dtype) for p in lora], self.scale)


class Block(torch.nn.Module):
    def __init__(self, ops, moe):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        for s in ("1", "2"):
            self.register_parameter("phi" + s, torch.nn.Parameter(
                torch.randn(M, n * D, generator=g) * 0.05))
            self.register_parameter("gamma" + s, torch.nn.Parameter(torch.ones(n * D)))
            self.register_parameter("alpha" + s, torch.nn.Parameter(torch.tensor([1.0, 1.0, 1.0])))
            self.register_parameter("bias" + s, torch.nn.Parameter(
                torch.randn(M, generator=g) * 0.1))
        self.qkv = torch.nn.Linear(D, 3 * D)
        self.o = torch.nn.Linear(D, D)
        self.router = torch.nn.Linear(D, 2 * N)
        with torch.no_grad():
            for lin in (self.qkv, self.o, self.router):
                lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) / D**0.5)
                lin.bias.zero_()
        self.ops, self.moe = ops, moe

    def forward(self, x):
        B, S = x.shape[:2]
        h, hp, comb = self.ops.mhc_pre(x, self.phi1, self.gamma1, self.alpha1, self.bias1)
        q, k, v = self.qkv(h).view(B, S, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        a = self.ops.attention(q, k, v, mask="causal").transpose(1, 2).reshape(B, S, D)
        x = self.ops.mhc_post(x, comb, hp, self.o(a))
        h, hp, comb = self.ops.mhc_pre(x, self.phi2, self.gamma2, self.alpha2, self.bias2)
        t = h.reshape(B * S, D)
        sxy = self.router(t)
        scores, idx = self.ops.router_topk(sxy[:, :N].contiguous(), sxy[:, N:].contiguous(), TOPK)
        y = self.moe(t, idx.int(), torch.softmax(scores.to(t.dtype), -1))
        return self.ops.mhc_post(x, comb, hp, y.view(B, S, D))


class RefOps:
    mhc_pre = staticmethod(R.mhc_pre)
    mhc_post = staticmethod(R.mhc_post)
    attention = staticmethod(R.attention)
    router_topk = staticmethod(lambda a, b, k: tuple(R.router_topk(a, b, k)))


def losses(model, x, target, steps):
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x).sum(2), target)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_training_step_matches_reference(device):
    g = torch.Generator().manual_seed(3)
    bf = lambda t: t.bfloat16().float()  # noqa: E731
    gate = bf(torch.randn(E, I, D, generator=g) / D**0.5)
    up = bf(torch.randn(E, I, D, generator=g) / D**0.5)
    down = bf(torch.randn(E, D, I, generator=g) / I**0.5)
    layer = ot.MoE(gate, up, down, TOPK, Bt * St, lora_rank=RANK, lora_alpha=8.0, threads=2)
    ref = Block(RefOps, RefMoE(layer, gate, up, down)).double()
    model = Block(ot, layer).to(device)
    x = torch.randn(Bt, St, n, D, generator=g)
    target = torch.randn(Bt, St, D, generator=g)
    got = losses(model, x.to(device), target.to(device), 5)
    want = losses(ref, x.double(), target.double(), 5)
    print("ompk", got, "reference", want)
    assert want[-1] < 0.9 * want[0]
    assert got[-1] < 0.9 * got[0]
    tol = 1e-5 if device.type == "cpu" else 2e-3  # GPU kernels sum in other orders
    for a, b in zip(got, want):
        assert abs(a - b) <= tol * abs(b), (got, want)
