"""jvpc.linearize(..., cache=True): the optimized graphs of an earlier call are reused where the
trace is the same (a hit runs the trace and fold only: its report's phases say "cache"), and
not where the shapes, the dtypes, a captured tensor, the function or argnums differ. A captured
tensor is the same where it is the same object (written in place or not), or a small one of
equal values."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import jvpc


def rand(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


class Block(torch.nn.Module):
    """Attention by hand (a scaled query, as timm's Swin writes it) and a GELU MLP."""

    def __init__(self, d=16, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.qkv = torch.nn.Linear(d, 3 * d).double()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)).double()

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        a = ((q * 0.25) @ k.transpose(-2, -1)).softmax(-1) @ v
        return self.mlp(a) + x


def hit(jvp_fn) -> bool:
    return "cache" in jvp_fn.report()["phases_ms"]


def reference(f, x, t):
    return torch.func.jvp(f, (x,), (t,))


def test_second_call_hits_and_is_right():
    block = Block()
    x, t = rand(2, 8, 16), rand(2, 8, 16, seed=1)
    out, jvp_fn = jvpc.linearize(block, x, cache=True)
    assert not hit(jvp_fn)
    x2 = rand(2, 8, 16, seed=2)
    out2, jvp_fn2 = jvpc.linearize(block, x2, cache=True)
    assert hit(jvp_fn2) and set(jvp_fn2.report()["phases_ms"]) == {"trace", "cache", "fold", "total"}
    want_out, want = reference(block, x2, t)
    torch.testing.assert_close(out2, want_out, rtol=1e-12, atol=0)
    torch.testing.assert_close(jvp_fn2(t), want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(jvp_fn(t), reference(block, x, t)[1], rtol=1e-10, atol=1e-12)  # its own point


def test_a_hit_sees_weights_written_in_place():
    block = Block()
    x, t = rand(2, 8, 16), rand(2, 8, 16, seed=1)
    jvpc.linearize(block, x, cache=True)
    with torch.no_grad():
        for p in block.parameters():
            p.mul_(0.9)  # an optimizer step
    out, jvp_fn = jvpc.linearize(block, x, cache=True)
    assert hit(jvp_fn)
    torch.testing.assert_close(jvp_fn(t), reference(block, x, t)[1], rtol=1e-10, atol=1e-12)


def test_a_hit_runs_the_trace_and_fold_only():
    block = Block()
    x = rand(2, 8, 16)
    jvpc.linearize(block, x, cache=True)
    with FlopCounterMode(display=False) as forward:
        block(x)
    with FlopCounterMode(display=False) as mode:
        _, jvp_fn = jvpc.linearize(block, x, cache=True)
    assert hit(jvp_fn)
    assert mode.get_total_flops() == jvp_fn.report()["linearize"]["matmul_flops"]
    assert forward.get_total_flops() <= mode.get_total_flops() <= 2 * forward.get_total_flops()


@pytest.mark.parametrize("change", ["shape", "dtype", "captured tensor", "function", "argnums"])
def test_misses_when_it_must(change):
    block = Block()
    x = rand(2, 8, 16)
    jvpc.linearize(block, x, cache=True)
    f, y, argnums = block, x, None
    if change == "shape":
        y = rand(2, 9, 16)
    elif change == "dtype":
        block.float()
        y = x.float()
    elif change == "captured tensor":
        block.qkv.weight = torch.nn.Parameter(block.qkv.weight.detach() * 1.5)  # another tensor, other values
    elif change == "function":
        f = block.mlp
    elif change == "argnums":
        def f(x, s):
            return block(x) * s
        jvpc.linearize(f, x, rand(1), cache=True)
        y, argnums = (x, rand(1)), 0
    args = y if isinstance(y, tuple) else (y,)
    _, jvp_fn = jvpc.linearize(f, *args, argnums=argnums, cache=True)
    assert not hit(jvp_fn)
    t = rand(*args[0].shape, seed=1, dtype=args[0].dtype)
    tol = 1e-10 if args[0].dtype == torch.float64 else 1e-5
    want = torch.func.jvp(lambda a: f(a, *args[1:]), (args[0],), (t,))[1]
    torch.testing.assert_close(jvp_fn(t), want, rtol=tol, atol=tol)


def test_no_cache_by_default():
    block = Block()
    x = rand(2, 8, 16)
    jvpc.linearize(block, x)
    assert not hit(jvpc.linearize(block, x)[1])
