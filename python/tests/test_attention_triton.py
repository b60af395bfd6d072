"""Attention's tangent and its backward as fused Triton kernels (jvpc/_attention_triton.py), run
on CPU tensors in Triton's interpreter: out, lse and d(out) in one pass, and the gradients to q, k,
v, dq, dk, dv from those of d(out) and out, against the math definition under autograd, the ATen
operator and torch.func on SDPA's math path; float64 at 1e-10 and float32. The route through them
(jvp_fn, tangent_grad) runs with the kernels registered for the CPU, in a process of its own."""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import jvpc  # noqa: F401  (registers the jvpc operators)

from test_attention_tangent_backward import reference


def _interpreter_runs_loops():
    """Triton 3.6's interpreter (torch 2.11's) cannot take a runtime loop bound with numpy >= 2.4."""
    import triton
    import triton.language as tl

    @triton.jit
    def count(x, n, step: tl.constexpr):
        for i in range(0, n, step):
            tl.store(x + i // step, 1.0)

    x = torch.zeros(2)
    try:
        count[(1,)](x, 2, step=1)
    except Exception:  # noqa: BLE001  (the interpreter's own error types vary by release)
        return False
    return bool(x.sum() == 2)


def _why_not() -> str | None:
    """Why the kernels cannot run in the interpreter here, or None. (The tests are skipped one by
    one, not the module: a module with no test collected fails pytest.)"""
    try:
        from jvpc import _attention_triton
    except ImportError as e:
        return f"no Triton: {e}"
    if type(_attention_triton._forward_kernel).__name__ != "InterpretedFunction":
        return "the kernels were decorated for the GPU before this file set TRITON_INTERPRET: run it alone"
    if not _interpreter_runs_loops():
        import triton

        return f"Triton {triton.__version__}'s interpreter cannot run a loop with a runtime bound here"
    return None


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
if WHY_NOT is None:
    from jvpc import _attention_triton as triton_attention

aten_tangent = torch.ops.jvpc.attention_tangent.default
aten_backward = torch.ops.jvpc.attention_tangent_backward.default

CASES = {  # name: (H, Hkv, Lq, Lk, D, Dv, mask, causal, tangents); lengths cross 16-wide blocks
    "plain": (2, 2, 37, 29, 8, 8, None, False, "qkv"),
    "causal_lq_gt_lk": (2, 2, 37, 21, 8, 8, None, True, "qkv"),
    "causal_lq_lt_lk_gqa_4_2": (4, 2, 20, 45, 8, 8, None, True, "qkv"),
    "bool_mask_gqa_4_1": (4, 1, 33, 18, 8, 8, "bool", False, "qv"),
    "float_mask_and_dmask": (2, 2, 17, 33, 8, 8, "float", False, "km"),
    "dead_rows_causal": (4, 2, 33, 33, 8, 8, "dead", True, "qkv"),
    "value_head_unlike_query": (2, 1, 19, 17, 20, 12, None, False, "qkv"),
}


def operands(H, Hkv, Lq, Lk, D, Dv, mask, causal, tangents, dtype=torch.float64, B=2):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    q, k, v = r(B, H, Lq, D), r(B, Hkv, Lk, D), r(B, Hkv, Lk, Dv)
    dq, dk, dv = (r(*t.shape) if n in tangents else None for n, t in zip("qkv", (q, k, v)))
    m = None
    if mask == "bool":
        m = torch.rand(1, H, Lq, Lk, generator=g) > 0.3
        m[..., 0] = True
    elif mask == "float":
        m = r(B, 1, Lq, Lk)
    elif mask == "dead":
        m = torch.rand(B, 1, Lq, Lk, generator=g) > 0.3
        m[:, :, 5] = False  # a row with every key masked
        m[:, :, 6:, 0] = True
    dm = r(1, 1, Lq, Lk) if "m" in tangents else None
    return q, k, v, dq, dk, dv, m, dm, causal, 0.37


def close(a, b, tol):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", CASES)
def test_forward_in_one_pass_and_given_lse(name):
    """out, lse, d(out) by the online pass; d(out) given out and lse (the operator's kernel); all
    equal the math definition and the ATen operator in float64 at 1e-10."""
    args = operands(*CASES[name])
    q, k, v, dq, dk, dv, m, dm, causal, scale = args
    ref_dout, ref_out, ref_lse = reference(q, k, v, dq, dk, dv, m, dm, causal, scale)
    out, lse, dout, _ = triton_attention.forward(q, k, v, m, dq, dk, dv, dm, causal, scale)
    close(out, ref_out, 1e-10)
    close(lse, ref_lse, 1e-10)
    close(dout, ref_dout, 1e-10)
    given = triton_attention.attention_tangent(q, k, v, ref_out, ref_lse, dq, dk, dv, m, dm, causal, scale, 0, 0)
    close(given, ref_dout, 1e-10)
    close(given, aten_tangent(q, k, v, ref_out, ref_lse, dq, dk, dv, m, dm, causal, scale, 4, 5), 1e-10)


@pytest.mark.parametrize("name", CASES)
def test_backward_through_out_and_its_tangent(name):
    """The six gradients of <G, d(out)> + <Go, out> equal autograd's through the math definition
    (float64, 1e-10); those of <G, d(out)> alone equal the ATen backward's."""
    args = operands(*CASES[name])
    q, k, v, dq, dk, dv, m, dm, causal, scale = args
    leaves = [None if t is None else t.clone().requires_grad_() for t in (q, k, v, dq, dk, dv)]
    dout, out, lse = reference(*leaves, m, dm, causal, scale)
    gen = torch.Generator().manual_seed(1)
    G = torch.randn(dout.shape, generator=gen, dtype=q.dtype)
    Go = torch.randn(dout.shape, generator=gen, dtype=q.dtype)
    out_h = reference_out(*leaves[:3], m, causal, scale)
    present = [t for t in leaves if t is not None]
    want = torch.autograd.grad((dout * G).sum() + (out_h * Go).sum(), present)
    got = triton_attention.backward(q, k, v, out, lse, dout.detach(), dq, dk, dv, m, dm, causal, scale, grad=G,
                                    grad_out=Go)
    assert [g is None for g in got] == [t is None for t in leaves]
    for a, b in zip([g for g in got if g is not None], want):
        close(a, b, 1e-10)
    mine = triton_attention.attention_tangent_backward(G, q, k, v, out, lse, dout.detach(), dq, dk, dv, m, dm, causal,
                                                       scale, 4, 5)
    theirs = aten_backward(G, q, k, v, out, lse, dout.detach(), dq, dk, dv, m, dm, causal, scale, 4, 5)
    for a, b in zip(mine, theirs):
        assert (a is None) == (b is None)
        if a is not None:
            close(a, b, 1e-10)


def reference_out(q, k, v, mask, causal, scale):
    """out = softmax(S)·v with autograd history (0 in a row with every key masked)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    alive = s.detach().logsumexp(-1, keepdim=True).isfinite()
    return torch.where(alive, torch.softmax(torch.where(alive, s, 0), -1), 0) @ v


@pytest.mark.parametrize("causal", [False, True])
def test_equals_torch_func_on_the_math_path(causal):
    """d(out) and the gradients of <G, d(out)> equal torch.func's jvp (and its vjp) through
    F.scaled_dot_product_attention on the math path, GQA 4/2, float64."""
    q, k, v, dq, dk, dv, _, _, _, scale = operands(4, 2, 35, 35, 8, 8, None, causal, "qkv")

    def attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)

    def tangent(q, k, v, dq, dk, dv):
        return torch.func.jvp(attention, (q, k, v), (dq, dk, dv))

    with sdpa_kernel(SDPBackend.MATH):
        (out, dout), vjp = torch.func.vjp(tangent, q, k, v, dq, dk, dv)
        G = torch.randn_like(dout)
        want = vjp((torch.zeros_like(out), G))
    got_out, lse, got_dout, _ = triton_attention.forward(q, k, v, None, dq, dk, dv, None, causal, scale)
    close(got_out, out, 1e-10)
    close(got_dout, dout, 1e-10)
    got = triton_attention.backward(q, k, v, got_out, lse, got_dout, dq, dk, dv, None, None, causal, scale, grad=G)
    for a, b in zip(got, want):
        close(a, b, 1e-10)


def test_float32():
    """float32 accumulates in float32: within 1e-5 of the float64 result (1e-4 for gradients)."""
    q, k, v, dq, dk, dv, m, dm, causal, scale = operands(*CASES["causal_lq_lt_lk_gqa_4_2"])
    f64 = (q, k, v, m, dq, dk, dv, dm)
    f32 = [t.float() for t in (q, k, v)] + [m] + [t.float() for t in (dq, dk, dv)] + [dm]
    out64, lse64, dout64, _ = triton_attention.forward(*f64, causal, scale)
    out32, lse32, dout32, _ = triton_attention.forward(*f32, causal, scale)
    assert out32.dtype == dout32.dtype == torch.float32
    for a, b in ((out32, out64), (lse32, lse64), (dout32, dout64)):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)
    G = torch.randn_like(dout64)
    g64 = triton_attention.backward(q, k, v, out64, lse64, dout64, dq, dk, dv, m, dm, causal, scale, grad=G)
    g32 = triton_attention.backward(*f32[:3], out32, lse32, dout32, *f32[4:7], m, dm, causal, scale, grad=G.float())
    for a, b in zip(g32, g64):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_float16_accumulates_in_float32():
    """float16 operands, float32 accumulation and lse: within float16's rounding of the float64
    result. (bfloat16 shares the code path; Triton's interpreter multiplies bfloat16 operands of
    tl.dot wrongly, so it is checked on a GPU only, by the GPU check.)"""
    q, k, v, dq, dk, dv, m, dm, causal, scale = operands(*CASES["causal_lq_lt_lk_gqa_4_2"])
    half = [t.half() for t in (q, k, v, dq, dk, dv)]
    out64, lse64, dout64, _ = triton_attention.forward(q, k, v, m, dq, dk, dv, dm, causal, scale)
    out16, lse16, dout16, _ = triton_attention.forward(*half[:3], m, *half[3:], dm, causal, scale)
    assert out16.dtype == dout16.dtype == torch.float16 and lse16.dtype == torch.float32
    for a, b in ((out16, out64), (lse16, lse64), (dout16, dout64)):
        assert (a.double() - b).abs().max() <= 5e-3 * b.abs().max()
    G = torch.randn_like(dout64)
    g64 = triton_attention.backward(q, k, v, out64, lse64, dout64, dq, dk, dv, m, dm, causal, scale, grad=G, grad_out=G)
    g16 = triton_attention.backward(*half[:3], out16, lse16, dout16, *half[3:], m, dm, causal, scale, grad=G.half(),
                                    grad_out=G.half())
    for a, b in zip(g16, g64):
        assert a.dtype == torch.float16 and (a.double() - b).abs().max() <= 5e-3 * b.abs().max()


def test_only_the_gradients_wanted():
    """wanted selects the gradients computed (one kernel or the other may not run at all); the
    rest are None, and those computed equal the full call's."""
    q, k, v, dq, dk, dv, m, dm, causal, scale = operands(*CASES["plain"])
    out, lse, dout, c = triton_attention.forward(q, k, v, m, dq, dk, dv, dm, causal, scale, want_c=True)
    G = torch.randn_like(dout)
    full = triton_attention.backward(q, k, v, out, lse, dout, dq, dk, dv, m, dm, causal, scale, grad=G)
    for wanted in [(False, True, False, False, False, True), (True, False, False, True, False, False),
                   (False, False, True, False, False, False)]:
        got = triton_attention.backward(q, k, v, out, lse, dout, dq, dk, dv, m, dm, causal, scale, grad=G, c=c,
                                        wanted=wanted)
        for w, a, b in zip(wanted, got, full):
            assert (a is not None) == w
            if w:
                close(a, b, 1e-12)


def test_bad_operands_are_refused_in_one_line():
    q = torch.randn(1, 3, 5, 8, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 8, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="3 query heads are not a multiple of the 2 key heads"):
        triton_attention.forward(q, k, k)
    with pytest.raises(RuntimeError, match="head sizes up to 256"):
        big = torch.randn(1, 1, 2, 300)
        triton_attention.forward(big, big, big)
    with pytest.raises(RuntimeError, match="does not broadcast"):
        triton_attention.forward(q, q, q, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(RuntimeError, match="dq must have the shape"):
        triton_attention.forward(q, q, q, dq=q.float())
    with pytest.raises(RuntimeError, match="dmask is the floating-point tangent of a float mask"):
        triton_attention.forward(q, q, q, torch.ones(5, 5, dtype=torch.bool), dmask=torch.ones(5, 5))


ROUTE = """
import os, torch, jvpc, torch.nn.functional as F
from jvpc import _attention_triton as T
T.register("CPU")
calls = {"forward": 0, "backward": 0}
def counted(name):
    inner = getattr(T, name)
    def call(*a, **kw):
        calls[name] += 1
        return inner(*a, **kw)
    setattr(T, name, call)
counted("forward"); counted("backward")
torch.manual_seed(0)
q, k, v, t = (torch.randn(1, 4, 40, 8, dtype=torch.float64) for _ in range(4))
k, v = k[:, :2], v[:, :2]
def f(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
o = jvpc.LinearizeOptions(); o.residual_budget = 0
out, jvp_fn = jvpc.linearize(f, q, k, v, options=o)
assert jvp_fn.cost()["ops"].get("jvpc::attention_tangent") == 1
from torch.nn.attention import SDPBackend, sdpa_kernel
with sdpa_kernel(SDPBackend.MATH):
    want = torch.func.jvp(f, (q, k, v), (t, k.flip(2), v * 2))[1]
torch.testing.assert_close(jvp_fn(t, k.flip(2), v * 2), want, rtol=1e-10, atol=1e-10)
leaves = [x.clone().requires_grad_() for x in (q, k, v, t)]
out, dout = jvpc.jvp(f, tuple(leaves[:3]), (leaves[3], k.flip(2), v * 2), tangent_grad=True, options=o)
dout.square().sum().backward()
with sdpa_kernel(SDPBackend.MATH):
    ref = [x.clone().requires_grad_() for x in (q, k, v, t)]
    torch.func.jvp(f, tuple(ref[:3]), (ref[3], k.flip(2), v * 2))[1].square().sum().backward()
for a, b in zip(leaves, ref):
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-10)
# jvp_fn's tangent, tangent_grad's forward and its tangent; the backward through both
assert calls["forward"] >= 3 and calls["backward"] >= 2, calls
print("route ok")
"""


def test_the_route_through_the_kernels():
    """With the kernels registered for a device (here the CPU, in the interpreter), jvp_fn's
    attention_tangent and tangent_grad's fused attention, its tangent and their backward run in
    them, and equal torch.func's on the math path (float64, 1e-10)."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(ROUTE)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0 and "route ok" in run.stdout, run.stderr[-3000:]
