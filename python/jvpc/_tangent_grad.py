"""Gradients through the tangent (tangent_grad=True): jvp_fn's outputs carry autograd history to
the tangents, the primals and the weights.

The forward is jvpc's: the compiled tangent graph, as without tangent_grad. The backward is the
vector-Jacobian product of the tangent map (x, t) -> J(x)·t, computed by torch.func (vjp of jvp)
at the inputs the call was made at, with the random generators as they were before the forward
(the same dropout masks) and the modules' buffers left as they are (BatchNorm's running statistics
move once per step). It is exact (torch.func's second-order gradients) and costs what torch.func's
does: one forward with its JVP and their reverse. Attention in it runs in O(L)
memory (_tangent_grad_attention: the fused kernel, its backward, and jvpc::attention_tangent's
backward, which recomputes P block by block); what that route does not cover takes SDPA's math
path, with its O(L²) attention memory (docs/training.md).

jvpc's own tangent graph cannot simply run under autograd: its derivative factors are ATen
backward kernels (silu_backward has no derivative) and multi-output kernels whose statistics
autograd does not differentiate (native_layer_norm's mean and rstd), so that would be wrong or
refused for common networks.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import torch
from torch.utils import _pytree as pytree
from torch.nn.attention import SDPBackend, sdpa_kernel

from ._pytrees import Inputs
from ._tangent_grad_attention import o_l_attention
from ._weights import buffers_kept


def rng_count(tensors: Sequence[torch.Tensor]) -> int:
    """How many generator states rng_states takes for these tensors: the CPU's, and the current
    CUDA device's where a tensor is on CUDA."""
    return 2 if any(t.is_cuda for t in tensors) else 1


def rng_states(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The CPU generator's state, and the current CUDA device's where a tensor is on CUDA: taken
    before a forward, so that a backward which runs func again draws what the forward drew."""
    states = [torch.random.get_rng_state()]
    if rng_count(tensors) > 1:
        states.append(torch.cuda.get_rng_state())
    return states


@contextlib.contextmanager
def _replaying(rng: list[torch.Tensor], buffers: list[torch.Tensor]):
    """The random generators at `rng` (restored after), and the modules' buffers left as they are
    (func run again in training writes BatchNorm's running statistics)."""
    devices = [torch.cuda.current_device()] if len(rng) > 1 else []
    with torch.random.fork_rng(devices=devices), buffers_kept(buffers):
        torch.random.set_rng_state(rng[0])
        if devices:
            torch.cuda.set_rng_state(rng[1])
        yield


def vjp_of_jvp(func: Callable, inputs: Inputs, x: Sequence[torch.Tensor], t: Sequence[torch.Tensor],
               grads_out: Sequence | None, grads_dout: Sequence | None, rng: list[torch.Tensor],
               buffers: Sequence[bool]) -> list[torch.Tensor | None]:
    """The gradients to the graph inputs x (func's arguments, flattened as `inputs`) and to the
    tangents t of <grads_out, func(x)> + <grads_dout, J(x)·t> (None: that half is not wanted), by
    torch.func run again at x, drawing as the forward did (rng) and leaving the buffers (marked
    among x) as they are. None for an input the result does not reach, as autograd.grad leaves it."""
    at = [inputs.names.index(n) for n in inputs.wrt]
    xs = [a.detach().requires_grad_(a.requires_grad) for a in x]
    ts = [a.detach().requires_grad_(a.requires_grad) for a in t]
    wanted = [a for a in xs + ts if a.requires_grad]

    def f(*d):
        args = list(xs)
        for i, v in zip(at, d):
            args[i] = v
        return tuple(pytree.tree_leaves(func(*inputs.rebuild(args))))

    with _replaying(rng, [b for b, is_buffer in zip(x, buffers) if is_buffer]), torch.enable_grad(), \
            sdpa_kernel(SDPBackend.MATH), o_l_attention():
        if grads_dout is not None:
            out, dout = torch.func.jvp(f, tuple(xs[i] for i in at), tuple(ts))
        else:
            out, dout = f(*(xs[i] for i in at)), ()
        pairs = [(o, g) for o, g in zip(out, grads_out or ()) if g is not None and o.requires_grad]
        pairs += [(o, g) for o, g in zip(dout, grads_dout or ()) if g is not None and o.requires_grad]
        got = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
                   if pairs and wanted else [None] * len(wanted))
    return [next(got) if a.requires_grad else None for a in xs + ts]


class _ThroughTangent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run, vjp, n_t, *tensors):
        ctx.vjp, ctx.n_t = vjp, n_t
        ctx.save_for_backward(*tensors)
        with torch.no_grad():
            return tuple(run(list(tensors[:n_t])))

    @staticmethod
    def backward(ctx, *grads):
        tensors = ctx.saved_tensors
        return (None, None, None, *ctx.vjp(tensors[ctx.n_t:], tensors[:ctx.n_t], list(grads)))


def through_tangent(run: Callable, func: Callable, inputs: Inputs, rng: list[torch.Tensor],
                    buffers: Sequence[bool]) -> Callable:
    """run (tangents -> output tangents, jvpc's graph) with autograd to the tangents and to every
    tensor of `inputs` (the graph inputs: func's arguments, flattened, `buffers` marking the
    modules' buffers among them); rng: the random generators' state before the forward."""
    x_now: Sequence[torch.Tensor] = inputs.tensors

    def vjp(x, t, grads):
        got = vjp_of_jvp(func, inputs, x, t, None, grads, rng, buffers)
        return got[len(x):] + got[:len(x)]

    def grad_run(tangents):
        return list(_ThroughTangent.apply(run, vjp, len(tangents), *tangents, *x_now))

    return grad_run
