"""jvpc.jvp and jvpc.jacfwd inside torch.func.vmap, as torch.func's: per-sample JVPs and
Jacobians, a Hutchinson estimator's batched tangents at one point, nested vmaps (float64)."""

import torch
from torch.func import jacfwd, jvp, vmap

import jvpc


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


W = rand(5, 4, seed=9)


def f(x):
    return torch.tanh(x @ W.T).sin()


def close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_shared_primals_batched_tangents_take_the_batched_tangent_graph():
    x, ts = rand(4), rand(6, 4, seed=1)
    got = vmap(lambda t: jvpc.jvp(f, (x,), (t,)), in_dims=0)(ts)
    want = vmap(lambda t: jvp(f, (x,), (t,)))(ts)
    close(got[0], want[0])
    close(got[1], want[1])
    # One linearization and one batched call: FlopCounterMode counts the forward once and the
    # tangent matmuls for six tangents. (torch 2.11's Python fallback asserts on a dispatch mode
    # around a custom op's vmap rule that dispatches.)
    if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 15):
        return
    with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
        vmap(lambda t: jvpc.jvp(f, (x,), (t,))[1])(ts)
    assert counter.get_total_flops() == 2 * 5 * 4 + 6 * 2 * 5 * 4


def test_a_hutchinson_estimate_of_the_jacobians_trace():
    g = lambda x: torch.tanh(x * W[:4].diagonal()).exp()  # noqa: E731
    x, vs = rand(4), torch.randint(0, 2, (64, 4), generator=torch.Generator().manual_seed(3)).double() * 2 - 1
    estimate = vmap(lambda v: (v * jvpc.jvp(g, (x,), (v,))[1]).sum())(vs).mean()
    want = vmap(lambda v: (v * jvp(g, (x,), (v,))[1]).sum())(vs).mean()
    close(estimate, want)


def test_per_sample_primals_and_tangents():
    xs, ts = rand(3, 4), rand(3, 4, seed=1)
    got = vmap(lambda x, t: jvpc.jvp(f, (x,), (t,)))(xs, ts)
    want = vmap(lambda x, t: jvp(f, (x,), (t,)))(xs, ts)
    close(got[0], want[0])
    close(got[1], want[1])


def test_per_sample_jacobians():
    xs = rand(3, 4)
    close(vmap(jvpc.jacfwd(f))(xs), vmap(jacfwd(f))(xs))


def test_nested_vmaps():
    xs, ts = rand(2, 3, 4), rand(2, 3, 4, seed=1)
    got = vmap(vmap(lambda x, t: jvpc.jvp(f, (x,), (t,))[1]))(xs, ts)
    want = vmap(vmap(lambda x, t: jvp(f, (x,), (t,))[1]))(xs, ts)
    close(got, want)


def test_an_identity_under_vmap():
    xs, ts = rand(3, 4), rand(3, 4, seed=1)
    out, dout = vmap(lambda x, t: jvpc.jvp(lambda y: y, (x,), (t,)))(xs, ts)
    close(out, xs)
    close(dout, ts)
