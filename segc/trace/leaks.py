"""Arrays a trace leaves where the caller can see them (JAX's leaked tracers).

A function may store an array it computes in an object it reaches without segc knowing:
a KV cache it closes over instead of taking it as an argument or in ``state=``, a list it
appends to, a captured module's buffer. Under a trace those arrays are MLX's
placeholders: kept, they fail at their next use with an error from deep inside MLX,
far from the cause. :func:`watch` records what the function reaches (its closure, the
globals it names, a bound method's object, a partial's arguments, a module's
attributes) before the trace; :meth:`Watch.leaks` afterwards names every place that
holds an array that was not there before, and :meth:`Watch.restore` puts every object
back as it was. A module's own arrays that its forward assigns (BatchNorm's running
statistics) are found the same way, in the trace's private copy of the module
(:func:`assigned_params`).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

_LEAVES = (str, bytes, int, float, complex, bool, type(None), mx.array, mx.Dtype)
_SKIP = (type, types.ModuleType, types.BuiltinFunctionType, types.CodeType)
_LIMIT = 20000  # containers recorded at most: a walk is bounded whatever the function reaches
_DEPTH = 8
_WIDE = 4096  # containers of more entries are not entered (nor checked)


@dataclass
class Watch:
    """Every container reached, with a shallow copy of what it held, and a second handle
    on every array reached: ``a[i] = v`` on an ``mx.array`` rebinds that Python object
    to a new graph node in place (an mlx-lm ``KVCache`` writes so), and the second
    handle keeps the old one."""

    saved: list[tuple[str, Any, str, Any]] = field(default_factory=list)  # (path, obj, how, copy)
    before: dict[int, tuple[mx.array, mx.array]] = field(default_factory=dict)  # id -> (array, old handle)
    broken: set[int] = field(default_factory=set)  # arrays rebound in place to the trace's values

    def leaks(self, allowed: Iterable[mx.array] = ()) -> list[str]:
        """Places that now hold an array not there before (nor in ``allowed``), or an
        array of before that a write in place bound to the trace's placeholders (it can
        no longer be evaluated)."""
        self.broken = {i for i, (a, _) in self.before.items() if not _evaluable(a)}
        known = set(self.before) | {id(a) for a in allowed}
        out = []
        for path, obj, how, _ in self.saved:
            for key, v in _items(obj, how):
                if not isinstance(v, mx.array):
                    continue
                # a new array is a leak only if it reads the trace's placeholders: one made of
                # constants (a table a module caches on first use) evaluates, as in eager MLX
                if id(v) in self.broken or (id(v) not in known and not _evaluable(v)):
                    out.append(f"{path}{_key(key, how)}")
        return out

    def restore(self) -> None:
        """Every container as it was, arrays written in place by their old handles."""
        old = {i: self.before[i][1] for i in self.broken}

        def fix(v: Any) -> Any:
            return old.get(id(v), v) if isinstance(v, mx.array) else v

        for _, obj, how, copy in self.saved:
            if how == "list":
                obj[:] = [fix(v) for v in copy]
            elif how == "dict":
                dict.clear(obj)
                dict.update(obj, {k: fix(v) for k, v in copy.items()})
            else:
                obj.__dict__.clear()
                obj.__dict__.update({k: fix(v) for k, v in copy.items()})


def _evaluable(a: mx.array) -> bool:
    try:
        mx.eval(a)
    except RuntimeError:  # "Attempting to eval an array without a primitive": a placeholder's
        return False
    return True


def _items(obj: Any, how: str) -> Iterable[tuple[Any, Any]]:
    if how == "list":
        return enumerate(list(obj))
    if how == "dict":
        return list(dict.items(obj))
    return list(obj.__dict__.items())


def _key(key: Any, how: str) -> str:
    return f".{key}" if how == "attrs" else f"[{key!r}]"


def roots(fn: Any) -> list[tuple[str, Any]]:
    """What ``fn`` reaches without being passed it: closure cells, the globals its code
    names, a bound method's object, a partial's arguments, a callable object's
    attributes."""
    out: list[tuple[str, Any]] = []
    if isinstance(fn, functools.partial):
        out += [(f"partial argument {k}", a) for k, a in enumerate(fn.args)]
        out += [(f"partial argument {k!r}", a) for k, a in (fn.keywords or {}).items()]
        return out + roots(fn.func)
    if isinstance(fn, types.MethodType):
        return [("self", fn.__self__), *roots(fn.__func__)]
    if isinstance(fn, types.FunctionType):
        code = fn.__code__
        out += [
            (f"captured {n!r}", c.cell_contents) for n, c in zip(code.co_freevars, fn.__closure__ or ()) if _full(c)
        ]
        names = set(_names(code))
        out += [(f"global {n!r}", fn.__globals__[n]) for n in sorted(names) if n in fn.__globals__]
        return out
    if hasattr(fn, "__dict__") and not isinstance(fn, _SKIP):
        out.append(("self", fn))
    return out


def _attrs(obj: Any) -> dict | None:
    """``obj.__dict__`` if it has a plain one; None for ``__slots__``, a mapping proxy, or
    a proxy object whose attribute lookup raises (a context-local outside its context)."""
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:  # whatever a lookup raises, the object is not walked
        return None
    return attrs if type(attrs) is dict else None


def _full(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell (a name assigned later)
        return False
    return True


def _names(code: types.CodeType) -> Iterable[str]:
    yield from code.co_names
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _names(c)


def watch(named: list[tuple[str, Any]], skip: Iterable[Any] = ()) -> Watch:
    """Record the containers reachable from ``named`` (see the module). Objects in
    ``skip`` (state objects segc functionalizes itself) are not entered."""
    w = Watch()
    seen = {id(o) for o in skip}
    stack: list[tuple[str, Any, int]] = [(p, o, 0) for p, o in reversed(named)]
    while stack and len(w.saved) < _LIMIT:
        path, obj, depth = stack.pop()
        if isinstance(obj, mx.array):
            if id(obj) not in w.before:
                w.before[id(obj)] = (obj, obj.reshape(obj.shape))  # a second handle, no copy
            continue
        if isinstance(obj, _LEAVES + _SKIP) or id(obj) in seen or depth > _DEPTH:
            continue
        seen.add(id(obj))
        kids: list[tuple[str, Any]] = []
        if isinstance(obj, list | tuple | dict) and len(obj) > _WIDE:
            continue  # a table of thousands (a vocabulary): not where a cache or a list of outputs lives
        if isinstance(obj, types.FunctionType):
            kids = [(f"{path} -> {p}", o) for p, o in roots(obj) if not p.startswith("global")]
        elif isinstance(obj, list):
            w.saved.append((path, obj, "list", list(obj)))
            kids = [(f"{path}[{k}]", v) for k, v in enumerate(obj)]
        elif isinstance(obj, tuple):
            kids = [(f"{path}[{k}]", v) for k, v in enumerate(obj)]
        elif isinstance(obj, dict):  # nn.Module too: its arrays and submodules are items
            w.saved.append((path, obj, "dict", dict(obj)))
            kids = [(f"{path}[{k!r}]", v) for k, v in dict.items(obj)]
        attrs = _attrs(obj) if not isinstance(obj, types.FunctionType) else None
        if attrs is not None and len(attrs) <= _WIDE:
            w.saved.append((path, obj, "attrs", dict(attrs)))
            kids += [(f"{path}.{k}", v) for k, v in attrs.items()]
        stack.extend((p, v, depth + 1) for p, v in reversed(kids))
    return w


def assigned_params(module: nn.Module, bound: dict[str, Any]) -> list[str]:
    """Parameters of ``module`` (the trace's private copy) that its forward assigned:
    paths whose array is no longer the one the trace bound there."""
    out = []
    for path, v in _param_items(module, ""):
        if path in bound and v is not bound[path]:
            out.append(path)
    return out


def _param_items(c: Any, prefix: str) -> Iterable[tuple[str, Any]]:
    items = dict.items(c) if isinstance(c, dict) else enumerate(c)
    for k, v in items:
        if isinstance(k, str) and k.startswith("_"):
            continue
        path = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, mx.array):
            yield path, v
        elif isinstance(v, dict | list):
            yield from _param_items(v, path)
