"""Whole models from timm and diffusers, random weights, at small configurations: the cases of the
models suite (python/tests/test_models.py, size "test": a second or less each on 2 cores) and of
the models benchmark (scripts/bench/models_bench.py, size "bench").

Each case is f(*primals) with the differentiated arguments (argnums) and the others (a diffusion
model's timestep, class labels) held as they are; a second point (point2) for compiled programs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

MODELS = ["vit", "resnet", "swin", "dit", "unet"]
NO_TORCH_FUNC_JVP = {"unet"}  # UNet2DModel: torch.func.jvp fails in group_norm's forward AD


@dataclass
class Case:
    name: str
    module: torch.nn.Module
    f: Callable
    primals: tuple
    argnums: tuple
    point2: tuple
    torch_func_jvp: bool = True  # whether torch.func.jvp differentiates it (UNet2DModel's group_norm: no)


def _randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def _init(module: torch.nn.Module, dtype, seed: int) -> torch.nn.Module:
    """Random weights from a fixed seed (every parameter, and batch norms' running statistics), in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.2)
        for name, b in module.named_buffers():
            if name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=gen, dtype=torch.float64) + 0.5)
            elif name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=gen, dtype=torch.float64) * 0.2)
    return module.to(dtype).eval().requires_grad_(False)


def build(name: str, dtype=torch.float32, size: str = "test", seed: int = 0) -> Case:
    gen = torch.Generator().manual_seed(seed + 1)
    bench = size == "bench"
    if name == "vit":
        import timm
        m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64 if bench else 32,
                              **({} if bench else {"depth": 2}))
        m = _init(m, dtype, seed)
        shape = (2, 3, 64, 64) if bench else (1, 3, 32, 32)
        x, x2 = _randn(gen, *shape, dtype=dtype), _randn(gen, *shape, dtype=dtype)
        return Case(name, m, m, (x,), (0,), (x2,))
    if name == "resnet":
        import timm
        m = _init(timm.create_model("resnet18", pretrained=False), dtype, seed)
        shape = (2, 3, 64, 64) if bench else (1, 3, 32, 32)
        x, x2 = _randn(gen, *shape, dtype=dtype), _randn(gen, *shape, dtype=dtype)
        return Case(name, m, m, (x,), (0,), (x2,))
    if name == "swin":  # attention written by hand with a scaled query
        import timm
        m = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=56,
                              embed_dim=48 if bench else 32, depths=(2, 2) if bench else (1, 1), num_heads=(2, 4),
                              window_size=7)
        m = _init(m, dtype, seed)
        shape = (2 if bench else 1, 3, 56, 56)
        x, x2 = _randn(gen, *shape, dtype=dtype), _randn(gen, *shape, dtype=dtype)
        return Case(name, m, m, (x,), (0,), (x2,))
    if name == "dit":
        from diffusers import DiTTransformer2DModel
        m = DiTTransformer2DModel(num_attention_heads=4 if bench else 2, attention_head_dim=16 if bench else 8,
                                  in_channels=4, out_channels=4, num_layers=4 if bench else 2,
                                  sample_size=16 if bench else 8, patch_size=2, num_embeds_ada_norm=10)
        m = _init(m, dtype, seed)
        b, s = (2, 16) if bench else (2, 8)
        z, z2 = _randn(gen, b, 4, s, s, dtype=dtype), _randn(gen, b, 4, s, s, dtype=dtype)
        labels = torch.tensor([1, 2])

        def dit(z, t):
            return m(z, timestep=t, class_labels=labels).sample

        return Case(name, m, dit, (z, torch.tensor([3, 7])), (0,), (z2, torch.tensor([5, 1])))
    if name == "unet":
        from diffusers import UNet2DModel
        m = UNet2DModel(sample_size=16 if bench else 8, in_channels=3, out_channels=3, layers_per_block=1,
                        block_out_channels=(32, 64) if bench else (16, 32),
                        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                        up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8, attention_head_dim=8)
        m = _init(m, dtype, seed)
        s = 16 if bench else 8
        x, x2 = _randn(gen, 1, 3, s, s, dtype=dtype), _randn(gen, 1, 3, s, s, dtype=dtype)

        def unet(x, t):
            return m(x, t).sample

        t, t2 = torch.tensor([5.0], dtype=dtype), torch.tensor([11.0], dtype=dtype)
        return Case(name, m, unet, (x, t), (0,), (x2, t2), torch_func_jvp=name not in NO_TORCH_FUNC_JVP)
    raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})")


def tangents_for(case: Case, seed: int = 7) -> tuple:
    """One random tangent per differentiated argument."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(_randn(gen, *case.primals[i].shape, dtype=case.primals[i].dtype) for i in case.argnums)


def partial(case: Case, primals: tuple | None = None) -> Callable:
    """f of the differentiated arguments alone, the others held at `primals` (torch.func.jvp's form)."""
    primals = case.primals if primals is None else primals

    def g(*diff):
        args = list(primals)
        for i, d in zip(case.argnums, diff):
            args[i] = d
        return case.f(*args)

    return g
