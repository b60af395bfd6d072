"""jacfwd: the Jacobian by batched tangents, one linearize and chunked calls of the batched tangent graph."""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils import _pytree as pytree

from ._C import Error
from ._api import linearize
from ._compat import in_vmap_only
from ._context import eager_only
from ._vmap import call_under_vmap


def jacfwd(func: Callable, argnums=0, has_aux: bool = False, *, randomness: str = "error",
           chunk_size: int | None = None):
    """As torch.func.jacfwd(func, argnums, has_aux, randomness=)(*primals): the Jacobian of func
    with respect to the arguments argnums names (pytrees of tensors), by forward mode: func is linearized once
    and its tangent graph applied to the columns of the identity, chunk_size columns per call of
    the batched tangent graph (None: all of them in one call), which bounds memory. chunk_size is
    jvpc's, keyword-only (torch.func.jacrev has one).

    The result has func's output structure; each leaf holds, in the structure of the argument
    argnums names (argnums an int) or of the tuple of them (argnums a tuple), the Jacobian
    [*out.shape, *in.shape] of each of its tensors, as torch.func's. With has_aux, func
    returns (output, aux) and the result is (jacobian, aux). randomness has torch.func's meaning
    for a func that draws (dropout, torch.rand): "error" refuses it, "same" gives every column
    the one draw of func's single run; "different", a draw per column, is refused: jvpc runs func
    once."""
    if randomness not in ("error", "different", "same"):
        raise Error(f"jacfwd: only allowed values for randomness are 'error', 'different', or 'same'. Got {randomness}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise Error(f"jacfwd: chunk_size must be a positive int or None, got {chunk_size!r}")

    @eager_only
    def wrapper(*primals):
        if in_vmap_only():  # per sample (jvpc/_vmap.py), each its own linearization
            if has_aux:
                raise Error("jacfwd: inside torch.func.vmap, has_aux is not supported")
            flat, spec = pytree.tree_flatten(primals)
            out_spec: list = []

            def per_element(inputs):
                jac = wrapper(*pytree.tree_unflatten(inputs, spec))
                out_spec[:] = [pytree.tree_structure(jac)]
                return pytree.tree_leaves(jac)

            return pytree.tree_unflatten(call_under_vmap(per_element, flat), out_spec[0])
        nums = _argnums(argnums, len(primals))
        out, jvp_fn, *aux = linearize(func, *primals, argnums=argnums, has_aux=has_aux)
        drawn = jvp_fn.report()["random_ops"] if randomness != "same" else []
        if drawn and randomness == "error":
            raise Error(f"jacfwd: func calls a random operation ({drawn[0]}) while randomness='error'; "
                        "pass randomness='same' (every column takes the one draw) or draw outside func")
        if drawn:
            raise Error(f"jacfwd: func calls a random operation ({drawn[0]}); randomness='different' would draw "
                        "per column, and jvpc runs func once: pass randomness='same'")
        # The differentiated arguments as torch.func takes them: a tuple of pytrees of tensors.
        flat_in, in_spec = pytree.tree_flatten(tuple(primals[i] for i in nums))
        sizes = [x.numel() for x in flat_in]
        n = sum(sizes)
        flat_out, out_spec = pytree.tree_flatten(out)
        columns = [[] for _ in flat_out]
        chunk = n if chunk_size is None else min(chunk_size, n)
        for start in range(0, n, max(chunk, 1)):
            k = min(chunk, n - start)
            rows = torch.arange(k, device=flat_in[0].device)
            tangents, offset = [], 0
            for x, size in zip(flat_in, sizes):  # the identity's columns start..start+k, input by input
                basis = torch.zeros(k, size, dtype=x.dtype, device=x.device)
                cols = start + rows - offset
                hit = (cols >= 0) & (cols < size)
                basis[rows[hit], cols[hit]] = 1
                tangents.append(basis.reshape(k, *x.shape))
                offset += size
            for i, r in enumerate(jvp_fn._lin.run_batched(k, tangents)):
                columns[i].append(r)
        jacs = []
        for o, cols in zip(flat_out, columns):
            full = torch.cat(cols) if cols else o.new_zeros(0, *o.shape)  # [n, *o.shape]
            parts = torch.split(full.movedim(0, -1), sizes, dim=-1)  # [*o.shape, numel of each input]
            per_input = [p.reshape(tuple(o.shape) + tuple(x.shape)) for p, x in zip(parts, flat_in)]
            per_arg = pytree.tree_unflatten(per_input, in_spec)  # the arguments' structure
            jacs.append(per_arg[0] if isinstance(argnums, int) else per_arg)
        jac = pytree.tree_unflatten(jacs, out_spec)
        return (jac, aux[0]) if has_aux else jac

    return wrapper


def _argnums(argnums, n: int) -> tuple[int, ...]:
    """argnums as a tuple of argument indices, checked as torch.func checks it, with its messages."""
    if not isinstance(argnums, (int, tuple)) or isinstance(argnums, bool):
        raise Error(f"argnums must be int or Tuple[int, ...], got: {type(argnums)}")
    nums = (argnums,) if isinstance(argnums, int) else argnums
    if not nums:
        raise Error("argnums must be non-empty")
    out = []
    for a in nums:
        if not isinstance(a, int) or isinstance(a, bool):
            raise Error(f"argnum must be int, got: {type(a)}")
        if not -n <= a < n:
            raise Error(f"Got argnum={a}, but only {n} positional inputs")
        out.append(a % n)
    if len(set(out)) != len(out):
        raise Error(f"argnums elements must be unique, got {argnums}")
    return tuple(out)
