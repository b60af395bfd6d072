"""A compiled program inside torch.compile: Program.jvp as one opaque operator.

Under torch.compile, `prog.jvp(primals, tangents)` is the custom operator `jvpc::program_jvp`:
(the caller's grad mode, the graph inputs, that is the weights read by name and the primals'
tensors, then the tangents) -> (func's outputs, their tangents, the random generators' state
before the call). Dynamo traces
the call without a graph break (fullgraph=True included); its fake kernel gives the outputs' shapes
from the graph traced at the primals' shapes. At run time the operator is the eager program call:
guards, retracing and the weights by name included.

Its derivative is `jvpc::program_jvp_backward`, another opaque operator: it runs func again by
torch.func, with the random generators as they were before the forward (the same draws) and the
modules' buffers left as they are, and returns the vector-Jacobian product to the weights, the
primals and, with tangent_grad=True, the tangents (the output tangents' gradients; without
tangent_grad they are a stop-gradient, as in eager). So the backward costs a forward of func (with
its JVP where tangent_grad) and its reverse, as activation checkpointing does.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from typing import Any, Protocol

import torch
from torch.utils import _pytree as pytree

from ._C import Error
from ._tangent_grad import rng_count, rng_states


class ProgramLike(Protocol):
    """What the operators use of a jvpc.Program (jvpc/_program.py, which imports this module)."""

    _handle: str
    _graphs: list

    def _jvp_flat(self, tensors: list[torch.Tensor], tangents: list[torch.Tensor]) -> tuple[list, list]: ...

    def _out_metas(self, tensors: list[torch.Tensor]) -> list: ...

    def _jvp_vjp(self, tensors: list[torch.Tensor], tangents: list[torch.Tensor], rng: list[torch.Tensor],
                 grads: list[torch.Tensor | None]) -> list: ...


# The programs an operator call can name, by handle (ops take tensors, scalars and strings).
_programs: "weakref.WeakValueDictionary[str, ProgramLike]" = weakref.WeakValueDictionary()
_numbers = itertools.count()
_CPU_RNG_BYTES = torch.random.get_rng_state().numel()


def register(prog: ProgramLike) -> str:
    """The handle an operator call names prog by, made when the program is (a string: Dynamo bakes
    it into the graph, where an int that differs between two compiles would become symbolic)."""
    h = f"program-{next(_numbers)}"  # never reused: a freed program's id may be
    _programs[h] = prog
    return h


def _program(h: str) -> ProgramLike:
    prog = _programs.get(h)
    if prog is None:
        raise Error("jvpc.Program.jvp under torch.compile: the program was freed; keep it alive while the "
                    "compiled function runs")
    return prog


@contextlib.contextmanager
def _as_eager(grad: bool):
    """Inside an operator's kernel, the caller's eager world back: autograd's dispatch keys (which
    autograd excludes while it runs a kernel), forward AD (off inside a custom Function's forward,
    which a trace would honour with no tangents) and the caller's grad mode."""
    C = torch._C
    exclude = C._dispatch_tls_local_exclude_set()
    for key in (C.DispatchKey.AutogradFunctionality, C.DispatchKey.AutogradOther, C.DispatchKey.AutogradNestedTensor):
        exclude = exclude.remove(key)
    with C._ForceDispatchKeyGuard(C._dispatch_tls_local_include_set(), exclude), \
            torch.autograd.forward_ad._set_fwd_grad_enabled(True), torch.set_grad_enabled(grad):
        yield


@torch.library.custom_op("jvpc::program_jvp", mutates_args=())
def program_jvp(h: str, grad: bool, n_inputs: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    prog = _program(h)
    rng = rng_states(tensors)
    with _as_eager(grad):
        outs, douts = prog._jvp_flat(tensors[:n_inputs], tensors[n_inputs:])
    outs, douts = [o.detach() for o in outs], [d.detach() for d in douts]
    inputs = {t.untyped_storage().data_ptr() for t in tensors}
    # An operator's results must not alias its arguments (an output that is an input, say).
    fresh = [o.clone() if o.untyped_storage().data_ptr() in inputs else o for o in outs + douts]
    return fresh + rng


@program_jvp.register_fake
def _program_jvp_fake(h, grad, n_inputs, tensors):
    metas = _program(h)._out_metas(tensors[:n_inputs])
    outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype, device in metas]
    rng = [torch.empty(_CPU_RNG_BYTES, dtype=torch.uint8)]
    if rng_count(tensors) > 1:
        rng.append(torch.empty(16, dtype=torch.uint8))  # the CUDA generator's state
    return outs + [torch.empty_like(o) for o in outs] + rng


@torch.library.custom_op("jvpc::program_jvp_backward", mutates_args=())
def program_jvp_backward(h: str, n_inputs: int, tensors: list[torch.Tensor], rng: list[torch.Tensor],
                         grads: list[torch.Tensor | None]) -> list[torch.Tensor]:
    with _as_eager(True):
        got = _program(h)._jvp_vjp(tensors[:n_inputs], tensors[n_inputs:], rng, grads)
    return [g if g is not None else torch.zeros_like(t) for g, t in zip(got, tensors)]


@program_jvp_backward.register_fake
def _program_jvp_backward_fake(h, n_inputs, tensors, rng, grads):
    return [torch.empty_like(t) for t in tensors]


def _setup_context(ctx, inputs, output):
    h, _, n_inputs, tensors = inputs
    n_rng = rng_count(tensors)
    ctx.h, ctx.n_inputs, ctx.n_tensors, ctx.n_rng = h, n_inputs, len(tensors), n_rng
    ctx.save_for_backward(*tensors, *output[len(output) - n_rng:])


def _backward(ctx, grads):
    saved = ctx.saved_tensors
    tensors, rng = list(saved[:ctx.n_tensors]), list(saved[ctx.n_tensors:])
    outs = list(grads[:len(grads) - ctx.n_rng])
    got = program_jvp_backward(ctx.h, ctx.n_inputs, tensors, rng, outs)
    return None, None, None, got


program_jvp.register_autograd(_backward, setup_context=_setup_context)


def call(prog: ProgramLike, primals: tuple, tangents: tuple) -> tuple[Any, Any]:
    """prog.jvp(primals, tangents) as torch.compile traces it: one jvpc::program_jvp call."""
    g = prog._graphs[0]
    weights = g.weights.read_by_attribute() if g.weights is not None else []
    flat_primals = pytree.tree_leaves(primals)
    flat_tangents = pytree.tree_leaves(tangents)
    tensors = [*weights, *[p for p in flat_primals if isinstance(p, torch.Tensor)]]
    res = torch.ops.jvpc.program_jvp(prog._handle, torch.is_grad_enabled(), len(tensors), [*tensors, *flat_tangents])
    n = g.out_spec.num_leaves
    return pytree.tree_unflatten(res[:n], g.out_spec), pytree.tree_unflatten(res[n:2 * n], g.out_spec)
