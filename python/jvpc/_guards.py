"""What a compiled program's trace depended on besides its tensors, and the check of it at every
call (jvpc.compile). The table of what is checked and what is assumed is in docs/python.md.

A trace records kernels; the Python that ran around them is gone from the graph, and with it
every value Python read: a module's `training` flag and its hooks, a number read from a module
attribute or a global, grad mode and autocast, a tensor's value turned into a Python number.
While compile traces, this module records those reads (`recording`), and the program checks
them before each call (`Guards.failure`), as torch.compile's guards do:

- Attributes read from the modules and plain objects the function reaches: their classes'
  `__getattribute__` is wrapped while tracing, and each read of a value in an instance's
  `__dict__` is kept: numbers, strings and None by value, modules and tensors by identity (a
  swapped `self.model`, a rebound tensor attribute), a module's hook dictionaries by their keys.
- Globals the code names (the function's, its helpers', the reached classes' methods'), and the
  closure cells of the functions reached: numbers by value, tensors, modules and functions by
  identity.
- Global state: grad mode, autocast (per device type: enabled and dtype), the default dtype.
- Tensors turned into Python values (`.item()`, `.tolist()`, `.numpy()`, `float(t)`, `bool(t)`,
  ...): refused where computed from the inputs or weights (the program would replay the number),
  and otherwise guarded by the version of the captured tensors they were computed from.
- Python's and NumPy's global random generators: a trace that draws from them is refused (the
  program would replay the number drawn).
"""

from __future__ import annotations

import contextlib
import functools
import random as _py_random
import sys
import types
from typing import Any, Callable

import torch
from torch import nn

from . import _C
from ._C import Error
from ._pytrees import same_value
from ._weights import code_names, is_number, reached

_MISSING = object()
# nn.Module's hook dictionaries, which nn.Module.__call__ reads: guarded by their keys (a hook's
# handle id), so that a hook added or removed is seen.
_HOOK_DICTS = frozenset({"_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
                         "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
                         "_forward_hooks_always_called"})
# Module-level hooks every module's call reads.
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_always_called")


def _describe(v: Any) -> str:
    if is_number(v):
        return repr(v)
    return f"a {type(v).__name__} at {id(v):#x}"


# --- recording reads while tracing ----------------------------------------------------------

class Reads:
    """What a trace read: attributes of watched objects, tensors turned into Python values."""

    def __init__(self, labels: dict[int, str]):
        self.labels = labels  # id -> a name for messages ("self.blocks.0.attn")
        self.attributes: dict[tuple[int, str], tuple[Any, str, Any]] = {}  # (id, name) -> (obj, name, value)
        self.captured: list[tuple[torch.Tensor, int, str]] = []  # tensors a Python value came from


def _wrap_getattribute(cls: type, watched: dict[int, Any], reads: Reads):
    original = cls.__getattribute__
    own = cls.__dict__.get("__getattribute__", _MISSING)

    def __getattribute__(self, name):
        value = original(self, name)
        if id(self) in watched and (id(self), name) not in reads.attributes:
            d = object.__getattribute__(self, "__dict__") if hasattr(type(self), "__dict__") else None
            if d is not None and name in d and d[name] is value:
                reads.attributes[(id(self), name)] = (self, name, value)
        return value

    try:
        cls.__getattribute__ = __getattribute__
    except TypeError:  # a type implemented in C (an immutable type): its reads are not recorded
        return lambda: None

    def restore():
        if own is _MISSING:
            del cls.__getattribute__
        else:
            cls.__getattribute__ = own
    return restore


class _ValueReads(torch.overrides.TorchFunctionMode):
    """Sees the tensor methods that turn values into Python numbers while compile traces."""

    _METHODS = {torch.Tensor.item: "item()", torch.Tensor.tolist: "tolist()", torch.Tensor.numpy: "numpy()",
                torch.Tensor.__float__: "float()", torch.Tensor.__int__: "int()", torch.Tensor.__bool__: "bool()",
                torch.Tensor.__index__: "an index", torch.Tensor.__complex__: "complex()",
                torch.Tensor.__array__: "numpy.asarray()"}

    def __init__(self, reads: Reads, who: str):
        super().__init__()
        self.reads, self.who = reads, who

    def __torch_function__(self, func, types, args=(), kwargs=None):
        how = self._METHODS.get(func)
        if how is not None and args and isinstance(args[0], torch.Tensor):
            origin = _C._trace_value_origin(args[0])
            if origin is not None:
                from_inputs, captured = origin
                if from_inputs:
                    raise Error(f"{self.who}: the function reads a value computed from its inputs or weights into "
                                f"Python ({how}); the program would replay that number at other inputs: keep the "
                                "computation in tensors, or use jvpc.linearize")
                for t in captured:
                    self.reads.captured.append((t, t._version, how))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def recording(func: Callable, who: str):
    """Records, around compile's trace of func, what Guards checks afterwards."""
    modules, objects, _ = reached(func)
    watched: dict[int, Any] = {}
    labels: dict[int, str] = {}
    for name, m in modules:
        for sub_name, sub in m.named_modules(remove_duplicate=False):
            watched[id(sub)] = sub
            labels.setdefault(id(sub), f"{name}.{sub_name}" if sub_name else name)
    for name, o in objects:
        watched[id(o)] = o
        labels.setdefault(id(o), name)
    reads = Reads(labels)
    restores = []
    py_state = _py_random.getstate()
    np_random = sys.modules.get("numpy.random")
    np_state = np_random.get_state() if np_random is not None else None
    try:
        for cls in {type(o) for o in watched.values()}:
            restores.append(_wrap_getattribute(cls, watched, reads))
        with _ValueReads(reads, who):
            yield reads
    finally:
        for r in restores:
            r()
    if _py_random.getstate() != py_state:
        raise Error(f"{who}: the function draws from Python's random module; the program would replay the number "
                    "drawn at every call: draw with torch (torch.rand), or use jvpc.linearize")
    if np_random is not None and not _same_np_state(np_random.get_state(), np_state):
        raise Error(f"{who}: the function draws from NumPy's global random generator; the program would replay the "
                    "number drawn at every call: draw with torch (torch.rand), or use jvpc.linearize")


def _same_np_state(a, b) -> bool:
    return a[0] == b[0] and (a[1] == b[1]).all() and a[2:] == b[2:]


# --- the checks ---------------------------------------------------------------------------

def global_state() -> tuple:
    """Grad mode, the default dtype, forward AD's switch (off, the trace gives no tangents),
    autocast per device type: what a trace may have branched on."""
    state = [torch.is_grad_enabled(), torch.get_default_dtype(), torch._C._is_fwd_grad_enabled()]
    for dev in _AUTOCAST_DEVICES:
        on = torch.is_autocast_enabled(dev)
        state.append((on, torch.get_autocast_dtype(dev) if on else None))
    return tuple(state)


_AUTOCAST_DEVICES = ("cpu", "cuda")


def _describe_state(i: int, v) -> tuple[str, str]:
    """(what, its value) of global_state()'s entry i."""
    if i == 0:
        return "grad mode", "on" if v else "off"
    if i == 1:
        return "the default dtype", str(v).removeprefix("torch.")
    if i == 2:
        return "forward AD (_set_fwd_grad_enabled)", "on" if v else "off"
    on, dtype = v
    return f"autocast on {_AUTOCAST_DEVICES[i - 3]}", str(dtype).removeprefix("torch.") if on else "off"


class Guards:
    """The checks of one traced graph. failure() names the first thing that changed, or None."""

    def __init__(self, reads: Reads, func: Callable, state: tuple):
        self._state = state
        self._entries: list[tuple[dict, str, Any, str]] = []  # (namespace, key, value, what)
        self._hooks: list[tuple[dict, tuple, str]] = []  # (hook dict, its keys, what)
        for obj, name, value in reads.attributes.values():
            what = f"{reads.labels.get(id(obj), type(obj).__name__)}.{name}"
            if name in _HOOK_DICTS and isinstance(value, dict):
                self._hooks.append((value, _user_hooks(value), what))
            elif is_number(value) or isinstance(value, (nn.Module, torch.Tensor, types.FunctionType)):
                self._entries.append((vars(obj), name, value, what))
        import torch.nn.modules.module as mm
        for h in _GLOBAL_HOOKS:
            d = getattr(mm, h, None)
            if isinstance(d, dict):
                self._hooks.append((d, _user_hooks(d), f"torch.nn.modules.module.{h}"))
        _, _, functions = reached(func)
        self._cells: list[tuple[Any, Any, str]] = []  # (closure cell, value, what)
        for f in functions:
            for name, cell in zip(f.__code__.co_freevars, f.__closure__ or ()):
                v = cell.cell_contents if _filled(cell) else _MISSING
                if is_number(v) or isinstance(v, (torch.Tensor, nn.Module, types.FunctionType)):
                    self._cells.append((cell, v, f"'{name}' of {f.__qualname__}'s closure"))
        for f in functions + _methods(reads):
            scope = f.__globals__
            for g in set(code_names(f.__code__)):
                v = scope.get(g, _MISSING)
                if v is not _MISSING and (is_number(v) or isinstance(v, (torch.Tensor, nn.Module, types.FunctionType))):
                    self._entries.append((scope, g, v, f"global '{g}' of {f.__module__}"))
        self._captured = [(t, version, how) for t, version, how in reads.captured]

    def failure(self) -> str | None:
        now = global_state()
        if now != self._state:
            for i, (a, b) in enumerate(zip(now, self._state)):
                if a != b:
                    (what, value), (_, then) = _describe_state(i, a), _describe_state(i, b)
                    return f"{what} is {value} (traced with {then})"
        for d, key, then, what in self._entries:
            v = d.get(key, _MISSING)
            if v is not then and (not is_number(then) or not same_value(v, then)):
                return f"{what} is {'gone' if v is _MISSING else _describe(v)} (traced with {_describe(then)})"
        for cell, then, what in self._cells:
            v = cell.cell_contents if _filled(cell) else _MISSING
            if v is not then and (not is_number(then) or not same_value(v, then)):
                return f"{what} is {'gone' if v is _MISSING else _describe(v)} (traced with {_describe(then)})"
        for d, keys, what in self._hooks:
            if (d or keys) and _user_hooks(d) != keys:
                return f"{what} changed: a hook was added or removed"
        for t, version, how in self._captured:
            if t._version != version:
                return (f"a captured {_meta(t)} whose value the function read into Python ({how}) was written "
                        "since")
        return None


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def _user_hooks(hooks: dict) -> tuple:
    """The keys of a hook dictionary's hooks but torch's own observers (FlopCounterMode's module
    tracker registers global hooks while it counts; they read, and change nothing)."""
    return tuple(k for k, h in hooks.items()
                 if not (getattr(h, "__module__", None) or "").startswith("torch."))


def _methods(reads: Reads) -> list[Callable]:
    """The Python functions defined by the classes of the objects whose attributes a trace read."""
    out, seen = [], set()
    for obj, _, _ in reads.attributes.values():
        for cls in type(obj).__mro__:
            if cls in seen or cls.__module__.startswith("torch.") or cls is object:
                continue
            seen.add(cls)
            out.extend(v for v in vars(cls).values() if isinstance(v, types.FunctionType))
    return out


def _meta(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} tensor"
