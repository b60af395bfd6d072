"""jvpc.linearize(..., cache=True): one cache of optimized graphs (compiler/api/linearize_cache.h)
per function, which lives as long as the function does (a bound method's: as its object)."""

from __future__ import annotations

import inspect
import weakref
from typing import Callable

from . import _C

_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def cache_for(func: Callable):
    """func's cache, made on first use; None where func cannot be weakly referenced."""
    owner = func.__self__ if inspect.ismethod(func) else func
    try:
        cache = _caches.get(owner)
        if cache is None:
            cache = _caches[owner] = _C._LinearizeCache()
    except TypeError:
        return None
    return cache
