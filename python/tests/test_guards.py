"""A compiled program checks what its trace depended on besides its tensors (jvpc/_guards.py):
where something changed it traces again and gives eager's result, or, with retrace=False,
refuses in one line naming the change; never does it run the old graph silently. Each case is
checked against eager at the call after the change."""

import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jvpc


def x32(*shape):
    return torch.randn(*shape)


def agrees(prog, f, *args, graphs):
    """prog(*args) is eager's f(*args), and the program holds `graphs` graphs."""
    out, _ = prog(*args)
    torch.testing.assert_close(out, f(*args), atol=0, rtol=0)
    assert prog.num_graphs == graphs


def test_train_after_eval_draws_dropouts_mask():
    m = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).eval()
    x = x32(4, 8)
    prog = jvpc.compile(m, x)
    m.train()
    torch.manual_seed(3)
    out, _ = prog(x)
    torch.manual_seed(3)
    want = m(x)
    assert torch.equal(out, want) and (out == 0).sum() > 0 and prog.num_graphs == 2
    m.eval()  # the first graph fits again
    agrees(prog, m, x, graphs=2)


def test_batch_norm_compiled_in_eval_then_trained():
    m = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).eval()
    ref = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))
    ref.load_state_dict(m.state_dict())
    x = x32(4, 8)
    prog = jvpc.compile(m, x)
    m.train()
    ref.train()
    agrees(prog, ref, x, graphs=2)
    torch.testing.assert_close(m[1].running_mean, ref[1].running_mean, atol=0, rtol=0)
    assert int(m[1].num_batches_tracked) == int(ref[1].num_batches_tracked) == 1


def test_hooks_added_or_removed():
    lin = nn.Linear(8, 8)
    x = x32(4, 8)
    prog = jvpc.compile(lin, x)
    handle = lin.register_forward_hook(lambda mod, args, out: out * 2)
    agrees(prog, lin, x, graphs=2)
    handle.remove()
    agrees(prog, lin, x, graphs=2)
    pre = lin.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
    agrees(prog, lin, x, graphs=3)
    pre.remove()
    glob = nn.modules.module.register_module_forward_hook(lambda mod, args, out: out - 1)
    try:
        agrees(prog, lin, x, graphs=4)
    finally:
        glob.remove()


def test_flop_counter_modes_own_hooks_do_not_retrace():
    lin = nn.Linear(8, 8)
    x = x32(4, 8)
    prog = jvpc.compile(lin, x)
    with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
        prog(x)
    assert prog.num_graphs == 1 and counter.get_total_flops() == 2 * 4 * 8 * 8


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.scale = 1.0
        self.shift = torch.zeros(8)

    def forward(self, x):
        return self.lin(x) * self.scale + self.shift


def test_module_attributes_the_forward_reads():
    m = Scaled()
    x = x32(4, 8)
    prog = jvpc.compile(m, x)
    m.scale = 5.0
    agrees(prog, m, x, graphs=2)
    m.shift = torch.ones(8)  # a tensor attribute rebound
    agrees(prog, m, x, graphs=3)


G_SCALE = 2.0
G_SHIFT = torch.ones(8)


def with_globals(x):
    return x * G_SCALE + G_SHIFT


def test_globals_the_code_names():
    global G_SCALE, G_SHIFT
    x = x32(4, 8)
    prog = jvpc.compile(with_globals, x)
    try:
        G_SCALE = 3.0
        agrees(prog, with_globals, x, graphs=2)
        G_SHIFT = torch.full((8,), 2.0)
        agrees(prog, with_globals, x, graphs=3)
    finally:
        G_SCALE, G_SHIFT = 2.0, torch.ones(8)


def test_closure_cells():
    scale = 2.0

    def f(x):
        return x * scale

    x = x32(4, 8)
    prog = jvpc.compile(f, x)
    scale = 4.0  # noqa: F841  (read through f's closure)
    agrees(prog, f, x, graphs=2)


def test_grad_mode_autocast_and_default_dtype():
    def f(x):
        return x * 2 if torch.is_grad_enabled() else x * 3

    x = x32(4, 8)
    prog = jvpc.compile(f, x)
    with torch.no_grad():
        agrees(prog, f, x, graphs=2)
    lin = nn.Linear(8, 8)
    prog = jvpc.compile(lin, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = prog(x)
        assert out.dtype == torch.bfloat16 and torch.equal(out, lin(x)) and prog.num_graphs == 2
    prog = jvpc.compile(lambda x: x + torch.ones(8), x, retrace=False)
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(jvpc.Error, match=r"the default dtype is float64 \(traced with float32\)"):
            prog(x)
    finally:
        torch.set_default_dtype(torch.float32)


def test_forward_ads_switch():
    """A graph traced with forward AD off (inside a custom Function's forward, or under
    _set_fwd_grad_enabled(False)) has no tangents: it is not run with forward AD on."""
    from torch.autograd.forward_ad import _set_fwd_grad_enabled

    net = nn.Linear(8, 8)
    x, v = x32(4, 8), x32(4, 8)
    prog = jvpc.compile(net, x, retrace=False)
    with _set_fwd_grad_enabled(False), pytest.raises(jvpc.Error, match=r"forward AD .* is off \(traced with on\)"):
        prog(x)
    prog = jvpc.compile(net, x)
    with _set_fwd_grad_enabled(False):
        _, jvp_fn = prog(x)
        assert not jvp_fn(v).any()  # values computed with forward AD off carry no tangent
    _, jvp_fn = prog(x)
    torch.testing.assert_close(jvp_fn(v), torch.func.jvp(net, (x,), (v,))[1])
    assert prog.num_graphs == 2


def test_non_tensor_arguments_compare_by_type_and_value():
    def f(x, k):
        return x * k if not isinstance(k, bool) else x + k

    x = x32(4, 8)
    prog = jvpc.compile(f, x, 1, argnums=0)
    agrees(prog, f, x, True, graphs=2)
    agrees(prog, f, x, 1, graphs=2)


def test_a_new_batch_size_is_traced_again():
    m = nn.Linear(8, 3)
    prog = jvpc.compile(m, x32(8, 8))
    agrees(prog, m, x32(6, 8), graphs=2)
    agrees(prog, m, x32(8, 8), graphs=2)


def test_retrace_false_names_the_change_in_one_line():
    m = Scaled()
    x = x32(4, 8)
    prog = jvpc.compile(m, x, retrace=False)
    m.scale = 7.0
    with pytest.raises(jvpc.Error, match=r"^jvpc.Program: self.scale is 7.0 \(traced with 1.0\); the program was "
                                         "compiled with retrace=False: compile again$"):
        prog(x)


def test_max_graphs_bounds_the_retraces():
    m = nn.Linear(8, 3)
    prog = jvpc.compile(m, x32(1, 8), max_graphs=2)
    prog(x32(2, 8))
    with pytest.raises(jvpc.Error, match=r"is float32\[3, 8\] on cpu \(traced with float32\[2, 8\] on cpu\), "
                                         "and the program holds max_graphs=2 graphs already"):
        prog(x32(3, 8))


def test_values_read_into_python():
    x = x32(4, 8)
    with pytest.raises(jvpc.Error, match=r"into Python \(tolist\(\)\)"):
        jvpc.compile(lambda x: x * x.abs().max().tolist(), x)
    with pytest.raises(jvpc.Error, match=r"into Python \(numpy\(\)\)"):
        jvpc.compile(lambda x: x * float(x.detach().numpy().max()), x)
    with pytest.raises(jvpc.Error, match=r"into Python \(float\(\)\)"):
        jvpc.compile(lambda x: x * float(x.sum()), x)
    captured = torch.ones(())

    def f(x):
        return x * captured.item()

    prog = jvpc.compile(f, x)
    captured.fill_(5)
    agrees(prog, f, x, graphs=2)


def test_pythons_and_numpys_random_generators_are_refused():
    x = x32(4, 8)
    with pytest.raises(jvpc.Error, match="draws from Python's random module"):
        jvpc.compile(lambda x: x * random.random(), x)
    np = pytest.importorskip("numpy")
    with pytest.raises(jvpc.Error, match="draws from NumPy's global random generator"):
        jvpc.compile(lambda x: x * float(np.random.rand()), x)


class Trainer:
    """A training codebase's object: the model is reached through it, not passed."""

    def __init__(self):
        self.model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))

    def forward(self, z):
        return self.model(z)


def test_a_model_reached_through_a_trainers_method():
    tr = Trainer()
    x = x32(4, 8)
    prog = jvpc.compile(lambda z: tr.forward(z), x)
    tr.model[0].weight = nn.Parameter(torch.randn(8, 8))  # bound by name: no retrace
    agrees(prog, tr.forward, x, graphs=1)
    with torch.no_grad():
        tr.model[2].bias.add_(1.0)  # an optimizer step
    agrees(prog, tr.forward, x, graphs=1)
    tr.model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))  # swapped: traced again
    agrees(prog, tr.forward, x, graphs=2)
    bound = jvpc.compile(tr.forward, x)  # a bound method of a plain object
    tr.model[0].weight = nn.Parameter(torch.randn(8, 8))
    agrees(bound, tr.forward, x, graphs=1)


def test_tied_weights_untied():
    m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    m[1].weight = m[0].weight
    x = x32(4, 8)
    prog = jvpc.compile(m, x)
    m[1].weight = nn.Parameter(torch.randn(8, 8))
    agrees(prog, m, x, graphs=2)


def test_a_retrace_leaves_the_generator_as_eager_would():
    m = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).train()
    prog = jvpc.compile(m, x32(4, 8))
    x = x32(6, 8)  # a new batch size: traced again inside this call
    torch.manual_seed(5)
    out, _ = prog(x)
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(out, m(x)) and torch.equal(torch.rand(3), after)


def test_compile_leaves_the_generator_as_it_was():
    x = x32(4, 8)
    torch.manual_seed(1)
    jvpc.compile(lambda x: F.dropout(x, 0.5), x)
    got = torch.rand(3)
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3), got)
