"""torch.func's conventions beyond the basic calls (has_aux, jacfwd's signature), jvpc inside
torch.compile, and whole-model patterns under a TorchDispatchMode (FlopCounterMode, or a mode
that only forwards every call)."""

import inspect

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

import jvpc


class Forwarding(TorchDispatchMode):
    """A mode that only forwards every call."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


MODES = [lambda: FlopCounterMode(display=False), Forwarding]


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_jvp_has_aux_as_torch_func():
    x, t = rand(3, 4), rand(3, 4, seed=1)

    def f(x):
        y = x.sin() * x
        return y, {"norm": y.norm().detach()}

    out, dout, aux = jvpc.jvp(f, (x,), (t,), has_aux=True)
    want, dwant, want_aux = torch.func.jvp(f, (x,), (t,), has_aux=True)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(dout, dwant, rtol=1e-12, atol=0)
    assert torch.equal(aux["norm"], want_aux["norm"])
    with pytest.raises(jvpc.Error, match=r"has_aux=True, func must return a tuple \(output, aux\)"):
        jvpc.jvp(lambda x: x * 2, (x,), (t,), has_aux=True)


def test_linearize_has_aux():
    x, t = rand(5), rand(5, seed=1)
    out, jvp_fn, aux = jvpc.linearize(lambda x: (x.exp(), x.shape[0]), x, has_aux=True)
    assert aux == 5
    torch.testing.assert_close(jvp_fn(t), x.exp() * t, rtol=1e-12, atol=0)


def test_jacfwd_takes_torch_funcs_signature():
    want = inspect.signature(torch.func.jacfwd).parameters
    got = inspect.signature(jvpc.jacfwd).parameters
    for name in ("func", "argnums", "has_aux", "randomness"):
        assert got[name].kind == want[name].kind and got[name].default == want[name].default, name
    assert got["chunk_size"].kind is inspect.Parameter.KEYWORD_ONLY
    x = rand(3)
    torch.testing.assert_close(jvpc.jacfwd(torch.sin, 0, False, randomness="same")(x), torch.diag(x.cos()))
    with pytest.raises(TypeError):
        jvpc.jacfwd(torch.sin, 0, False, 2)  # chunk_size is keyword-only
    with pytest.raises(jvpc.Error, match="randomness"):
        jvpc.jacfwd(torch.sin, randomness="sometimes")


def test_jacfwd_takes_and_gives_pytrees_as_torch_func():
    x, y, s = rand(3), rand(2, 3, seed=1), torch.tensor(0.7, dtype=torch.float64)

    def f(d, s):
        return {"a": d["x"].sin() * s, "b": (d["y"] @ d["x"], s * s)}

    for argnums in (0, 1, (0, 1), (1, 0)):
        got = jvpc.jacfwd(f, argnums=argnums)({"x": x, "y": y}, s)
        want = torch.func.jacfwd(f, argnums=argnums)({"x": x, "y": y}, s)
        flat_got, spec_got = torch.utils._pytree.tree_flatten(got)
        flat_want, spec_want = torch.utils._pytree.tree_flatten(want)
        assert spec_got == spec_want, argnums
        for a, b in zip(flat_got, flat_want):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=0)
    # 0-dim in and out; the same tensor in two places of a tuple.
    torch.testing.assert_close(jvpc.jacfwd(torch.sin)(s), torch.func.jacfwd(torch.sin)(s))
    g = lambda t: t[0] * t[1]  # noqa: E731
    got, want = jvpc.jacfwd(g)((x, x)), torch.func.jacfwd(g)((x, x))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("argnums, message", [
    (0.0, "argnums must be int or Tuple[int, ...], got: <class 'float'>"),
    ([0], "argnums must be int or Tuple[int, ...], got: <class 'list'>"),
    ((), "argnums must be non-empty"),
    ((0, 0), "argnums elements must be unique, got (0, 0)"),
    (5, "Got argnum=5, but only 2 positional inputs"),
])
def test_jacfwd_checks_argnums_as_torch_func(argnums, message):
    x = rand(3)
    with pytest.raises(RuntimeError) as want:
        torch.func.jacfwd(torch.mul, argnums=argnums)(x, x)
    with pytest.raises(jvpc.Error) as got:
        jvpc.jacfwd(torch.mul, argnums=argnums)(x, x)
    assert str(got.value) == str(want.value) == message


def test_a_value_computed_without_forward_ad_has_no_tangent():
    import torch.autograd.forward_ad as fwAD

    def f(x):
        with fwAD._set_fwd_grad_enabled(False):
            shift = x ** 2
        return x ** 2 - shift

    x, t = rand(4), rand(4, seed=1)
    torch.testing.assert_close(jvpc.jvp(f, (x,), (t,))[1], torch.func.jvp(f, (x,), (t,))[1], rtol=1e-12, atol=0)
    torch.testing.assert_close(jvpc.compile(f, x)(x)[1](t), 2 * x * t, rtol=1e-12, atol=0)


def test_inside_torch_compile_is_an_opaque_call():
    x, t = rand(4), rand(4, seed=1)
    torch._dynamo.reset()

    @torch.compile(backend="eager")
    def g(x, t):
        out, dout = jvpc.jvp(torch.sin, (x * 2,), (t,))
        return out + 1, dout

    out, dout = g(x, t)
    torch.testing.assert_close(out, (x * 2).sin() + 1)
    torch.testing.assert_close(dout, (x * 2).cos() * t)

    @torch.compile(backend="eager", fullgraph=True)
    def h(x, t):
        return jvpc.jvp(torch.sin, (x,), (t,))

    with pytest.raises(Exception, match="jvpc.jvp traces and runs its graphs eagerly"):
        h(x, t)


@pytest.mark.parametrize("make_mode", MODES)
def test_hand_written_attention_with_a_scaled_query_under_a_mode(make_mode):
    q, k, v = (rand(2, 4, 16, 8, seed=s) for s in range(3))
    dq, dk, dv = (rand(2, 4, 16, 8, seed=s) for s in range(3, 6))

    def attention(q, k, v):
        return ((q * 0.125) @ k.transpose(-2, -1)).softmax(-1) @ v

    want = torch.func.jvp(attention, (q, k, v), (dq, dk, dv))[1]
    with make_mode():
        _, jvp_fn = jvpc.linearize(attention, q, k, v)
    torch.testing.assert_close(jvp_fn(dq, dk, dv), want, rtol=1e-10, atol=1e-12)
    assert "jvpc::attention_tangent" in str(jvpc.linearize(attention, q, k, v, options=o_form())[1].graph)


def o_form():
    o = jvpc.LinearizeOptions()
    o.residual_budget = 0
    return o


@pytest.mark.parametrize("make_mode", MODES)
def test_program_with_a_scalar_constant_under_a_mode(make_mode):
    x, t, dx = rand(4, 3), rand(4), rand(4, 3, seed=2)

    def f(x, t):
        return x * torch.sin(t[:, None] * 1000)

    prog = jvpc.compile(f, x, t)
    with make_mode():
        out, jvp_fn = prog(x, t)
        dout = jvp_fn(dx, torch.zeros_like(t))
    torch.testing.assert_close(out, f(x, t), rtol=1e-12, atol=0)
    torch.testing.assert_close(dout, dx * torch.sin(t[:, None] * 1000), rtol=1e-12, atol=0)
