"""A program's two graphs as AOTInductor packages, which C++ loads and runs without Python
(runtime/aoti_program.h, `jvpc jvp --aoti`).

Each graph becomes an FX graph of the same ATen operators (_inductor.to_fx), torch.export makes
it an ExportedProgram at the graph's input layouts, and AOTInductor compiles it into a package:
"p.json" gets "p.primal.pt2" and "p.tangent.pt2" beside it. The packages take every graph input,
captured tensors and residuals included, in graph order: a package holds code, not weights, and
a new point or a trained weight needs no new package. Both are written in full under temporary
names before either replaces its destination.

    python -m jvpc._aoti prog.json [--trusted]    (what `jvpc compile --aoti` runs)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time

import torch

from . import _C
from ._C import Error
from ._inductor import _DTYPES, to_fx


def _example(meta: dict) -> torch.Tensor:
    """A tensor of the input's sizes, strides, dtype and device (its values unused: a program's
    graphs have no value-dependent shapes)."""
    sizes, strides = meta["sizes"], meta["strides"]
    span = 1 + sum((n - 1) * s for n, s in zip(sizes, strides)) if all(sizes) else 0
    storage = torch.zeros(span, dtype=_DTYPES[meta["dtype"]], device=meta["device"])
    return storage.as_strided(sizes, strides)


# The package's metadata names the program file it was compiled from (the SHA-1 of its bytes):
# AotiProgram refuses a package beside a program it does not belong to.
METADATA_KEY = "jvpc_program_sha1"


def _package(graph: _C.Graph, dest: str, program_sha1: str) -> float:
    """Writes graph's package at dest; returns the seconds AOTInductor took."""
    inputs = json.loads(graph.to_json())["inputs"]
    args = tuple(_example(i["meta"]) for i in inputs)
    t0 = time.perf_counter()
    exported = torch.export.export(to_fx(graph), args, strict=False)
    torch._inductor.aoti_compile_and_package(
        exported, package_path=dest, inductor_configs={"aot_inductor.metadata": {METADATA_KEY: program_sha1}})
    return time.perf_counter() - t0


def write_packages(path: str, trusted: bool = False) -> list[tuple[str, float]]:
    """Writes the packages of the primal and tangent graphs of the program file `path` (as it
    loads: trusted as jvpc.load_program's) beside it; returns each package's path and its compile
    time in seconds."""
    with open(path, "rb") as f:
        program_sha1 = hashlib.sha1(f.read()).hexdigest()
    prog = _C._load_program(path, trusted, None, _C.ExecutableOptions())
    targets = [(prog.primal_graph, _C.primal_package_path_for(path)),
               (prog.tangent_graph, _C.tangent_package_path_for(path))]
    written, done = [], []
    try:
        for graph, dest in targets:
            fd, tmp = tempfile.mkstemp(prefix=os.path.basename(dest) + ".", suffix=".pt2",
                                       dir=os.path.dirname(os.path.abspath(dest)))
            os.close(fd)
            written.append(tmp)
            done.append((dest, _package(graph, tmp, program_sha1)))
        for tmp, (dest, _) in zip(written, done):
            os.replace(tmp, dest)
        written.clear()
    finally:
        for tmp in written:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return done


def main(argv: list[str]) -> int:
    usage = "usage: python -m jvpc._aoti PROGRAM.json [--trusted]"
    if argv and argv[0] in ("-h", "--help"):
        print(usage + "\nWrites the AOTInductor packages of a program `jvpc compile -o` wrote, beside it.")
        return 0
    if not argv:
        print(f"jvpc: error: {usage}", file=sys.stderr)
        return 2
    path, rest = argv[0], argv[1:]
    if rest not in ([], ["--trusted"]):
        print(f"jvpc: error: {usage}", file=sys.stderr)
        return 2
    try:
        for dest, seconds in write_packages(path, bool(rest)):
            print(f"wrote {dest} (AOTInductor: {seconds:.1f} s)")
    except (Error, OSError, RuntimeError) as e:
        print(f"jvpc: error: AOTInductor package of {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
