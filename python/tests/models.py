"""The CLI's examples (examples/*.cpp) in Python: SDPA variants, MLP, block. The tests take them
at small sizes (the *_case functions); the PyTorch side of the benchmark
(scripts/bench/torch_reference.py) takes attention, block_fn and block_inputs at its own."""

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def randn(gen, *sizes, dtype, scale=1.0):
    return (torch.randn(*sizes, generator=gen, dtype=torch.float64) * scale).to(dtype)


# examples/sdpa.cpp's variants: (name, flags). kv_heads: grouped-query attention.
SDPA_VARIANTS = [
    ("plain", {}),
    ("causal", {"causal": True}),
    ("bool_mask", {"mask": "bool"}),
    ("float_mask", {"mask": "float"}),
    ("kv_seq", {"kv_seq": 24}),
    ("gqa", {"kv_heads": 1}),
    ("scale", {"scale": 0.3}),
    ("flash", {"backend": "flash"}),
    ("flash_causal", {"backend": "flash", "causal": True}),
]


def sdpa_case(dtype, bsz=2, heads=4, seq=16, head_dim=8, kv_seq=None, kv_heads=None, causal=False, mask="none",
              scale=None, backend="math", seed=0):
    """(f, primals, constants): f(q, k, v) with the mask captured as a constant."""
    gen = torch.Generator().manual_seed(seed)
    kv_seq = kv_seq or seq
    kv_heads = kv_heads or heads
    q = randn(gen, bsz, heads, seq, head_dim, dtype=dtype)
    k = randn(gen, bsz, kv_heads, kv_seq, head_dim, dtype=dtype)
    v = randn(gen, bsz, kv_heads, kv_seq, head_dim, dtype=dtype)
    attn_mask = None
    if mask == "bool":
        attn_mask = torch.rand(seq, kv_seq, generator=gen) < 0.8
        attn_mask[:, 0] = True
    elif mask == "float":
        attn_mask = randn(gen, seq, kv_seq, dtype=dtype)
    kernel = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def make(kern):
        def f(q, k, v):
            with sdpa_kernel(kern):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, scale=scale,
                                                      enable_gqa=kv_heads != heads)
        return f

    # The reference runs the math backend (LibTorch's fused kernels have no forward-AD formula).
    return make(kernel), make(SDPBackend.MATH), (q, k, v)


def mlp_case(dtype, bsz=2, seq=8, d=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = 4 * d
    x = randn(gen, bsz, seq, d, dtype=dtype)
    w1 = randn(gen, h, d, dtype=dtype, scale=1 / math.sqrt(d))
    b1 = randn(gen, h, dtype=dtype, scale=0.1)
    w2 = randn(gen, d, h, dtype=dtype, scale=1 / math.sqrt(h))
    b2 = randn(gen, d, dtype=dtype, scale=0.1)

    def f(x, w1, b1, w2, b2):
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)

    return f, f, (x, w1, b1, w2, b2)


def attention(q, k, v, causal):
    """examples/sdpa.cpp's function. The math backend: the fused kernels have no forward-AD formula."""
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def block_fn(bsz, seq, d, head_dim, causal):
    """examples/block.cpp's function: a pre-norm transformer block, f(x, ln1_w, ln1_b, w_qkv, b_qkv,
    w_o, b_o, ln2_w, ln2_b, w1, b1, w2, b2), x [bsz, seq, d], d // head_dim heads."""
    heads = d // head_dim

    def f(x, ln1_w, ln1_b, w_qkv, b_qkv, w_o, b_o, ln2_w, ln2_b, w1, b1, w2, b2):
        a = F.layer_norm(x, [d], ln1_w, ln1_b)
        qkv = F.linear(a, w_qkv, b_qkv).view(bsz, seq, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        o = attention(q, k, v, causal).transpose(1, 2).reshape(bsz, seq, d)
        h = x + F.linear(o, w_o, b_o)
        m = F.layer_norm(h, [d], ln2_w, ln2_b)
        m = F.linear(F.gelu(F.linear(m, w1, b1)), w2, b2)
        return h + m

    return f


def block_inputs(bsz, seq, d):
    """block_fn's inputs as (shape, scale, offset), in the order and with the scales of
    examples/block.cpp: weights 1/sqrt(fan_in), biases 0.1, layer-norm weights 1 + 0.1 * randn."""
    sd, sh = 1 / math.sqrt(d), 1 / math.sqrt(4 * d)
    return [((bsz, seq, d), 1.0, 0.0), ((d,), 0.1, 1.0), ((d,), 0.1, 0.0), ((3 * d, d), sd, 0.0),
            ((3 * d,), 0.1, 0.0), ((d, d), sd, 0.0), ((d,), 0.1, 0.0), ((d,), 0.1, 1.0),
            ((d,), 0.1, 0.0), ((4 * d, d), sd, 0.0), ((4 * d,), 0.1, 0.0), ((d, 4 * d), sh, 0.0),
            ((d,), 0.1, 0.0)]


def block_case(dtype, bsz=2, seq=8, d=32, head_dim=8, causal=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p = []
    for shape, scale, offset in block_inputs(bsz, seq, d):
        x = randn(gen, *shape, dtype=dtype, scale=scale)
        p.append(x + offset if offset else x)  # the offset added in dtype
    f = block_fn(bsz, seq, d, head_dim, causal)
    return f, f, tuple(p)


def tolerance(dtype):
    return {torch.float64: dict(rtol=1e-9, atol=1e-10), torch.float32: dict(rtol=2e-4, atol=2e-5)}[dtype]


def on_math(f):
    """f with attention on the math backend: LibTorch's fused kernels (the CPU flash kernel that
    the default backend picks) have no forward-AD formula, so torch.func's reference needs it."""
    def g(*args):
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)  # as jvpc traces: no inference fast path
        try:
            with sdpa_kernel(SDPBackend.MATH):
                return f(*args)
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
    return g
