"""The rest of the API: the tangent graph's forms and report, save and load, trace, options, vmap."""

import json

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention
from torch.utils.flop_counter import FlopCounterMode

import jvpc
from models import mlp_case, sdpa_case


def seed_like(seq=16, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 5, seq, 64, generator=gen, dtype=dtype) for _ in range(6))


def math_sdpa(q, k, v):
    with sdpa_kernel(SDPBackend.MATH):
        return scaled_dot_product_attention(q, k, v)


def test_tangent_graph_forms_and_report():
    q, dq, k, dk, v, dv = seed_like(128)
    _, jvp_fn = jvpc.linearize(math_sdpa, q, k, v)
    text = str(jvp_fn.graph)
    assert text == jvp_fn.to_text() and text.count("aten::baddbmm") == 2 and text.count("aten::bmm") == 2
    g = json.loads(jvp_fn.to_json())
    assert len(g["nodes"]) == 12
    assert jvp_fn.to_dot().startswith("digraph")
    rep = jvp_fn.report()
    assert rep["linearize"]["matmul_flops"] == 20_971_520
    assert rep["jvp"]["matmul_flops"] == 41_943_040 and rep["jvp"]["tangents"] == ["dq", "dk", "dv"]
    assert [p["name"] for p in rep["passes"]] == ["trace", "tangent graph"]
    assert jvp_fn.report_text().splitlines()[1].startswith("trace")
    every = jvpc.LinearizeOptions()
    every.pass_costs = True
    _, each = jvpc.linearize(math_sdpa, q, k, v, options=every)
    rows = each.report()["passes"]
    assert [p["name"] for p in rows][:2] == ["trace", "jvp"] and len(rows) > 10
    assert rows[-1]["matmul_flops"] == rep["passes"][-1]["matmul_flops"] == 41_943_040
    assert jvp_fn.cost()["matmul_flops"] == 41_943_040
    assert jvp_fn.tangent_names == ["dq", "dk", "dv"]  # math_sdpa's parameters


def test_save_and_load(tmp_path):
    q, dq, k, dk, v, dv = seed_like()
    _, jvp_fn = jvpc.linearize(math_sdpa, q, k, v)
    path = tmp_path / "tangent.json"
    jvp_fn.save(path)
    assert (tmp_path / "tangent.safetensors").exists()
    loaded = jvpc.load(path)
    assert loaded.argument_names == ["dq", "dk", "dv"]
    expected = jvp_fn(dq, dk, dv)
    (got,) = loaded(dq, dk, dv)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    with FlopCounterMode(display=False) as mode:
        loaded(dq, dk, dv)
    assert mode.get_total_flops() == jvp_fn.cost()["matmul_flops"]
    with pytest.raises(jvpc.Error, match="expected shape"):
        loaded(dq[:, :, :3], dk, dv)


def test_load_refuses_a_missing_file(tmp_path):
    with pytest.raises(jvpc.Error):
        jvpc.load(tmp_path / "nothing.json")


def test_a_hostile_graph_file_is_an_error_not_a_crash(tmp_path):
    # max_pool2d_with_indices_backward writes at its indices: 1e8 killed the interpreter, 20
    # corrupted the heap, 16 gave wrong numbers; indices made by the graph (full) or computed from
    # an input (_to_copy of a float) alike.
    def meta(sizes, strides, dtype="Float"):
        return {"sizes": sizes, "strides": strides, "dtype": dtype, "device": "cpu"}
    quarter = meta([1, 1, 2, 2], [4, 4, 2, 1])
    def graph(indices_node, extra_inputs=()):
        return {
            "format": "jvpc-graph", "schema_version": 1,
            "inputs": [{"name": "x", "id": 0, "role": "primal", "meta": meta([1, 1, 4, 4], [16, 16, 4, 1])},
                       {"name": "g", "id": 1, "role": "primal", "meta": quarter}, *extra_inputs],
            "nodes": [
                indices_node,
                {"op": "aten::max_pool2d_with_indices_backward",
                 "args": [{"tensor": 1}, {"tensor": 0}, {"ints": [2, 2]}, {"ints": [2, 2]}, {"ints": [0, 0]},
                          {"ints": [1, 1]}, {"bool": False}, {"tensor": 3}],
                 "outputs": [{"id": 4, "meta": meta([1, 1, 4, 4], [16, 16, 4, 1])}]}],
            "outputs": [{"name": "dx", "id": 4}]}
    out_of_range = r"argument 'indices' holds an index out of range \[0, 16\)"
    x, g = torch.randn(1, 1, 4, 4), torch.randn(1, 1, 2, 2)
    for value in (100000000, 20, 16):
        path = tmp_path / f"pool{value}.json"
        path.write_text(json.dumps(graph(
            {"op": "aten::full",
             "args": [{"ints": [1, 1, 2, 2]}, {"int": value}, {"scalar_type": "Long"}, {"none": None},
                      {"device": "cpu"}, {"none": None}],
             "outputs": [{"id": 3, "meta": meta([1, 1, 2, 2], [4, 4, 2, 1], "Long")}]})))
        loaded = jvpc.load(path)
        with pytest.raises(jvpc.Error, match=out_of_range):
            loaded(x, g)
    path = tmp_path / "computed.json"
    path.write_text(json.dumps(graph(
        {"op": "aten::_to_copy",
         "args": [{"tensor": 2}, {"scalar_type": "Long"}, {"none": None}, {"none": None}, {"none": None},
                  {"bool": False}, {"none": None}],
         "outputs": [{"id": 3, "meta": meta([1, 1, 2, 2], [4, 4, 2, 1], "Long")}]},
        [{"name": "v", "id": 2, "role": "primal", "meta": quarter}])))
    loaded = jvpc.load(path)
    for value in (1e8, 20.0, 16.0, -1.0):
        with pytest.raises(jvpc.Error, match=out_of_range):
            loaded(x, g, torch.full((1, 1, 2, 2), value))
    good = torch.tensor([0.0, 3.0, 12.0, 15.0]).view(1, 1, 2, 2)
    want = torch.ops.aten.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False, good.long())
    (dx,) = loaded(x, g, good)
    torch.testing.assert_close(dx, want, rtol=0, atol=0)


def test_trace():
    f, _, primals = mlp_case(torch.float32)
    g = jvpc.trace(f, *primals)
    torch.testing.assert_close(g.outputs, f(*primals))
    assert "aten::gelu" in str(g)
    assert json.loads(g.to_json())["nodes"]
    assert g.to_dot().startswith("digraph")
    cost = g.cost()
    x, w1 = primals[0], primals[1]
    flops = 2 * x.numel() * w1.shape[0] + 2 * x.numel() // x.shape[-1] * w1.shape[0] * x.shape[-1]
    assert cost["matmul_flops"] == flops


def test_options():
    assert "cse" in jvpc.optional_passes()
    q, dq, k, dk, v, dv = seed_like()
    o = jvpc.LinearizeOptions()
    o.disabled_passes = {"scale-to-residual"}
    o.runtime.reuse_buffers = False
    _, plain = jvpc.linearize(math_sdpa, q, k, v)
    _, without = jvpc.linearize(math_sdpa, q, k, v, options=o)
    assert plain.graph.num_nodes == 12 and without.graph.num_nodes == 14
    torch.testing.assert_close(without(dq, dk, dv), plain(dq, dk, dv))


def test_argnums_with_integer_and_constant_inputs():
    x = torch.randn(5, 3, dtype=torch.float64)
    w = torch.randn(3, 3, dtype=torch.float64)
    idx = torch.tensor([4, 0, 2])

    def f(x, idx, w, scale):
        return (x[idx] @ w).tanh() * scale

    out, jvp_fn = jvpc.linearize(f, x, idx, w, 0.5, argnums=(2, 0))
    assert jvp_fn.tangent_names == ["dw", "dx"]
    dw, dx = torch.randn_like(w), torch.randn_like(x)
    _, ref = torch.func.jvp(lambda w, x: f(x, idx, w, 0.5), (w, x), (dw, dx))
    torch.testing.assert_close(jvp_fn(dw, dx), ref)
    out2, dout = jvpc.jvp(f, (x, idx, w, 0.5), (dw, dx), argnums=(2, 0))
    torch.testing.assert_close(dout, ref)


def test_vmap_over_jvp_fn():
    q, dq, k, dk, v, dv = seed_like()
    _, jvp_fn = jvpc.linearize(math_sdpa, q, k, v)
    _, ref_fn = torch.func.linearize(math_sdpa, q, k, v)
    batch = tuple(torch.randn(3, *t.shape) for t in (dq, dk, dv))
    got = torch.func.vmap(jvp_fn)(*batch)
    ref = torch.stack([ref_fn(*(t[i] for t in batch)) for i in range(3)])
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    # in_dims other than 0, and an unbatched tangent
    got = torch.func.vmap(jvp_fn, in_dims=(1, None, 0))(batch[0].movedim(0, 1), dk, batch[2])
    ref = torch.stack([ref_fn(batch[0][i], dk, batch[2][i]) for i in range(3)])
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    with FlopCounterMode(display=False) as mode:
        torch.func.vmap(jvp_fn)(*batch)
    assert mode.get_total_flops() == 3 * jvp_fn.cost()["matmul_flops"]


def test_nested_vmap_over_jvp_fn():
    x = torch.randn(4, dtype=torch.float64)
    _, jvp_fn = jvpc.linearize(lambda x: x.sin() * x, x)
    t = torch.randn(2, 3, 4, dtype=torch.float64)
    got = torch.func.vmap(torch.func.vmap(jvp_fn))(t)
    torch.testing.assert_close(got, t * (x.cos() * x + x.sin()))


def test_many_calls_and_threads():
    import threading
    f, _, primals = sdpa_case(torch.float32)
    _, jvp_fn = jvpc.linearize(f, *primals)
    t = tuple(torch.randn_like(p) for p in primals)
    expected = jvp_fn(*t)
    results = []

    def work():
        for _ in range(5):
            results.append(jvp_fn(*t))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(results) == 20
    for r in results:
        torch.testing.assert_close(r, expected, rtol=0, atol=0)


def test_plain_calls_and_pytree_calls_agree():
    """One tensor per argument and one out take a short path past pytree; tensor subclasses,
    nested tangents and outputs take pytree's. Both give the same values and structure."""
    q, k, v = seed_like(seq=4)[::2]
    _, jvp_fn = jvpc.linearize(math_sdpa, q, k, v)
    t = tuple(torch.randn_like(x) for x in (q, k, v))
    plain = jvp_fn(*t)
    assert type(plain) is torch.Tensor
    subclass = jvp_fn(*(torch.nn.Parameter(x, requires_grad=False) for x in t))
    assert torch.equal(plain, subclass)
    with pytest.raises(jvpc.Error, match="tangent"):
        jvp_fn(t[0], t[1], t[2][..., :3])  # a wrong shape on the short path
    with pytest.raises(jvpc.Error, match="structure"):
        jvp_fn(t[0], t[1])

    def nested(x, kv):
        return {"out": math_sdpa(x, kv[0], kv[1]), "twice": [2 * x]}

    _, jvp_nested = jvpc.linearize(nested, q, (k, v))
    got = jvp_nested(t[0], (t[1], t[2]))
    assert set(got) == {"out", "twice"} and torch.equal(got["out"], plain)
    torch.testing.assert_close(got["twice"][0], 2 * t[0])
