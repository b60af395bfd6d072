"""Python and the CLI meet: a graph traced in Python, with the inputs it was traced at, runs in
the CLI; primals and tangents written in Python with safetensors run in `jvpc jvp`, whose results
Python reads back and checks against torch.func.jvp; a program compiled by the CLI loads in
Python, and `jvpc show`/`cost` print a program's two graphs."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention

import jvpc

JVPC = os.environ.get("JVPC_CLI", str(Path(__file__).resolve().parents[2] / "build" / "jvpc"))


def cli(*args: str) -> str:
    r = subprocess.run([JVPC, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "ERROR" not in r.stderr, r.stderr  # nothing spurious, on a machine without a GPU too
    return r.stdout


def attention(q, k, v):
    with sdpa_kernel(SDPBackend.MATH):
        return scaled_dot_product_attention(q, k, v)


def qkv(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 2, 8, 4, dtype=torch.float64, generator=g) for _ in range(3)]


def test_a_graph_and_its_inputs_go_from_python_to_the_cli_and_back(tmp_path):
    q, k, v = qkv(0)
    traced = jvpc.trace(attention, q, k, v)
    assert [line.split()[3].rstrip(",):") for line in str(traced).splitlines()[:3]] == ["q", "k", "v"]  # its parameters
    traced.save(tmp_path / "attn.json")
    saved = load_file(tmp_path / "attn.inputs.safetensors")
    assert set(saved) == {"q", "k", "v"} and torch.equal(saved["k"], k)

    # The CLI linearizes it at the inputs it was traced at, and checks it against forward AD.
    out = cli("linearize", str(tmp_path / "attn.json"))
    assert f"primals from {tmp_path / 'attn.inputs.safetensors'}" in out and "PASS" in out

    # A program, run at primals and tangents written in Python, by the graph's names.
    cli("compile", str(tmp_path / "attn.json"), "-o", str(tmp_path / "prog.json"))
    q2, k2, v2 = qkv(1)
    dq, dk, dv = qkv(2)
    save_file({"q": q2, "k": k2, "v": v2}, tmp_path / "primals.safetensors")
    save_file({"dq": dq, "dk": dk, "dv": dv}, tmp_path / "tangents.safetensors")
    cli("jvp", str(tmp_path / "prog.json"), "--primals", str(tmp_path / "primals.safetensors"),
        "--tangents", str(tmp_path / "tangents.safetensors"), "-o", str(tmp_path / "out.safetensors"))
    got = load_file(tmp_path / "out.safetensors")
    want_out, want_t = torch.func.jvp(attention, (q2, k2, v2), (dq, dk, dv))
    assert sorted(got) == ["dout0", "out0"]
    torch.testing.assert_close(got["out0"], want_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got["dout0"], want_t, rtol=1e-10, atol=1e-12)

    # The same program in Python, with its graphs' costs in report_text().
    prog = jvpc.load_program(tmp_path / "prog.json")
    out2, jvp_fn = prog(q2, k2, v2)
    torch.testing.assert_close(jvp_fn(dq, dk, dv), want_t, rtol=1e-10, atol=1e-12)
    assert jvp_fn.tangent_names == ["dq", "dk", "dv"]
    rows = [line.split()[0:2] for line in prog.report_text().splitlines()[1:]]
    assert rows == [["primal", "graph"], ["tangent", "graph"]]


def test_show_and_cost_print_a_programs_two_graphs(tmp_path):
    prog = jvpc.compile(attention, *qkv(0))
    prog.save(tmp_path / "prog.json")
    shown = cli("show", str(tmp_path / "prog.json"))
    assert shown.startswith("// primal graph: the function's outputs (1), then its residuals (")
    assert "\n// tangent graph\ngraph(" in shown
    cost = cli("cost", str(tmp_path / "prog.json"))
    lines = cost.splitlines()
    assert lines[1].startswith("primal graph") and lines[2].startswith("tangent graph")
    bmms = prog.tangent_graph.to_text().count("= aten::bmm(")
    assert f"aten::bmm×{bmms}" in cost.split("\ntangent graph\nops:")[1].splitlines()[0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "term"])
def test_an_interrupted_write_leaves_the_previous_files_and_no_temporary(tmp_path, sig):
    out = tmp_path / "tangent.json"
    cli("linearize", "sdpa", "--seq-len", "8", "-o", str(out))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    # A graph whose residuals take a while to write (about 300 MB), interrupted while writing.
    p = subprocess.Popen([JVPC, "linearize", "sdpa", "--seq-len", "2048", "--model-dim", "1024", "-o", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not any(q.name.startswith(".") for q in tmp_path.iterdir()):
        assert p.poll() is None and time.monotonic() < deadline, "the write never started"
        time.sleep(0.01)
    p.send_signal(sig)
    assert p.wait(timeout=60) == -sig
    assert {q.name: q.read_bytes() for q in tmp_path.iterdir()} == before


def test_a_traced_graph_whose_inputs_file_cannot_be_written_leaves_the_previous_save(tmp_path):
    q, k, v = qkv(0)
    path = tmp_path / "attn.json"
    jvpc.trace(attention, q, k, v).save(path)
    before = path.read_bytes()
    (tmp_path / "attn.inputs.safetensors").unlink()
    (tmp_path / "attn.inputs.safetensors").mkdir()  # the inputs file cannot be written
    with pytest.raises(jvpc.Error, match="attn.inputs.safetensors"):
        jvpc.trace(lambda q, k, v: attention(q, k, v) * 2, q, k, v).save(path)
    assert path.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
