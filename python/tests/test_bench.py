"""scripts/bench/python_bench.py: its floor (jvpc's tangent graph's matmul kernels alone) runs
exactly the arithmetic of jvpc's call, as FlopCounterMode counts it, and --device cuda refuses
in one line where there is no GPU. scripts/bench/batched_bench.py: its floor (the batched graph's
matmul kernels alone) runs K times one call's matmul FLOPs, the batched call's. Times are printed,
never asserted."""

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "bench", "python_bench.py")
BATCHED_SCRIPT = os.path.join(ROOT, "scripts", "bench", "batched_bench.py")


def run_bench(tmp_path, *flags):
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, SCRIPT, *flags, "--rounds", "3", "--warmup", "1", "--skip-compile",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    return r, (json.loads(out.read_text()) if out.exists() else None)


def test_floor_is_the_seeds_four_matmuls(tmp_path):
    r, got = run_bench(tmp_path, "--config", "sdpa")
    assert r.returncode == 0, r.stderr
    flops = got["matmul_flops"]
    floor = got["floor"]
    # jvpc's later calls, PyTorch's later calls and the floor: the same 4 matmuls, 41,943,040 FLOPs.
    assert flops["jvpc"] == flops["torch.func eager"] == flops[floor["name"]] == 41_943_040
    assert floor["name"] == "jvpc's 4 matmuls alone"
    assert sorted(k.split("(")[0] for k in floor["kernels"]) == ["aten::baddbmm"] * 2 + ["aten::bmm"] * 2
    assert floor["gflops_per_s"] == pytest.approx(41_943_040 / floor["time_s"] / 1e9)
    assert got["target"]["time_s"] == pytest.approx(0.4 * got["median_s"]["torch.func eager"])
    for line in ("floor: jvpc / matmuls alone", "matmul throughput at these shapes: 41,943,040 FLOPs",
                 "target 0.4x torch.func eager"):
        assert line in r.stdout


def test_floor_of_the_block(tmp_path):
    r, got = run_bench(tmp_path, "--config", "block", "--seq-len", "16", "--model-dim", "64", "--head-dim", "16")
    assert r.returncode == 0, r.stderr
    flops = got["matmul_flops"]
    assert flops["jvpc"] == flops[got["floor"]["name"]] > 0
    assert flops["jvpc"] == flops["torch.func eager"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without a GPU")
def test_cuda_refused_without_a_gpu(tmp_path):
    r, got = run_bench(tmp_path, "--config", "sdpa", "--device", "cuda")
    assert r.returncode == 2 and got is None
    assert r.stderr.strip().splitlines()[-1].endswith(
        "error: --device cuda: no CUDA device here (torch.cuda.is_available() is False)")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_floor_on_cuda(tmp_path):
    r, got = run_bench(tmp_path, "--config", "sdpa", "--device", "cuda")
    assert r.returncode == 0, r.stderr
    flops = got["matmul_flops"]
    assert flops["jvpc"] == flops[got["floor"]["name"]] == 41_943_040
    assert "float16, CUDA" in got["config"]


@pytest.mark.parametrize("flags, message", [
    (["--target", "0"], "--target must be a ratio above 0, not 0.0"),
    (["--rounds", "0"], "--rounds must be at least 1, --warmup, --profile and --busy at least 0, --nice from 0 to 19"),
    (["--nice", "20"], "--rounds must be at least 1, --warmup, --profile and --busy at least 0, --nice from 0 to 19"),
])
def test_bad_flags_refused(tmp_path, flags, message):
    r = subprocess.run([sys.executable, SCRIPT, "--config", "sdpa", *flags], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith(f"error: {message}")


def test_batched_floor_is_k_times_the_seeds_four_matmuls(tmp_path):
    out = tmp_path / "batched.json"
    r = subprocess.run([sys.executable, BATCHED_SCRIPT, "--config", "sdpa", "--tangents", "1,4", "--rounds", "2",
                        "--warmup", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["K"] for row in rows] == [1, 4]
    for row in rows:
        # The batched call and its matmuls alone: K times one call's 41,943,040 FLOPs, in 4 kernels.
        assert row["matmul_flops"] == row["K"] * 41_943_040
        assert sorted(k.split("(")[0] for k in row["floor_kernels"]) == ["aten::baddbmm"] * 2 + ["aten::bmm"] * 2
        per = row["per_tangent_s"]
        assert row["batched_over_floor"] == pytest.approx(per["jvpc batched"] / per["matmuls alone"])
    assert "K=4 167,772,160 FLOPs" in r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without a GPU")
def test_batched_cuda_refused_without_a_gpu():
    r = subprocess.run([sys.executable, BATCHED_SCRIPT, "--config", "sdpa", "--device", "cuda"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith(
        "error: --device cuda: no CUDA device here (torch.cuda.is_available() is False)")


@pytest.mark.parametrize("tangents, message", [
    ("a", "--tangents: a comma-separated list of integers, not 'a'"),
    ("4,0", "--tangents: each K must be at least 1"),
])
def test_batched_bad_tangents_refused(tangents, message):
    r = subprocess.run([sys.executable, BATCHED_SCRIPT, "--config", "sdpa", "--tangents", tangents],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith(f"error: {message}")


def test_train_step_bench_runs_and_its_sides_losses_agree(tmp_path):
    out = tmp_path / "train.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench", "train_step.py"), "--sizes", "small",
                        "--objectives", "meanflow", "--rounds", "1", "--warmup", "0", "--skip-compile",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(out.read_text())
    assert row["losses_agree"] and set(row["sides"]) == {"jvpc", "func eager", "plain (no JVP)", "finite differences"}
    assert row["sides"]["jvpc"]["flops"] < row["sides"]["func eager"]["flops"]
    # The floor does no JVP: fewer FLOPs than any side that does.
    assert row["sides"]["plain (no JVP)"]["flops"] < row["sides"]["jvpc"]["flops"]
    # jvpc's JVP is exact in float32 where central differences are not.
    errors = row["jvp_errors"]
    assert errors["jvpc float32"] < 1e-5 < errors["finite differences float32"]
