"""The examples run as the README says: MeanFlow on scikit-learn's digits trains for a few dozen
steps with each JVP (jvpc, torch.func, finite differences), its loss falls, and it writes its
picture, its loss curve and its record."""

import json
import os
import runpy

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TRAIN = os.path.join(ROOT, "examples", "meanflow_digits", "train.py")


def run_example(*args):
    module = runpy.run_path(TRAIN, run_name="meanflow_digits")
    module["main"](list(args))


@pytest.mark.parametrize("jvp", ["jvpc", "torch", "fd"])
def test_meanflow_on_digits_trains_and_writes_its_files(tmp_path, jvp):
    out = tmp_path / "run"
    run_example("--jvp", jvp, "--steps", "40", "--batch", "32", "--judge", "5", "--samples", "2", "--quiet",
                "--out", str(out))
    assert {p.name for p in out.iterdir()} == {"samples.png", "loss.png", "run.json"}
    record = json.loads((out / "run.json").read_text())
    losses = record["sides"][jvp]["losses"]
    assert len(losses) == 40 and sum(losses[-10:]) < sum(losses[:10])
    acc = record["sides"][jvp]["accuracy"]
    assert 0.0 <= acc["1_step"] <= 1.0 and 0.0 <= acc["2_step"] <= 1.0
    assert (out / "samples.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_trains_both_sides_from_one_seed_alike(tmp_path):
    out = tmp_path / "cmp"
    run_example("--compare", "--steps", "12", "--batch", "16", "--judge", "2", "--samples", "1", "--quiet",
                "--out", str(out))
    record = json.loads((out / "run.json").read_text())
    a, b = record["sides"]["jvpc"]["losses"], record["sides"]["torch"]["losses"]
    assert max(abs(x - y) / abs(y) for x, y in zip(a, b)) < 1e-4


def test_bad_flags_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_example("--steps", "0", "--out", str(tmp_path / "x"))
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "error: --steps and --samples and --judge must be at least 1, --batch at least 2")
