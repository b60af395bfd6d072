"""The calling contexts jvpc's tracer cannot record faithfully: refused, or switched off while it traces."""

from __future__ import annotations

import contextlib

import torch

from ._C import Error
from ._compat import in_functorch_transform
from ._reverse import reverse_by_autograd


def eager_only(fn):
    """jvpc's entry points as torch.compile sees them: an opaque call that Dynamo does not trace
    into (a graph break, with this reason; under fullgraph=True, an error naming it). They then
    run eagerly, the function they trace included, inside the compiled function."""
    return torch.compiler.disable(fn, reason=f"jvpc.{fn.__name__} traces and runs its graphs eagerly; "
                                  "torch.compile calls it as an opaque function")


@contextlib.contextmanager
def supported_context(who: str):
    """Refuses the contexts the tracer cannot record faithfully, when linearize is called in them."""
    if in_functorch_transform():
        raise Error(f"{who}: called inside a torch.func transform (vmap, grad, jvp); jvpc traces plain tensors")
    # torch.compile'd code inside func (a compiled module, a compiled helper) runs eagerly, as
    # its Python: Inductor's kernels would run outside the dispatcher, where the tracer sees
    # nothing. The trace is of the code torch.compile compiles, which computes the same.
    stance = "force_eager"
    # nn.MultiheadAttention's and nn.TransformerEncoderLayer's inference fast path (fused kernels
    # that PyTorch does not differentiate either; torch.func's dual tensors never take it) is off.
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.compiler.set_stance(stance), reverse_by_autograd():
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
