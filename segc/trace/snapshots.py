"""Copies of state objects for checking a call against eager MLX and rolling it back."""

from __future__ import annotations

from typing import Any

import mlx.core as mx


def _fresh(v: Any) -> Any:
    if isinstance(v, mx.array):
        return mx.array(v)
    if isinstance(v, list | tuple):
        out = [_fresh(x) for x in v]
        return out if isinstance(v, list) else tuple(out)
    return v


def fresh_attrs(obj: Any) -> dict[str, Any]:
    """A state object's attributes with every array a new ``mx.array`` object (eager
    ``a[...] = b`` rebinds the object it is called on) and lists copied, so code can
    mutate the object without touching the arrays the caller holds. Nested state
    objects are kept: they are state objects of the call themselves."""
    return {k: _fresh(v) for k, v in vars(obj).items()}


def snapshot(obj: Any) -> dict[str, Any]:
    """The attributes of a state object, lists copied, for :func:`roll_back`."""
    return {k: list(v) if isinstance(v, list) else v for k, v in vars(obj).items()}


def roll_back(obj: Any, snap: dict[str, Any]) -> None:
    obj.__dict__.clear()
    obj.__dict__.update(snap)


def observable(obj: Any) -> list[Any]:
    """What a caller can read of a cache: its offset and its ``state`` arrays."""
    out: list[Any] = [getattr(obj, "offset", None)]
    try:
        st = obj.state
    except Exception:  # a cache without a readable state: the offset must do
        return out
    stack = [st]
    while stack:
        x = stack.pop()
        if isinstance(x, list | tuple):
            stack.extend(reversed(x))
        else:
            out.append(x)
    return out
