"""jvpc.compile: a program compiled once linearizes at new primals by running its primal graph alone,
checked against torch.func.jvp in float64; FlopCounterMode counts exactly the primal graph's matmuls;
captured parameters are read afresh after an optimizer step; guards are one-line jvpc.Errors; a
saved program loads back (jvpc.load_program) and runs as the one saved, vmap included."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import jvpc


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def seed_shaped(dtype=torch.float32):
    return tuple(torch.randn(1, 5, 128, 64, dtype=dtype) for _ in range(3))


def test_prog_counts_exactly_the_seeds_forward():
    with sdpa_kernel(SDPBackend.MATH):
        prog = jvpc.compile(sdpa, *seed_shaped())
        q, k, v = seed_shaped()
        with FlopCounterMode(display=False) as m:
            out, jvp_fn = prog(q, k, v)
        assert m.get_total_flops() == 20_971_520
        assert prog.primal_cost()["matmul_flops"] == 20_971_520
        dq, dk, dv = seed_shaped()
        with FlopCounterMode(display=False) as m:
            dout = jvp_fn(dq, dk, dv)
        assert m.get_total_flops() == 41_943_040
        ref_out, ref_dout = torch.func.jvp(sdpa, (q, k, v), (dq, dk, dv))
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(dout, ref_dout, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_new_points_match_torch_func_jvp_in_float64(causal):
    f = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    with sdpa_kernel(SDPBackend.MATH):
        prog = jvpc.compile(f, *seed_shaped(torch.float64))
        for _ in range(2):
            x, t = seed_shaped(torch.float64), seed_shaped(torch.float64)
            out, jvp_fn = prog(*x)
            ref_out, ref_dout = torch.func.jvp(f, x, t)
            torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-12)
            torch.testing.assert_close(jvp_fn(*t), ref_dout, atol=1e-12, rtol=1e-10)


def test_an_optimizer_step_between_two_points_is_seen():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 8, dtype=torch.float64)
    prog = jvpc.compile(model, x)
    dx = torch.randn(3, 8, dtype=torch.float64)
    _, jvp_before = prog(x)
    before = jvp_before(dx)
    model(x).square().sum().backward()
    opt.step()  # in place, under no_grad
    x2 = torch.randn(3, 8, dtype=torch.float64)
    out, jvp_fn = prog(x2)
    ref_out, ref_dout = torch.func.jvp(model, (x2,), (dx,))
    torch.testing.assert_close(out, ref_out.detach())
    torch.testing.assert_close(jvp_fn(dx), ref_dout.detach())
    # The weights are the program's inputs, read by name: a residual that is one aliases it, so the
    # earlier map refuses to run once the step wrote it (it would mix old and new weights).
    with pytest.raises(jvpc.Error, match=r"aliases the input '0.weight', which was written in place"):
        jvp_before(dx)


def test_guards_are_one_line_errors_naming_the_input():
    f = lambda x, y: x.sin() * y  # noqa: E731
    prog = jvpc.compile(f, torch.randn(3, 4), torch.randn(3, 4), retrace=False)
    with pytest.raises(jvpc.Error, match=r"'y' is float32\[4, 3\] on cpu \(traced with float32\[3, 4\] on cpu\); "
                                         "the program was compiled with retrace=False: compile again"):
        prog(torch.randn(3, 4), torch.randn(4, 3))
    with pytest.raises(jvpc.Error, match=r"'x' is float64\[3, 4\] on cpu \(traced with float32"):
        prog(torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4))
    with pytest.raises(jvpc.Error, match=r"primal 'x': expected strides \[4,1\] but got \[1,3\]"):
        prog(torch.randn(4, 3).t(), torch.randn(3, 4))
    with pytest.raises(jvpc.Error, match=r"1 positional arguments \(traced with 2\)"):
        prog(torch.randn(3, 4))
    loose = jvpc.compile(lambda x, y: x.sin() * y, torch.randn(3, 4), torch.randn(3, 4), exact_strides=False)
    x, y = torch.randn(4, 3).t(), torch.randn(3, 4)
    out, _ = loose(x, y)
    torch.testing.assert_close(out, x.sin() * y)


def test_reading_a_value_into_a_number_cannot_be_compiled():
    with pytest.raises(jvpc.Error, match=r"reads a value computed from its inputs or weights into Python \(item\(\)\)"):
        jvpc.compile(lambda x: x * x.sum().item(), torch.randn(3))


def test_a_program_saves_as_one_json_file(tmp_path):
    prog = jvpc.compile(sdpa, *seed_shaped())
    prog.save(tmp_path / "prog.json")
    assert (tmp_path / "prog.json").read_text().startswith("{")
    assert '"format": "jvpc-program"' in (tmp_path / "prog.json").read_text()


def test_a_saved_program_loads_and_runs_as_the_one_saved(tmp_path):
    # Captured tensors (the safetensors file beside the JSON; a module's weights would be inputs,
    # read by name), a non-differentiated argument and two outputs: the loaded program takes
    # tensors positionally and returns a tuple.
    torch.manual_seed(0)
    w, b = torch.randn(4, 8, dtype=torch.float64), torch.randn(4, dtype=torch.float64)

    def f(x, scale):
        h = torch.tanh(torch.nn.functional.linear(x, w, b)) * scale
        return h, h.sum(-1)

    x, scale = torch.randn(3, 8, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    prog = jvpc.compile(f, x, scale, argnums=0)
    prog.save(tmp_path / "prog.json")
    loaded = jvpc.load_program(tmp_path / "prog.json")
    assert [name for name, _, _ in loaded._graphs[0].prog.primal_inputs] == ["x", "scale"]
    x2, dx = torch.randn(3, 8, dtype=torch.float64), torch.randn(3, 8, dtype=torch.float64)
    (h, s), jvp_fn = loaded(x2, scale)
    (want_h, want_s), want_fn = prog(x2, scale)
    torch.testing.assert_close(h, want_h, atol=0, rtol=0)
    torch.testing.assert_close(s, want_s, atol=0, rtol=0)
    dh, ds = jvp_fn(dx)  # one tangent: only x is differentiated
    want_dh, want_ds = want_fn(dx)
    torch.testing.assert_close(dh, want_dh, atol=0, rtol=0)
    ref_out, ref_dout = torch.func.jvp(lambda x: f(x, scale), (x2,), (dx,))
    torch.testing.assert_close(dh, ref_dout[0].detach(), atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(ds, ref_dout[1].detach(), atol=1e-12, rtol=1e-10)
    with pytest.raises(jvpc.Error, match=r"primal 'x': expected shape \[3,8\] but got \[8,3\]"):
        loaded(torch.randn(8, 3, dtype=torch.float64), scale)
    with pytest.raises(jvpc.Error, match=r"1 positional arguments \(traced with 2\); a loaded program holds one graph"):
        loaded(x2)


def test_a_loaded_seed_program_counts_the_forward_and_batches(tmp_path):
    with sdpa_kernel(SDPBackend.MATH):
        jvpc.compile(sdpa, *seed_shaped()).save(tmp_path / "seed.json")
    prog = jvpc.load_program(tmp_path / "seed.json")
    q, k, v = seed_shaped()
    with FlopCounterMode(display=False) as m:
        out, jvp_fn = prog(q, k, v)
    assert m.get_total_flops() == 20_971_520
    assert isinstance(out, torch.Tensor)  # one output: a tensor, not a tuple
    batch = [torch.randn(4, 1, 5, 128, 64) for _ in range(3)]
    with FlopCounterMode(display=False) as m:
        got = torch.func.vmap(jvp_fn)(*batch)
    assert m.get_total_flops() == 4 * 41_943_040
    with sdpa_kernel(SDPBackend.MATH):
        want = torch.stack([torch.func.jvp(sdpa, (q, k, v), tuple(t[i] for t in batch))[1] for i in range(4)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_a_bad_program_file_is_a_one_line_error(tmp_path):
    with pytest.raises(jvpc.Error, match="cannot read program file .*missing.json': No such file"):
        jvpc.load_program(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"format": "jvpc-program", "version": 1')
    with pytest.raises(jvpc.Error, match="bad.json: invalid JSON at byte 40") as e:
        jvpc.load_program(tmp_path / "bad.json")
    assert "\n" not in str(e.value)
    g = tmp_path / "graph.json"
    jvpc.linearize(lambda x: x.sin(), torch.randn(3))[1].save(g)
    with pytest.raises(jvpc.Error, match='format is not "jvpc-program"'):
        jvpc.load_program(g)  # a tangent graph, not a program


def test_compiling_leaves_a_linear_map_of_the_same_model_valid():
    """A compile keeps the buffers as they were; it writes none it did not change, so a jvp_fn
    made from the model before (which refuses to run after a write to a weight or buffer) runs."""
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).eval()
    x = torch.randn(3, 4)
    _, jvp_fn = jvpc.linearize(net, x)
    jvpc.compile(net, x)
    torch.testing.assert_close(jvp_fn(x), torch.func.jvp(net, (x,), (x,))[1])
