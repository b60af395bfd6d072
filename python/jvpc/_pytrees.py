"""Arguments and results as torch.func takes them: pytrees of tensors, flattened for the graph.

Inputs and outputs are pytrees (nested tuples, lists and dicts) of tensors, flattened with
torch.utils._pytree as torch.func does. A tensor passed twice is two graph inputs (the second a
view of the first), each with its own tangent, as torch.func takes it. Every tensor leaf of a differentiated argument is a
primal input of the traced graph; tensor leaves of the other arguments (argnums) are inputs
held constant, and their other leaves (ints, floats, ...) are passed to the function as they are.
Tensors the function captures (module parameters, globals) are constants of the graph.

Graph inputs are named after the function's parameters where Python knows them (q, k, v for
`def f(q, k, v)`; a leaf inside an argument adds its pytree path: x['w'], x[0]), else a0, a1, ...
by position; tangents take "d" and the primal's name (dq). The names are what the CLI's
safetensors files hold (`jvpc linearize x.json --inputs`, `jvpc jvp --primals --tangents`).
"""

from __future__ import annotations

import copy
import inspect
import types
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree

from ._C import Error


def argnums_of(argnums, n: int, who: str) -> tuple[int, ...]:
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


def parameter_names(func: Callable, n: int) -> list[str]:
    """Names for func's first n positional arguments: its positional parameters' names, as far as
    inspect finds them (not past *args), else a0, a1, ... by position (builtins, *args)."""
    names = [f"a{i}" for i in range(n)]
    if type(func) is types.FunctionType and not hasattr(func, "__wrapped__") and not hasattr(func, "__signature__"):
        # A plain function: its code names its positional parameters first (inspect's answer, faster).
        code = func.__code__
        for i, name in enumerate(code.co_varnames[:min(n, code.co_argcount)]):
            names[i] = name
        return names
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return names
    for i, p in enumerate(params[:n]):
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        names[i] = p.name
    return names


def check_primal(p: Any, who: str) -> None:
    if not isinstance(p, torch.Tensor):
        raise Error(f"{who}: expected the differentiated primals to only contain Tensors, got {type(p)}")
    if not (p.is_floating_point() or p.is_complex()):
        # torch.func's error for integer primals, word for word.
        raise ValueError(f"Expected primal to be floating point or complex, but got: {p.dtype}")


class Inputs:
    """The flattened positional arguments: which leaves are graph inputs, and how to rebuild them."""

    def __init__(self, args: Sequence[Any], diff: tuple[int, ...], who: str, arg_names: Sequence[str] | None = None):
        self.n = len(args)
        self.arg_names = list(arg_names) if arg_names is not None else [f"a{i}" for i in range(self.n)]
        self.diff = diff
        self.specs = []
        self.leaves = []  # per argument: its leaves (the values passed when not a graph input)
        self.slots = []  # per argument: per leaf, the graph input index or None
        self.tensors = []
        self.names = []
        self.differentiable = []
        self.diff_specs = []  # per differentiated argument: (spec, shapes, dtypes, devices)
        seen: set[int] = set()
        for i, a in enumerate(args):
            with_path, spec = pytree.tree_flatten_with_path(a)
            self.specs.append(spec)
            leaves = [leaf for _, leaf in with_path]
            self.leaves.append(leaves)
            slots = []
            for path, leaf in with_path:
                if i in diff:
                    check_primal(leaf, who)
                if isinstance(leaf, torch.Tensor):
                    if id(leaf) in seen:
                        # The same tensor again (self-attention's mha(q, q, q)): a graph input of its
                        # own, as torch.func's dual tensors are, on the same storage.
                        leaf = leaf.view_as(leaf)
                    seen.add(id(leaf))
                    slots.append(len(self.tensors))
                    self.tensors.append(leaf)
                    self.names.append(f"{self.arg_names[i]}{pytree.keystr(path)}")
                    self.differentiable.append(i in diff)
                else:
                    slots.append(None)
            self.slots.append(slots)
        self.wrt = [self.names[s] for i in diff for s in self.slots[i]]

    def structure(self) -> "Inputs":
        """These Inputs without their tensors: the structure, non-tensor leaves and names a compiled
        program checks each call against, holding none of the example's tensors alive."""
        s = copy.copy(self)
        s.metas = [(t.shape, t.dtype, t.device) for t in self.tensors]
        s.leaves = [[leaf if slot is None else None for slot, leaf in zip(slots, leaves)]
                    for slots, leaves in zip(self.slots, self.leaves)]
        s.tensors = []
        return s

    def rebuild(self, tensors: Sequence[torch.Tensor]) -> list[Any]:
        """The positional arguments with the graph's tensors in place of the inputs' leaves."""
        out = []
        for i in range(self.n):
            leaves = [self.leaves[i][j] if s is None else tensors[s] for j, s in enumerate(self.slots[i])]
            out.append(pytree.tree_unflatten(leaves, self.specs[i]))
        return out


def same_value(now: Any, then: Any) -> bool:
    """Whether a non-tensor value is the one a trace saw: equal and of the same type (the trace of
    f(x, 1) is not that of f(x, True)); an object that is no number, the same object."""
    if now is then:
        return True
    if type(now) is not type(then):
        return False
    try:
        return bool(now == then)
    except Exception:  # noqa: BLE001  (a comparison that raises, or is ambiguous, differs)
        return False


def flat_outputs(out: Any, who: str) -> tuple[list[torch.Tensor], Any]:
    leaves, spec = pytree.tree_flatten(out)
    for leaf in leaves:
        if not isinstance(leaf, torch.Tensor):
            raise Error(f"{who}: expected the function to return a pytree of Tensors, got a leaf of {type(leaf)}")
    return leaves, spec


def traced_fn(func: Callable, inputs: Inputs, who: str, out_spec: list) -> Callable:
    def call(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        out = func(*inputs.rebuild(tensors))
        leaves, spec = flat_outputs(out, who)
        out_spec.append(spec)
        return leaves

    return call


def with_aux(func: Callable, who: str, aux: list) -> Callable:
    """func returning (output, aux), as torch.func's has_aux=True takes it: a function returning
    output alone, which appends aux to the list `aux` (aux is not differentiated)."""

    def call(*args):
        res = func(*args)
        if not (isinstance(res, tuple) and len(res) == 2):
            raise Error(f"{who}: with has_aux=True, func must return a tuple (output, aux), "
                        f"got {type(res).__name__}")
        aux.append(res[1])
        return res[0]

    return call


def shape_of(spec) -> str:
    """A pytree structure on one line: ((*, *), {'a': *})."""
    return str(pytree.tree_unflatten([Leaf()] * spec.num_leaves, spec))


class Leaf:
    def __repr__(self) -> str:
        return "*"
