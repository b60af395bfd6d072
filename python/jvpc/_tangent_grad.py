"""Gradients through the tangent (tangent_grad=True): jvp_fn's outputs carry autograd history to
the tangents, the primals and the weights.

The forward is jvpc's: the compiled tangent graph, as without tangent_grad. The backward is the
vector-Jacobian product of the tangent map (x, t) -> J(x)·t, computed by torch.func (vjp of jvp)
at the inputs the call was made at. It is exact (torch.func's second-order gradients) and costs
what torch.func's does: one forward with its JVP and their reverse. Attention in it runs in O(L)
memory (_tangent_grad_attention: the fused kernel, its backward, and jvpc::attention_tangent's
backward, which recomputes P block by block); what that route does not cover takes SDPA's math
path, with its O(L²) attention memory (docs/training.md).

jvpc's own tangent graph cannot simply run under autograd: its derivative factors are ATen
backward kernels (silu_backward has no derivative) and multi-output kernels whose statistics
autograd does not differentiate (native_layer_norm's mean and rstd), so that would be wrong or
refused for common networks.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch.utils import _pytree as pytree
from torch.nn.attention import SDPBackend, sdpa_kernel

from ._pytrees import Inputs
from ._tangent_grad_attention import o_l_attention


class _ThroughTangent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, tangent_map, n_t, *tensors):
        ctx.tangent_map, ctx.n_t = tangent_map, n_t
        ctx.save_for_backward(*tensors)
        with torch.no_grad():
            return tuple(run(list(tensors[:n_t])))

    @staticmethod
    def backward(ctx, *grads):
        # Reverse mode over torch.func's forward mode, by autograd.grad, which leaves None (not
        # zeros) for an input the tangent does not reach, as eager's backward leaves a weight's
        # .grad unset (an optimizer then skips it: no weight decay, no momentum).
        tensors = ctx.saved_tensors
        t = [a.detach().requires_grad_(a.requires_grad) for a in tensors[:ctx.n_t]]
        x = [a.detach().requires_grad_(a.requires_grad) for a in tensors[ctx.n_t:]]
        wanted = [a for a in t + x if a.requires_grad]
        with torch.enable_grad(), sdpa_kernel(SDPBackend.MATH), o_l_attention():
            outs = ctx.tangent_map(t, x)
            pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad and g is not None]
            got = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
                       if pairs and wanted else [None] * len(wanted))
        return (None, None, None, *[next(got) if a.requires_grad else None for a in t + x])


def through_tangent(run: Callable, func: Callable, inputs: Inputs) -> Callable:
    """run (tangents -> output tangents, jvpc's graph) with autograd to the tangents and to every
    tensor of `inputs` (the graph inputs: func's arguments, flattened)."""
    at = [inputs.names.index(n) for n in inputs.wrt]
    x_now: Sequence[torch.Tensor] = inputs.tensors

    def tangent_map(t, x):
        def f(*d):
            xs = list(x)
            for i, v in zip(at, d):
                xs[i] = v
            return tuple(pytree.tree_leaves(func(*inputs.rebuild(xs))))

        return torch.func.jvp(f, tuple(x[i] for i in at), tuple(t))[1]

    def grad_run(tangents):
        return list(_ThroughTangent.apply(run, tangent_map, len(tangents), *tangents, *x_now))

    return grad_run
