"""jvpc.linearize and jvpc.jvp against torch.func.linearize and torch.func.jvp (and central
differences in float64), on the CLI's examples, nn.MultiheadAttention and nn.TransformerEncoderLayer."""

import pytest
import torch
from torch.func import functional_call

import jvpc
from models import SDPA_VARIANTS, block_case, mlp_case, on_math, sdpa_case, tolerance

DTYPES = [torch.float64, torch.float32]


def tangents_like(primals, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype) for p in primals)


def check(f, ref, primals, dtype):
    tol = tolerance(dtype)
    out, jvp_fn = jvpc.linearize(f, *primals)
    ref_out, ref_jvp = torch.func.linearize(ref, *primals)
    torch.testing.assert_close(out, ref_out, **tol)
    for seed in (1, 2):  # the first and a later call
        t = tangents_like(primals, seed)
        torch.testing.assert_close(jvp_fn(*t), ref_jvp(*t), **tol)
    t = tangents_like(primals, 3)
    out2, dout = jvpc.jvp(f, primals, t)
    ref_out2, ref_dout = torch.func.jvp(ref, primals, t)
    torch.testing.assert_close(out2, ref_out2, **tol)
    torch.testing.assert_close(dout, ref_dout, **tol)
    if dtype == torch.float64:  # central differences decide where references may be wrong
        eps = 1e-6
        plus = ref(*[p + eps * d for p, d in zip(primals, t)])
        minus = ref(*[p - eps * d for p, d in zip(primals, t)])
        torch.testing.assert_close(dout, (plus - minus) / (2 * eps), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name,flags", SDPA_VARIANTS, ids=[v[0] for v in SDPA_VARIANTS])
def test_sdpa(name, flags, dtype):
    f, ref, primals = sdpa_case(dtype, **flags)
    check(f, ref, primals, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mlp(dtype):
    check(*mlp_case(dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_block(dtype, causal):
    check(*block_case(dtype, causal=causal), dtype)



@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_multihead_attention_functional_call(dtype):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).to(dtype).eval()
    params = {k: v.detach() for k, v in mha.named_parameters()}
    x = torch.randn(2, 8, 16, dtype=dtype)

    def f(params, x):
        return functional_call(mha, params, (x, x, x), {"need_weights": False})[0]

    out, jvp_fn = jvpc.linearize(f, params, x)
    ref_out, ref_jvp = torch.func.linearize(on_math(f), params, x)
    tol = tolerance(dtype)
    torch.testing.assert_close(out, ref_out, **tol)
    dp = {k: torch.randn_like(v) for k, v in params.items()}
    dx = torch.randn_like(x)
    torch.testing.assert_close(jvp_fn(dp, dx), ref_jvp(dp, dx), **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_transformer_encoder_layer_captured(dtype):
    """Parameters captured (constants): the derivative with respect to the input only."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True).to(dtype).eval()
    x = torch.randn(2, 8, 16, dtype=dtype)
    with torch.no_grad():
        check(layer, on_math(layer), (x,), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_transformer_encoder_layer_functional_call(dtype):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True).to(dtype).eval()
    params = {k: v.detach() for k, v in layer.named_parameters()}
    x = torch.randn(2, 8, 16, dtype=dtype)

    def f(params, x):
        return functional_call(layer, params, (x,))

    out, jvp_fn = jvpc.linearize(f, params, x)
    ref_out, ref_jvp = torch.func.linearize(on_math(f), params, x)
    tol = tolerance(dtype)
    torch.testing.assert_close(out, ref_out, **tol)
    dp = {k: torch.randn_like(v) for k, v in params.items()}
    dx = torch.randn_like(x)
    torch.testing.assert_close(jvp_fn(dp, dx), ref_jvp(dp, dx), **tol)


def test_pytrees_and_argnums():
    x = {"a": torch.randn(3, 4, dtype=torch.float64), "b": [torch.randn(4, dtype=torch.float64)]}
    idx = torch.tensor([2, 0])

    def f(d, idx, power):
        y = (d["a"] @ d["b"][0]).sin()
        return {"y": y[idx] ** power, "z": (d["a"].exp(), y)}

    out, jvp_fn = jvpc.linearize(f, x, idx, 3, argnums=0)
    ref_out, ref_jvp = torch.func.linearize(lambda d: f(d, idx, 3), x)
    torch.testing.assert_close(out, ref_out)
    t = {"a": torch.randn(3, 4, dtype=torch.float64), "b": [torch.randn(4, dtype=torch.float64)]}
    torch.testing.assert_close(jvp_fn(t), ref_jvp(t))
    assert jvp_fn.tangent_names == ["dd['a']", "dd['b'][0]"]


def test_integer_primal_is_refused_as_torch_func_does():
    with pytest.raises(ValueError, match="Expected primal to be floating point or complex, but got: torch.int64"):
        jvpc.linearize(lambda x: x * 2, torch.arange(3))
    with pytest.raises(ValueError):
        torch.func.linearize(lambda x: x * 2, torch.arange(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name,flags", SDPA_VARIANTS[:3], ids=[v[0] for v in SDPA_VARIANTS[:3]])
def test_sdpa_cuda(name, flags):
    f, ref, primals = sdpa_case(torch.float32, **flags)
    primals = tuple(p.cuda() for p in primals)
    out, jvp_fn = jvpc.linearize(f, *primals)
    ref_out, ref_jvp = torch.func.linearize(ref, *primals)
    t = tuple(torch.randn_like(p) for p in primals)
    for _ in range(3):  # eager, capture, replay
        torch.testing.assert_close(jvp_fn(*t), ref_jvp(*t), rtol=1e-3, atol=1e-4)
