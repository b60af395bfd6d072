"""Weights bound by name: a program reads the parameters and buffers of the modules its function
reaches at every call, as torch.func.functional_call binds them; a linear map refuses to run once
one of its weights was replaced or rebound."""

import copy
import gc
import weakref

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch import nn

import jvpc

from dit import DiT


def case(seed=0):
    torch.manual_seed(seed)
    net = DiT().double()
    z = torch.randn(2, 8, 4, dtype=torch.float64)
    t = torch.rand(2, dtype=torch.float64)
    return net, (z, t * 0.5, t)


def check_matches_eager(prog, net, x):
    out, jvp_fn = prog(*x)
    dz = torch.randn_like(x[0])
    with sdpa_kernel(SDPBackend.MATH):  # torch.func has no forward AD for the fused kernels
        ref_out, ref_d = torch.func.jvp(net, x, (dz, torch.zeros_like(x[1]), torch.ones_like(x[2])))
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(jvp_fn(dz, torch.zeros_like(x[1]), torch.ones_like(x[2])), ref_d,
                               rtol=1e-10, atol=1e-12)


def test_a_replaced_parameter_is_seen_and_gets_the_gradient():
    net, x = case()
    prog = jvpc.compile(net, *x)
    net.blocks[1].qkv.weight = nn.Parameter(torch.randn_like(net.blocks[1].qkv.weight))
    check_matches_eager(prog, net, x)
    out, _ = prog(*x)
    out.sum().backward()
    assert net.blocks[1].qkv.weight.grad is not None


def test_load_state_dict_assign_and_an_ema_swap_are_seen():
    net, x = case()
    ema = copy.deepcopy(net)
    for p in ema.parameters():
        p.data.mul_(0.5)
    prog = jvpc.compile(net, *x)
    net.load_state_dict(ema.state_dict(), assign=True)
    check_matches_eager(prog, net, x)
    other = DiT().double()
    for p, q in zip(net.parameters(), other.parameters()):  # an EMA swap through .data
        p.data, q.data = q.data, p.data
    check_matches_eager(prog, net, x)


@pytest.mark.parametrize("tangent_grad", [False, True])
def test_a_program_holds_neither_the_weights_nor_the_primals_it_was_compiled_with(tangent_grad):
    net, x = case()
    z = x[0].clone()
    prog = jvpc.compile(net, z, *x[1:], tangent_grad=tangent_grad)
    old, example = weakref.ref(net.blocks[1].qkv.weight), weakref.ref(z)
    net.blocks[1].qkv.weight = nn.Parameter(torch.randn_like(net.blocks[1].qkv.weight))
    del z
    gc.collect()
    assert old() is None and example() is None
    check_matches_eager(prog, net, x)


def test_a_buffer_is_read_by_name():
    net, x = case()
    prog = jvpc.compile(lambda z, r, t: net(z, r, t), *x)  # the module reached through a closure
    net.freqs = net.freqs * 2
    out, _ = prog(*x)
    torch.testing.assert_close(out, net(*x), rtol=1e-12, atol=1e-12)


def test_a_new_shape_or_dtype_is_a_one_line_error_naming_the_parameter():
    net, x = case()
    prog = jvpc.compile(net, *x, retrace=False)
    net.out.bias = nn.Parameter(torch.zeros(5, dtype=torch.float64))
    with pytest.raises(jvpc.Error, match=r"parameter 'out.bias' is float64\[5\] on cpu \(traced with float64\[4\]"):
        prog(*x)
    net.out.bias = nn.Parameter(torch.zeros(4))
    with pytest.raises(jvpc.Error, match=r"parameter 'out.bias' is float32\[4\] on cpu \(traced with float64\[4\] on cpu\); "
                                         "the program was compiled with retrace=False"):
        prog(*x)


def test_a_new_dtype_is_traced_again():
    net, x = case()
    prog = jvpc.compile(net, *x)
    net.float()
    x32 = [a.float() for a in x]
    out, _ = prog(*x32)
    assert prog.num_graphs == 2 and out.dtype == torch.float32
    torch.testing.assert_close(out, net(*x32), atol=0, rtol=0)


def test_linearize_refuses_a_replaced_or_rebound_weight():
    net, x = case()
    _, jvp_fn = jvpc.linearize(net, *x)
    t = (torch.randn_like(x[0]), torch.zeros_like(x[1]), torch.ones_like(x[2]))
    jvp_fn(*t)
    net.out.weight.data = net.out.weight.data * 2  # rebound through .data
    with pytest.raises(jvpc.Error, match=r"parameter 'out.weight' was rebound \(.data = ...\) since jvpc.linearize"):
        jvp_fn(*t)
    _, jvp_fn = jvpc.linearize(net, *x)
    net.blocks[0].fc1.weight = nn.Parameter(net.blocks[0].fc1.weight.detach().clone())
    with pytest.raises(jvpc.Error, match=r"parameter 'blocks.0.fc1.weight' was replaced"):
        jvp_fn(*t)


def test_linearize_with_aux_refuses_a_replaced_weight():
    net, x = case()
    out, jvp_fn, aux = jvpc.linearize(lambda *a: (net(*a), a[1]), *x, has_aux=True)
    assert aux is x[1]
    t = (torch.randn_like(x[0]), torch.zeros_like(x[1]), torch.ones_like(x[2]))
    jvp_fn(*t)
    net.blocks[0].fc1.weight = nn.Parameter(net.blocks[0].fc1.weight.detach().clone())
    with pytest.raises(jvpc.Error, match=r"parameter 'blocks.0.fc1.weight' was replaced"):
        jvp_fn(*t)


def test_linearize_refuses_a_write_through_data():
    net, x = case()
    ema = DiT().double()
    _, jvp_fn = jvpc.linearize(net, *x)
    t = (torch.randn_like(x[0]), torch.zeros_like(x[1]), torch.ones_like(x[2]))
    jvp_fn(*t)
    net.blocks[1].proj.weight.data.copy_(ema.blocks[1].proj.weight)  # no version counter moves
    with pytest.raises(jvpc.Error, match=r"parameter 'blocks.1.proj.weight' was written \(through .data\)"):
        jvp_fn(*t)


def test_linearize_sees_a_write_through_data_that_keeps_the_sum():
    net, x = case()
    _, jvp_fn = jvpc.linearize(net, *x)
    w = net.blocks[0].qkv.weight.data
    w[0, :2] = w[0, :2].flip(0)  # two elements swapped: every sum as it was
    t = (torch.randn_like(x[0]), torch.zeros_like(x[1]), torch.ones_like(x[2]))
    with pytest.raises(jvpc.Error, match=r"parameter 'blocks.0.qkv.weight' was written \(through .data\)"):
        jvp_fn(*t)


def test_linearize_sees_writes_through_data_in_a_strided_weight_and_in_the_last_megabyte():
    torch.manual_seed(0)
    lin = nn.Linear(512, 640, dtype=torch.float64)  # 2.5 MiB of weight: three chunks of the checksum
    lin.weight = nn.Parameter(lin.weight.detach().t().contiguous().t())  # column-major, dense
    x = torch.randn(3, 512, dtype=torch.float64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        _, jvp_fn = jvpc.linearize(lin, x)
        torch.set_num_threads(1)  # the checksum does not depend on the number of threads
        jvp_fn(torch.randn_like(x))
        lin.weight.data[-1, -1] += 1
        with pytest.raises(jvpc.Error, match=r"parameter 'weight' was written \(through .data\)"):
            jvp_fn(torch.randn_like(x))
    finally:
        torch.set_num_threads(threads)


def test_linearize_sees_a_write_through_data_in_an_integer_buffer():
    bn = nn.BatchNorm1d(4, dtype=torch.float64)
    x = torch.randn(3, 4, dtype=torch.float64)
    _, jvp_fn = jvpc.linearize(bn, x)
    bn.num_batches_tracked.data.fill_(7)
    with pytest.raises(jvpc.Error, match=r"buffer 'num_batches_tracked' was written \(through .data\)"):
        jvp_fn(torch.randn_like(x))
