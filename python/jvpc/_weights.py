"""Weights bound by name: the parameters and buffers of the modules a function reaches, as
torch.func.functional_call binds them.

The modules `func` reaches are found where Python keeps them: `func` itself (a module), the module
of a bound method (`net.forward`), a functools.partial's arguments, and the closure cells and
globals `func`'s code names. A compiled program takes their tensors as inputs of its primal graph
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
from typing import Any, Callable

import torch
from torch import nn

from . import _C
from ._C import Error
from ._compat import reparametrize_module
from ._pytrees import Inputs


def modules_reached(func: Callable) -> list[tuple[str, nn.Module]]:
    """(name, module) for each module func reaches; submodules of another one found are left out."""
    found: list[tuple[str, nn.Module]] = []

    def add(name: str, obj: Any) -> None:
        if isinstance(obj, nn.Module) and all(obj is not m for _, m in found):
            found.append((name, obj))

    while isinstance(func, functools.partial):
        for i, a in enumerate(func.args):
            add(f"arg{i}", a)
        for k, a in func.keywords.items():
            add(k, a)
        func = func.func
    add("self", func)
    add("self", getattr(func, "__self__", None))
    code = getattr(func, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, getattr(func, "__closure__", None) or ()):
            with contextlib.suppress(ValueError):  # an empty cell
                add(name, cell.cell_contents)
        scope = getattr(func, "__globals__", {})
        for name in code.co_names:
            add(name, scope.get(name))
    if len(found) < 2:
        return found
    inner = {id(sub) for _, m in found for sub in list(m.modules())[1:]}
    return [(n, m) for n, m in found if id(m) not in inner]


class Weights:
    """The named parameters and buffers of the modules a function reaches, and how to read them."""

    def __init__(self, func: Callable):
        roots = modules_reached(func)
        self._roots = roots
        self._where: list[tuple[int, tuple[str, ...], str, str]] = []  # root, module path, "_parameters"/"_buffers", key
        self._found: list[torch.Tensor] = []  # the tensors bound when found
        for r, (_, root) in enumerate(roots):
            for path, kind, key, t in _named_weights(root):
                self._where.append((r, path, kind, key))
                self._found.append(t)
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

    def read(self) -> list[torch.Tensor]:
        """The tensors bound now, by name."""
        out = []
        for i, (r, path, kind, key) in enumerate(self._where):
            m = self._roots[r][1]
            try:
                for part in path:
                    m = m._modules[part]
                t = getattr(m, kind)[key]
            except (AttributeError, KeyError):
                t = None
            if not isinstance(t, torch.Tensor):
                raise Error(f"{'parameter' if kind == '_parameters' else 'buffer'} '{self.names[i]}' is gone "
                            "from its module; compile again for the module as it is")
            out.append(t)
        return out

    def remember_metas(self) -> None:
        """Keeps the shape, dtype and device of each weight bound now, which read_checked expects."""
        self._metas = [(t.shape, t.dtype, t.device) for t in self.read()]

    def read_checked(self, who: str) -> list[torch.Tensor]:
        """read(), each tensor checked against remember_metas(): shape, dtype, device."""
        out = self.read()
        for name, t, (shape, dtype, device) in zip(self.names, out, self._metas):
            if t.shape != shape or t.dtype != dtype or t.device != device:
                raise Error(f"{who}: parameter '{name}' is {_meta(t.shape, t.dtype, t.device)}, compiled for "
                            f"{_meta(shape, dtype, device)}; compile again for the new weights")
        return out

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


def _named_weights(root: nn.Module) -> list[tuple[tuple[str, ...], str, str, torch.Tensor]]:
    """(module path, "_parameters" or "_buffers", key, tensor) of each of root's named_parameters()
    and then named_buffers(), in their order, in one walk of the modules (a linearize walks them
    every call: the tables are read from each module's __dict__, where nn.Module keeps them)."""
    params: list = []
    buffers: list = []
    seen_modules: set[int] = set()
    seen_params: set[int] = set()
    seen_buffers: set[int] = set()
    stack: list[tuple[nn.Module, tuple[str, ...]]] = [(root, ())]
    while stack:  # depth first, children in order, as named_parameters() walks them
        m, path = stack.pop()
        if id(m) in seen_modules:
            continue
        seen_modules.add(id(m))
        d = m.__dict__
        for key, t in (d["_parameters"] if "_parameters" in d else m._parameters).items():
            if t is not None and id(t) not in seen_params:
                seen_params.add(id(t))
                params.append((path, "_parameters", key, t))
        for key, t in (d["_buffers"] if "_buffers" in d else m._buffers).items():
            if t is not None and id(t) not in seen_buffers:
                seen_buffers.add(id(t))
                buffers.append((path, "_buffers", key, t))
        subs = d["_modules"] if "_modules" in d else m._modules
        if subs:
            stack.extend([(sub, path + (key,)) for key, sub in reversed(subs.items()) if sub is not None])
    return params + buffers


def _meta(shape, dtype, device) -> str:
    return f"{str(dtype).removeprefix('torch.')}{list(shape)} on {device}"
