"""Compiled programs (jvpc.compile, compiler/api/program.h): traced and optimized once, linearized
at any primals by running the primal graph alone."""

from __future__ import annotations

import contextlib
import json
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import _C, _in_compile
from ._C import Error
from ._context import eager_only, supported_context
from ._guards import Guards, global_state, recording
from ._jvp_fn import JvpFn
from ._pytrees import Inputs, argnums_of, parameter_names, same_value, shape_of, traced_fn
from ._inductor import check_backend, primal_run, tangent_run
from ._tangent_grad import rng_states, through_tangent, vjp_of_jvp
from ._compat import distributed_data_parallel
from ._weights import Weights, buffers_kept, reached, with_weights

__all__ = ["Program", "compile", "load_program"]


class _Traced:
    """One traced and optimized pair of graphs, with the inputs it was traced at (their structure
    and metadata) and the guards of what else the trace depended on."""

    def __init__(self, prog, inputs: Inputs, out_spec, weights: Weights | None = None,
                 tangent_grad_of: Callable | None = None, guards: Guards | None = None, check_metas: bool = True,
                 func: Callable | None = None, out_metas: list | None = None):
        self.prog = prog
        self.func = func  # the traced function, taking the graph's arguments (the weights first)
        self.inductor = None  # with backend="inductor": what tangent_run keeps across calls
        self.out_metas = out_metas  # (shape, dtype, device) of each output leaf, as traced
        self.inputs = inputs  # the example's structure (Inputs.structure(): no tensors)
        self.out_spec = out_spec
        self.weights = weights  # bound by name at each call: the program's first argument
        self.tangent_grad_of = tangent_grad_of  # the traced function, where tangent_grad
        self.guards = guards
        self.metas = inputs.metas if check_metas else None  # a loaded program's runtime checks them

    def bind(self, primals: tuple) -> tuple[tuple | None, str | None]:
        """(the graph's arguments, None) where primals, the weights and the guards are as traced;
        else (None, what differs)."""
        ref = self.inputs
        k = 1 if self.weights is not None else 0
        if len(primals) != ref.n - k:
            return None, f"{len(primals)} positional arguments (traced with {ref.n - k})"
        specs = [spec for _, spec in map(pytree.tree_flatten, primals)]
        for i in range(k, ref.n):
            if specs[i - k] != ref.specs[i]:
                return None, (f"argument {i - k} has the structure {shape_of(specs[i - k])} (traced with "
                              f"{shape_of(ref.specs[i])})")
        if k:
            tensors, why = self.weights.read_if_unchanged()
            if why is not None:
                return None, why
            primals = (tensors,) + primals
        inputs = Inputs(primals, ref.diff, "jvpc.Program", ref.arg_names)
        for i in range(k, ref.n):
            for j, (s, leaf) in enumerate(zip(ref.slots[i], inputs.leaves[i])):
                if s is None and not same_value(leaf, ref.leaves[i][j]):
                    return None, (f"argument {i - k}'s non-tensor leaf {j} is {leaf!r} (traced with "
                                  f"{ref.leaves[i][j]!r}; non-tensor leaves are compiled in)")
                if s is not None and not isinstance(leaf, torch.Tensor):
                    return None, f"argument {i - k}'s leaf {j} is a {type(leaf).__name__} (traced with a Tensor)"
        w = len(self.weights) if self.weights is not None else 0
        for name, t, (shape, dtype, device) in zip(inputs.names[w:], inputs.tensors[w:], (self.metas or [])[w:]):
            if t.shape != shape or t.dtype != dtype or t.device != device:
                return None, f"'{name}' is {_meta(t.shape, t.dtype, t.device)} (traced with {_meta(shape, dtype, device)})"
        if self.guards is not None:
            why = self.guards.failure()
            if why is not None:
                return None, why
        return inputs, None

    def buffers(self) -> list[bool]:
        """Per graph input, whether it is a module's buffer."""
        n = len(self.inputs.metas)
        return self.weights.buffer_marks(n) if self.weights is not None else [False] * n

    def run(self, inputs: Inputs, who: str):
        rng = rng_states(inputs.tensors) if self.tangent_grad_of is not None else None  # what the call draws with
        if self.inductor is not None and "primal" not in self.inductor:
            self.inductor["primal"] = primal_run(self.prog, self.inductor)
        primal = self.inductor["primal"] if self.inductor is not None else None
        # Under a dispatch mode (FlopCounterMode, a profiler's) torch.compile compiles nothing:
        # the interpreter runs the primal graph there, kernel by kernel, as the mode expects.
        if primal is not None and _get_current_dispatch_mode() is None:
            outputs, lin = self.prog.linearize_from(inputs.tensors, primal(inputs.tensors))
        else:
            outputs, lin = self.prog.linearize(inputs.tensors)
        run = tangent_run(lin, self.inductor) if self.inductor is not None else None
        if self.tangent_grad_of is not None:
            run = through_tangent(run or lin.run, self.tangent_grad_of, inputs, rng, self.buffers())
        return pytree.tree_unflatten(outputs, self.out_spec), JvpFn(lin, inputs, self.out_spec, who, run=run,
                                                                  tangent_grad=self.tangent_grad_of is not None,
                                                                  inductor=self.inductor)


class Program:
    """func compiled once (jvpc.compile): prog(*primals) -> (func(*primals), jvp_fn) at any primals.

    Each call runs a primal graph alone (no tracing, no passes): FlopCounterMode around it counts
    exactly the primal graph's matmuls. The weights of the modules func reaches are read by name
    at each call (other tensors func captures as they are), so an optimizer step or a swap
    between two calls is seen; under grad mode the call is recorded by autograd. Each jvp_fn keeps
    its own residuals.

    Before each call the program checks what its graphs were traced under (jvpc/_guards.py): the
    primals' structure, shapes, dtypes and devices, their non-tensor leaves, the weights' names,
    shapes and ties, the attributes and globals func read, hooks, grad mode, autocast and the
    default dtype. Where the graph in use does not fit, another it holds that fits runs; else func
    is traced again at these primals (up to max_graphs graphs), or, with retrace=False, the call
    is a one-line jvpc.Error naming what changed.
    """

    def __init__(self, first: _Traced, who: str, retrace: Callable | None = None, max_graphs: int = 1):
        self._graphs = [first]
        self._who = who
        self._retrace = retrace  # primals -> a new _Traced; None: never
        self._max_graphs = max_graphs
        self._handle = _in_compile.register(self)

    def jvp(self, primals: tuple, tangents: tuple) -> tuple[Any, Any]:
        """(func(*primals), J·tangents), as torch.func.jvp: `out, jvp_fn = prog(*primals)` and
        `jvp_fn(*tangents)` in one call. Inside a torch.compile'd function it is one opaque
        operator, which compiles without a graph break (fullgraph=True included) and which autograd
        differentiates as eager does (jvpc/_in_compile.py): the program must have been traced at
        these primals' shapes before, by a call or by jvpc.compile."""
        if not isinstance(primals, tuple) or not isinstance(tangents, tuple):
            raise Error(f"jvpc.Program.jvp: expected primals and tangents as tuples, got "
                        f"{type(primals).__name__} and {type(tangents).__name__}")
        if torch.compiler.is_compiling():
            return _in_compile.call(self, primals, tangents)
        out, jvp_fn = self(*primals)
        return out, jvp_fn(*tangents)

    def _matching(self, tensors: list[torch.Tensor]) -> _Traced | None:
        """The graph traced at these graph inputs' shapes, dtypes and devices."""
        for g in self._graphs:
            metas = g.inputs.metas
            if len(metas) == len(tensors) and all(
                    tuple(t.shape) == tuple(shape) and t.dtype == dtype and t.device == device
                    for t, (shape, dtype, device) in zip(tensors, metas)):
                return g
        return None

    def _out_metas(self, tensors: list[torch.Tensor]) -> list:
        g = self._matching(tensors)
        if g is None or g.out_metas is None:
            raise Error("jvpc.Program.jvp under torch.compile: no graph of the program was traced at these "
                        "primals' shapes, dtypes and devices; call the program once at them before compiling")
        for shape, dtype, _ in g.out_metas:
            if not (dtype.is_floating_point or dtype.is_complex):
                raise Error(f"jvpc.Program.jvp under torch.compile: an output is {dtype}; only floating-point "
                            "outputs have tangents there")
        return g.out_metas

    def _jvp_flat(self, tensors: list[torch.Tensor], tangents: list[torch.Tensor]) -> tuple[list, list]:
        """The eager call on flat graph inputs (the weights first, then the primals' tensors) and flat
        tangents: the output leaves and their tangents' leaves."""
        g = self._graphs[0]
        args = g.inputs.rebuild(tensors)
        k = 1 if g.weights is not None else 0
        tangent_args, at = [], 0
        for i in g.inputs.diff:
            n = g.inputs.specs[i].num_leaves
            tangent_args.append(pytree.tree_unflatten(list(tangents[at:at + n]), g.inputs.specs[i]))
            at += n
        out, jvp_fn = self(*args[k:])
        return pytree.tree_leaves(out), pytree.tree_leaves(jvp_fn(*tangent_args))

    def _jvp_vjp(self, tensors, tangents, rng, grads) -> list:
        """The gradients to the graph inputs and the tangents of <grads, (out leaves, dout leaves)>
        (the second half a stop-gradient unless tangent_grad), func run again as the forward ran."""
        g = self._matching(tensors)
        if g is None or g.func is None:
            raise Error("jvpc.Program.jvp's backward: the graph the forward ran is gone (max_graphs)")
        tangent_grad = g.tangent_grad_of is not None
        buffers = g.buffers()
        x = [a.detach().requires_grad_((a.is_floating_point() or a.is_complex()) and not buffer)
             for a, buffer in zip(tensors, buffers)]
        t = [a.detach().requires_grad_(tangent_grad) for a in tangents]
        n = len(grads) // 2
        return vjp_of_jvp(g.func, g.inputs, x, t, grads[:n], grads[n:] if tangent_grad else None, rng, buffers)

    @eager_only
    def __call__(self, *primals: Any):
        who = "jvpc.Program"
        why = None  # what differs for the graph the last call ran
        for i, g in enumerate(self._graphs):
            inputs, differs = g.bind(primals)
            if inputs is not None:
                if i:
                    self._graphs.insert(0, self._graphs.pop(i))
                return g.run(inputs, who)
            why = why or differs
        if self._retrace is None:
            raise Error(f"{who}: {why}; " + ("the program was compiled with retrace=False: compile again"
                                             if self._max_graphs == 0 else "a loaded program holds one graph"))
        if len(self._graphs) >= self._max_graphs:
            raise Error(f"{who}: {why}, and the program holds max_graphs={self._max_graphs} graphs already: "
                        "compile again, or allow more")
        g = self._retrace(primals)
        self._graphs.insert(0, g)
        inputs, why = g.bind(primals)
        if inputs is None:
            raise Error(f"{who}: traced again, the new graph does not fit its own primals: {why}")
        return g.run(inputs, who)

    @property
    def num_graphs(self) -> int:
        """The traced graphs the program holds (one, plus one per retrace that was kept)."""
        return len(self._graphs)

    @property
    def primal_graph(self) -> _C.Graph:
        """Primal inputs (and captured tensors) -> func's outputs, then the residuals (of the graph
        the last call ran)."""
        return self._graphs[0].prog.primal_graph

    @property
    def tangent_graph(self) -> _C.Graph:
        """Residuals and tangents -> output tangents: the graph every jvp_fn runs (of the graph
        the last call ran)."""
        return self._graphs[0].prog.tangent_graph

    def primal_cost(self) -> dict:
        """Cost of one call (the primal graph's): matmul FLOPs as FlopCounterMode counts them, bytes."""
        return json.loads(self._graphs[0].prog.primal_cost_json)

    def report_text(self) -> str:
        """The compile's per-pass cost table, as `jvpc linearize` prints it; a loaded program (which
        keeps no compile report) shows its primal and tangent graphs' costs, as `jvpc cost` does."""
        return self._graphs[0].prog.report_text

    def save(self, path: str, trusted: bool = False, aoti: bool = False) -> None:
        """Writes the program (JSON) and its captured tensors (safetensors beside it); `jvpc jvp` runs it.
        (The graph the last call ran; the file holds no guards: a loaded program checks its
        primals' shapes, dtypes and devices.)

        trusted: allow ops off the list graph files may use (the derivative factors a primal graph
        computes, such as gelu_backward, are on it); such a file loads back only as trusted.
        aoti: also write both graphs as AOTInductor packages beside it (p.primal.pt2,
        p.tangent.pt2), which C++ runs without Python (runtime/aoti_program.h, `jvpc jvp
        --aoti`); compiling them takes seconds to minutes."""
        self._graphs[0].prog.save(str(path), trusted)
        if aoti:
            from ._aoti import write_packages
            write_packages(str(path), trusted)


@eager_only
def compile(func: Callable, *example_primals: Any, argnums=None, exact_strides: bool = True,
            options: _C.LinearizeOptions | None = None, tangent_grad: bool = False, retrace: bool = True,
            max_graphs: int = 8, backend: str | None = None) -> Program:
    """Traces and optimizes func once, at example_primals; returns a Program, prog(*primals) -> (out, jvp_fn).

    argnums and options as jvpc.linearize's. exact_strides=False admits primals of other layouts
    (copied into the example's). func must not read values computed from its inputs or weights
    into Python (item(), tolist(), if tensor): the program replays its graph at other primals, so
    that is an error naming the op. The parameters and buffers of the modules func reaches are
    read by name at every call (jvpc/_weights.py); under grad mode the call's primal outputs carry
    eager's autograd history. tangent_grad: jvp_fn's outputs carry autograd history too
    (docs/training.md).

    Each call checks what the trace depended on (Program; docs/python.md lists it). retrace: where
    it changed, trace again at the call's primals, keeping up to max_graphs graphs (False: a
    one-line jvpc.Error naming the change). Tracing runs func once; the random generators and the
    modules' buffers are left as they were before it, so that a program's draws and its writes
    to the buffers (BatchNorm's running statistics, at every call) are eager's.

    backend: what runs the program's graphs: "interpreter" (jvpc's runtime) or "inductor", which
    compiles the tangent graph once per traced graph, reused by every call, and runs the primal
    graph through torch.compile's Inductor backend (under grad mode with AOTAutograd's backward);
    a graph that draws random numbers stays on the interpreter. None (the default):
    $JVPC_BACKEND, else "interpreter".
    """
    who = "jvpc.compile"
    backend = check_backend(backend, who)
    if not isinstance(max_graphs, int) or max_graphs < 1:
        raise Error(f"{who}: max_graphs must be a positive int, got {max_graphs!r}")
    n = len(example_primals)
    diff = argnums_of(argnums, n, who)
    names = parameter_names(func, n)
    options = options or _C.LinearizeOptions()

    if distributed_data_parallel(m for _, m in reached(func)[0]):
        raise Error(f"{who}: the function calls DistributedDataParallel's forward, whose bookkeeping (its buffers' "
                    "broadcast, its reducer's preparation for the backward) a program cannot replay: compile the "
                    "wrapped module (ddp.module) inside a step that DistributedDataParallel wraps (docs/training.md), "
                    "or use jvpc.linearize")

    def trace_at(primals) -> _Traced:
        weights = Weights(func)
        weights.remember_metas()
        traced, inputs = with_weights(func, weights, primals, diff, who, names)
        out_spec: list = []
        out_metas: list = []
        state = global_state()
        buffers = [t for t, b in zip(inputs.tensors, weights.buffers) if b]
        run = traced_fn(traced, inputs, who, out_spec)

        def recorded(tensors):
            leaves = run(tensors)
            out_metas.append([(tuple(t.shape), t.dtype, t.device) for t in leaves])
            return leaves

        with supported_context(who), _random_state_kept(), buffers_kept(buffers), recording(func, who) as reads:
            prog = _C._compile(recorded, inputs.tensors, inputs.names, inputs.differentiable, inputs.wrt, options,
                               exact_strides, weights.buffers)
        weights.release()  # the program reads them by name; a replaced weight is freed
        g = _Traced(prog, inputs.structure(), out_spec[0], weights if len(weights) else None,
                    traced if tangent_grad else None, Guards(reads, func, state), func=traced, out_metas=out_metas[0])
        g.inductor = {} if backend == "inductor" else None
        return g

    return Program(trace_at(example_primals), who, trace_at if retrace else None, max_graphs if retrace else 0)


@contextlib.contextmanager
def _random_state_kept():
    """Leaves torch's random generators as they were: a trace's draws are not a call's."""
    cuda = torch.cuda.is_initialized()
    cpu_state = torch.random.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if cuda else None
    try:
        yield
    finally:
        torch.random.set_rng_state(cpu_state)
        if cuda:
            torch.cuda.set_rng_state_all(cuda_states)


def _meta(shape, dtype, device) -> str:
    return f"{str(dtype).removeprefix('torch.')}{list(shape)} on {device}"


@eager_only
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
    inputs = Inputs([m for _, _, m in metas], tuple(i for i, (_, d, _) in enumerate(metas) if d), who,
                    [name for name, _, _ in metas])
    n = prog.num_primal_outputs
    out_spec = pytree.tree_structure(0 if n == 1 else tuple(range(n)))
    return Program(_Traced(prog, inputs.structure(), out_spec, check_metas=False), "jvpc.Program")
