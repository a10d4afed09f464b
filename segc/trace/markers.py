"""Boundary markers: ``segc.boundary(x, name)``.

``segc.boundary(x, name)`` is ``mx.depends([x], [tag])`` where ``tag`` is a small uint8
constant spelling ``segc:<name>``. In eager code that is an identity; in a trace it is a
``Depends`` primitive whose tag the tracer recognises (:func:`marker_name`) and turns
into a ``segc.cut`` equation (the marker's outputs alias its inputs).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from .. import dtypes
from ..errors import TraceError
from .pytree import flatten, unflatten

_MAGIC = b"segc:"


def _tag(name: str) -> mx.array:
    # made from host data, so it is already evaluated: a constant of the trace
    return mx.array(list(_MAGIC + name.encode()), dtype=mx.uint8)


def boundary(x: Any, name: str = "boundary") -> Any:
    """Mark a segment boundary after ``x`` (an array or a pytree of arrays).

    An exact identity when run eagerly; under ``segc.jit`` the segment ends here.
    """
    if not isinstance(name, str) or not name:
        raise TraceError(f"segc.boundary: name must be a non-empty string, got {name!r}")
    leaves, _, td = flatten(x, what="segc.boundary value")
    if not leaves:
        return x
    return unflatten(td, mx.depends(leaves, [_tag(name)]))


def marker_name(value: mx.array) -> str | None:
    """The boundary name a traced constant spells, or None for an ordinary constant."""
    if value.dtype != mx.uint8 or value.ndim != 1 or value.size < len(_MAGIC):
        return None
    raw = dtypes.to_bytes(value)  # (on CUDA from a copy: the constant stays out of managed memory)
    return raw[len(_MAGIC) :].decode() if raw.startswith(_MAGIC) else None
