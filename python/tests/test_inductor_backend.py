"""backend="inductor" (jvpc/_inductor.py): jvp_fn's tangent graph, after jvpc's pipeline, compiled
by Inductor. Its results equal the interpreter's and torch.func's in float64, for linearize, jvp,
programs (one compilation for every call), tangent_grad and attention's O(L) form; it checks its
tangents and constants as the interpreter does."""

import copy

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import jvpc
from jvpc import _inductor


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 8)).double()


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_linearize_and_jvp_equal_the_interpreter_and_torch_func():
    m, x, v = net(), randn(4, 8), randn(4, 8)
    want = torch.func.jvp(m, (x,), (v,))
    _inductor._compiled.clear()
    out, jvp_fn = jvpc.linearize(m, x, backend="inductor")
    assert jvp_fn.report()["phases_ms"]["inductor compile"] == 0  # compiled at the first call
    close(out, want[0])
    close(jvp_fn(v), want[1])
    assert jvp_fn.report()["phases_ms"]["inductor compile"] > 0
    close(jvp_fn(v * 2), want[1] * 2)
    close(jvpc.jvp(m, (x,), (v,), backend="inductor")[1], want[1])
    close(jvpc.linearize(m, x)[1](v), want[1])


def test_the_kept_compilations_are_bounded(monkeypatch):
    m = net()
    monkeypatch.setattr(_inductor, "_CAPACITY", 1)
    _inductor._compiled.clear()
    for rows in (4, 2):  # two graphs: the second's compilation pushes the first's out
        x, v = randn(rows, 8), randn(rows, 8)
        _, jvp_fn = jvpc.linearize(m, x, backend="inductor")
        close(jvp_fn(v), torch.func.jvp(m, (x,), (v,))[1])
        assert len(_inductor._compiled) == 1
    x, v = randn(4, 8), randn(4, 8)
    _, jvp_fn = jvpc.linearize(m, x, backend="inductor")
    jvp_fn(v)
    assert jvp_fn.report()["phases_ms"]["inductor compile"] > 0  # compiled again


def test_a_program_compiles_its_tangent_graph_once():
    m, x, v = net(), randn(4, 8), randn(4, 8)
    prog = jvpc.compile(m, x, backend="inductor")
    before = len(_inductor.compile_ms())
    for k in range(3):
        xk = x + k
        out, jvp_fn = prog(xk)
        close(jvp_fn(v), torch.func.jvp(m, (xk,), (v,))[1])
    # The primal graph and the tangent graph, once each (the tangent graph: none where an earlier
    # test compiled this graph).
    assert len(_inductor.compile_ms()) - before <= 2
    assert jvp_fn.report()["phases_ms"]["inductor compile"] >= 0


def test_a_programs_primal_graph_and_its_backward_run_through_inductor():
    """Under grad mode the primal graph runs through torch.compile (AOTAutograd's backward):
    outputs, gradients (weights by name, after an optimizer step too), BatchNorm's running
    statistics and the tangent equal eager's and torch.func's in float64."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.GELU(), nn.Linear(16, 8)).double()
    ref = copy.deepcopy(m)
    x, v = randn(6, 8), randn(6, 8)
    prog = jvpc.compile(m, x, backend="inductor")
    opt, ref_opt = (torch.optim.SGD(n.parameters(), lr=0.1) for n in (m, ref))
    for step in range(2):
        xk = x + step
        with fwAD.dual_level():  # LibTorch's forward AD, on a copy whose statistics then move
            dual = copy.deepcopy(ref)(fwAD.make_dual(xk, v))
            want_out, want_dout = (t.detach() for t in fwAD.unpack_dual(dual))
        out, jvp_fn = prog(xk)
        assert type(out.grad_fn).__name__ == "CompiledFunctionBackward"  # AOTAutograd's
        eager = ref(xk)  # the step eager code takes: its running statistics move as the program's
        close(out, eager)
        close(out, want_out)
        close(jvp_fn(v), want_dout)
        close(m[1].running_mean, ref[1].running_mean)
        for o, n in ((opt, m), (ref_opt, ref)):
            o.zero_grad()
        out.square().sum().backward()
        eager.square().sum().backward()
        for a, b in zip(m.parameters(), ref.parameters()):
            close(a.grad, b.grad)
        opt.step()
        ref_opt.step()


def test_gradients_through_the_tangent_of_a_program():
    """tangent_grad=True with both graphs on Inductor: d(‖out‖² + ‖J·v‖²)/dweights is torch.func's."""
    m, x, v = net(), randn(4, 8), randn(4, 8)
    ref = copy.deepcopy(m)
    out, jvp_fn = jvpc.compile(m, x, tangent_grad=True, backend="inductor")(x)
    assert type(out.grad_fn).__name__ == "CompiledFunctionBackward"
    (out.square().sum() + jvp_fn(v).square().sum()).backward()
    o, d = torch.func.jvp(ref, (x,), (v,))
    (o.square().sum() + d.square().sum()).backward()
    for a, b in zip(m.parameters(), ref.parameters()):
        close(a.grad, b.grad)


def test_a_random_primal_graph_stays_on_the_interpreter():
    torch.manual_seed(0)
    d = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).double()
    x = randn(4, 8)
    prog = jvpc.compile(d, x, backend="inductor")
    torch.manual_seed(1)
    out, _ = prog(x)
    torch.manual_seed(1)
    close(out, d(x))  # eager's draw
    assert prog._graphs[0].inductor["primal"] is None


def test_tangent_grad_and_attention_in_the_o_l_form():
    torch.manual_seed(0)
    q, k, val, dq = (randn(1, 2, 40, 8) for _ in range(4))

    def attention(q):
        return F.scaled_dot_product_attention(q, k, val, is_causal=True)

    o = jvpc.LinearizeOptions()
    o.residual_budget = 0
    qs, dqs = q.clone().requires_grad_(), dq.clone().requires_grad_()
    out, dout = jvpc.jvp(attention, (qs,), (dqs,), options=o, tangent_grad=True, backend="inductor")
    assert "jvpc::attention_tangent" in str(jvpc.linearize(attention, q, options=o)[1].graph)
    dout.square().sum().backward()
    with sdpa_kernel(SDPBackend.MATH):
        ref_q, ref_dq = q.clone().requires_grad_(), dq.clone().requires_grad_()
        torch.func.jvp(attention, (ref_q,), (ref_dq,))[1].square().sum().backward()
    close(qs.grad, ref_q.grad)
    close(dqs.grad, ref_dq.grad)


def test_tangents_and_weights_are_checked_as_the_interpreter_checks_them():
    m, x, v = net(), randn(4, 8), randn(4, 8)
    _, jvp_fn = jvpc.linearize(m, x, backend="inductor")
    with pytest.raises(jvpc.Error, match="expected"):
        jvp_fn(randn(5, 8))
    close(jvp_fn(v.t().contiguous().t()), jvpc.linearize(m, x)[1](v))  # a view of another layout
    with torch.no_grad():
        m[0].weight.add_(1)
    with pytest.raises(jvpc.Error, match="linearize again"):
        jvp_fn(v)


def test_lists_tuples_dtypes_and_infinities_convert():
    """Ops returning lists and tuples, dtype arguments and non-finite constants reach Inductor
    as the interpreter runs them."""
    def f(x):
        a, b = torch.split(x, [3, 5], dim=1)
        y = torch.cat([a.sin(), b.to(torch.float32).to(torch.float64).exp()], 1)
        m, i = y.max(dim=1)
        return y.clamp(min=float("-inf"), max=2.0) * m[:, None], torch.where(y > 0, y, float("inf")).amin(1)

    x, v = randn(4, 8), randn(4, 8)
    want = torch.func.jvp(f, (x,), (v,))[1]
    got = jvpc.jvp(f, (x,), (v,), backend="inductor")[1]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_vmap_the_cache_and_a_programs_guards():
    """vmap(jvp_fn) runs the batched tangent graph (on the interpreter); cache=True reuses the
    optimized graphs and the compilation; a program's guards retrace (eval) and its new graph
    compiles anew."""
    m, x = net(), randn(4, 8)
    vs = randn(3, 4, 8)
    _, jvp_fn = jvpc.linearize(m, x, backend="inductor")
    close(torch.func.vmap(jvp_fn)(vs), torch.stack([torch.func.jvp(m, (x,), (v,))[1] for v in vs]))
    for k in range(2):
        xk = x + k
        _, jvp_fn = jvpc.linearize(m, xk, cache=True, backend="inductor")
        close(jvp_fn(vs[0]), torch.func.jvp(m, (xk,), (vs[0],))[1])
    d = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).double()
    prog = jvpc.compile(d, x, backend="inductor")
    d.eval()
    _, jvp_fn = prog(x)
    close(jvp_fn(vs[0]), torch.func.jvp(d, (x,), (vs[0],))[1])
    assert prog.num_graphs == 2


def test_an_unknown_backend_is_refused():
    with pytest.raises(jvpc.Error, match="backend must be one of interpreter, inductor"):
        jvpc.linearize(net(), randn(4, 8), backend="xla")


def test_a_programs_aoti_packages_run_from_the_cli_as_torch_func(tmp_path):
    """Program.save(aoti=True) writes both graphs as AOTInductor packages; `jvpc jvp --aoti`
    runs them from C++ (runtime/aoti_program.h) and equals torch.func in float64, attention's
    O(L) form (jvpc::attention_tangent in the package) included. A package beside a program file
    compiled again is refused."""
    import json
    import os
    import subprocess
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    cli = os.environ.get("JVPC_CLI", str(Path(__file__).resolve().parents[2] / "build" / "jvpc"))
    m, x, v = net(), randn(4, 8), randn(4, 8)
    prog = jvpc.compile(m, x)
    path = tmp_path / "p.json"
    prog.save(path, aoti=True)
    assert (tmp_path / "p.primal.pt2").is_file() and (tmp_path / "p.tangent.pt2").is_file()

    def inputs(graph, role):
        return [i["name"] for i in json.loads(graph.to_json())["inputs"] if i["role"] == role]

    weights = {k: w.detach() for k, w in m.named_parameters()}  # primals by name, beside x
    (x_name,), (v_name,) = [n for n in inputs(prog.primal_graph, "primal") if n not in weights], inputs(
        prog.tangent_graph, "tangent")
    save_file({**weights, x_name: x}, tmp_path / "x.safetensors")
    save_file({v_name: v}, tmp_path / "v.safetensors")

    def jvp(*extra):
        r = subprocess.run([cli, "jvp", str(path), "--primals", str(tmp_path / "x.safetensors"), "--tangents",
                            str(tmp_path / "v.safetensors"), "-o", str(tmp_path / "out.safetensors"), *extra],
                           capture_output=True, text=True)
        return r, (load_file(tmp_path / "out.safetensors") if r.returncode == 0 else None)

    r, got = jvp("--aoti")
    assert r.returncode == 0, r.stderr
    assert "not measured: AOTInductor's kernels" in r.stdout
    out, dout = torch.func.jvp(m, (x,), (v,))
    close(got["out0"], out)
    close(got["dout0"], dout)

    jvpc.compile(net()[:2], x).save(path)  # another program in its place: the packages are stale
    r, _ = jvp("--aoti")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"jvpc: error: AOTInductor package '{tmp_path / 'p.primal.pt2'}' was compiled from "
                                "another program file: write it again (jvpc compile --aoti -o)")

    # Attention's tangent in the O(L) form: jvpc::attention_tangent, one operator in the package.
    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    qkv, dqkv = [randn(1, 2, 32, 8) for _ in range(3)], [randn(1, 2, 32, 8) for _ in range(3)]
    options = jvpc.LinearizeOptions()
    options.residual_budget = 0
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        attention = jvpc.compile(f, *qkv, options=options)
    assert "jvpc::attention_tangent" in attention.tangent_graph.to_text()
    attention.save(path, aoti=True)
    save_file(dict(zip("qkv", qkv)), tmp_path / "x.safetensors")
    save_file(dict(zip(("dq", "dk", "dv"), dqkv)), tmp_path / "v.safetensors")
    r, got = jvp("--aoti")
    assert r.returncode == 0, r.stderr
    with sdpa_kernel(SDPBackend.MATH):
        out, dout = torch.func.jvp(f, tuple(qkv), tuple(dqkv))
    close(got["out0"], out)
    close(got["dout0"], dout)



def test_jvpc_backend_sets_the_default_backend(monkeypatch):
    """JVPC_BACKEND names the backend where none is given (the suites' *_inductor runs rely on it);
    an unknown name is refused, saying where it came from."""
    m, x, v = net(), randn(4, 8), randn(4, 8)
    monkeypatch.setenv("JVPC_BACKEND", "inductor")
    _inductor._compiled.clear()
    _, jvp_fn = jvpc.linearize(m, x)
    close(jvp_fn(v), torch.func.jvp(m, (x,), (v,))[1])
    assert jvp_fn.report()["phases_ms"]["inductor compile"] > 0
    _, jvp_fn = jvpc.linearize(m, x, backend="interpreter")  # an explicit backend wins
    jvp_fn(v)
    assert "inductor compile" not in jvp_fn.report()["phases_ms"]
    monkeypatch.setenv("JVPC_BACKEND", "xla")
    with pytest.raises(jvpc.Error, match=r"got 'xla' \(from \$JVPC_BACKEND\)"):
        jvpc.compile(m, x)
