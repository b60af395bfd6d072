"""The Python blocks of README.md and docs/*.md run as written.

Every fenced ```python block is a test case, run in its own Python process in an empty folder
(so that the files a block writes go nowhere), with the environment of this process (ctest's:
PYTHONPATH to the module, JVPC_VERIFY_EACH=1, OMP_NUM_THREADS=1). A block is run as it stands
unless the nearest non-blank line above its fence is a marker (an HTML comment, which Markdown
does not render):

  <!-- doc-test: prelude NAME -->    run PRELUDES[NAME] first: it defines, at small sizes, the
                                     names the block uses without defining them (f, q, k, v, net...)
  <!-- doc-test: skip: REASON -->    do not run it; REASON says why (a CLI step between its lines,
                                     a process group, ...), and must not be empty

A marker that names no prelude, or a skip without a reason, fails.

  PYTHONPATH=build/python JVPC_VERIFY_EACH=1 JVPC_CLI=build/jvpc OMP_NUM_THREADS=1 \
    python3 -m pytest -q -p no:cacheprovider python/tests/test_docs.py
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
MARKER = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->$")

# Names the blocks use without defining them, at small sizes.
PRELUDES = {
    # Attention as the seed's script writes it, at a small size: f(q, k, v), a second point
    # (q2, k2, v2) and tangents (dq, dk, dv).
    "sdpa": """
        import torch
        import jvpc
        torch.manual_seed(0)
        def f(q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
        q, k, v, q2, k2, v2, dq, dk, dv = (torch.randn(1, 2, 8, 16) for _ in range(9))
    """,
    # A small network net(z, r, t) (z: batch x tokens x width, r and t: one time per sample), its
    # optimizer, example inputs, a few batches and the tangents MeanFlow's JVP takes.
    "meanflow": """
        import torch
        from torch import nn
        import jvpc
        torch.manual_seed(0)
        class Net(nn.Module):
            def __init__(self, width=8):
                super().__init__()
                self.inp, self.out = nn.Linear(width + 2, 16), nn.Linear(16, width)
            def forward(self, z, r, t):
                times = torch.stack([r, t], -1)[:, None, :].expand(z.shape[0], z.shape[1], 2)
                return self.out(torch.tanh(self.inp(torch.cat([z, times], -1))))
        def DiT(*args):
            return Net()
        B, L, D = 4, 6, 8
        net = DiT(...)
        z0, r0, t0 = torch.randn(B, L, D), torch.rand(B), torch.rand(B)
        z, r, t, v = torch.randn(B, L, D), torch.rand(B), torch.rand(B), torch.randn(B, L, D)
        zeros, ones = torch.zeros_like(r), torch.ones_like(t)
        loader = [(torch.randn(B, L, D), torch.randn(B, L, D), torch.rand(B) * 0.5, 0.5 + torch.rand(B) * 0.5)
                  for _ in range(3)]
    """,
    # sCM: a network net(x, t) with t of shape [B, 1, 1], compiled; a point x_t, its velocity
    # dxdt, and the loss's constant c.
    "scm": """
        import torch
        from torch import nn
        from torch import cos, sin
        import jvpc
        torch.manual_seed(0)
        class Net(nn.Module):
            def __init__(self, width=8):
                super().__init__()
                self.inp, self.out = nn.Linear(width + 1, 16), nn.Linear(16, width)
            def forward(self, x, t):
                return self.out(torch.tanh(self.inp(torch.cat([x, t.expand(x.shape[0], x.shape[1], 1)], -1))))
        B, L, D = 4, 6, 8
        net = Net()
        x_t, t, dxdt = torch.randn(B, L, D), torch.rand(B, 1, 1), torch.randn(B, L, D)
        c = 0.1
        prog = jvpc.compile(net, x_t, t)
    """,
}


def _blocks():
    """(file, line of the fence, marker or None, code) for every ```python block."""
    for path in DOCS:
        lines = path.read_text().split("\n")
        i = 0
        while i < len(lines):
            if lines[i].strip() == "```python":
                j = i + 1
                while j < len(lines) and lines[j].strip() != "```":
                    j += 1
                above = next((lines[n].strip() for n in range(i - 1, -1, -1) if lines[n].strip()), "")
                m = MARKER.match(above)
                code = textwrap.dedent("\n".join(lines[i + 1:j]))
                yield path.relative_to(ROOT).as_posix(), i + 1, m.group(1) if m else None, code
                i = j
            i += 1


BLOCKS = list(_blocks())


def test_there_are_blocks():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("doc,line,marker,code", BLOCKS, ids=[f"{d}:{n}" for d, n, _, _ in BLOCKS])
def test_block_runs(doc, line, marker, code, tmp_path):
    prelude = ""
    if marker is not None:
        if marker.startswith("skip:"):
            reason = marker[len("skip:"):].strip()
            assert reason, f"{doc}:{line}: a skipped block must say why"
            pytest.skip(reason)
        m = re.fullmatch(r"prelude\s+(\w+)", marker)
        assert m and m.group(1) in PRELUDES, f"{doc}:{line}: unknown doc-test marker '{marker}'"
        prelude = textwrap.dedent(PRELUDES[m.group(1)])
    script = tmp_path / "block.py"
    script.write_text(prelude + "\n" + code + "\n")
    env = dict(os.environ)
    # The block runs in tmp_path: a relative PYTHONPATH (ctest's is absolute) must still reach the module.
    env["PYTHONPATH"] = os.pathsep.join(
        str((Path.cwd() / p).resolve()) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, (f"{doc}:{line}: the block failed (exit {r.returncode})\n"
                               f"--- block ---\n{code}\n--- stderr ---\n{r.stderr[-4000:]}")
