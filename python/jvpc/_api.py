"""linearize, jvp, trace and load with torch.func's conventions, over jvpc._C (see _pytrees for
how arguments and results are flattened)."""

from __future__ import annotations

import json
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from . import _C
from ._C import Error
from ._cache import cache_for
from ._vmap import call_under_vmap
from ._compat import distributed_data_parallel, in_vmap_only, sync_ddp_buffers_untraced
from ._context import eager_only, supported_context
from ._nested import nested_linearize
from ._jvp_fn import JvpFn
from ._pytrees import Inputs, argnums_of, parameter_names, traced_fn, with_aux
from ._inductor import check_backend, tangent_run
from ._tangent_grad import rng_states, through_tangent
from ._weights import Weights, reached, with_weights

__all__ = ["Loaded", "TracedGraph", "jvp", "linearize", "load", "trace"]


@eager_only
def linearize(func: Callable, *primals: Any, argnums=None, has_aux: bool = False, cache: bool = False,
              options: _C.LinearizeOptions | None = None, tangent_grad: bool = False, backend: str | None = None):
    """As torch.func.linearize(func, *primals): (func(*primals), jvp_fn), with func run once.

    argnums (int or tuple of ints, as torch.func.jacfwd's): the positional arguments to
    differentiate (default: all); the others may hold integers, constants, non-tensors, and
    jvp_fn takes tangents of the differentiated ones only, in argnums order.
    has_aux (as torch.func.jvp's): func returns (output, aux); the result is (output, jvp_fn, aux),
    aux from the one run of func, not differentiated.
    cache: reuse the optimized graphs of an earlier call with this func whose trace is the same
    (ops, shapes, dtypes, captured tensors): then only the trace and fold run, about two
    forwards (FlopCounterMode counts the trace's kernels and fold's); see docs/python.md.
    options: jvpc.LinearizeOptions (disabled passes, verification, runtime options).
    tangent_grad: jvp_fn's outputs carry autograd history to the tangents, the primals and the
    weights of the modules func reaches (jvpc/_tangent_grad.py; docs/training.md).
    backend: what runs jvp_fn's tangent graph: "interpreter" (jvpc's runtime, kernel by kernel) or
    "inductor" (compiled by torch.compile's Inductor into fused kernels on first call, seconds,
    then shared by every graph of the same text: jvpc/_inductor.py). None (the default):
    $JVPC_BACKEND, else "interpreter".
    """
    return _linearize(func, primals, argnums, has_aux, cache, options, tangent_grad, guard=True, backend=backend)


def _linearize(func: Callable, primals: tuple, argnums, has_aux: bool, cache: bool, options, tangent_grad: bool, *,
               guard: bool, backend: str | None = None):
    """linearize; guard: jvp_fn checks before each call that the weights are as they were."""
    who = "jvpc.linearize"
    backend = check_backend(backend, who)
    if _C._tracing():  # inside a function jvpc traces (jacfwd(jacfwd(f))): by torch.autograd
        return nested_linearize(func, primals, argnums_of(argnums, len(primals), who), has_aux)
    names = parameter_names(func, len(primals))
    for ddp in distributed_data_parallel(m for _, m in reached(func)[0]):
        sync_ddp_buffers_untraced(ddp)
    graphs = cache_for(func) if cache else None
    aux: list = []
    reaches = func  # the modules whose weights the linear map is for
    if has_aux:
        func = with_aux(func, who, aux)
    diff = argnums_of(argnums, len(primals), who)
    inputs = Inputs(primals, diff, who, names)
    out_spec: list = []
    rng = rng_states(inputs.tensors) if tangent_grad else None  # what the trace draws with
    with supported_context(who):
        outputs, lin = _C._linearize(traced_fn(func, inputs, who, out_spec), inputs.tensors, inputs.names,
                                     inputs.differentiable, inputs.wrt, options or _C.LinearizeOptions(), graphs)
    # The weights as the run left them (read now, the forward's reads of them are recent).
    weights = Weights(reaches) if guard or tangent_grad else None
    check = run = None
    if guard and len(weights):
        stamp = weights.stamp()

        def check():
            weights.check_stamp(stamp, who)

    inductor = {} if backend == "inductor" else None
    base = tangent_run(lin, inductor) if inductor is not None else None
    if tangent_grad:
        traced, at = with_weights(func, weights, primals, diff, who, names)
        run = through_tangent(base or lin.run, traced, at, rng, weights.buffer_marks(len(at.tensors)))
    else:
        run = base
    out = pytree.tree_unflatten(outputs, out_spec[0])
    jvp_fn = JvpFn(lin, inputs, out_spec[0], who, run=run, check=check, tangent_grad=tangent_grad, inductor=inductor)
    return (out, jvp_fn, aux[0]) if has_aux else (out, jvp_fn)


@eager_only
def jvp(func: Callable, primals: Any, tangents: Any, *, argnums=None, has_aux: bool = False, cache: bool = False,
        options=None, tangent_grad: bool = False, backend: str | None = None):
    """As torch.func.jvp(func, primals, tangents, has_aux=): (func(*primals), J·tangents), and
    with has_aux (func returns (output, aux)) (output, J·tangents, aux). argnums, cache, options,
    tangent_grad and backend as linearize's."""
    who = "jvpc.jvp"
    for what, v in (("primals", primals), ("tangents", tangents)):
        if not isinstance(v, (tuple, list)):
            raise Error(f"{who}(f, primals, tangents): expected {what} to be a tuple, "
                        "e.g. it should be valid to call f(*primals)")
    if in_vmap_only():
        if has_aux or tangent_grad:
            raise Error(f"{who}: inside torch.func.vmap, has_aux and tangent_grad are not supported: call it per sample")
        return _jvp_under_vmap(func, tuple(primals), tuple(tangents), argnums, options)
    diff = argnums_of(argnums, len(primals), who)
    if argnums is None and len(tangents) != len(primals):
        raise Error(f"{who}: expected as many tangents ({len(tangents)}) as primals ({len(primals)})")
    if argnums is not None and len(tangents) != len(diff):
        raise Error(f"{who}: expected one tangent per differentiated argument ({len(diff)}), got {len(tangents)}")
    res = _linearize(func, tuple(primals), argnums, has_aux, cache, options, tangent_grad, guard=False,
                     backend=backend)
    return (res[0], res[1](*tangents)) + tuple(res[2:])


def _jvp_under_vmap(func: Callable, primals: tuple, tangents: tuple, argnums, options):
    """jvp inside torch.func.vmap (jvpc/_vmap.py): the batched tangent graph where the primals are
    shared by the batch, else one jvp per element (their optimized graphs cached)."""
    flat_p, spec_p = pytree.tree_flatten(primals)
    flat_t, spec_t = pytree.tree_flatten(tangents)
    n_p = len(flat_p)
    out_spec: list = []

    def per_element(inputs):
        ps = pytree.tree_unflatten(inputs[:n_p], spec_p)
        ts = pytree.tree_unflatten(inputs[n_p:], spec_t)
        out, dout = jvp(func, ps, ts, argnums=argnums, cache=True, options=options)
        flat_out, out_spec[:] = pytree.tree_flatten(out)[0], [pytree.tree_structure(out)]
        return flat_out + pytree.tree_leaves(dout)

    def shared(k, dims, inputs):
        if any(d is not None for d in dims[:n_p]):
            return None
        out, jvp_fn = linearize(func, *pytree.tree_unflatten(inputs[:n_p], spec_p), argnums=argnums, options=options)
        stacked = [(t.movedim(d, 0) if d is not None else t.unsqueeze(0).expand(k, *t.shape)).contiguous()
                   for t, d in zip(inputs[n_p:], dims[n_p:])]
        douts = list(jvp_fn._lin.run_batched(k, stacked))
        flat_out, out_spec[:] = pytree.tree_flatten(out)[0], [pytree.tree_structure(out)]
        return flat_out + douts, [None] * len(flat_out) + [0] * len(douts)

    flat = call_under_vmap(per_element, flat_p + flat_t, shared)
    n_out = len(flat) // 2
    return pytree.tree_unflatten(flat[:n_out], out_spec[0]), pytree.tree_unflatten(flat[n_out:], out_spec[0])


class TracedGraph:
    """The kernel-level graph of func at these inputs (jvpc.trace), and the inputs it was traced at."""

    def __init__(self, graph: _C.Graph, outputs, inputs: Inputs):
        self.graph = graph
        self.outputs = outputs
        self._inputs = inputs

    def __str__(self) -> str:
        return self.graph.to_text()

    def to_text(self) -> str:
        return self.graph.to_text()

    def to_json(self) -> str:
        return self.graph.to_json()

    def to_dot(self, title: str = "jvpc") -> str:
        return self.graph.to_dot(title)

    def cost(self) -> dict:
        return json.loads(self.graph._cost_json())

    def save(self, path: str, trusted: bool = False) -> None:
        """Writes the graph as `jvpc trace -o` does: x.json, its constants in x.safetensors, and the
        inputs it was traced at, by name, in x.inputs.safetensors, where `jvpc linearize x.json`
        and `jvpc compile x.json` take their primals from."""
        _C._save_traced(self.graph, str(path), trusted, self._inputs.names, [t.detach() for t in self._inputs.tensors])


@eager_only
def trace(func: Callable, *args: Any) -> TracedGraph:
    """Traces func(*args) into a jvpc graph (every tensor leaf of args an input); .outputs holds func's result."""
    who = "jvpc.trace"
    inputs = Inputs(args, (), who, parameter_names(func, len(args)))
    out_spec: list = []
    with supported_context(who):
        graph, outputs = _C._trace(traced_fn(func, inputs, who, out_spec), inputs.tensors, inputs.names)
    return TracedGraph(graph, pytree.tree_unflatten(outputs, out_spec[0]), inputs)


class Loaded:
    """A saved graph, loaded and compiled: call it with one tensor per input (argument_names order)."""

    def __init__(self, exe):
        self._exe = exe
        self.argument_names = list(exe.argument_names)

    def __call__(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        return self._exe.run(list(tensors))

    @property
    def graph(self) -> _C.Graph:
        return self._exe.graph


def load(path: str, *, trusted: bool = False, device: str | None = None,
         runtime: _C.ExecutableOptions | None = None) -> Loaded:
    """Loads a graph saved by JvpFn.save (or `jvpc linearize -o`) and compiles it for running."""
    return Loaded(_C._load(str(path), trusted, device, runtime or _C.ExecutableOptions()))
