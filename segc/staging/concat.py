"""The concatenated weights of ``segc.jit(..., concat_projections=True)``.

The ``concat_projections`` pass (``segc.passes.concat``) gives a graph parameters named
``segc:concat(a,b,c)``: the weights ``a``, ``b``, ``c`` concatenated along their rows.
:class:`Concats` builds each one from the module's current parameters, once: it keeps
the members it was built from and builds again only when one of them is another array
(the caller loaded new weights).

So that no weight is held twice, the module's own parameters are then *rebound* to row
slices of the concatenation (``rebind``: the gatherer writes them where they live in the
module tree). MLX evaluates a row slice of a contiguous array as a view of its buffer,
so the module's values and its eager outputs do not change, and the old arrays are
freed once nothing else holds them (the gatherer's dict follows the rebinding, so the
first call frees each group's members as it goes). Concatenations are shared by every jitted function
of the process (weakly, by the identity of the views they handed out), so that two
functions over one module find each other's instead of building and rebinding in turn.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable

import mlx.core as mx

from ..passes.concat import members

Rebind = Callable[[dict[str, mx.array]], None]
Ref = Callable[[], "mx.array | None"]

# every concatenation built with views handed out, by the identities of those views
_SHARED: dict[tuple[int, ...], tuple[list[Ref], Ref]] = {}


def _shared(arrays: list[mx.array]) -> mx.array | None:
    """The live concatenation whose views ``arrays`` are, if any."""
    hit = _SHARED.get(tuple(map(id, arrays)))
    if hit is None or not all(r() is a for r, a in zip(hit[0], arrays)):
        return None
    return hit[1]()


def _share(views: list[mx.array], cat: mx.array) -> None:
    for k in [k for k, (rs, c) in _SHARED.items() if c() is None or any(r() is None for r in rs)]:
        del _SHARED[k]
    _SHARED[tuple(map(id, views))] = ([weakref.ref(v) for v in views], weakref.ref(cat))


class Concats:
    def __init__(self, rebind: Rebind | None = None):
        self._rebind = rebind
        self._built: dict[str, tuple[list[mx.array], mx.array]] = {}

    def get(self, path: str, params: dict[str, mx.array]) -> mx.array:
        names = members(path)
        assert names is not None, path
        arrays = [params[n] for n in names]
        hit = self._built.get(path)
        if hit is not None and all(map(operator.is_, hit[0], arrays)):
            return hit[1]
        if (cat := _shared(arrays)) is not None:  # another function built it from these
            self._built[path] = (arrays, cat)
            return cat
        cat = mx.concatenate(arrays, axis=0)
        views: list[mx.array] = []
        start = 0
        for a in arrays:
            views.append(cat[start : start + a.shape[0]])
            start += a.shape[0]
        mx.eval(cat, views)  # once per set of weights: views of the buffer from here on
        if self._rebind is not None:
            self._rebind(dict(zip(names, views)))
            self._built[path] = (views, cat)
            _share(views, cat)
        else:
            self._built[path] = (arrays, cat)
        return cat

    def clear(self) -> None:
        self._built.clear()


def is_concat(path: str) -> bool:
    return members(path) is not None
