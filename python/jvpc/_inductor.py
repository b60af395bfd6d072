"""jvpc's tangent graph compiled by Inductor (backend="inductor").

After jvpc's pipeline, the tangent graph (residuals and tangents -> output tangents, the same ATen
ops, jvpc::attention_tangent an opaque operator with its Meta kernel) becomes an FX graph, which
Inductor compiles into fused kernels (C++/OpenMP on the CPU, Triton on GPUs). The residuals are
inputs of the compiled function, not constants baked into it: a program's calls, each with new
residuals, and a linearize at a new point of the same graph, reuse one compilation. Compilations
are kept per graph text and input layout (`_compiled`); Inductor keeps its own caches on disk.

What stays on jvpc's interpreter: vmap over jvp_fn (the batched tangent graph), and a graph
with a random op.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable

import torch

from . import _C
from ._C import Error

BACKENDS = ("interpreter", "inductor")

_DTYPES = {aten: getattr(torch, py) for aten, py in _C.dtype_names()}
_LAYOUTS = {"Strided": torch.strided, "Sparse": torch.sparse_coo, "Mkldnn": torch._mkldnn}
_FORMATS = {"Contiguous": torch.contiguous_format, "Preserve": torch.preserve_format,
            "ChannelsLast": torch.channels_last, "ChannelsLast3d": torch.channels_last_3d}


def check_backend(backend: str, who: str) -> str:
    if backend not in BACKENDS:
        raise Error(f"{who}: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


def _op(name: str):
    ns, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
    except AttributeError:
        raise Error(f"backend='inductor': no operator {name} in this torch") from None


def _number(v):
    return float(v) if not isinstance(v, str) else float(v)  # "inf", "-inf", "nan" written as text


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


def to_fx(graph: _C.Graph) -> torch.fx.GraphModule:
    """The graph as an FX graph of the same operators: one placeholder per graph input, in order."""
    j = json.loads(graph.to_json())
    g = torch.fx.Graph()
    env: dict[int, Any] = {}
    for i, inp in enumerate(j["inputs"]):
        env[inp["id"]] = g.placeholder(f"in{i}")
    for n in j["nodes"]:
        if n.get("impure"):
            raise Error(f"backend='inductor': the graph draws random numbers ({n['op']})")
        op = _op(n["op"])
        args, kwargs = [], {}
        for spec, a in zip(op._schema.arguments, n["args"]):
            v = _arg(a, env)
            if spec.kwarg_only:
                kwargs[spec.name] = v
            else:
                args.append(v)
        node = g.call_function(op, tuple(args), kwargs)
        outs = [o["id"] for o in n["outputs"]]
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
    g.output(tuple(env[o["id"]] for o in j["outputs"]))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _getitem(x, i):
    return x[i]


# One compilation per (graph text, input layouts): a program's calls and repeated linearizes of
# one graph share it.
_compiled: dict[tuple, Callable] = {}
_lock = threading.Lock()


def compile_tangent(graph: _C.Graph, constants: list[torch.Tensor], tangents_like: list[torch.Tensor],
                    timings: dict | None = None) -> Callable:
    """(tangents -> output tangents) for the tangent graph with these constants, by Inductor. The
    compiled function is shared by every graph of the same text and input layouts; the first
    compile's seconds go to timings["inductor_compile_ms"]."""
    roles = [r for r in json.loads(graph.to_json())["inputs"]]
    key_inputs = []
    it_c, it_t = iter(constants), iter(tangents_like)
    order = []  # per graph input: ("t", k) or ("c", k)
    nt = nc = 0
    for r in roles:
        if r["role"] == "constant":
            t = next(it_c)
            order.append(("c", nc))
            nc += 1
        else:
            t = next(it_t)
            order.append(("t", nt))
            nt += 1
        key_inputs.append((tuple(t.shape), tuple(t.stride()), t.dtype, t.device))
    key = (str(graph), tuple(key_inputs))
    with _lock:
        fn = _compiled.get(key)
    if fn is None:
        t0 = time.perf_counter()
        gm = to_fx(graph)
        example = [constants[k] if kind == "c" else tangents_like[k] for kind, k in order]
        fn = torch._inductor.compile(gm, example)
        with _lock:
            _compiled[key] = fn
        if timings is not None:
            timings["inductor_compile_ms"] = (time.perf_counter() - t0) * 1e3

    def run(tangents: list[torch.Tensor]) -> list[torch.Tensor]:
        args = [constants[k] if kind == "c" else tangents[k] for kind, k in order]
        with torch.no_grad():
            return list(fn(*args))

    return run
