"""Autograd: primal outputs carry eager's gradients; tangent outputs are a stop-gradient
(detached); the residuals keep no autograd graph alive."""

import gc
import weakref

import torch
import torch.nn.functional as F
from torch.func import functional_call

import jvpc
from models import block_case


def test_primal_outputs_backpropagate_as_eager():
    f, _, primals = block_case(torch.float64)
    leaves = [p.clone().requires_grad_() for p in primals]
    out, jvp_fn = jvpc.linearize(f, *leaves)
    assert out.grad_fn is not None
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, g)
    eager_leaves = [p.clone().requires_grad_() for p in primals]
    eager_grads = torch.autograd.grad(f(*eager_leaves), eager_leaves, g)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_tangent_outputs_are_detached():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    t = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    out, dout = jvpc.jvp(lambda x: x.sin() * x, (x,), (t,))
    assert out.requires_grad and out.grad_fn is not None
    assert dout.grad_fn is None and not dout.requires_grad


def test_scm_style_loss_matches_torch_func_jvp_then_backward():
    """The sCM / MeanFlow pattern: a network's JVP, detached, in a loss through the primal output;
    the gradient flows through the primal part only, parameters via functional_call."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SiLU(), torch.nn.Linear(16, 8)).double()
    params = dict(net.named_parameters())
    x = torch.randn(5, 8, dtype=torch.float64)
    v = torch.randn(5, 8, dtype=torch.float64)

    def f(x):
        return functional_call(net, params, (x,))

    def loss_of(jvp):
        out, dout = jvp(f, (x,), (v,))
        return ((out - dout.detach()) ** 2).mean()

    grads = torch.autograd.grad(loss_of(jvpc.jvp), list(params.values()))
    ref = torch.autograd.grad(loss_of(torch.func.jvp), list(params.values()))
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_residuals_keep_no_autograd_graph_alive():
    x = torch.randn(64, dtype=torch.float64, requires_grad=True)
    kept = []

    def f(x):
        y = x * 2  # sin saves y for backward; fold makes cos(y) a residual
        kept.append(weakref.ref(y))
        return y.sin()

    out, jvp_fn = jvpc.linearize(f, x)
    gc.collect()
    assert kept[0]() is not None  # the output's autograd graph holds y
    del out
    gc.collect()
    assert kept[0]() is None  # jvp_fn, alive, does not
    t = torch.randn_like(x)
    torch.testing.assert_close(jvp_fn(t), t * 2 * torch.cos(x.detach() * 2))


def test_captured_parameters_receive_gradients_through_the_primal_output():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    out, _ = jvpc.linearize(lambda x: F.gelu(lin(x)), x)
    out.sum().backward()
    g = lin.weight.grad.clone()
    lin.weight.grad = None
    F.gelu(lin(x)).sum().backward()
    torch.testing.assert_close(g, lin.weight.grad)
