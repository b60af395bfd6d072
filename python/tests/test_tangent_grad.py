"""tangent_grad=True: jvp_fn's outputs carry autograd history to the primals, the weights and the
tangents; dout's gradients are torch.func.jvp's second-order ones (float64, math backend)."""

import os
import sys

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import jvpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "bench"))
from dit import DiT  # noqa: E402


def case():
    torch.manual_seed(0)
    net = DiT().double()
    z = torch.randn(2, 8, 4, dtype=torch.float64)
    t = torch.rand(2, dtype=torch.float64)
    v = torch.randn(2, 8, 4, dtype=torch.float64)
    return net, (z, t * 0.5, t), v


def leaves(*xs):
    return [x.clone().requires_grad_() for x in xs]


def grads_of(jvp, net, x, v, **kw):
    z, r, t, dz = leaves(x[0], x[1], x[2], v)
    net.zero_grad()
    with sdpa_kernel(SDPBackend.MATH):
        out, dout = jvp(net, (z, r, t), (dz, torch.zeros_like(r), torch.ones_like(t)), **kw)
        (dout.square().sum() + (out * dout).sum()).backward()
    return [z.grad, r.grad, t.grad, dz.grad] + [p.grad.clone() for p in net.parameters()]


@pytest.mark.parametrize("how", ["jvp", "linearize", "compile"])
def test_gradients_through_the_tangent_match_torch_func(how):
    net, x, v = case()

    def jvpc_jvp(f, primals, tangents):
        if how == "jvp":
            return jvpc.jvp(f, primals, tangents, tangent_grad=True)
        if how == "linearize":
            out, jvp_fn = jvpc.linearize(f, *primals, tangent_grad=True)
        else:
            out, jvp_fn = jvpc.compile(f, *[p.detach() for p in primals], tangent_grad=True)(*primals)
        return out, jvp_fn(*tangents)

    got = grads_of(jvpc_jvp, net, x, v)
    ref = grads_of(torch.func.jvp, net, x, v)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_without_tangent_grad_the_tangent_is_a_stop_gradient():
    net, x, v = case()
    out, dout = jvpc.jvp(net, x, (v, torch.zeros_like(x[1]), torch.ones_like(x[2])))
    assert out.grad_fn is not None and dout.grad_fn is None
