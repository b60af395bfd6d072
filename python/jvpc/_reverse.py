"""torch.func's reverse-mode transforms inside a traced function (forward-over-reverse).

While jvpc traces, `torch.func.grad`, `grad_and_value`, `vjp` and `jacrev` called inside the function are
computed by torch.autograd, with torch.func's conventions (argnums, has_aux, pytrees, zeros for
unused inputs, its errors): the backward's kernels then run as plain ATen ops, which the tracer
records and the JVP pass differentiates (passes/jvp_rules/backward.cpp has the rules of backward
kernels). `jvpc.jvp(torch.func.grad(f), (x,), (v,))` is a Hessian-vector product. jacrev's rows
are taken one by one (one backward per output element).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable

import torch
import torch._functorch.eager_transforms as eager_transforms
from torch.utils._pytree import tree_flatten, tree_unflatten


def _watched(t: Any) -> Any:
    """A tensor that autograd differentiates with respect to: t itself where it already requires
    grad through a graph, else a view of it made a leaf that requires grad (the view keeps the
    trace's data flow from t; detaching would cut it)."""
    if not isinstance(t, torch.Tensor):
        return t
    v = t.view_as(t)
    if not v.requires_grad:
        v.requires_grad_(True)
    return v


def _grads(outputs: list[torch.Tensor], inputs: list[torch.Tensor], cotangents: list | None,
           unused: Callable[[torch.Tensor], Any] = torch.zeros_like) -> list:
    """torch.autograd.grad with torch.func's conventions: unused(input) (zeros) where an input is
    unused or no output requires grad; create_graph, so that the grads stay differentiable."""
    pairs = [(o, c) for o, c in zip(outputs, cotangents or [None] * len(outputs)) if o.requires_grad]
    wanted = [i for i in inputs if isinstance(i, torch.Tensor) and i.requires_grad]
    got: tuple = ()
    if pairs and wanted:
        got = torch.autograd.grad([o for o, _ in pairs], wanted, [c for _, c in pairs] if cotangents else None,
                                  retain_graph=True, create_graph=True, allow_unused=True)
    by_input = {id(i): g for i, g in zip(wanted, got) if g is not None}
    return [by_input[id(i)] if id(i) in by_input else unused(i) for i in inputs]


def _with_watched(args: tuple, argnums) -> tuple[tuple, Any]:
    """args with the tensors that argnums selects made differentiable, and those (a pytree)."""
    diff = eager_transforms._slice_argnums(args, argnums, as_tuple=False)
    leaves, spec = tree_flatten(diff)
    watched = tree_unflatten([_watched(t) for t in leaves], spec)
    positions = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    parts = (watched,) if isinstance(argnums, int) else tuple(watched)
    new_args = list(args)
    for p, w in zip(positions, parts):
        new_args[p] = w
    return tuple(new_args), watched


def _grad_and_value_impl(func: Callable, argnums, has_aux: bool, args: tuple, kwargs: dict) -> tuple:
    with torch.enable_grad():
        args, diff = _with_watched(args, argnums)
        output = func(*args, **kwargs)
        aux = None
        if has_aux:
            if not (isinstance(output, tuple) and len(output) == 2):
                raise RuntimeError("grad_and_value(f)(*args): output of function f should be a tuple: (output, aux) "
                                   "if has_aux is True")
            output, aux = output
        if not isinstance(output, torch.Tensor):
            raise RuntimeError(f"grad_and_value(f)(*args): Expected f(*args) to return a Tensor, got {type(output)}")
        if output.dim() != 0:
            raise RuntimeError("grad_and_value(f)(*args): Expected f(*args) to return a scalar Tensor, got tensor "
                               f"with {output.dim()} dims. Maybe you wanted to use the vjp or jacrev APIs instead?")
        flat, spec = tree_flatten(diff)
        grad = tree_unflatten(_grads([output], flat, None), spec)
    return (grad, (output, aux)) if has_aux else (grad, output)


def _grad_impl(func: Callable, argnums, has_aux: bool, args: tuple, kwargs: dict) -> Any:
    grad, value = _grad_and_value_impl(func, argnums, has_aux, args, kwargs)
    return (grad, value[1]) if has_aux else grad


def _vjp_with_argnums(func: Callable, *primals: Any, argnums=None, has_aux: bool = False):
    with torch.enable_grad():
        if argnums is None:
            leaves, spec = tree_flatten(primals)
            diff = tree_unflatten([_watched(t) for t in leaves], spec)
            primals = diff
        else:
            primals, diff = _with_watched(primals, argnums)
        out = func(*primals)
        aux = None
        if has_aux:
            if not (isinstance(out, tuple) and len(out) == 2):
                raise RuntimeError("vjp(f, *primals): output of function f should be a tuple: (output, aux) "
                                   "if has_aux is True")
            out, aux = out
        flat_out, out_spec = tree_flatten(out)
        for o in flat_out:
            if not isinstance(o, torch.Tensor):
                raise RuntimeError(f"vjp(f, *primals): Expected f to be a function that has non-empty output "
                                   f"(got a {type(o).__name__})")
            if not (o.is_floating_point() or o.is_complex()):
                raise RuntimeError("vjp(f, ...): All outputs of f must be floating-point or complex Tensors, "
                                   f"got Tensor with dtype {o.dtype}")
    flat_diff, diff_spec = tree_flatten(diff)

    def vjp_fn(cotangents: Any, retain_graph: bool = True, create_graph: bool | None = None) -> Any:
        flat_ct, ct_spec = tree_flatten(cotangents)
        if ct_spec != out_spec:
            raise RuntimeError("Expected pytree structure of cotangents to be the same as pytree structure of "
                               "outputs to the function.")
        with torch.enable_grad():
            grads = tree_unflatten(_grads(flat_out, flat_diff, flat_ct), diff_spec)
        return grads if argnums is not None else tuple(grads)

    vjp_fn._jvpc_rows = True  # jacrev maps it over the basis: row by row (_vmap_rows)
    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def _vmap_rows(func: Callable, in_dims=0, out_dims=0, randomness="error", *, chunk_size=None) -> Callable:
    """vmap of a vjp_fn above (jacrev's rows): the cotangents one by one, the results stacked."""
    if not getattr(func, "_jvpc_rows", False) or in_dims != 0 or out_dims != 0:
        return _originals["vmap"](func, in_dims, out_dims, randomness, chunk_size=chunk_size)

    def rows(basis):
        leaves, spec = tree_flatten(basis)
        results = [func(tree_unflatten([t[i] for t in leaves], spec)) for i in range(leaves[0].shape[0])]
        flat = [tree_flatten(r) for r in results]
        return tree_unflatten([torch.stack(parts) for parts in zip(*(f[0] for f in flat))], flat[0][1])

    return rows


_on = threading.local()  # this thread is tracing: torch.func's reverse transforms go to autograd
_originals: dict[str, Callable] = {}


def _install() -> None:
    """Puts a dispatcher in place of each of torch.func's implementations, once: the thread that
    traces gets autograd's, every other thread torch.func's own."""
    if _originals:
        return
    for name, ours in (("grad_impl", _grad_impl), ("grad_and_value_impl", _grad_and_value_impl),
                       ("_vjp_with_argnums", _vjp_with_argnums), ("vmap", _vmap_rows)):
        original = getattr(eager_transforms, name)
        _originals[name] = original

        def dispatch(*args, _ours=ours, _original=original, **kwargs):
            return (_ours if getattr(_on, "depth", 0) else _original)(*args, **kwargs)

        setattr(eager_transforms, name, functools.wraps(original)(dispatch))


@contextlib.contextmanager
def reverse_by_autograd():
    """torch.func.grad, grad_and_value and vjp run by torch.autograd on this thread while it is on."""
    _install()
    _on.depth = getattr(_on, "depth", 0) + 1
    try:
        yield
    finally:
        _on.depth -= 1
