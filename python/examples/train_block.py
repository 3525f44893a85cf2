"""A training step through ompk's PyTorch ops: one transformer-style block with n residual streams
(mHC pre + Sinkhorn and post around causal attention, and around a product-key-routed MoE whose
frozen bf16 experts carry trainable LoRA adapters), trained with Adam on a toy regression.

    pip install ./python torch
    OMPK_LIBRARY=build/libompk.so KMP_BLOCKTIME=0 python python/examples/train_block.py [cuda]
"""
import sys

import torch
import torch.nn.functional as F

import ompk.torch as ot

B, S, n, D, HEADS = 2, 16, 4, 64, 2  # attention head dim D/HEADS = 32
N, TOPK, I, RANK = 4, 2, 64, 8       # N*N = 16 experts, addressed by the router's pair index
M = 2 * n + n * n                    # rows of the mHC projection phi


class MhcBlock(torch.nn.Module):
    """x [B,S,n,D] -> x [B,S,n,D]: sublayer(mhc_pre(x)) merged back by mhc_post."""

    def __init__(self, sublayer):
        super().__init__()
        self.phi = torch.nn.Parameter(torch.randn(M, n * D) * 0.05)
        self.gamma = torch.nn.Parameter(torch.ones(n * D))
        self.alpha = torch.nn.Parameter(torch.ones(3))
        self.bias = torch.nn.Parameter(torch.zeros(M))
        self.sublayer = sublayer

    def forward(self, x):
        h_in, h_post, comb = ot.mhc_pre(x, self.phi, self.gamma, self.alpha, self.bias)
        return ot.mhc_post(x, comb, h_post, self.sublayer(h_in))


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.o = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, D)

    def forward(self, h):
        q, k, v = self.qkv(h).view(B, S, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        return self.o(ot.attention(q, k, v, mask="causal").transpose(1, 2).reshape(B, S, D))


class RoutedMoE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router = torch.nn.Linear(D, 2 * N)
        E = N * N
        gate, up = torch.randn(E, I, D) / D**0.5, torch.randn(E, I, D) / D**0.5
        down = torch.randn(E, D, I) / I**0.5
        self.experts = ot.MoE(gate, up, down, TOPK, B * S, lora_rank=RANK, lora_alpha=16.0)

    def forward(self, h):
        t = h.reshape(B * S, D)
        s = self.router(t)
        scores, pairs = ot.router_topk(s[:, :N].contiguous(), s[:, N:].contiguous(), TOPK)
        return self.experts(t, pairs, torch.softmax(scores, -1)).view(B, S, D)


def main(device="cpu", steps=20):
    torch.manual_seed(0)
    model = torch.nn.Sequential(MhcBlock(Attention()), MhcBlock(RoutedMoE())).to(device)
    x = torch.randn(B, S, n, D, device=device)
    target = torch.randn(B, S, D, device=device)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(model(x).sum(2), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"step {step:2d}  loss {losses[-1]:.4f}")
    return losses


if __name__ == "__main__":
    main(*sys.argv[1:2])
