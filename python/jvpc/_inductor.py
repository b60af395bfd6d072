"""jvpc's tangent graph compiled by Inductor (backend="inductor").

After jvpc's pipeline, the tangent graph (residuals and tangents -> output tangents, the same ATen
ops, jvpc::attention_tangent an opaque operator with its Meta kernel) becomes an FX graph, which
Inductor compiles into fused kernels (C++/OpenMP on the CPU, Triton on GPUs). The residuals are
inputs of the compiled function, not constants baked into it: a program's calls, each with new
residuals, and a linearize at a new point of the same graph, reuse one compilation. Compilations
are kept per graph text and input layout (`_compiled`, the 64 used last); Inductor keeps its own
caches on disk.

A compiled program (jvpc.compile) runs its primal graph through torch.compile's Inductor backend
too (primal_run): under grad mode AOTAutograd gives it a backward, so a training step's forward
and backward are Inductor's fused kernels, and the residuals come out of the same run.

What stays on jvpc's interpreter: vmap over jvp_fn (the batched tangent graph), and a graph
with a random op.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import OrderedDict
import time
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import _C
from ._C import Error

BACKENDS = ("interpreter", "inductor")

_DTYPES = {aten: getattr(torch, py) for aten, py in _C.dtype_names()}
_LAYOUTS = {"Strided": torch.strided, "Sparse": torch.sparse_coo, "SparseCsr": torch.sparse_csr, "Mkldnn": torch._mkldnn}
_FORMATS = {"Contiguous": torch.contiguous_format, "Preserve": torch.preserve_format,
            "ChannelsLast": torch.channels_last, "ChannelsLast3d": torch.channels_last_3d}


def check_backend(backend: str | None, who: str) -> str:
    """backend, or where it is None, $JVPC_BACKEND ("interpreter" where that is unset)."""
    where = ""
    if backend is None:
        backend, where = os.environ.get("JVPC_BACKEND") or "interpreter", " (from $JVPC_BACKEND)"
    if backend not in BACKENDS:
        raise Error(f"{who}: backend must be one of {', '.join(BACKENDS)}, got {backend!r}{where}")
    return backend


def _op(name: str):
    ns, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
    except AttributeError:
        raise Error(f"backend='inductor': no operator {name} in this torch") from None


def _number(v):
    return float(v)  # a number, or "inf", "-inf", "nan" written as text


def _arg(a: dict, env: dict):
    (kind, v), = a.items()
    if kind == "none":
        return None
    if kind in ("bool", "int", "str", "ints", "bools"):
        return v
    if kind == "float":
        return _number(v)
    if kind == "floats":
        return [_number(x) for x in v]
    if kind == "scalar_type":
        return _DTYPES[v]
    if kind == "layout":
        return _LAYOUTS[v]
    if kind == "memory_format":
        return _FORMATS[v]
    if kind == "device":
        return torch.device(v)
    if kind == "tensor":
        return env[v]
    if kind in ("tensors", "opt_tensors"):
        return [None if x is None else env[x] for x in v]
    raise Error(f"backend='inductor': unknown argument kind {kind!r}")


def to_fx(graph: _C.Graph, detach_from: int | None = None) -> torch.fx.GraphModule:
    """The graph as an FX graph of the same operators: one placeholder per graph input, in order.
    detach_from: the outputs from this one on are detached (a primal graph's state and residuals,
    which hold no autograd history: AOTAutograd then differentiates the primal outputs alone)."""
    j = json.loads(graph.to_json())
    g = torch.fx.Graph()
    env: dict[int, Any] = {}
    for i, inp in enumerate(j["inputs"]):
        env[inp["id"]] = g.placeholder(f"in{i}")
    for n in j["nodes"]:
        if n.get("impure"):
            raise Error(f"backend='inductor': the graph draws random numbers ({n['op']})")
        # A view of the layout jvpc's runtime gives a value, where Inductor may choose another
        # (channels-last, say): as reshape, the same values, copied where the layout asks.
        op = _op(_AS_RESHAPE.get(n["op"], n["op"]))
        args, kwargs = [], {}
        for spec, a in zip(op._schema.arguments, n["args"]):
            v = _arg(a, env)
            if spec.kwarg_only:
                kwargs[spec.name] = v
            else:
                args.append(v)
        outs = [o["id"] for o in n["outputs"]]
        dtypes = [_DTYPES[o["meta"]["dtype"]] for o in n["outputs"]]
        if n["op"] in _MIXED_NORMS and dtypes[1] != dtypes[0]:
            # A low-precision input with float32 weights: LibTorch's kernel computes in float32
            # and returns float32 statistics, Inductor's decomposition the input's dtype. The
            # input upcast gives both the same float32 statistics and output, rounded after.
            args[0] = g.call_function(torch.ops.aten._to_copy.default, (args[0],), {"dtype": dtypes[1]})
            node = g.call_function(op, tuple(args), kwargs)
            items = [g.call_function(_getitem, (node, r)) for r in range(3)]
            items[0] = g.call_function(torch.ops.aten._to_copy.default, (items[0],), {"dtype": dtypes[0]})
            env.update(zip(outs, items))
            continue
        node = g.call_function(op, tuple(args), kwargs)
        returns = op._schema.returns
        if len(returns) == 1 and not isinstance(returns[0].type, torch.ListType):
            env[outs[0]] = node
            continue
        counts = n.get("returns", [1] * len(returns))
        k = 0
        for r, (ret, count) in enumerate(zip(returns, counts)):
            item = g.call_function(_getitem, (node, r)) if len(returns) > 1 else node
            if isinstance(ret.type, torch.ListType):
                for c in range(count):
                    env[outs[k]] = g.call_function(_getitem, (item, c))
                    k += 1
            else:
                env[outs[k]] = item
                k += 1
    outs = [env[o["id"]] for o in j["outputs"]]
    if detach_from is not None:
        outs[detach_from:] = [g.call_function(torch.ops.aten.detach.default, (o,)) for o in outs[detach_from:]]
    g.output(tuple(outs))
    return torch.fx.GraphModule(torch.nn.Module(), g)


_AS_RESHAPE = {"aten::view": "aten::reshape", "aten::_unsafe_view": "aten::reshape"}
_MIXED_NORMS = ("aten::native_layer_norm", "aten::native_group_norm")


def _getitem(x, i):
    return x[i]


# One compilation per (graph text, input layouts): a program's calls and repeated linearizes of
# one graph share it. The least recently used go beyond _CAPACITY (a linear map holds its own).
_CAPACITY = 64
_compiled: OrderedDict[tuple, Callable] = OrderedDict()
_lock = threading.Lock()


def tangent_run(lin, shared: dict | None = None) -> Callable:
    """lin.run (tangents -> output tangents) with the tangent graph compiled by Inductor: the
    tangents and constants checked as the interpreter checks them, then Inductor's function of
    the graph inputs in graph order. `shared` is kept by the caller across linear maps of one
    graph (a program's calls): the graph is read and looked up once there. One compilation
    serves every graph of the same text and input layouts; compile_ms() gives its time, and
    shared["compile_ms"] what compiling took for this graph here (jvp_fn.report()'s phase)."""
    shared = {} if shared is None else shared
    if "order" not in shared:
        order = []  # per graph input: (is a constant, its index among its kind)
        counts = [0, 0]
        for r in json.loads(lin.graph.to_json())["inputs"]:
            is_constant = r["role"] == "constant"
            order.append((is_constant, counts[is_constant]))
            counts[is_constant] += 1
        shared["order"], shared["text"], shared["fns"] = order, str(lin.graph), {}
    order, fns = shared["order"], shared["fns"]
    constants = list(lin.constants)
    graph = lin.graph

    def run(tangents: list[torch.Tensor]) -> list[torch.Tensor]:
        if _get_current_dispatch_mode() is not None:  # FlopCounterMode, a profiler's: kernel by kernel
            return lin.run(list(tangents))
        t = lin.checked(list(tangents))
        args = [constants[k] if is_constant else t[k] for is_constant, k in order]
        layouts = tuple((a.shape, a.stride(), a.dtype, a.device) for a in args)
        fn = fns.get(layouts)
        if fn is None:
            with _without_autocast():
                fn, ms = _compiled_for(graph, shared["text"], layouts, args)
            if len(fns) >= _CAPACITY:  # the oldest layout goes (it is still in _compiled while recent)
                fns.pop(next(iter(fns)))
            fns[layouts] = fn
            shared["compile_ms"] = shared.get("compile_ms", 0.0) + ms
        with torch.no_grad(), _without_autocast():
            return list(fn(*args))

    return run


def _compiled_for(graph: _C.Graph, text: str, layouts: tuple, args: list[torch.Tensor]) -> tuple[Callable, float]:
    """Inductor's function for the graph at these layouts, and the ms spent compiling it now (0
    where an earlier compilation serves)."""
    key = (text, layouts)
    with _lock:
        fn = _compiled.get(key)
        if fn is not None:
            _compiled.move_to_end(key)
    if fn is not None:
        return fn, 0.0
    t0 = time.perf_counter()
    fn = torch._inductor.compile(to_fx(graph), args)
    ms = (time.perf_counter() - t0) * 1e3
    with _lock:
        _compiled[key] = fn
        while len(_compiled) > _CAPACITY:
            _compiled.popitem(last=False)
        _compile_ms.append(ms)
    return fn, ms


_compile_ms: list[float] = []


def primal_run(prog: _C._Program, shared: dict) -> Callable | None:
    """A program's primal graph through torch.compile's Inductor backend: tensors (the graph's
    primal inputs, in order) -> the primal graph's outputs (primal outputs, state, residuals).
    Under grad mode AOTAutograd records it: the outputs carry a backward that Inductor compiled
    too. The primals are checked (and laid out) as the interpreter's program checks them, and the
    captured tensors are passed at every call, as they are then. None where the graph
    draws random numbers (it stays on the interpreter, whose draws are eager's). What compiling
    took (the first call, and any recompilation torch.compile's guards ask for) is added to
    shared["compile_ms"]."""
    graph = prog.primal_graph
    try:
        gm = to_fx(graph, detach_from=prog.num_primal_outputs)
    except Error:
        return None
    compiled = torch.compile(gm, backend="inductor", fullgraph=True, dynamic=False)
    seen: set = set()

    def run(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        args = prog.primal_graph_inputs(tensors)  # checked as the interpreter checks them
        key = (torch.is_grad_enabled(), tuple((a.shape, a.stride(), a.dtype, a.requires_grad) for a in args))
        t0 = time.perf_counter()
        with _without_autocast():
            outs = list(compiled(*args))
        if key not in seen:  # a first call at these (a compilation, or a cache hit of Inductor's)
            seen.add(key)
            ms = (time.perf_counter() - t0) * 1e3
            shared["compile_ms"] = shared.get("compile_ms", 0.0) + ms
            _compile_ms.append(ms)
        return outs

    return run


@contextlib.contextmanager
def _without_autocast():
    """A graph states its casts (it was traced under the autocast it ran in): autocast around
    its compilation or its run would cast its operands again, as the interpreter's run excludes."""
    with torch.autocast("cpu", enabled=False):
        if torch.cuda.is_available():
            with torch.autocast("cuda", enabled=False):
                yield
        else:
            yield


def compile_ms() -> list[float]:
    """The wall time of each Inductor compilation of a tangent graph so far, in ms."""
    return list(_compile_ms)
