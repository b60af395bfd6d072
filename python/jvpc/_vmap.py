"""jvpc's transforms inside torch.func.vmap (jvpc.jvp, jvpc.jacfwd): per-sample JVPs, Hutchinson
estimators, batched Jacobians.

Under vmap, the call becomes one call of a torch.library op whose batching rule vmap runs with
the plain tensors and their batch dims. Where the primals are shared by the batch (only the
tangents are batched), the function is linearized once and the batched tangent graph takes all
the tangents in one call (as vmap(jvp_fn) does); otherwise the call runs once per element, each
a jvpc call on plain tensors, and the results are stacked. An outer vmap level runs its own rule
on the op in turn. The computation is passed to the op by handle: ops take tensors and numbers.
"""

from __future__ import annotations

import itertools
from typing import Callable, Optional

import torch

from ._compat import functorch_level_lowered, is_functorch_wrapped

# handle -> (flat function: tensors -> tensors, the shared-primals path or None)
_calls: dict[int, tuple[Callable, Optional[Callable]]] = {}
_handles = itertools.count()


@torch.library.custom_op("jvpc::under_vmap", mutates_args=())
def _under_vmap(handle: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    fn, _ = _calls[handle]
    ins = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    # An op's results may not alias its inputs (an identity's output is its input).
    return [t.clone() if t.numel() and t.untyped_storage().data_ptr() in ins else t for t in fn(inputs)]


def _under_vmap_rule(info, in_dims, handle, inputs):
    dims = in_dims[1]
    fn, shared = _calls[handle]
    if not any(is_functorch_wrapped(t) for t in inputs):  # the innermost level: plain tensors
        with functorch_level_lowered():
            out = shared(info.batch_size, dims, inputs) if shared is not None else None
            if out is None:
                per_element = [fn([t if d is None else t.select(d, b) for t, d in zip(inputs, dims)])
                               for b in range(info.batch_size)]
                stacked = [torch.stack([o[i] for o in per_element]) for i in range(len(per_element[0]))]
                out = stacked, [0] * len(stacked)
        return out
    # An outer level batches too: one call of the op per element, which that level's rule runs.
    per_element = []
    for b in range(info.batch_size):
        element = [t if d is None else t.select(d, b) for t, d in zip(inputs, dims)]
        per_element.append(_under_vmap(handle, element))
    outs = [torch.stack([o[i] for o in per_element]) for i in range(len(per_element[0]))]
    return outs, [0] * len(outs)


_under_vmap.register_vmap(_under_vmap_rule)


def call_under_vmap(fn: Callable, inputs: list[torch.Tensor], shared: Optional[Callable] = None) -> list:
    """fn(inputs) -> list of tensors, called inside vmap through the op above. shared(k, dims,
    inputs) -> (outputs, out_dims) or None: the path for a batch, tried first."""
    handle = next(_handles)
    _calls[handle] = (fn, shared)
    try:
        return _under_vmap(handle, inputs)
    finally:
        del _calls[handle]
