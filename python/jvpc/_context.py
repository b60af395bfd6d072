"""The calling contexts jvpc's tracer cannot record faithfully: refused, or switched off while it traces."""

from __future__ import annotations

import contextlib

import torch

from ._C import Error
from ._compat import dynamo_stance, in_functorch_transform


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
    # torch.compile'd code inside func: Dynamo would compile it (the tracer's dispatch key fails
    # its guards) into kernels that run outside the dispatcher, where the tracer sees nothing.
    # This stance makes that compilation an error, which is reported as jvpc's.
    # A caller's "force_eager" stance already runs such code eagerly, which traces.
    stance = "force_eager" if dynamo_stance() == "force_eager" else "fail_on_recompile"
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
