"""tangent_grad=True: jvp_fn's outputs carry autograd history to the primals, the weights and the
tangents; dout's gradients are torch.func.jvp's second-order ones (float64, math backend), with
attention in the O(L) form in the forward and the backward (jvpc::attention_tangent_backward)."""


import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import jvpc

from dit import DiT


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


class Attention(nn.Module):
    """Grouped-query self-attention (4 query heads, 2 key heads) with a causal or boolean mask."""

    def __init__(self, d=16, causal=True):
        super().__init__()
        self.causal = causal
        self.q, self.kv, self.out = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x, keep):
        B, L, D = x.shape
        q = self.q(x).view(B, L, 4, D // 4).transpose(1, 2)
        k, v = self.kv(x).view(B, L, 2, 2, D // 4).permute(2, 0, 3, 1, 4).unbind(0)
        mask = None if self.causal else keep[:, None, None, :]
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, enable_gqa=True)
        return x + self.out(a.transpose(1, 2).reshape(B, L, D).tanh())


def o_l_options():
    opts = jvpc.LinearizeOptions()
    opts.residual_budget = 0  # every attention in the O(L) form
    return opts


def backward_ops(call):
    """What FlopCounterMode counted per operator while call ran."""
    with FlopCounterMode(display=False) as mode:
        call()
    return mode.get_flop_counts()["Global"]


@pytest.mark.parametrize("causal", [True, False])
def test_attention_in_the_o_l_form_forward_and_backward(causal):
    """The forward's attention is jvpc::attention_tangent and the backward's its O(L) backward;
    the gradients are torch.func's on the math path (float64, 1e-10)."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([Attention(causal=causal), Attention(causal=causal)]).double()
    x = torch.randn(2, 40, 16, dtype=torch.float64)
    keep = torch.rand(2, 40) > 0.3
    keep[:, 0] = True
    dx = torch.randn_like(x)

    def f(x):
        for b in blocks:
            x = b(x, keep)
        return x

    def grads(jvp, **kw):
        xs, ts = x.clone().requires_grad_(), dx.clone().requires_grad_()
        blocks.zero_grad()
        out, dout = jvp(f, (xs,), (ts,), **kw)
        loss = dout.square().sum() + (out * dout).sum()
        counts = backward_ops(loss.backward)
        return [xs.grad, ts.grad] + [p.grad.clone() for p in blocks.parameters()], counts

    with sdpa_kernel(SDPBackend.MATH):
        ref, _ = grads(torch.func.jvp)
    _, jvp_fn = jvpc.linearize(f, x, options=o_l_options())
    assert jvp_fn.cost()["ops"].get("jvpc::attention_tangent") == 2
    got, counts = grads(jvpc.jvp, tangent_grad=True, options=o_l_options())
    assert torch.ops.jvpc.attention_tangent_backward in counts
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_the_dit_in_the_o_l_form():
    net, x, v = case()
    _, jvp_fn = jvpc.linearize(net, *x, options=o_l_options())
    assert jvp_fn.cost()["ops"].get("jvpc::attention_tangent") == 2
    got = []
    counts = backward_ops(lambda: got.extend(grads_of(jvpc.jvp, net, x, v, tangent_grad=True, options=o_l_options())))
    assert torch.ops.jvpc.attention_tangent_backward in counts
    ref = grads_of(torch.func.jvp, net, x, v)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_what_the_o_l_route_does_not_cover_takes_the_math_path():
    """Dropout aside, a float mask computed from the inputs: its gradient is torch.func's."""
    torch.manual_seed(0)
    x = torch.randn(1, 2, 6, 4, dtype=torch.float64)
    dx = torch.randn_like(x)

    def f(x):
        return F.scaled_dot_product_attention(x, x.sin(), x.cos(), attn_mask=x[0, 0, :, :1] * x[0, 0, :, 1])

    def grads(jvp, **kw):
        xs, ts = x.clone().requires_grad_(), dx.clone().requires_grad_()
        _, dout = jvp(f, (xs,), (ts,), **kw)
        counts = backward_ops(lambda: dout.square().sum().backward())
        return [xs.grad, ts.grad], counts

    with sdpa_kernel(SDPBackend.MATH):
        ref, _ = grads(torch.func.jvp)
        got, counts = grads(jvpc.jvp, tangent_grad=True)
    assert torch.ops.jvpc.attention_tangent_backward not in counts
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_a_weight_the_tangent_does_not_reach_gets_no_gradient():
    # out = W·x + b: the tangent W·dx does not reach b. A loss on the tangent alone leaves b.grad
    # None, as torch.func's does, so that an optimizer skips it (no weight decay, no momentum).
    lin = nn.Linear(4, 3).double()
    x, dx = torch.randn(2, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    torch.func.jvp(lin, (x,), (dx,))[1].square().sum().backward()
    want = lin.weight.grad.clone()
    assert lin.bias.grad is None
    lin.zero_grad(set_to_none=True)
    jvpc.jvp(lin, (x,), (dx,), tangent_grad=True)[1].square().sum().backward()
    assert lin.bias.grad is None
    torch.testing.assert_close(lin.weight.grad, want, rtol=1e-12, atol=1e-12)


def test_dropout_in_training_draws_the_forwards_mask():
    """The backward runs func again, with the forward's draws (dropout's mask): the gradients equal
    torch.func's at the same seed, from jvpc.jvp and from a program's jvp."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.5), nn.Linear(16, 8)).double()
    x, v = torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)

    def grads(jvp, **kw):
        xs, vs = x.clone().requires_grad_(), v.clone().requires_grad_()
        net.zero_grad()
        torch.manual_seed(5)
        out, dout = jvp(net, (xs,), (vs,), **kw)
        (dout.square().sum() + (out * dout).sum()).backward()
        return [xs.grad, vs.grad] + [p.grad.clone() for p in net.parameters()]

    want = grads(torch.func.jvp)
    for a, b in zip(grads(jvpc.jvp, tangent_grad=True), want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    prog = jvpc.compile(net, x, tangent_grad=True)
    for a, b in zip(grads(lambda f, p, t: prog.jvp(p, t)), want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
