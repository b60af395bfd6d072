"""Weights bound by name: the parameters and buffers of the modules a function reaches, as
torch.func.functional_call binds them.

The modules `func` reaches are found where Python keeps them (`reached`): `func` itself (a module),
the object of a bound method (`net.forward`, a trainer's `self.step`), a functools.partial's
arguments, the closure cells and globals `func`'s code names, the attributes of the plain objects
found so (a trainer's `self.model`), and the same for every function found. A compiled program takes their tensors as inputs of its primal graph
(held constant, without tangents) and reads them again, by name, at every call: a replaced
parameter (`m.weight = nn.Parameter(...)`), `load_state_dict(..., assign=True)` and an EMA swap
are seen, and autograd reaches the parameters the call read. A linear map (`jvpc.linearize`) is
for the weights it was made with: its jvp_fn refuses to run once one was replaced, rebound
(`p.data = ...`) or written in place since; a write through `p.data`, which moves no version
counter, is seen where it changes the checksum of a CPU weight's bytes (docs/training.md).
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Any, Callable

import torch
from torch import nn

from . import _C
from ._C import Error
from ._compat import reparametrize_module
from ._pytrees import Inputs


_NUMBERS = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device)


def is_number(v: Any) -> bool:
    """A Python value a trace bakes in as it is: a number, a string, None, a dtype, a device, or a
    short tuple of them."""
    if isinstance(v, _NUMBERS):
        return True
    return isinstance(v, tuple) and len(v) <= 16 and all(isinstance(x, _NUMBERS) for x in v)


def code_names(code: types.CodeType) -> list[str]:
    """The global and attribute names a code object and the code nested in it name."""
    out = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out.extend(code_names(c))
    return out


def reached(func: Callable, depth: int = 3) -> tuple[list[tuple[str, nn.Module]], list[tuple[str, Any]], list[Callable]]:
    """The modules, plain objects and Python functions `func` reaches: func itself, a bound
    method's object, functools.partial's arguments, closure cells, the globals its code names,
    the attributes of plain objects found so (a trainer's `self.model`), and the same of each
    function found, `depth` levels deep. Modules and objects come with a name ("self",
    "self.model", a global's name); submodules of another module found are left out."""
    modules: list[tuple[str, nn.Module]] = []
    objects: list[tuple[str, Any]] = []
    functions: list[Callable] = []
    seen: set[int] = set()

    def visit(name: str, obj: Any, level: int) -> None:
        if id(obj) in seen or level > depth:
            return
        if isinstance(obj, nn.Module):
            seen.add(id(obj))
            modules.append((name, obj))
        elif isinstance(obj, functools.partial):
            seen.add(id(obj))
            for i, a in enumerate(obj.args):
                visit(f"arg{i}", a, level)
            for k, a in obj.keywords.items():
                visit(k, a, level)
            visit(name, obj.func, level)
        elif isinstance(obj, types.MethodType):
            seen.add(id(obj))
            visit(name, obj.__self__, level)
            visit(name, obj.__func__, level)
        elif isinstance(obj, types.FunctionType):
            seen.add(id(obj))
            functions.append(obj)
            for cell_name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
                with contextlib.suppress(ValueError):  # an empty cell
                    visit(cell_name, cell.cell_contents, level + 1)
            scope = obj.__globals__
            for g in code_names(obj.__code__):
                v = scope.get(g)
                if isinstance(v, (nn.Module, functools.partial, types.MethodType, types.FunctionType)) or \
                        _plain_object(v):
                    visit(g, v, level + 1)
        elif _plain_object(obj):
            seen.add(id(obj))
            objects.append((name, obj))
            for k, v in list(vars(obj).items()):
                if isinstance(v, (nn.Module, types.FunctionType, types.MethodType)) or _plain_object(v):
                    visit(f"{name}.{k}", v, level + 1)

    visit("self", func, 0)
    if len(modules) > 1:
        inner = {id(sub) for _, m in modules for sub in list(m.modules())[1:]}
        modules = [(n, m) for n, m in modules if id(m) not in inner]
    return modules, objects, functions


def _plain_object(v: Any) -> bool:
    """An instance of a Python class of the user's, holding attributes (a trainer, a config): not a
    module, tensor, class, function, container, number, or an object of Python's or torch's own."""
    if v is None or is_number(v) or isinstance(v, (nn.Module, torch.Tensor, type, types.ModuleType, types.FunctionType,
                                                   types.MethodType, types.BuiltinFunctionType, functools.partial,
                                                   list, tuple, dict, set, frozenset)):
        return False
    module = getattr(type(v), "__module__", None) or "builtins"
    return hasattr(v, "__dict__") and module != "builtins" and module.split(".")[0] not in ("torch", "jvpc", "numpy")


class Weights:
    """The named parameters and buffers of the modules a function reaches, and how to read them."""

    def __init__(self, func: Callable):
        roots = reached(func)[0]
        self._roots = roots
        self._where: list[tuple[int, tuple[str, ...], str, str]] = []  # root, module path, "_parameters"/"_buffers", key
        self._found: list[torch.Tensor] = []  # the tensors bound when found
        # Tied weights (one tensor under several names) are bound once, under their first name;
        # the others are (root, module path, kind, key, the index of the first).
        self._ties: list[tuple[int, tuple[str, ...], str, str, int]] = []
        for r, (_, root) in enumerate(roots):
            entries, ties = _named_weights(root)
            first = len(self._where)
            for path, kind, key, t in entries:
                self._where.append((r, path, kind, key))
                self._found.append(t)
            self._ties.extend((r, path, kind, key, first + i) for path, kind, key, i in ties)
        self._names: list[str] | None = None
        self._metas = None

    @property
    def names(self) -> list[str]:
        """Each weight's name, as functional_call takes it ("blocks.0.attn.qkv.weight"), prefixed by
        its root's name where func reaches more than one module."""
        if self._names is None:
            several = len(self._roots) > 1
            self._names = [(self._roots[r][0] + "." if several else "") + ".".join(path + (key,))
                           for r, path, _, key in self._where]
        return self._names

    def __len__(self) -> int:
        return len(self._where)

    def buffer_marks(self, n_inputs: int) -> list[bool]:
        """Per graph input of a function with these weights first (with_weights), whether it is a
        buffer: `buffers`, then False for the n_inputs - len(self) arguments' tensors."""
        return self.buffers + [False] * (n_inputs - len(self))

    @property
    def buffers(self) -> list[bool]:
        """Per weight, whether it is a buffer (a module's state, which its forward may write:
        BatchNorm's running statistics) rather than a parameter."""
        return [kind == "_buffers" for _, _, kind, _ in self._where]

    def _lookup(self, r: int, path: tuple[str, ...], kind: str, key: str):
        m = self._roots[r][1]
        try:
            for part in path:
                m = m._modules[part]
            t = getattr(m, kind)[key]
        except (AttributeError, KeyError):
            return None
        return t if isinstance(t, torch.Tensor) else None

    def read(self) -> list[torch.Tensor]:
        """The tensors bound now, by name."""
        out = []
        for i, (r, path, kind, key) in enumerate(self._where):
            t = self._lookup(r, path, kind, key)
            if t is None:
                raise Error(f"{'parameter' if kind == '_parameters' else 'buffer'} '{self.names[i]}' is gone "
                            "from its module; compile again for the module as it is")
            out.append(t)
        return out

    def read_by_attribute(self) -> list[torch.Tensor]:
        """read() by attribute access alone (module.sub.weight), which torch.compile's Dynamo traces,
        lifting each tensor as an input of its graph; no checks (the program's call checks them)."""
        out = []
        for r, path, _, key in self._where:
            m = self._roots[r][1]
            for part in path:
                m = getattr(m, part)
            out.append(getattr(m, key))
        return out

    def remember_metas(self) -> None:
        """Keeps the shape, dtype and device of each weight bound now, which read_if_unchanged expects."""
        self._metas = [(t.shape, t.dtype, t.device) for t in self.read()]

    def read_if_unchanged(self) -> tuple[list[torch.Tensor] | None, str | None]:
        """(read(), None) where every weight is still there with the shape, dtype and device of
        remember_metas() and the weights tied then still are; else (None, what changed)."""
        out = []
        for i, (r, path, kind, key) in enumerate(self._where):
            t = self._lookup(r, path, kind, key)
            if t is None:
                return None, f"{'parameter' if kind == '_parameters' else 'buffer'} '{self.names[i]}' is gone"
            shape, dtype, device = self._metas[i]
            if t.shape != shape or t.dtype != dtype or t.device != device:
                return None, (f"parameter '{self.names[i]}' is {_meta(t.shape, t.dtype, t.device)} (traced with "
                              f"{_meta(shape, dtype, device)})")
            out.append(t)
        for r, path, kind, key, first in self._ties:
            if self._lookup(r, path, kind, key) is not out[first]:
                name = ".".join(path + (key,))
                return None, f"'{name}' is no longer tied to '{self.names[first]}' (tied when traced)"
        return out, None

    @contextlib.contextmanager
    def bound(self, tensors: list[torch.Tensor]):
        """The modules with `tensors` in place of their weights, by name (functional_call's binding)."""
        per_root: list[dict[str, torch.Tensor]] = [{} for _ in self._roots]
        for (r, path, _, key), t in zip(self._where, tensors):
            per_root[r][".".join(path + (key,))] = t
        with contextlib.ExitStack() as stack:
            for (_, root), d in zip(self._roots, per_root):
                stack.enter_context(reparametrize_module(root, d))
            yield

    def release(self) -> None:
        """Forgets the tensors bound when found, which only stamp() reads: a compiled program reads
        its weights by name at each call, and holds none it was compiled with."""
        self._found = []

    def stamp(self):
        """What a linear map was made with: each weight as found when these Weights were made, its
        data pointer, its version and, in CPU memory, a checksum of its bytes (a write through
        .data moves no version counter)."""
        return _C._WeightStamp(self._found)

    def check_stamp(self, stamp, who: str) -> None:
        """Refuses a linear map whose weights were replaced, rebound (.data = ...) or written since."""
        change = stamp.changed(self.read())
        if change is not None:
            i, how = change
            what = "parameter" if self._where[i][2] == "_parameters" else "buffer"
            raise Error(f"{who}'s jvp_fn: {what} '{self.names[i]}' was {how} since jvpc.linearize (the linear "
                        "map holds values computed from the old one): linearize again")


def with_weights(func: Callable, weights: Weights, args, diff: tuple[int, ...], who: str, names: list[str]):
    """func taking the weights first (bound by name) and then its arguments, and those Inputs, the
    weights' leaves named as the weights; func and Inputs(args) as they are where there are none."""
    if not len(weights):
        return func, Inputs(args, diff, who, names)

    def bound(w, *a):
        with weights.bound(w):
            return func(*a)

    inputs = Inputs((weights.read(),) + tuple(args), tuple(i + 1 for i in diff), who, ["weights"] + names)
    inputs.names[:len(weights)] = weights.names
    return bound, inputs


def _named_weights(root: nn.Module):
    """(module path, "_parameters" or "_buffers", key, tensor) of each of root's named_parameters()
    and then named_buffers(), in their order, in one walk of the modules (a linearize walks them
    every call: the tables are read from each module's __dict__, where nn.Module keeps them); and
    (module path, kind, key, index of the first name) of each other name of a tied tensor."""
    params: list = []
    buffers: list = []
    ties: list = []
    seen_modules: set[int] = set()
    seen_params: dict[int, int] = {}
    seen_buffers: dict[int, int] = {}
    stack: list[tuple[nn.Module, tuple[str, ...]]] = [(root, ())]
    while stack:  # depth first, children in order, as named_parameters() walks them
        m, path = stack.pop()
        if id(m) in seen_modules:
            continue
        seen_modules.add(id(m))
        d = m.__dict__
        for key, t in (d["_parameters"] if "_parameters" in d else m._parameters).items():
            if t is None:
                continue
            if id(t) in seen_params:
                ties.append((path, "_parameters", key, seen_params[id(t)]))
                continue
            seen_params[id(t)] = len(params)
            params.append((path, "_parameters", key, t))
        for key, t in (d["_buffers"] if "_buffers" in d else m._buffers).items():
            if t is None:
                continue
            if id(t) in seen_buffers:
                ties.append((path, "_buffers", key, seen_buffers[id(t)]))  # offset by the parameters below
                continue
            seen_buffers[id(t)] = len(buffers)
            buffers.append((path, "_buffers", key, t))
        subs = d["_modules"] if "_modules" in d else m._modules
        if subs:
            stack.extend([(sub, path + (key,)) for key, sub in reversed(subs.items()) if sub is not None])
    ties = [(p, kind, key, i + (len(params) if kind == "_buffers" else 0)) for p, kind, key, i in ties]
    return params + buffers, ties


def _meta(shape, dtype, device) -> str:
    return f"{str(dtype).removeprefix('torch.')}{list(shape)} on {device}"


@contextlib.contextmanager
def buffers_kept(buffers: list[torch.Tensor]):
    """Leaves the modules' buffers as they were: writes to them by a run that is not a call's (a
    trace, a backward running func again; BatchNorm's running statistics) are undone. A buffer the
    run did not change is not written, so that its version stays and the linear maps made from
    the module earlier, and autograd's saved copies, see no write."""
    saved = [b.clone() for b in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                if not torch.equal(b, s):
                    b.copy_(s)
