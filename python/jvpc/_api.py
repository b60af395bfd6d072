"""linearize, jvp, trace and load with torch.func's conventions, over jvpc._C.

Inputs and outputs are pytrees (nested tuples, lists and dicts) of tensors, flattened with
torch.utils._pytree as torch.func does. Every tensor leaf of a differentiated argument is a
primal input of the traced graph; tensor leaves of the other arguments (argnums) are inputs
held constant, and their other leaves (ints, floats, ...) are passed to the function as they are.
Tensors the function captures (module parameters, globals) are constants of the graph.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree

from . import _C
from ._C import Error

__all__ = ["JvpFn", "Loaded", "Program", "TracedGraph", "compile", "jacfwd", "jvp", "linearize", "load",
           "load_program", "trace"]


def _argnums(argnums, n: int, who: str) -> tuple[int, ...]:
    """The differentiated positional arguments, as torch.func.jacfwd's argnums."""
    if argnums is None:
        return tuple(range(n))
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums) if isinstance(argnums, (tuple, list)) else None
    if nums is None or not nums or not all(isinstance(a, int) and not isinstance(a, bool) for a in nums):
        raise Error(f"{who}: argnums must be an int or a non-empty tuple of ints, got {argnums!r}")
    out = []
    for a in nums:
        if not -n <= a < n:
            raise Error(f"{who}: argnums {a} is out of range for a function of {n} positional arguments")
        a %= n
        if a in out:
            raise Error(f"{who}: argnums {a} appears twice")
        out.append(a)
    return tuple(out)


def _check_primal(p: Any, who: str) -> None:
    if not isinstance(p, torch.Tensor):
        raise Error(f"{who}: expected the differentiated primals to only contain Tensors, got {type(p)}")
    if not (p.is_floating_point() or p.is_complex()):
        # torch.func's error for integer primals, word for word.
        raise ValueError(f"Expected primal to be floating point or complex, but got: {p.dtype}")


class _Inputs:
    """The flattened positional arguments: which leaves are graph inputs, and how to rebuild them."""

    def __init__(self, args: Sequence[Any], diff: tuple[int, ...], who: str):
        self.n = len(args)
        self.diff = diff
        self.specs = []
        self.leaves = []  # per argument: its leaves (the values passed when not a graph input)
        self.slots = []  # per argument: per leaf, the graph input index or None
        self.tensors = []
        self.names = []
        self.differentiable = []
        self.diff_specs = []  # per differentiated argument: (spec, shapes, dtypes, devices)
        for i, a in enumerate(args):
            with_path, spec = pytree.tree_flatten_with_path(a)
            self.specs.append(spec)
            leaves = [leaf for _, leaf in with_path]
            self.leaves.append(leaves)
            slots = []
            for path, leaf in with_path:
                if i in diff:
                    _check_primal(leaf, who)
                if isinstance(leaf, torch.Tensor):
                    slots.append(len(self.tensors))
                    self.tensors.append(leaf)
                    self.names.append(f"a{i}{pytree.keystr(path)}")
                    self.differentiable.append(i in diff)
                else:
                    slots.append(None)
            self.slots.append(slots)
        self.wrt = [self.names[s] for i in diff for s in self.slots[i]]

    def rebuild(self, tensors: Sequence[torch.Tensor]) -> list[Any]:
        """The positional arguments with the graph's tensors in place of the inputs' leaves."""
        out = []
        for i in range(self.n):
            leaves = [self.leaves[i][j] if s is None else tensors[s] for j, s in enumerate(self.slots[i])]
            out.append(pytree.tree_unflatten(leaves, self.specs[i]))
        return out


def _flat_outputs(out: Any, who: str) -> tuple[list[torch.Tensor], Any]:
    leaves, spec = pytree.tree_flatten(out)
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            raise Error(f"{who}: expected the function to return a pytree of Tensors, got a leaf of {type(leaf)}")
    return leaves, spec


@contextlib.contextmanager
def _supported_context(who: str):
    """Refuses the contexts the tracer cannot record faithfully, when linearize is called in them."""
    for dev in ("cpu", "cuda"):
        if torch.is_autocast_enabled(dev):
            raise Error(f"{who}: autocast ({dev}) is enabled; jvpc traces the kernels as called, "
                        "and autocast's casts sit below its tracer: call it outside autocast")
    if torch._C._functorch.peek_interpreter_stack() is not None:
        raise Error(f"{who}: called inside a torch.func transform (vmap, grad, jvp); jvpc traces plain tensors")
    # torch.compile'd code inside func: Dynamo would compile it (the tracer's dispatch key fails
    # its guards) into kernels that run outside the dispatcher, where the tracer sees nothing.
    # This stance makes that compilation an error, which is reported as jvpc's.
    # A caller's "force_eager" stance already runs such code eagerly, which traces.
    from torch._dynamo import eval_frame
    stance = "force_eager" if eval_frame._stance.stance == "force_eager" else "fail_on_recompile"
    # nn.MultiheadAttention's and nn.TransformerEncoderLayer's inference fast path (fused kernels
    # that PyTorch does not differentiate either; torch.func's dual tensors never take it) is off.
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.compiler.set_stance(stance):
            yield
    except RuntimeError as e:
        if type(e) is RuntimeError and "torch.compile stance is 'fail_on_recompile'" in str(e):
            raise Error(f"{who}: the function runs torch.compile'd code, which computes outside the dispatcher "
                        "where jvpc's tracer cannot see it; trace the uncompiled function "
                        "(torch.compiler.set_stance('force_eager') runs compiled code eagerly)") from None
        raise
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def _traced_fn(func: Callable, inputs: _Inputs, who: str, out_spec: list) -> Callable:
    def call(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        out = func(*inputs.rebuild(tensors))
        leaves, spec = _flat_outputs(out, who)
        out_spec.append(spec)
        return leaves

    return call


class JvpFn:
    """The linear map x ↦ J·x at the primals: call it with tangents shaped as the primals.

    Tangents have the structure of the differentiated arguments (all of them, or those argnums
    names, in that order); outputs have the structure of func's output. Tangent outputs are
    computed without autograd (a stop-gradient: see docs/python.md).
    """

    def __init__(self, lin, inputs: _Inputs, out_spec, who: str):
        self._lin = lin
        self._who = who
        self._out_spec = out_spec
        self._arg_specs = [inputs.specs[i] for i in inputs.diff]
        self._tangent_spec = pytree.tree_structure(tuple(
            pytree.tree_unflatten([0] * inputs.specs[i].num_leaves, inputs.specs[i]) for i in inputs.diff))
        self._names = [inputs.names[s] for i in inputs.diff for s in inputs.slots[i]]
        # The graph takes tangents of the differentiated inputs in `wrt` order, which is ours.
        self.tangent_names = list(lin.tangent_names)
        # The common case, one tensor per differentiated argument and one tensor out, skips
        # pytree's flattening and rebuilding (several µs a call; the graph checks the tensors).
        self._plain_n = len(inputs.diff) if all(inputs.specs[i].is_leaf() for i in inputs.diff) else -1
        self._single_out = out_spec.is_leaf()
        self._run = lin.run

    def __call__(self, *tangents: Any) -> Any:
        if len(tangents) == self._plain_n and all(type(t) is torch.Tensor for t in tangents) and \
                torch._C._functorch.peek_interpreter_stack() is None:
            out = self._run(tangents)
            return out[0] if self._single_out else pytree.tree_unflatten(out, self._out_spec)
        flat, spec = pytree.tree_flatten(tangents)
        if spec != self._tangent_spec:
            raise Error(f"{self._who}'s jvp_fn: expected tangents with the structure of the primals, "
                        f"{_shape_of(self._tangent_spec)}, got {_shape_of(spec)}")
        for i, t in enumerate(flat):
            if not isinstance(t, torch.Tensor):
                raise Error(f"{self._who}'s jvp_fn: tangent {i} ({self._names[i]}) is a {type(t).__name__}, not a Tensor")
        if torch._C._functorch.peek_interpreter_stack() is not None:
            return _batched_call(self, flat)
        return pytree.tree_unflatten(self._lin.run(flat), self._out_spec)

    def __del__(self):
        _registry.pop(id(self._lin), None)

    # --- what the compiled map is -----------------------------------------------------------
    @property
    def graph(self) -> _C.Graph:
        """The tangent graph: str() is its text form; .to_json(), .to_dot()."""
        return self._lin.graph

    def to_text(self) -> str:
        return self._lin.graph.to_text()

    def to_json(self) -> str:
        return self._lin.graph.to_json()

    def to_dot(self, title: str = "jvpc") -> str:
        return self._lin.graph.to_dot(title)

    def report(self) -> dict:
        """The compile report: cost after every pass, forward cost, measured linearize FLOPs, tangent cost."""
        return json.loads(self._lin.report_json)

    def report_text(self) -> str:
        """The per-pass cost table, as `jvpc linearize` prints it."""
        return self._lin.report_text

    def cost(self) -> dict:
        """Cost of one call: matmul FLOPs (FlopCounterMode's rules), other FLOPs, bytes, residual memory."""
        return json.loads(self._lin.graph._cost_json())

    def save(self, path: str, trusted: bool = False) -> None:
        """Writes the tangent graph (JSON) and its residuals (safetensors beside it); jvpc.load reads it back."""
        self._lin.graph.save(str(path), trusted)


def _shape_of(spec) -> str:
    """A pytree structure on one line: ((*, *), {'a': *})."""
    return str(pytree.tree_unflatten([_Leaf()] * spec.num_leaves, spec))


class _Leaf:
    def __repr__(self) -> str:
        return "*"


def _batched_call(fn: JvpFn, flat: list) -> Any:
    """Under torch.func.vmap: a custom op whose vmap rule runs the batched tangent graph once."""
    out = _looped_jvp(fn._lin, flat)
    return pytree.tree_unflatten(list(out), fn._out_spec)


# A torch.library op whose batching rule runs the batched tangent graph (compiled once per batch
# size) in one call, so that vmap(jvp_fn) is one call for the whole batch. The compiled map is
# passed by handle: ops take tensors and scalars only.
_registry: dict[int, Any] = {}


@torch.library.custom_op("jvpc::run_graph", mutates_args=())
def _run_graph(handle: int, tangents: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in _registry[handle].run(tangents)]


def _run_graph_vmap(info, in_dims, handle, tangents):
    # The innermost vmap level: one call of the batched tangent graph (batched tangents): each
    # tangent with its batch dim moved to the front, an unbatched one broadcast. A dispatch mode
    # around vmap (FlopCounterMode) sees that call's kernels. Where an inner vmap level batches
    # its own, one call of the op per batch element.
    dims = in_dims[1]
    lower = any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tangents)
    if not lower:
        k = info.batch_size
        stacked = [(t.movedim(d, 0) if d is not None else t.unsqueeze(0).expand(k, *t.shape)).contiguous()
                   for t, d in zip(tangents, dims)]
        outs = list(_registry[handle].run_batched(k, stacked))
        return outs, [0] * len(outs)
    run = (lambda ts: _run_graph(handle, ts)) if lower else _registry[handle].run
    outs = [run([t if d is None else t.select(d, b) for t, d in zip(tangents, dims)]) for b in range(info.batch_size)]
    stacked = [torch.stack([o[i] for o in outs]) for i in range(len(outs[0]))]
    return stacked, [0] * len(stacked)


_run_graph.register_vmap(_run_graph_vmap)


def _looped_jvp(lin, flat):
    _registry[id(lin)] = lin  # dropped by JvpFn.__del__
    return _run_graph(id(lin), flat)


def linearize(func: Callable, *primals: Any, argnums=None, options: _C.LinearizeOptions | None = None):
    """As torch.func.linearize(func, *primals): (func(*primals), jvp_fn), with func run once.

    argnums (int or tuple of ints, as torch.func.jacfwd's): the positional arguments to
    differentiate (default: all); the others may hold integers, constants, non-tensors, and
    jvp_fn takes tangents of the differentiated ones only, in argnums order.
    options: jvpc.LinearizeOptions (disabled passes, verification, runtime options).
    """
    who = "jvpc.linearize"
    diff = _argnums(argnums, len(primals), who)
    inputs = _Inputs(primals, diff, who)
    out_spec: list = []
    with _supported_context(who):
        outputs, lin = _C._linearize(_traced_fn(func, inputs, who, out_spec), inputs.tensors, inputs.names,
                                     inputs.differentiable, inputs.wrt, options or _C.LinearizeOptions())
    return pytree.tree_unflatten(outputs, out_spec[0]), JvpFn(lin, inputs, out_spec[0], who)


def jvp(func: Callable, primals: Any, tangents: Any, *, argnums=None, options=None):
    """As torch.func.jvp(func, primals, tangents): (func(*primals), J·tangents)."""
    who = "jvpc.jvp"
    for what, v in (("primals", primals), ("tangents", tangents)):
        if not isinstance(v, (tuple, list)):
            raise Error(f"{who}(f, primals, tangents): expected {what} to be a tuple, "
                        "e.g. it should be valid to call f(*primals)")
    out, jvp_fn = linearize(func, *primals, argnums=argnums, options=options)
    diff = _argnums(argnums, len(primals), who)
    if argnums is None and len(tangents) != len(primals):
        raise Error(f"{who}: expected as many tangents ({len(tangents)}) as primals ({len(primals)})")
    if argnums is not None and len(tangents) != len(diff):
        raise Error(f"{who}: expected one tangent per differentiated argument ({len(diff)}), got {len(tangents)}")
    return out, jvp_fn(*tangents)


class TracedGraph:
    """The kernel-level graph of func at these inputs (jvpc.trace)."""

    def __init__(self, graph: _C.Graph, outputs):
        self.graph = graph
        self.outputs = outputs

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
        self.graph.save(str(path), trusted)


def trace(func: Callable, *args: Any) -> TracedGraph:
    """Traces func(*args) into a jvpc graph (every tensor leaf of args an input); .outputs holds func's result."""
    who = "jvpc.trace"
    inputs = _Inputs(args, (), who)
    out_spec: list = []
    with _supported_context(who):
        graph, outputs = _C._trace(_traced_fn(func, inputs, who, out_spec), inputs.tensors, inputs.names)
    return TracedGraph(graph, pytree.tree_unflatten(outputs, out_spec[0]))


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


# --- compiled programs: jvpc.compile (compiler/api/program.h) --------------------------------
class Program:
    """func compiled once (jvpc.compile): prog(*primals) -> (func(*primals), jvp_fn) at any primals.

    Each call runs the primal graph alone (no tracing, no passes): FlopCounterMode around it
    counts exactly the primal graph's matmuls. The primals must have the structure, shapes,
    dtypes, devices and strides of the example primals, and equal non-tensor leaves (those are
    compiled in). Tensors func captures (module parameters) are read as they are at each call,
    so an optimizer step between two calls is seen; each jvp_fn keeps its own residuals.
    """

    def __init__(self, prog, inputs: _Inputs, out_spec, who: str):
        self._prog = prog
        self._inputs = inputs
        self._out_spec = out_spec
        self._who = who

    def __call__(self, *primals: Any):
        who = "jvpc.Program"
        ref = self._inputs
        if len(primals) != ref.n:
            raise Error(f"{who}: expected {ref.n} positional arguments, as compiled, got {len(primals)}")
        inputs = _Inputs(primals, ref.diff, who)
        for i in range(ref.n):
            if inputs.specs[i] != ref.specs[i]:
                raise Error(f"{who}: argument {i} has the structure {_shape_of(inputs.specs[i])}, "
                            f"compiled for {_shape_of(ref.specs[i])}")
            for j, (s, leaf) in enumerate(zip(ref.slots[i], inputs.leaves[i])):
                if s is None and leaf != ref.leaves[i][j]:
                    raise Error(f"{who}: argument {i}'s non-tensor leaf {j} is {leaf!r}, compiled for "
                                f"{ref.leaves[i][j]!r} (non-tensor leaves are compiled in)")
                if s is not None and not isinstance(leaf, torch.Tensor):
                    raise Error(f"{who}: argument {i}'s leaf {j} is a {type(leaf).__name__}, compiled for a Tensor")
        outputs, lin = self._prog.linearize(inputs.tensors)
        return pytree.tree_unflatten(outputs, self._out_spec), JvpFn(lin, inputs, self._out_spec, who)

    @property
    def primal_graph(self) -> _C.Graph:
        """Primal inputs (and captured tensors) -> func's outputs, then the residuals."""
        return self._prog.primal_graph

    @property
    def tangent_graph(self) -> _C.Graph:
        """Residuals and tangents -> output tangents: the graph every jvp_fn runs."""
        return self._prog.tangent_graph

    def primal_cost(self) -> dict:
        """Cost of one call (the primal graph's): matmul FLOPs as FlopCounterMode counts them, bytes."""
        return json.loads(self._prog.primal_cost_json)

    def report_text(self) -> str:
        """The compile's per-pass cost table, as `jvpc linearize` prints it."""
        return self._prog.report_text

    def save(self, path: str, trusted: bool = False) -> None:
        """Writes the program (JSON) and its captured tensors (safetensors beside it); `jvpc jvp` runs it.

        trusted: allow ops off the list graph files may use (the derivative factors a primal graph
        computes, such as gelu_backward, are on it); such a file loads back only as trusted."""
        self._prog.save(str(path), trusted)


def compile(func: Callable, *example_primals: Any, argnums=None, exact_strides: bool = True,
            options: _C.LinearizeOptions | None = None) -> Program:
    """Traces and optimizes func once, at example_primals; returns a Program, prog(*primals) -> (out, jvp_fn).

    argnums and options as jvpc.linearize's. exact_strides=False admits primals of other layouts
    (copied into the example's). func must not read tensor values into Python numbers (item(),
    if tensor): the program replays its graph at other primals, so that is an error naming the op.
    """
    who = "jvpc.compile"
    diff = _argnums(argnums, len(example_primals), who)
    inputs = _Inputs(example_primals, diff, who)
    out_spec: list = []
    with _supported_context(who):
        prog = _C._compile(_traced_fn(func, inputs, who, out_spec), inputs.tensors, inputs.names,
                           inputs.differentiable, inputs.wrt, options or _C.LinearizeOptions(), exact_strides)
    return Program(prog, inputs, out_spec[0], who)


def load_program(path: str, *, trusted: bool = False, device: str | None = None,
                 runtime: _C.ExecutableOptions | None = None) -> Program:
    """Loads a program saved by Program.save (or `jvpc compile -o`): prog(*primals) -> (out, jvp_fn).

    The file holds the graphs, not func's pytrees: the loaded program takes one tensor per primal
    input, positionally, and returns its output as a tensor (a tuple of tensors where it has
    several); jvp_fn takes one tangent per differentiated input. A graph file is data from a
    stranger: it may use only the ops on the list graph files may use, within the memory limit,
    unless trusted. device moves the program there (its captured tensors included)."""
    who = "jvpc.load_program"
    prog = _C._load_program(str(path), trusted, device, runtime or _C.ExecutableOptions())
    metas = prog.primal_inputs
    inputs = _Inputs([m for _, _, m in metas], tuple(i for i, (_, d, _) in enumerate(metas) if d), who)
    n = prog.num_primal_outputs
    out_spec = pytree.tree_structure(0 if n == 1 else tuple(range(n)))
    return Program(prog, inputs, out_spec, "jvpc.Program")


# --- jacfwd (issue 20): the Jacobian by batched tangents ---------------------------------------
def jacfwd(func: Callable, argnums=0, has_aux: bool = False, chunk_size: int | None = None):
    """As torch.func.jacfwd(func, argnums, has_aux, chunk_size)(*primals): the Jacobian of func
    with respect to the tensor arguments argnums names, by forward mode: func is linearized once
    and its tangent graph applied to the columns of the identity, chunk_size columns per call of
    the batched tangent graph (None: all of them in one call), which bounds memory.

    The result has func's output structure; each leaf is the Jacobian [*out.shape, *in.shape]
    (argnums an int), or a tuple of them, one per argument (argnums a tuple). With has_aux, func
    returns (output, aux) and the result is (jacobian, aux)."""
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise Error(f"jacfwd: chunk_size must be a positive int or None, got {chunk_size!r}")

    def wrapper(*primals):
        nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        for i in nums:
            if not isinstance(i, int) or not -len(primals) <= i < len(primals):
                raise Error(f"jacfwd: argnums {argnums!r} does not fit {len(primals)} positional arguments")
            if not isinstance(primals[i], torch.Tensor):
                raise Error(f"jacfwd: argument {i} is a {type(primals[i]).__name__}, not a Tensor")
        aux = []

        def f(*args):
            if not has_aux:
                return func(*args)
            res = func(*args)
            if not (isinstance(res, tuple) and len(res) == 2):
                raise Error("jacfwd: with has_aux=True, func must return (output, aux)")
            aux.append(res[1])
            return res[0]

        out, jvp_fn = linearize(f, *primals, argnums=argnums)
        ins = [primals[i] for i in nums]
        sizes = [x.numel() for x in ins]
        n = sum(sizes)
        flat_out, out_spec = pytree.tree_flatten(out)
        columns = [[] for _ in flat_out]
        chunk = n if chunk_size is None else min(chunk_size, n)
        for start in range(0, n, max(chunk, 1)):
            k = min(chunk, n - start)
            rows = torch.arange(k, device=ins[0].device)
            tangents, offset = [], 0
            for x, size in zip(ins, sizes):
                basis = torch.zeros(k, size, dtype=x.dtype, device=x.device)
                cols = start + rows - offset
                hit = (cols >= 0) & (cols < size)
                basis[rows[hit], cols[hit]] = 1
                tangents.append(basis.reshape(k, *x.shape))
                offset += size
            for i, r in enumerate(jvp_fn._lin.run_batched(k, tangents)):
                columns[i].append(r)
        jacs = []
        for o, cols in zip(flat_out, columns):
            full = torch.cat(cols) if cols else o.new_zeros(0, *o.shape)  # [n, *o.shape]
            full = full.movedim(0, -1)  # [*o.shape, n]
            parts = torch.split(full, sizes, dim=-1)
            per_input = tuple(p.reshape(*o.shape, *x.shape) for p, x in zip(parts, ins))
            jacs.append(per_input[0] if isinstance(argnums, int) else per_input)
        jac = pytree.tree_unflatten(jacs, out_spec)
        return (jac, aux[0]) if has_aux else jac

    return wrapper
