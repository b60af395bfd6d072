"""A small DiT (adaLN-Zero blocks, SDPA, sinusoidal time embeddings of r and t) for the training-step
benchmark (train_step.py) and the training tests (python/tests/test_train_*.py).

net(z, r, t): z [B, L, C] tokens, r and t [B] times; returns [B, L, C]. MeanFlow differentiates it
along (v, 0, 1); sCM along (dx/dt, 1) with r unused.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ada = nn.Linear(d, 6 * d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        s1, b1, g1, s2, b2, g2 = self.ada(F.silu(c)).unsqueeze(1).chunk(6, dim=-1)
        h = F.layer_norm(x, (D,)) * (1 + s1) + b1
        q, k, v = self.qkv(h).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, D)
        x = x + g1 * self.proj(a)
        h = F.layer_norm(x, (D,)) * (1 + s2) + b2
        return x + g2 * self.fc2(F.gelu(self.fc1(h), approximate="tanh"))


class DiT(nn.Module):
    def __init__(self, channels: int = 4, d: int = 32, depth: int = 2, heads: int = 2, freq: int = 16):
        super().__init__()
        self.register_buffer("freqs", torch.exp(-math.log(1e4) * torch.arange(freq // 2) / (freq // 2)))
        self.inp = nn.Linear(channels, d)
        self.t_mlp = nn.Sequential(nn.Linear(2 * freq, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(depth))
        self.out = nn.Linear(d, channels)

    def embed(self, s: torch.Tensor) -> torch.Tensor:
        a = s[:, None] * self.freqs
        return torch.cat([a.sin(), a.cos()], dim=-1)

    def forward(self, z: torch.Tensor, r: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        c = self.t_mlp(torch.cat([self.embed(t), self.embed(t - r)], dim=-1))
        x = self.inp(z)
        for b in self.blocks:
            x = b(x, c)
        return self.out(x)
