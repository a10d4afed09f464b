"""A minimal pytree: tuples, lists, dicts and None are nodes; everything else a leaf.
A namedtuple and an ``OrderedDict`` come back as themselves (the class is part of the
tree definition, as in ``jax.tree_util``).

Array leaves become graph inputs; hashable Python scalars and strings are *static*
leaves, kept inside the tree definition so they are part of the trace-cache key.

Why not ``mlx.utils.tree_flatten``/``tree_unflatten``: they flatten to ``(path, leaf)``
pairs and rebuild lists and dicts from the paths, so a tuple comes back as a list and a
static leaf has nowhere to live but the leaf list. The trace cache needs a hashable
structure that tells ``(x,)`` from ``[x]`` and keys static values; :class:`TreeDef` is
that structure. Module parameters, which are plain nested dicts and lists, do go through
``mlx.utils`` (``params.py``).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..errors import TraceError

STATIC_TYPES = (bool, int, float, str, bytes, type(None), mx.Dtype)


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def static_key(x: Any) -> tuple[str, Any]:
    """What identifies a static value in the trace-cache key: its type and its value, a
    float by its exact bits, so that values eager MLX treats differently never share an
    entry (``2``/``2.0``/``True``, ``0.0``/``-0.0``, ``nan``/``-nan``) and NaNs of one bit
    pattern do."""
    if isinstance(x, float):  # its 64 bits: x.hex() gives "nan" for every NaN, whatever its sign
        return type(x).__name__, struct.pack("<d", x).hex()
    if isinstance(x, mx.Dtype):
        return "Dtype", str(x)
    return f"{type(x).__module__}.{type(x).__qualname__}", x


@dataclass(frozen=True, slots=True)
class TreeDef:
    kind: str  # "leaf" | "static" | "tuple" | "list" | "dict" | "none"
    children: tuple[TreeDef, ...] = ()
    keys: tuple[Any, ...] = ()  # dict keys, or a static value's static_key (one element)
    value: Any = field(default=None, compare=False)  # a static value itself
    node: type | None = None  # a tuple's or dict's own class (a namedtuple, an OrderedDict)

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)

    def __str__(self) -> str:
        if self.kind == "leaf":
            return "*"
        if self.kind == "static":
            return repr(self.value)
        if self.kind == "none":
            return "None"
        inner = ", ".join(
            f"{k!r}: {c}" if self.kind == "dict" else str(c)
            for k, c in zip(self.keys or [None] * len(self.children), self.children)
        )
        return {"tuple": f"({inner})", "list": f"[{inner}]", "dict": f"{{{inner}}}"}[self.kind]


def flatten(
    tree: Any, path: str = "", *, what: str = "argument", names: tuple[str, ...] | None = None
) -> tuple[list[mx.array], list[str], TreeDef]:
    """Leaves (arrays), their paths, and the tree definition.

    ``names`` labels the children of a root tuple (``("args", "kwargs")`` gives paths
    like ``args[0]['k']``). Raises :class:`TraceError` for a leaf that is neither an
    array nor a static scalar, naming its path.
    """
    leaves: list[mx.array] = []
    paths: list[str] = []
    if names is not None and isinstance(tree, tuple):
        kids = tuple(_flat(v, n, leaves, paths, what) for v, n in zip(tree, names))
        return leaves, paths, TreeDef("tuple", kids)
    return leaves, paths, _flat(tree, path, leaves, paths, what)


def _flat(x: Any, p: str, leaves: list[mx.array], paths: list[str], what: str) -> TreeDef:
    """``flatten``'s recursion, a module function (as ``_build`` is ``unflatten``'s): a
    closure that calls itself is a reference cycle, and would keep a call's leaves alive
    until Python's cyclic collector runs."""
    if isinstance(x, mx.array):
        leaves.append(x)
        paths.append(p)
        return TreeDef("leaf")
    if x is None:
        return TreeDef("none")
    if isinstance(x, nn.Module):  # a dict subclass: it would flatten to its parameters
        raise TraceError(
            f"{what} {p or '<root>'} is an nn.Module ({type(x).__name__}); segc traces a module as the "
            "jitted function itself (segc.jit(module)) or closed over by it, not as an argument"
        )
    if isinstance(x, tuple | list):
        named = getattr(x, "_fields", None) if isinstance(x, tuple) else None
        kids = tuple(
            _flat(v, f"{p}.{named[i]}" if named else f"{p}[{i}]", leaves, paths, what) for i, v in enumerate(x)
        )
        node = type(x) if named is not None else None
        return TreeDef("tuple" if isinstance(x, tuple) else "list", kids, node=node)
    if isinstance(x, dict):
        keys = tuple(x.keys())
        kids = tuple(_flat(x[k], f"{p}[{k!r}]", leaves, paths, what) for k in keys)
        return TreeDef("dict", kids, keys, node=type(x) if type(x) is OrderedDict else None)
    if isinstance(x, STATIC_TYPES) or (p.startswith("static") and _hashable(x)):
        return TreeDef("static", (), (static_key(x),), x)
    raise TraceError(
        f"{what} {p or '<root>'} is a {type(x).__module__}.{type(x).__qualname__}; "
        "segc traces mx.array leaves (convert with mx.array) and hashable static "
        "values (int, float, bool, str, None) inside tuples, lists and dicts"
    )


def unflatten(td: TreeDef, leaves: list[Any]) -> Any:
    return _build(td, iter(leaves))


def _build(t: TreeDef, it: Iterator[Any]) -> Any:
    """``unflatten``'s recursion (a module function: see ``_flat``)."""
    if t.kind == "leaf":
        return next(it)
    if t.kind == "static":
        return t.value
    if t.kind == "none":
        return None
    kids = [_build(c, it) for c in t.children]
    if t.kind == "tuple":
        return t.node(*kids) if t.node is not None else tuple(kids)
    if t.kind == "list":
        return kids
    return t.node(zip(t.keys, kids)) if t.node is not None else dict(zip(t.keys, kids))
