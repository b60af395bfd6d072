"""Forward-over-reverse: jvpc.jvp and jacfwd of functions that take gradients (torch.func.grad,
vjp, jacrev, torch.autograd.grad), against torch.func in float64. The backward's kernels are
traced and differentiated by their rules (passes/jvp_rules/backward.cpp)."""


import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, jacrev, vjp
from torch.nn.attention import SDPBackend, sdpa_kernel

import jvpc

from dit import DiT
from model_zoo import build

D = torch.float64


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D)


def close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def check_hvp(loss, x, v, reference=None):
    """jvp(grad(loss)) at x along v: the gradient and the Hessian-vector product."""
    got = jvpc.jvp(grad(loss), (x,), (v,))
    try:
        with sdpa_kernel(SDPBackend.MATH):  # torch.func has no forward AD of the fused attentions
            want = torch.func.jvp(grad(reference or loss), (x,), (v,))
    except RuntimeError:  # torch 2.11's forward AD of group_norm fails (UNet2DModel): central differences
        eps = 1e-6
        close(got[0], grad(loss)(x))
        fd = (grad(loss)(x + eps * v) - grad(loss)(x - eps * v)) / (2 * eps)
        torch.testing.assert_close(got[1], fd, rtol=1e-6, atol=1e-9)
        return
    close(got[0], want[0])
    close(got[1], want[1])


W1, W2, LW, LB = rand(8, 4, seed=1), rand(3, 8, seed=2), rand(8, seed=3), rand(8, seed=4)
ACTIVATIONS = {
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": F.relu, "leaky_relu": F.leaky_relu, "gelu": F.gelu,
    "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), "silu": F.silu, "softmax": lambda h: h.softmax(-1),
    "log_softmax": lambda h: h.log_softmax(-1), "layer_norm": lambda h: F.layer_norm(h, (8,), LW, LB),
    "layer_norm_plain": lambda h: F.layer_norm(h, (8,)), "hardtanh": F.hardtanh,
}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_hvp_of_an_mlp(name):
    act = ACTIVATIONS[name]
    check_hvp(lambda x: (act(x @ W1.T) @ W2.T - 1).pow(2).mean(), rand(5, 4, seed=5), rand(5, 4, seed=6))


def test_the_weights_hvp_and_an_mse_loss():
    x, target = rand(5, 4, seed=5), rand(5, 3, seed=7)
    loss = lambda w: F.mse_loss(torch.tanh(x @ w.T) @ W2.T, target)  # noqa: E731
    want_grad = grad(loss)(W1)
    got = jvpc.jvp(grad(loss), (W1,), (rand(8, 4, seed=8),))
    close(got[0], want_grad)
    eps = 1e-6  # torch.func fails on mse_loss_backward's forward AD with a constant target: central differences
    fd = (grad(loss)(W1 + eps * rand(8, 4, seed=8)) - grad(loss)(W1 - eps * rand(8, 4, seed=8))) / (2 * eps)
    torch.testing.assert_close(got[1], fd, rtol=1e-6, atol=1e-8)


def test_the_hessian_by_jacfwd_of_grad_and_of_jacrev_vjp_and_autograd_grad():
    f = lambda x: torch.tanh(x @ W1[:, :4].T).pow(2).sum()  # noqa: E731
    x = rand(4, seed=9)
    H = torch.func.hessian(f)(x)
    close(jvpc.jacfwd(grad(f))(x), H)
    close(jvpc.jacfwd(jacrev(f))(x), H)
    by_vjp = lambda y: vjp(f, y)[1](torch.ones((), dtype=D))[0]  # noqa: E731
    close(jvpc.jacfwd(by_vjp)(x), H)

    def by_autograd(y):
        y = y.requires_grad_()
        return torch.autograd.grad(f(y), y, create_graph=True)[0]

    close(jvpc.jacfwd(by_autograd)(x.clone()), H)


def test_grad_with_argnums_and_aux():
    def f(a, b):
        out = (torch.sin(a) * b).sum()
        return out, out.detach() * 2

    a, b, ta, tb = rand(3, seed=1), rand(3, seed=2), rand(3, seed=3), rand(3, seed=4)
    g = grad(f, argnums=(0, 1), has_aux=True)
    want = torch.func.jvp(lambda a, b: g(a, b)[0], (a, b), (ta, tb))
    got = jvpc.jvp(lambda a, b: g(a, b)[0], (a, b), (ta, tb))
    for w, o in zip(want, got):
        close(o[0], w[0])
        close(o[1], w[1])
    # torch.func's errors where f's output is not a scalar
    with pytest.raises(RuntimeError, match="Expected f\\(\\*args\\) to return a scalar Tensor"):
        jvpc.jvp(grad(lambda x: x * 2), (a,), (ta,))


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
def test_hvp_through_the_fused_attention(mask):
    m = {"bool": rand(4, 4, seed=1) > -0.5, "float": rand(4, 4, seed=2)}.get(mask)
    if mask == "bool":
        m[:, 0] = True

    def loss(q):
        return F.scaled_dot_product_attention(q, q * 2, q.tanh() * 3, attn_mask=m,
                                              is_causal=mask == "causal").pow(2).sum()

    check_hvp(loss, rand(1, 2, 4, 8, seed=3), rand(1, 2, 4, 8, seed=4))


def test_hvp_of_a_dit():
    torch.manual_seed(0)
    net = DiT().to(D)
    z, t = rand(2, 8, 4, seed=1), torch.rand(2, generator=torch.Generator().manual_seed(2), dtype=D)
    check_hvp(lambda z: net(z, t, t).pow(2).mean(), z, rand(2, 8, 4, seed=3))


@pytest.mark.parametrize("name", ["vit", "resnet", "unet"])
def test_hvp_of_a_model(name):
    case = build(name, dtype=D)
    x, rest = case.primals[0], case.primals[1:]
    check_hvp(lambda x: case.f(x, *rest).pow(2).mean(), x, rand(*x.shape, seed=11))


@pytest.mark.parametrize("train", [True, False])
def test_hvp_through_batch_norm_and_convolution(train):
    # in training, batch statistics (torch.func refuses the running statistics' update)
    bn = torch.nn.BatchNorm2d(4, track_running_stats=not train).to(D).train(train)
    with torch.no_grad():
        bn.weight.copy_(rand(4, seed=1))
        if not train:
            bn.running_var.copy_(rand(4, seed=2).abs() + 0.5)
    w = rand(4, 2, 3, 3, seed=3)

    def loss(x):
        return F.gelu(bn(F.conv2d(x, w, padding=1))).pow(2).mean()

    x, v = rand(2, 2, 5, 5, seed=4), rand(2, 2, 5, 5, seed=5)
    want = torch.func.jvp(grad(loss), (x,), (v,))
    got = jvpc.jvp(grad(loss), (x,), (v,))
    close(got[0], want[0])
    close(got[1], want[1])


def test_torch_func_grad_in_another_thread_is_torch_funcs():
    import threading

    f = lambda x: torch.sin(x).sum()  # noqa: E731
    x = rand(3)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.func.jvp(grad(f), (x,), (x,))[1]))
    thread.start()
    thread.join()
    close(seen[0], -torch.sin(x) * x)


def test_nested_jvpc_jacfwd_and_jvp():
    """jvpc inside a function jvpc traces: the inner JVP by torch.autograd (jvpc/_nested.py),
    against reverse-over-reverse and central differences."""
    w = rand(3, 4, seed=12)

    def f(x):  # R^4 -> R^3, with a norm and two activations
        return F.gelu(F.layer_norm(torch.tanh(x) * 2, (4,)) @ w.T)

    x, t, s = rand(4, seed=13), rand(4, seed=14), rand(4, seed=15)
    close(jvpc.jacfwd(jvpc.jacfwd(f))(x), torch.func.jacrev(torch.func.jacrev(f))(x))
    got = jvpc.jvp(lambda y: jvpc.jvp(f, (y,), (t,))[1], (x,), (s,))
    inner = lambda y: torch.func.jvp(f, (y,), (t,))[1]  # noqa: E731
    close(got[0], inner(x))
    eps = 1e-6
    torch.testing.assert_close(got[1], (inner(x + eps * s) - inner(x - eps * s)) / (2 * eps), rtol=1e-7, atol=1e-8)
    scalar = lambda y: f(y).pow(2).sum()  # noqa: E731
    close(jvpc.jacfwd(jvpc.jacfwd(scalar))(x), torch.func.hessian(scalar)(x))


def test_torch_func_forward_over_forward_through_layer_norm_is_off():
    """torch.func.jvp of a torch.func.jvp through layer_norm disagrees with central differences
    and with jacrev(jacrev) (torch 2.11 to 2.15); jvpc's nested JVP agrees with both (above). When
    this fails, torch.func is fixed: compare against it directly and drop this test."""
    f = lambda x: F.layer_norm(x, (4,))  # noqa: E731
    x, t, s = rand(4, seed=16), rand(4, seed=17), rand(4, seed=18)
    inner = lambda y: torch.func.jvp(f, (y,), (t,))[1]  # noqa: E731
    eps = 1e-6
    fd = (inner(x + eps * s) - inner(x - eps * s)) / (2 * eps)
    assert (torch.func.jvp(inner, (x,), (s,))[1] - fd).abs().max() > 1e-3
    torch.testing.assert_close(jvpc.jvp(lambda y: jvpc.jvp(f, (y,), (t,))[1], (x,), (s,))[1], fd, rtol=1e-7, atol=1e-8)
