"""The rules at boundary points, against torch.func.jvp: primals at 0, at the bounds of clamps and
thresholds, at ties, ±inf and NaN, and tangents that are ±inf and NaN where a mask or a
selection is off. Each result equals torch.func's, NaNs where its NaNs are (float64, CPU), or
differs for a reason docs/python.md lists (`KNOWN` here, each checked to still differ)."""

import math

import pytest
import torch
import torch.nn.functional as F

import jvpc

INF, NAN = math.inf, math.nan
X = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 6.0, 3.0, INF, -INF, NAN, 1e-300, -1e-300, 1e300],
                 dtype=torch.float64)
N = X.numel()
# Tangents: finite everywhere; then infinite and NaN in turn, so that each element meets one.
TANGENTS = {
    "finite": torch.linspace(-1.5, 2.5, N, dtype=torch.float64),
    "inf": torch.tensor([INF, -INF, 1.0] * 5 + [INF], dtype=torch.float64)[:N],
    "nan": torch.tensor([NAN, 1.0] * 8, dtype=torch.float64)[:N],
}
Y = X.flip(0)  # a second operand, with ties against X where the list is symmetric
Y[0] = 0.0  # a tie at 0
Y[2] = 1.0  # and at 1

UNARY = {
    "relu": torch.relu, "relu6": F.relu6, "threshold": lambda x: F.threshold(x, 0.5, -1.0),
    "hardtanh": lambda x: F.hardtanh(x, -1.0, 1.0), "clamp": lambda x: x.clamp(-1.0, 1.0),
    "clamp_min": lambda x: x.clamp(min=0.0), "clamp_max": lambda x: x.clamp(max=1.0),
    "leaky_relu": F.leaky_relu, "elu": F.elu, "selu": F.selu, "celu": F.celu, "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "mish": F.mish,
    "softplus": F.softplus, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid,
    "softshrink": F.softshrink, "hardshrink": F.hardshrink, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "abs": torch.abs, "sign": torch.sign, "floor": torch.floor, "round": torch.round, "exp": torch.exp,
    "expm1": torch.expm1, "log1p": torch.log1p, "sin": torch.sin, "cos": torch.cos, "atan": torch.atan,
    "asinh": torch.asinh, "erf": torch.erf, "sqrt_abs": lambda x: x.abs().sqrt(), "square": torch.square,
    "reciprocal": torch.reciprocal, "nan_to_num": torch.nan_to_num,
    "masked_mul": lambda x: x * (x > 0).to(x.dtype), "where": lambda x: torch.where(x > 0, x, 0.0),
    "pow3": lambda x: x.pow(3), "pow_half_abs": lambda x: x.abs().pow(0.5), "logsigmoid": F.logsigmoid,
}
BINARY = {
    "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin,
    "clamp_min_t": torch.clamp_min, "clamp_max_t": torch.clamp_max, "mul": torch.mul, "div": torch.div,
    "atan2": torch.atan2, "hypot": torch.hypot, "copysign": torch.copysign,
    "clamp_t": lambda x, y: torch.clamp(x, torch.minimum(y, torch.zeros_like(y)), torch.maximum(y, torch.zeros_like(y))),
}
REDUCTIONS = {
    "amax": lambda x: x.view(4, 4).amax(1), "amin": lambda x: x.view(4, 4).amin(1),
    "max_dim": lambda x: x.view(4, 4).max(1).values, "max": lambda x: x.max().reshape(1),
    "logsumexp": lambda x: x.view(4, 4).logsumexp(1), "softmax": lambda x: x.view(4, 4).softmax(1),
    "norm2": lambda x: x.view(4, 4).norm(dim=1), "norm_inf": lambda x: x.view(4, 4).norm(p=INF, dim=1),
    "sort": lambda x: x.view(4, 4).sort(1).values, "cumsum": lambda x: x.cumsum(0),
}
# Where jvpc differs from torch.func, and why (docs/python.md lists them).
KNOWN: dict[tuple[str, str], str] = {
    ("norm_inf", "finite"): "the inf-norm of a row holding NaN is NaN; torch.func gives it tangent 0, jvpc NaN",
}
# jvpc's rules are torch 2.15's. Before it, forward AD sent ties, bounds and infinite tangents of
# these ops elsewhere (torch 2.11: a clamp's bound passes the tangent, maximum's tangent is
# other_t + (self_t - other_t) where self wins, NaN for infinite ones); the 2.15 stage checks them.
SELECTIONS_BEFORE_2_15 = {"clamp", "clamp_min", "clamp_max", "clamp_t", "clamp_min_t", "clamp_max_t", "maximum",
                          "minimum", "fmax", "fmin"}
OLDER_TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 15)


def agree(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Elementwise: NaN where torch.func has NaN, the same infinity, and finite values within
    rounding (1e-12 relative: the rules compute the same derivative by other kernels)."""
    close = (got - want).abs() <= 1e-12 * want.abs() + 1e-300
    return (got == want) | (got.isnan() & want.isnan()) | (got.isfinite() & want.isfinite() & close)


def same(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and bool(agree(got, want).all())


def check(name, f, primals, tangents, kind):
    try:
        want = torch.func.jvp(f, primals, tangents)[1]
    except Exception as e:  # noqa: BLE001  (torch.func has no rule there: nothing to match)
        pytest.skip(f"torch.func.jvp fails: {str(e).splitlines()[0][:80]}")
    got = jvpc.jvp(f, primals, tangents)[1]
    if (name, kind) in KNOWN:
        assert not same(got, want), f"{name} ({kind}) now agrees: drop it from KNOWN and docs/python.md"
        return
    if OLDER_TORCH and name in SELECTIONS_BEFORE_2_15 and not same(got, want):
        pytest.skip(f"torch {torch.__version__} takes other ties for {name}; jvpc follows torch 2.15")
    bad = ~agree(got, want)
    assert same(got, want), (f"{name} ({kind} tangents): at primals {primals[0][bad.nonzero().flatten()].tolist()} "
                             f"jvpc gives {got[bad].tolist()}, torch.func {want[bad].tolist()}")


@pytest.mark.parametrize("kind", list(TANGENTS))
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name, kind):
    check(name, UNARY[name], (X.clone(),), (TANGENTS[kind].clone(),), kind)


@pytest.mark.parametrize("kind", list(TANGENTS))
@pytest.mark.parametrize("name", list(BINARY))
def test_binary(name, kind):
    t = TANGENTS[kind]
    check(name, BINARY[name], (X.clone(), Y.clone()), (t.clone(), t.flip(0) * 10), kind)


@pytest.mark.parametrize("kind", list(TANGENTS))
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions_and_ties(name, kind):
    x = torch.tensor([1.0, 1.0, 0.0, -1.0, 2.0, 2.0, 2.0, 0.0, -INF, 0.0, 0.0, 3.0, NAN, 1.0, 1.0, 0.0],
                     dtype=torch.float64)
    check(name, REDUCTIONS[name], (x,), (TANGENTS[kind].clone(),), kind)
