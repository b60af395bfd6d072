"""jvpc from Python: forward-mode derivatives of Python functions over tensors, compiled.

    import torch, jvpc
    out, jvp_fn = jvpc.linearize(f, q, k, v)      # as torch.func.linearize; f runs once
    dout = jvp_fn(dq, dk, dv)                      # the compiled tangent graph
    out, dout = jvpc.jvp(f, (q, k, v), (dq, dk, dv))
    prog = jvpc.compile(f, q, k, v)                # traced and optimized once
    out, jvp_fn = prog(q2, k2, v2)                 # the primal graph alone, at new primals
    prog.save("prog.json"); prog = jvpc.load_program("prog.json")   # tensors in, positionally

Installed with `pip install --no-build-isolation .`, or built by jvpc's CMake into build/python/jvpc
(`PYTHONPATH=build/python python3 -c "import jvpc"`). It loads only under the torch release it
was built against. See docs/python.md.
"""

import os as _os

import torch  # noqa: F401  (loads LibTorch and its Python bindings before the extension)

from . import _build, _compat

_compat.check_torch(_build.torch_version)

from . import _C  # noqa: E402
from . import _flops  # noqa: F401  (FlopCounterMode's formula for jvpc::attention_tangent)
from ._C import Error, ExecutableOptions, Graph, LinearizeOptions, optional_passes
from ._api import Loaded, TracedGraph, jvp, linearize, load, trace
from ._jacfwd import jacfwd
from ._jvp_fn import JvpFn
from ._program import Program, compile, load_program

if torch.cuda.is_available() and _os.environ.get("JVPC_ATTENTION_KERNELS", "triton") != "aten":
    try:  # attention's tangent and its backward on CUDA in fused Triton kernels (docs/design.md)
        from . import _attention_triton

        _attention_triton.register("CUDA")
    except ImportError:  # no Triton: the ATen route
        pass

__all__ = [
    "Error",
    "ExecutableOptions",
    "Graph",
    "JvpFn",
    "LinearizeOptions",
    "Loaded",
    "Program",
    "TracedGraph",
    "compile",
    "jacfwd",
    "jvp",
    "linearize",
    "load",
    "load_program",
    "optional_passes",
    "trace",
]
