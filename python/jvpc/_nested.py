"""jvpc.jvp, linearize and jacfwd called inside a function jvpc is tracing (jacfwd(jacfwd(f)), a
Hessian): the inner JVP is taken by torch.autograd, as the derivative of a vector-Jacobian
product along its cotangent (J·t = ∂/∂u ⟨Jᵀu, t⟩), so that the outer trace records its backward
kernels and differentiates them (jvpc/_reverse.py, passes/jvp_rules/backward.cpp)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from ._reverse import _grads, _with_watched


class _Batched:
    """What jacfwd asks of a linear map: k tangents at once (here one after another)."""

    def __init__(self, fn: "NestedJvpFn"):
        self._fn = fn

    def run_batched(self, k: int, tangents: list[torch.Tensor]) -> list[torch.Tensor]:
        columns = [self._fn.flat(*(t[i] for t in tangents)) for i in range(k)]
        return [torch.stack(parts) for parts in zip(*columns)]


class NestedJvpFn:
    def __init__(self, outputs: list[torch.Tensor], out_spec, inputs: list[torch.Tensor], in_spec):
        self._outputs, self._out_spec, self._inputs, self._in_spec = outputs, out_spec, inputs, in_spec
        with torch.enable_grad():
            self._cotangents = [torch.zeros_like(o).requires_grad_() for o in outputs]
            self._vjp = _grads(outputs, inputs, self._cotangents, unused=lambda _: None)  # Jᵀu, None: unused
        self._lin = _Batched(self)

    def report(self) -> dict:
        return {"random_ops": []}  # the outer trace records them

    def flat(self, *flat_tangents: torch.Tensor) -> list[torch.Tensor]:
        """J·t for the flat tangents: ∂/∂u ⟨Jᵀu, t⟩ (zeros where no input reaches an output)."""
        with torch.enable_grad():
            terms = [(g * t).sum() for g, t in zip(self._vjp, flat_tangents) if g is not None]
            return _grads([sum(terms)] if terms else [], self._cotangents, None)

    def __call__(self, *tangents: Any) -> Any:
        flat, spec = pytree.tree_flatten(tangents)
        if spec != self._in_spec or any(t.shape != x.shape for t, x in zip(flat, self._inputs)):
            raise RuntimeError("jvp_fn: expected tangents of the differentiated arguments' structure and shapes")
        return pytree.tree_unflatten(self.flat(*flat), self._out_spec)


def nested_linearize(func: Callable, primals: tuple, diff: tuple[int, ...], has_aux: bool) -> tuple:
    """linearize inside a trace: (func(*primals), jvp_fn[, aux]), by torch.autograd."""
    with torch.enable_grad():
        args, watched = _with_watched(primals, diff)
        flat_in, in_spec = pytree.tree_flatten(watched)
        out = func(*args)
        aux = None
        if has_aux:
            out, aux = out
        flat_out, out_spec = pytree.tree_flatten(out)
        jvp_fn = NestedJvpFn(flat_out, out_spec, flat_in, in_spec)
    return (out, jvp_fn, aux) if has_aux else (out, jvp_fn)
