"""Whole models from timm and diffusers (python/tests/model_zoo.py: random weights, small
configurations): jvpc's primal and tangent against torch.func.jvp on the math SDPA backend
(float64 and float32), FlopCounterMode's count of jvp_fn against the forward's, a compiled
program at a second point, and UNet2DModel, which torch.func.jvp cannot differentiate, against
central differences in float64."""

import os
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import jvpc

from models import on_math  # noqa: E402
from model_zoo import MODELS, NO_TORCH_FUNC_JVP, build, partial, tangents_for

BY_TORCH_FUNC = [m for m in MODELS if m not in NO_TORCH_FUNC_JVP]
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}


def rel_error(got, want):
    return ((got - want).norm() / want.norm()).item()


def diff_primals(case, primals=None):
    primals = case.primals if primals is None else primals
    return tuple(primals[i] for i in case.argnums)


def central_differences(g, primals, tangents, eps=1e-6):
    plus = g(*(p + eps * t for p, t in zip(primals, tangents)))
    minus = g(*(p - eps * t for p, t in zip(primals, tangents)))
    return (plus - minus) / (2 * eps)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", BY_TORCH_FUNC)
def test_matches_torch_func_jvp(name, dtype):
    case = build(name, dtype)
    g, x, t = partial(case), diff_primals(case), tangents_for(case)
    want_out, want = torch.func.jvp(on_math(g), x, t)
    out, dout = jvpc.jvp(g, x, t)
    assert rel_error(out, want_out) <= TOLERANCE[dtype]
    assert rel_error(dout, want) <= TOLERANCE[dtype]


@pytest.mark.parametrize("name", MODELS)
def test_jvp_fn_flops_against_the_forwards(name):
    """jvp_fn's matmuls, as FlopCounterMode counts them: what the cost model says, and at most twice
    the forward's (a product with one varying factor has one product as tangent, attention's two;
    products of constants, such as a timestep embedding's, none), fewer than torch.func.jvp's."""
    case = build(name, torch.float32)
    g, x, t = on_math(partial(case)), diff_primals(case), tangents_for(case)
    with FlopCounterMode(display=False) as forward:
        g(*x)
    _, jvp_fn = jvpc.linearize(g, *x)
    with FlopCounterMode(display=False) as tangent:
        jvp_fn(*t)
    count = tangent.get_total_flops()
    assert count == jvp_fn.cost()["matmul_flops"]
    assert 0 < count <= 2 * forward.get_total_flops()
    if case.torch_func_jvp:
        with FlopCounterMode(display=False) as torch_jvp:
            torch.func.jvp(g, x, t)
        assert count < torch_jvp.get_total_flops()


@pytest.mark.parametrize("name", MODELS)
def test_compiled_program_at_a_second_point(name):
    case = build(name, torch.float64)
    prog = jvpc.compile(case.f, *case.primals, argnums=case.argnums)
    out, jvp_fn = prog(*case.point2)
    t = tangents_for(case)
    dout = jvp_fn(*t)
    g, x2 = partial(case, case.point2), diff_primals(case, case.point2)
    # Inductor's kernels (JVPC_BACKEND=inductor) round as torch.compile's: the DiT computes its
    # time embedding in float32 whatever its dtype, where Inductor's sin and cos are not libm's,
    # and torch.compile's own output is 5.8e-8 from eager's there.
    inductor = os.environ.get("JVPC_BACKEND") == "inductor"
    with torch.no_grad():
        assert rel_error(out, g(*x2)) <= (1e-7 if inductor else 1e-12)
    if case.torch_func_jvp:
        want = torch.func.jvp(on_math(g), x2, t)[1]
        assert rel_error(dout, want) <= (1e-7 if inductor else 1e-10)
    else:
        with torch.no_grad():
            assert rel_error(dout, central_differences(g, x2, t)) <= 1e-7


def test_unet_which_torch_func_cannot_differentiate_against_central_differences():
    case = build("unet", torch.float64)
    g, x, t = partial(case), diff_primals(case), tangents_for(case)
    with pytest.raises(RuntimeError):  # group_norm's forward AD (why this model is checked so)
        torch.func.jvp(g, x, t)
    out, dout = jvpc.jvp(g, x, t)
    with torch.no_grad():
        assert rel_error(out, g(*x)) <= 1e-12
        fd = central_differences(g, x, t)
    assert rel_error(dout, fd) <= 1e-7


def test_models_bench_refuses_an_unknown_model():
    import subprocess
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "bench", "models_bench.py")
    r = subprocess.run([sys.executable, script, "--models", "vit,nope"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "unknown model 'nope'" in r.stderr.strip().splitlines()[-1]
