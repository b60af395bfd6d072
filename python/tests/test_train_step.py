"""One forward per training step: under grad mode a program's call records autograd for its
primal outputs as eager does (loss.backward() gives eager's gradients), from the same run that
gives the tangent's residuals; without anything requiring grad it records nothing."""


import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import jvpc

from dit import DiT


def point(seed, B=2, L=8, C=4, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, L, C, generator=g, dtype=dtype)
    t = torch.rand(B, generator=g, dtype=dtype)
    r = t * torch.rand(B, generator=g, dtype=dtype)
    v = torch.randn(B, L, C, generator=g, dtype=dtype)
    return z, r, t, v


def meanflow_loss(u, dudt, v, r, t):
    u_tgt = v - (t - r)[:, None, None] * dudt
    return ((u - u_tgt.detach()) ** 2).mean()


def flops(fn):
    fc = FlopCounterMode(display=False)
    # The CPU flash kernel as the cost model counts it: FlopCounterMode of torch 2.11 has no
    # formula for it (2.15 has this one), and the DiT's attention runs it.
    aten = torch.ops.aten
    fc.flop_registry.setdefault(aten._scaled_dot_product_flash_attention_for_cpu,
                                fc.flop_registry[aten._scaled_dot_product_flash_attention])
    with fc:
        out = fn()
    return fc.get_total_flops(), out


def test_a_step_is_one_forward_and_backpropagates_as_eager():
    torch.manual_seed(0)
    net = DiT().double()
    z, r, t, v = point(0)
    prog = jvpc.compile(net, z, r, t)
    z, r, t, v = point(1)
    step_flops, (u, jvp_fn) = flops(lambda: prog(z, r, t))
    eager_flops, _ = flops(lambda: net(z, r, t))
    # The call is the step's only forward: the primal graph once (the forward, and the residuals'
    # extra: P recomputed from the fused kernel's outputs), far from a second forward's 2x.
    assert step_flops == prog.primal_cost()["matmul_flops"]
    assert eager_flops <= step_flops < 1.1 * eager_flops
    assert u.grad_fn is not None
    dudt = jvp_fn(v, torch.zeros_like(r), torch.ones_like(t))
    meanflow_loss(u, dudt, v, r, t).backward()
    grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    with sdpa_kernel(SDPBackend.MATH):  # torch.func has no forward AD for the fused kernels
        ref_u, ref_dudt = torch.func.jvp(net, (z, r, t), (v, torch.zeros_like(r), torch.ones_like(t)))
    torch.testing.assert_close(dudt, ref_dudt.detach(), rtol=1e-10, atol=1e-12)
    meanflow_loss(ref_u, ref_dudt, v, r, t).backward()
    for p, g in zip(net.parameters(), grads):
        torch.testing.assert_close(g, p.grad, rtol=1e-10, atol=1e-12)


def test_inputs_that_require_grad_get_eager_gradients():
    f = lambda x, w: torch.tanh(x @ w).sin()  # noqa: E731
    x, w = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    prog = jvpc.compile(f, x, w, argnums=0)
    x2, w2 = x.clone().requires_grad_(), (w + 1).requires_grad_()
    out, _ = prog(x2, w2)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (x2, w2), g)
    ref = torch.autograd.grad(f(x2, w2), (x2, w2), g)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_without_grad_nothing_is_recorded():
    net = DiT().double()
    z, r, t, _ = point(0)
    prog = jvpc.compile(net, z, r, t)
    with torch.no_grad():
        u, _ = prog(z, r, t)
    assert u.grad_fn is None
    for p in net.parameters():
        p.requires_grad_(False)
    u, _ = prog(z, r, t)
    assert u.grad_fn is None and not u.requires_grad
    torch.testing.assert_close(u, net(z, r, t), rtol=1e-12, atol=1e-12)
