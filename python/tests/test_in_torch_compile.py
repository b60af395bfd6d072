"""A compiled program inside torch.compile (jvpc/_in_compile.py): `prog.jvp(primals, tangents)`
compiles without a graph break (fullgraph=True), gives eager's outputs and tangents, and autograd
through it gives eager's gradients to the primals, the weights and (tangent_grad) the tangents, in
float64; dropout draws as eager's and BatchNorm's running statistics move once per step."""

import pytest
import torch
from torch import nn

import jvpc


def mlp(dropout=0.0, norm=False):
    torch.manual_seed(0)
    layers = [nn.Linear(8, 16), nn.BatchNorm1d(16) if norm else nn.Identity(), nn.Tanh(), nn.Dropout(dropout),
              nn.Linear(16, 8)]
    return nn.Sequential(*layers).double()


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def step_of(prog):
    def step(x, v):
        out, dout = prog.jvp((x,), (v,))
        return out.square().sum() + (dout * out).sum() + dout.square().sum(), out, dout
    return step


def run(step, net, x, v, seed=1):
    """(loss, out, dout, x.grad, v.grad, weights' grads) of one step and its backward."""
    net.zero_grad()
    xs, vs = x.clone().requires_grad_(), v.clone().requires_grad_()
    torch.manual_seed(seed)
    loss, out, dout = step(xs, vs)
    loss.backward()
    return [loss.detach(), out.detach(), dout.detach(), xs.grad, vs.grad] + [p.grad for p in net.parameters()]


def same(got, want, tol=1e-12):
    for i, (a, b) in enumerate(zip(got, want)):
        if b is None:  # a stop-gradient in eager: zeros through the operator
            assert a is None or not a.any(), i
            continue
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=f"result {i}")


@pytest.mark.parametrize("tangent_grad", [False, True])
def test_a_compiled_step_around_a_program(tangent_grad):
    """fullgraph=True compiles the step; the loss, out, dout and every gradient equal the eager
    step's (without tangent_grad, dout is a stop-gradient in both); they equal torch.func's."""
    net = mlp()
    x, v = randn(4, 8), randn(4, 8)
    prog = jvpc.compile(net, x, tangent_grad=tangent_grad)
    step = step_of(prog)
    eager = run(step, net, x, v)
    compiled = run(torch.compile(step, fullgraph=True), net, x, v)
    same(compiled, eager)
    if tangent_grad:
        def func_step(x, v):
            out, dout = torch.func.jvp(net, (x,), (v,))
            return out.square().sum() + (dout * out).sum() + dout.square().sum(), out, dout
        same(compiled, run(func_step, net, x, v))


def test_dropout_draws_as_eager_and_the_backward_replays_it():
    """A program with dropout, in training: the compiled step draws eager's mask (the random
    generator as the step left it), and the backward, which runs func again, takes the same draws."""
    net = mlp(dropout=0.5)
    x, v = randn(4, 8), randn(4, 8)
    prog = jvpc.compile(net, x, tangent_grad=True)
    step = step_of(prog)
    eager = run(step, net, x, v, seed=3)
    compiled = run(torch.compile(step, fullgraph=True), net, x, v, seed=3)
    same(compiled, eager)
    with torch.no_grad():
        assert not torch.allclose(eager[1], net.eval()(x))  # dropout dropped something


def test_batch_norm_statistics_move_once_per_step():
    """In training, the step writes the running statistics once: the backward, which runs func
    again, leaves them. (With tangent_grad, torch.func refuses BatchNorm's write in training.)"""
    net = mlp(norm=True)
    x, v = randn(4, 8), randn(4, 8)
    prog = jvpc.compile(net, x)
    step = step_of(prog)
    bn = net[1]
    before = bn.running_mean.clone()
    eager = run(step, net, x, v)
    after_eager = bn.running_mean.clone()
    bn.running_mean.copy_(before)
    bn.running_var.fill_(1)
    bn.num_batches_tracked.zero_()
    compiled = run(torch.compile(step, fullgraph=True), net, x, v)
    same(compiled, eager)
    torch.testing.assert_close(bn.running_mean, after_eager, rtol=0, atol=0)


def test_the_guards_still_hold_inside():
    """net.eval() after the step was compiled: the program traces again inside the operator (no
    dropout), as eager's call would."""
    net = mlp(dropout=0.5)
    x, v = randn(4, 8), randn(4, 8)
    prog = jvpc.compile(net, x)
    compiled = torch.compile(step_of(prog), fullgraph=True)
    run(compiled, net, x, v)
    net.eval()
    got = run(compiled, net, x, v)
    with torch.no_grad():
        torch.testing.assert_close(got[1], net(x))
    assert prog.num_graphs == 2


def test_shapes_never_traced_are_refused_in_one_line():
    net = mlp()
    prog = jvpc.compile(net, randn(4, 8))
    compiled = torch.compile(step_of(prog), fullgraph=True, dynamic=False)
    with pytest.raises(Exception, match="no graph of the program was traced at these primals' shapes"):
        compiled(randn(5, 8), randn(5, 8))
