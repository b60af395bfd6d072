"""Compiled programs (jvpc.compile, compiler/api/program.h): traced and optimized once, linearized
at any primals by running the primal graph alone."""

from __future__ import annotations

import json
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from . import _C
from ._C import Error
from ._context import eager_only, supported_context
from ._jvp_fn import JvpFn
from ._pytrees import Inputs, argnums_of, parameter_names, shape_of, traced_fn
from ._tangent_grad import through_tangent
from ._weights import Weights, with_weights

__all__ = ["Program", "compile", "load_program"]


class Program:
    """func compiled once (jvpc.compile): prog(*primals) -> (func(*primals), jvp_fn) at any primals.

    Each call runs the primal graph alone (no tracing, no passes): FlopCounterMode around it
    counts exactly the primal graph's matmuls. The primals must have the structure, shapes,
    dtypes, devices and strides of the example primals, and equal non-tensor leaves (those are
    compiled in). The weights of the modules func reaches are read by name at each call (other
    tensors func captures as they are), so an optimizer step or a swap between two calls is seen;
    under grad mode the call is recorded by autograd. Each jvp_fn keeps its own residuals.
    """

    def __init__(self, prog, inputs: Inputs, out_spec, who: str, weights: Weights | None = None,
                 tangent_grad_of: Callable | None = None):
        self._prog = prog
        self._inputs = inputs  # the example's structure (Inputs.structure(): no tensors)
        self._out_spec = out_spec
        self._who = who
        self._weights = weights  # bound by name at each call: the program's first argument
        self._tangent_grad_of = tangent_grad_of  # the traced function, where tangent_grad

    @eager_only
    def __call__(self, *primals: Any):
        who = "jvpc.Program"
        ref = self._inputs
        k = 1 if self._weights is not None else 0
        if len(primals) != ref.n - k:
            raise Error(f"{who}: expected {ref.n - k} positional arguments, as compiled, got {len(primals)}")
        if k:
            primals = (self._weights.read_checked(who),) + primals
        inputs = Inputs(primals, ref.diff, who, ref.arg_names)
        for i in range(k, ref.n):
            if inputs.specs[i] != ref.specs[i]:
                raise Error(f"{who}: argument {i - k} has the structure {shape_of(inputs.specs[i])}, "
                            f"compiled for {shape_of(ref.specs[i])}")
            for j, (s, leaf) in enumerate(zip(ref.slots[i], inputs.leaves[i])):
                if s is None and leaf != ref.leaves[i][j]:
                    raise Error(f"{who}: argument {i - k}'s non-tensor leaf {j} is {leaf!r}, compiled for "
                                f"{ref.leaves[i][j]!r} (non-tensor leaves are compiled in)")
                if s is not None and not isinstance(leaf, torch.Tensor):
                    raise Error(f"{who}: argument {i - k}'s leaf {j} is a {type(leaf).__name__}, compiled for a Tensor")
        outputs, lin = self._prog.linearize(inputs.tensors)
        run = None
        if self._tangent_grad_of is not None:
            run = through_tangent(lin.run, self._tangent_grad_of, inputs)
        return pytree.tree_unflatten(outputs, self._out_spec), JvpFn(lin, inputs, self._out_spec, who, run=run)

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
        """The compile's per-pass cost table, as `jvpc linearize` prints it; a loaded program (which
        keeps no compile report) shows its primal and tangent graphs' costs, as `jvpc cost` does."""
        return self._prog.report_text

    def save(self, path: str, trusted: bool = False) -> None:
        """Writes the program (JSON) and its captured tensors (safetensors beside it); `jvpc jvp` runs it.

        trusted: allow ops off the list graph files may use (the derivative factors a primal graph
        computes, such as gelu_backward, are on it); such a file loads back only as trusted."""
        self._prog.save(str(path), trusted)


@eager_only
def compile(func: Callable, *example_primals: Any, argnums=None, exact_strides: bool = True,
            options: _C.LinearizeOptions | None = None, tangent_grad: bool = False) -> Program:
    """Traces and optimizes func once, at example_primals; returns a Program, prog(*primals) -> (out, jvp_fn).

    argnums and options as jvpc.linearize's. exact_strides=False admits primals of other layouts
    (copied into the example's). func must not read tensor values into Python numbers (item(),
    if tensor): the program replays its graph at other primals, so that is an error naming the op.
    The parameters and buffers of the modules func reaches are read by name at every call
    (jvpc/_weights.py); under grad mode the call's primal outputs carry eager's autograd history.
    tangent_grad: jvp_fn's outputs carry autograd history too (docs/training.md).
    """
    who = "jvpc.compile"
    n = len(example_primals)
    diff = argnums_of(argnums, n, who)
    names = parameter_names(func, n)
    weights = Weights(func)
    weights.remember_metas()
    traced, inputs = with_weights(func, weights, example_primals, diff, who, names)
    out_spec: list = []
    with supported_context(who):
        prog = _C._compile(traced_fn(traced, inputs, who, out_spec), inputs.tensors, inputs.names,
                           inputs.differentiable, inputs.wrt, options or _C.LinearizeOptions(), exact_strides)
    weights.release()  # the program reads them by name; a replaced weight is freed
    return Program(prog, inputs.structure(), out_spec[0], who, weights if len(weights) else None,
                   traced if tangent_grad else None)


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
    return Program(prog, inputs.structure(), out_spec, "jvpc.Program")
