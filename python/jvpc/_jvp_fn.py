"""JvpFn, the compiled linear map x -> J·x, and its batching rule under torch.func.vmap."""

from __future__ import annotations

import json
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import _C
from ._C import Error
from ._compat import in_functorch_transform, is_functorch_wrapped
from ._context import eager_only
from ._pytrees import Inputs, shape_of


class JvpFn:
    """The linear map x ↦ J·x at the primals: call it with tangents shaped as the primals.

    Tangents have the structure of the differentiated arguments (all of them, or those argnums
    names, in that order); outputs have the structure of func's output. Tangent outputs are
    computed without autograd (a stop-gradient: see docs/python.md), unless made with
    tangent_grad (`run`: _tangent_grad.through_tangent), and `run` is the tangent graph compiled by
    Inductor where backend="inductor" (jvpc/_inductor.py). `check` runs before every call (a weight
    replaced since).
    """

    def __init__(self, lin, inputs: Inputs, out_spec, who: str, *, run=None, check=None, tangent_grad=False,
                 inductor=None):
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
        self._tangent_grad = tangent_grad
        self._inductor = inductor  # backend="inductor": what _inductor.tangent_run keeps (its compile time)
        self._run = run or lin.run
        self._check = check
        if check is not None:
            run = self._run

            def checked_run(tangents):
                check()
                return run(tangents)

            self._run = checked_run

    @eager_only
    def __call__(self, *tangents: Any) -> Any:
        if len(tangents) == self._plain_n and all(type(t) is torch.Tensor for t in tangents) and \
                not in_functorch_transform():
            out = self._run(tangents)
            return out[0] if self._single_out else pytree.tree_unflatten(out, self._out_spec)
        flat, spec = pytree.tree_flatten(tangents)
        if spec != self._tangent_spec:
            raise Error(f"{self._who}'s jvp_fn: expected tangents with the structure of the primals, "
                        f"{shape_of(self._tangent_spec)}, got {shape_of(spec)}")
        for i, t in enumerate(flat):
            if not isinstance(t, torch.Tensor):
                raise Error(f"{self._who}'s jvp_fn: tangent {i} ({self._names[i]}) is a {type(t).__name__}, not a Tensor")
        if in_functorch_transform():
            if self._tangent_grad:
                raise Error(f"{self._who}'s jvp_fn: tangent_grad=True does not run under torch.func transforms "
                            "(vmap): call it per tangent")
            if self._check is not None:
                self._check()
            return _batched_call(self, flat)
        return pytree.tree_unflatten(list(self._run(flat)), self._out_spec)

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
        """The compile report: cost after every pass, forward cost, measured linearize FLOPs, tangent
        cost; with backend="inductor", phases_ms["inductor compile"]: what Inductor's compile of the
        tangent graph took at this map's calls so far (0 where an earlier one serves)."""
        r = json.loads(self._lin.report_json)
        if self._inductor is not None:
            r["phases_ms"]["inductor compile"] = self._inductor.get("compile_ms", 0.0)
        return r

    def report_text(self) -> str:
        """The per-pass cost table, as `jvpc linearize` prints it."""
        return self._lin.report_text

    def cost(self) -> dict:
        """Cost of one call: matmul FLOPs (FlopCounterMode's rules), other FLOPs, bytes, residual memory."""
        return json.loads(self._lin.graph._cost_json())

    def save(self, path: str, trusted: bool = False) -> None:
        """Writes the tangent graph (JSON) and its residuals (safetensors beside it); jvpc.load reads it back."""
        self._lin.graph.save(str(path), trusted)


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
    lower = any(is_functorch_wrapped(t) for t in tangents)
    if not lower:
        k = info.batch_size
        stacked = [(t.movedim(d, 0) if d is not None else t.unsqueeze(0).expand(k, *t.shape)).contiguous()
                   for t, d in zip(tangents, dims)]
        outs = list(_registry[handle].run_batched(k, stacked))
        return outs, [0] * len(outs)
    outs = [_run_graph(handle, [t if d is None else t.select(d, b) for t, d in zip(tangents, dims)])
            for b in range(info.batch_size)]
    stacked = [torch.stack([o[i] for o in outs]) for i in range(len(outs[0]))]
    return stacked, [0] * len(stacked)


_run_graph.register_vmap(_run_graph_vmap)


def _looped_jvp(lin, flat):
    _registry[id(lin)] = lin  # dropped by JvpFn.__del__
    return _run_graph(id(lin), flat)
