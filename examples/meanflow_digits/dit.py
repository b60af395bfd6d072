"""Small DiTs: adaLN-Zero blocks with SDPA, conditioned on sinusoidal embeddings of the times r
and t.

DigitsDiT is train.py's model: class-conditional, on the digits' 2x2 patches. DiT is the plain
one that the training-step benchmark (scripts/bench/train_step.py) and the Python tests train:
net(z, r, t), z [B, L, C] tokens, r and t [B] times; returns [B, L, C]; with classes, net(z, r, t,
y) adds y's label embedding to the conditioning, and qk_norm RMS-normalises each head's q and k.
MeanFlow differentiates it along (v, 0, 1); sCM along (dx/dt, 1) with r unused. The tests and
the benchmarks import this file with this folder on sys.path.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """A DiT block: attention and an MLP, each modulated by the conditioning c (adaLN-Zero).
    zero_init: the modulation starts at zero, so that the block starts as the identity. qk_norm:
    RMSNorm (a learnable weight) on each head's q and k."""

    def __init__(self, d: int, heads: int, zero_init: bool = False, qk_norm: bool = False):
        super().__init__()
        self.heads = heads
        self.ada = nn.Linear(d, 6 * d)
        if zero_init:
            nn.init.zeros_(self.ada.weight)
            nn.init.zeros_(self.ada.bias)
        self.qkv = nn.Linear(d, 3 * d)
        self.q_norm = nn.RMSNorm(d // heads) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(d // heads) if qk_norm else nn.Identity()
        self.proj = nn.Linear(d, d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        s1, b1, g1, s2, b2, g2 = self.ada(F.silu(c)).unsqueeze(1).chunk(6, dim=-1)
        h = F.layer_norm(x, (D,)) * (1 + s1) + b1
        q, k, v = self.qkv(h).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(self.q_norm(q), self.k_norm(k), v).transpose(1, 2).reshape(B, L, D)
        x = x + g1 * self.proj(a)
        h = F.layer_norm(x, (D,)) * (1 + s2) + b2
        return x + g2 * self.fc2(F.gelu(self.fc1(h), approximate="tanh"))


class DiT(nn.Module):
    """net(z, r, t, y=None): z [B, L, channels] tokens, r and t [B] times; with classes, y [B]
    labels, from 0 to classes - 1, or classes for none (classifier-free guidance)."""

    def __init__(self, channels: int = 4, d: int = 32, depth: int = 2, heads: int = 2, freq: int = 16,
                 classes: int | None = None, qk_norm: bool = False):
        super().__init__()
        self.register_buffer("freqs", torch.exp(-math.log(1e4) * torch.arange(freq // 2) / (freq // 2)))
        self.inp = nn.Linear(channels, d)
        self.t_mlp = nn.Sequential(nn.Linear(2 * freq, d), nn.SiLU(), nn.Linear(d, d))
        if classes is not None:
            self.label = nn.Embedding(classes + 1, d)
        self.blocks = nn.ModuleList(Block(d, heads, qk_norm=qk_norm) for _ in range(depth))
        self.out = nn.Linear(d, channels)

    def embed(self, s: torch.Tensor) -> torch.Tensor:
        a = s[:, None] * self.freqs
        return torch.cat([a.sin(), a.cos()], dim=-1)

    def forward(self, z: torch.Tensor, r: torch.Tensor, t: torch.Tensor,
                y: torch.Tensor | None = None) -> torch.Tensor:
        c = self.t_mlp(torch.cat([self.embed(t), self.embed(t - r)], dim=-1))
        if y is not None:
            c = c + self.label(y)
        x = self.inp(z)
        for b in self.blocks:
            x = b(x, c)
        return self.out(x)


def timestep_embedding(s: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, dtype=s.dtype) / half)
    a = s[:, None] * 1000.0 * freqs[None]
    return torch.cat([a.cos(), a.sin()], dim=-1)


class DigitsDiT(nn.Module):
    """u(z, r, t | y): z [B, 16, 4] tokens (2x2 patches of an 8x8 image), r and t [B] times, y [B]
    labels, from 0 to classes - 1, or classes for none."""

    def __init__(self, d: int = 64, depth: int = 3, heads: int = 4, classes: int = 10):
        super().__init__()
        self.d = d
        self.inp = nn.Linear(4, d)
        self.pos = nn.Parameter(torch.randn(1, 16, d) * 0.02)
        self.label = nn.Embedding(classes + 1, d)
        self.time = nn.Sequential(nn.Linear(2 * d, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList(Block(d, heads, zero_init=True) for _ in range(depth))
        self.out_ada = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, 4)
        for m in (self.out_ada, self.out):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, z: torch.Tensor, r: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        c = self.time(torch.cat([timestep_embedding(t, self.d), timestep_embedding(t - r, self.d)], -1))
        c = c + self.label(y)
        x = self.inp(z) + self.pos
        for b in self.blocks:
            x = b(x, c)
        shift, scale = self.out_ada(F.silu(c)).unsqueeze(1).chunk(2, dim=-1)
        return self.out(F.layer_norm(x, (self.d,)) * (1 + scale) + shift)
