"""jvpc::attention_tangent's backward (runtime/attention_tangent.h): d(out)'s gradients to q, k,
v, dq, dk, dv equal autograd's through an explicit softmax reference in float64, for causal,
boolean and float masks, grouped heads, Lq != Lk, a fully masked row and blocks that do not divide
L; FlopCounterMode counts the bmms it runs; it never holds an Lq x Lk tensor."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import jvpc  # noqa: F401  (registers the jvpc operators)

op = torch.ops.jvpc.attention_tangent


def reference(q, k, v, dq, dk, dv, mask, dmask, causal, scale):
    """d(out) by the math definition, differentiable by autograd; and out, lse (detached)."""
    g = q.shape[1] // k.shape[1]
    k, v, dk, dv = (None if t is None else t.repeat_interleave(g, 1) for t in (k, v, dk, dv))
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    if causal:
        lq, lk = s.shape[-2:]
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), float("-inf"))
    alive = s.detach().logsumexp(-1, keepdim=True).isfinite()  # a row with every key masked: P = 0
    s = torch.where(alive, s, 0)
    lse = s.logsumexp(-1, keepdim=True)
    p = torch.where(alive, (s - lse).exp(), 0)
    lse = torch.where(alive, lse, float("-inf"))
    ds = torch.zeros_like(s)
    if dq is not None:
        ds = ds + dq @ k.transpose(-1, -2) * scale
    if dk is not None:
        ds = ds + q @ dk.transpose(-1, -2) * scale
    if dmask is not None:
        ds = ds + dmask
    pds = p * ds
    dout = pds @ v - pds.sum(-1, keepdim=True) * (p @ v)
    if dv is not None:
        dout = dout + p @ dv
    return dout, (p @ v).detach(), lse.squeeze(-1).detach()


CASES = {  # name: (H, Hkv, Lq, Lk, mask, causal, tangents, block_q, block_k)
    "plain": (2, 2, 13, 13, None, False, "qkv", 4, 5),
    "causal": (2, 2, 13, 13, None, True, "qkv", 4, 5),
    "causal_lq_lt_lk": (2, 2, 9, 14, None, True, "qkv", 4, 5),
    "bool_mask": (2, 2, 13, 11, "bool", False, "qkv", 4, 5),
    "float_mask_and_dmask": (2, 2, 13, 11, "float", False, "qkvm", 4, 5),
    "gqa_4_2": (4, 2, 13, 13, None, True, "qkv", 4, 5),
    "gqa_4_1": (4, 1, 13, 13, "float", False, "qkvm", 4, 5),
    "lq_gt_lk": (2, 2, 17, 6, "bool", False, "qkv", 4, 5),
    "lq_lt_lk": (2, 1, 6, 17, None, False, "qkv", 4, 5),
    "dead_row": (2, 2, 13, 13, "dead", False, "qkv", 4, 5),
    "dead_row_causal_gqa": (4, 2, 13, 13, "dead", True, "qkvm", 3, 7),
    "only_dv": (2, 2, 13, 13, None, True, "v", 4, 5),
    "only_dq": (2, 2, 13, 13, "float", False, "q", 4, 5),
    "only_dmask": (2, 2, 13, 13, "float", False, "m", 4, 5),
}


def operands(H, Hkv, Lq, Lk, mask_kind, tangents, D=5, Dv=3, B=2):
    gen = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q, k, v = r(B, H, Lq, D), r(B, Hkv, Lk, D), r(B, Hkv, Lk, Dv)
    dq, dk, dv = (r(*x.shape) if c in tangents else None for x, c in ((q, "q"), (k, "k"), (v, "v")))
    mask = dmask = None
    if mask_kind in ("bool", "dead"):
        mask = torch.rand(B, 1, Lq, Lk, generator=gen) > 0.3
        mask[..., 0] = True
        if mask_kind == "dead":
            mask[:, :, 2] = False  # query row 2: every key masked
            mask = mask.expand(B, H, Lq, Lk).clone()
            mask[0, 1, 5] = False
            if "m" in tangents:  # a float mask with -inf where the bool one hides
                mask = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, float("-inf"))
    elif mask_kind == "float":
        mask = r(Lq, Lk)
    if "m" in tangents:
        dmask = r(1, H, Lq, Lk)
    return q, k, v, dq, dk, dv, mask, dmask


@pytest.mark.parametrize("name", CASES)
def test_backward_matches_autograd_through_the_reference(name):
    H, Hkv, Lq, Lk, mask_kind, causal, tangents, bq, bk = CASES[name]
    q, k, v, dq, dk, dv, mask, dmask = operands(H, Hkv, Lq, Lk, mask_kind, tangents)
    scale = 0.43
    wrt = [t.requires_grad_() for t in (q, k, v, dq, dk, dv) if t is not None]
    ref, out, lse = reference(q, k, v, dq, dk, dv, mask, dmask, causal, scale)
    got = op(q, k, v, out, lse, dq, dk, dv, mask, dmask, causal, scale, bq, bk)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(ref)
    expected = torch.autograd.grad(ref, wrt, grad)
    grads = torch.autograd.grad(got, wrt, grad)
    for a, b in zip(grads, expected):
        assert a.isfinite().all()
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_gradcheck_at_a_small_size():
    q, k, v, dq, dk, dv, mask, _ = operands(4, 2, 5, 7, "bool", "qkv", D=3, Dv=2, B=1)
    _, out, lse = reference(q, k, v, dq, dk, dv, mask, None, True, 0.5)

    def f(q, k, v, dq, dk, dv):  # out and lse recomputed: the total derivative through q, k, v
        _, out, lse = reference(q, k, v, None, None, None, mask, None, True, 0.5)
        return op(q, k, v, out, lse, dq, dk, dv, mask, None, True, 0.5, 2, 3)

    torch.autograd.gradcheck(f, [t.requires_grad_() for t in (q, k, v, dq, dk, dv)])


def test_a_mask_that_requires_grad_is_refused():
    q, k, v, dq, dk, dv, mask, dmask = operands(2, 2, 6, 6, "float", "qkvm")
    _, out, lse = reference(q, k, v, dq, dk, dv, mask, dmask, False, 0.5)
    with pytest.raises(RuntimeError, match="gradients to mask and dmask are not propagated"):
        op(q, k, v, out, lse, dq, dk, dv, mask.requires_grad_(), dmask, False, 0.5, 4, 4)


def test_bad_operands_are_one_line_errors():
    q, k, v, dq, dk, dv, mask, dmask = operands(2, 2, 6, 6, "float", "qkv")
    _, out, lse = reference(q, k, v, dq, dk, dv, mask, dmask, False, 0.5)
    back = torch.ops.jvpc.attention_tangent_backward
    with pytest.raises(RuntimeError, match="grad and dout must have out's shape"):
        back(out[:, :, :3], q, k, v, out, lse, out, dq, dk, dv, mask, None, False, 0.5, 4, 4)
    with pytest.raises(RuntimeError, match="jvpc::attention_tangent_backward: dk must have the shape"):
        back(out, q, k, v, out, lse, out, dq, dk[:, :1], dv, mask, None, False, 0.5, 4, 4)


def backward_call(causal, kv_heads, tangents, L=300, D=8, blocks=(64, 128)):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, L, D, generator=gen)
    k, v = (torch.randn(1, kv_heads, L, D, generator=gen) for _ in range(2))
    dq, dk, dv = (torch.randn(x.shape, generator=gen) if c in tangents else None for x, c in ((q, "q"), (k, "k"),
                                                                                              (v, "v")))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k.repeat_interleave(2 // kv_heads, 1), v.repeat_interleave(2 // kv_heads, 1), 0.0, causal)
    args = (q, k, v, out, lse, dq, dk, dv, None, None, causal, D ** -0.5, *blocks)
    dout = op(*args)
    return lambda: torch.ops.jvpc.attention_tangent_backward(torch.ones_like(dout), *args[:5], dout, *args[5:])


@pytest.mark.parametrize("causal,kv_heads,tangents", [(False, 2, "qkv"), (True, 1, "qkv"), (True, 2, "v"),
                                                      (False, 2, "k")])
def test_flop_counter_counts_the_bmms_that_ran(causal, kv_heads, tangents):
    from torch.profiler import ProfilerActivity, profile
    call = backward_call(causal, kv_heads, tangents)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        call()
    ran = 0  # the bmms' and baddbmm_'s FLOPs, from the shapes the profiler recorded
    for e in prof.events():
        if e.name in ("aten::bmm", "aten::baddbmm_"):
            (b, m, k), (_, _, n) = [s for s in e.input_shapes if len(s) == 3][-2:]
            ran += 2 * b * m * k * n
    assert ran > 0
    with FlopCounterMode(display=False) as mode:
        call()
    assert mode.get_flop_counts()["Global"] == {torch.ops.jvpc.attention_tangent_backward: ran}


def test_never_holds_an_lq_by_lk_tensor():
    """L 2048, blocks 128 x 256: no kernel inside the backward reads a tensor of a sixteenth of one
    head's Lq x Lk scores, and none allocates one (blocks of 2048 x 2048 fail both)."""
    import math
    from torch.profiler import ProfilerActivity, profile
    L = 2048
    call = backward_call(True, 1, "qkv", L=L, D=16, blocks=(128, 256))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        call()
    events = prof.events()
    assert any(e.name == "jvpc::attention_tangent_backward" for e in events)
    read = max(math.prod(s) for e in events for s in e.input_shapes if s and all(isinstance(n, int) for n in s))
    allocated = max(e.self_cpu_memory_usage for e in events)
    assert 0 < read < L * L / 16 and 0 < allocated < L * L * 4 / 16, (read, allocated)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_gives_the_cpus_gradients():
    q, k, v, dq, dk, dv, mask, dmask = operands(4, 2, 13, 11, "dead", "qkvm")
    _, out, lse = reference(q, k, v, dq, dk, dv, mask, dmask, True, 0.43)
    args = (q, k, v, out, lse, dq, dk, dv, mask, dmask)
    dout = op(*args, True, 0.43, 4, 5)
    grad = torch.randn_like(dout)
    back = torch.ops.jvpc.attention_tangent_backward
    want = back(grad, *args[:5], dout, *args[5:], True, 0.43, 4, 5)
    cuda = [t.cuda() for t in args]
    got = back(grad.cuda(), *cuda[:5], dout.cuda(), *cuda[5:], True, 0.43, 4, 5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_takes_the_fused_triton_route_for_tangent_grad():
    """On CUDA with Triton, tangent_grad's attention, its tangent and their backward run in the
    fused kernels (jvpc/_attention_triton.py) and give the CPU's float64 gradients."""
    pytest.importorskip("triton")
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from jvpc import _tangent_grad_attention

    assert "cuda" in _tangent_grad_attention.triton_devices()
    x, t = (torch.randn(2, 4, 77, 32, dtype=torch.float64) for _ in range(2))
    kv = torch.randn(2, 2, 77, 32, dtype=torch.float64)

    def f(x):
        return F.scaled_dot_product_attention(x, kv.to(x.device), kv.to(x.device) * 2, is_causal=True,
                                              enable_gqa=True)

    def grads(device, jvp, **kw):
        xs, ts = x.to(device).requires_grad_(), t.to(device).requires_grad_()
        out, dout = jvp(f, (xs,), (ts,), **kw)
        (dout.square().sum() + out.sum()).backward()
        return xs.grad.cpu(), ts.grad.cpu()

    with sdpa_kernel(SDPBackend.MATH):
        want = grads("cpu", torch.func.jvp)
    options = jvpc.LinearizeOptions()
    options.residual_budget = 0
    got = grads("cuda", jvpc.jvp, tangent_grad=True, options=options)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
