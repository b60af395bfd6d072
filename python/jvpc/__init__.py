"""jvpc from Python: forward-mode derivatives of Python functions over tensors, compiled.

    import torch, jvpc
    out, jvp_fn = jvpc.linearize(f, q, k, v)      # as torch.func.linearize; f runs once
    dout = jvp_fn(dq, dk, dv)                      # the compiled tangent graph
    out, dout = jvpc.jvp(f, (q, k, v), (dq, dk, dv))

`import torch` must come first (the extension links LibTorch's Python bindings). The module is
built by jvpc's CMake into build/python/jvpc: `PYTHONPATH=build/python python3 -c "import torch, jvpc"`.
See docs/python.md.
"""

import torch  # noqa: F401  (loads LibTorch and its Python bindings before the extension)

from . import _C
from ._C import Error, ExecutableOptions, Graph, LinearizeOptions, optional_passes
from ._api import JvpFn, Loaded, TracedGraph, jacfwd, jvp, linearize, load, trace

__all__ = [
    "Error",
    "ExecutableOptions",
    "Graph",
    "JvpFn",
    "LinearizeOptions",
    "Loaded",
    "TracedGraph",
    "jacfwd",
    "jvp",
    "linearize",
    "load",
    "optional_passes",
    "trace",
]
