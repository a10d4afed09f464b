"""The layout MLX gives a view: its strides and flags, and whether a reshape copies.

MLX makes a view (a slice, a transpose, a reshape, ...) by sharing its input's buffer
with new strides, and sets two flags that decide what later views cost: ``row``
(row-contiguous, MLX's ``flags().row_contiguous``: axes of size 1 are ignored, so a
slice of columns of a one-row matrix keeps it) and ``holes`` (not MLX's
``flags().contiguous``: a slice that skips elements). A reshape of a row-contiguous
value is a view; of another, it is a view where the new shape splits and merges the
input's contiguous runs of axes (MLX's ``prepare_reshape`` over its one-array
``collapse_contiguous_dims``, which skips axes of size 1), else a copy. :func:`view_layout` follows MLX's rules for
each view primitive (``mlx/backend/common/common.cpp``, ``slicing.cpp``,
``utils.h``'s ``check_contiguity``), so the analyses count the copies MLX makes and no
others: a reshape of a transposed matrix copies; a reshape of a slice of one row's
columns (a concatenated q, k and v product's) does not. Strides are in elements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..ir import Eqn

_INT32_MAX = 2**31 - 1  # collapse_contiguous_dims' default size_cap


@dataclass(frozen=True, slots=True)
class Layout:
    strides: tuple[int, ...]
    row: bool  # row-contiguous
    holes: bool  # a slice skipped elements (MLX's ``contiguous`` flag unset)


def dense(shape: Sequence[int]) -> Layout:
    """A buffer of its own, row-major."""
    strides, s = [], 1
    for n in reversed(shape):
        strides.append(s)
        s *= n
    return Layout(tuple(reversed(strides)), True, False)


def check_contiguity(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, bool]:
    """MLX's ``check_contiguity``: the data a view covers without its broadcast axes,
    and whether it is row-contiguous (axes of size 1 ignored)."""
    size, b, row = 1, 1, True
    for n, st in zip(reversed(shape), reversed(strides)):
        row &= st == b or n == 1
        b *= n
        if st > 0:
            size *= n
    return size, row


def _collapse(shape: Sequence[int], strides: Sequence[int]) -> tuple[list[int], list[int]]:
    """MLX's one-array ``collapse_contiguous_dims`` (``utils.cpp``, what ``prepare_reshape``
    calls) as MLX 0.32.4 runs it: axes of size 1 skipped, the first too, and each other
    axis merged into the run before it where its stride times its size is that run's
    stride (and the run stays within ``int32``), else a run of its own. (MLX 0.32.2's
    source kept a first axis of size 1, which 0.32.4 reshapes as a view without copying:
    ``tests/test_analysis_mlx.py``; the several-array form MLX's kernels use breaks a run
    at an axis of size 1, which a reshape's does not.)"""
    out_shape: list[int] = []
    out_strides: list[int] = []
    for n, st in zip(shape, strides):
        if n == 1:
            continue
        if not out_shape or st * n != out_strides[-1] or out_shape[-1] * n > _INT32_MAX:
            out_shape.append(n)
            out_strides.append(st)
        else:
            out_shape[-1] *= n
            out_strides[-1] = st
    return out_shape, out_strides


def _reshape(src: Layout, in_shape: Sequence[int], out_shape: Sequence[int]) -> Layout | None:
    """MLX's ``prepare_reshape``: the view's layout, or None where it copies."""
    if src.row or math.prod(in_shape) == 0:
        return dense(out_shape)
    if not in_shape:
        return Layout(tuple(0 for _ in out_shape), src.row, src.holes)
    shape, strides = _collapse(in_shape, src.strides)
    out: list[int] = []
    j = 0
    for n in out_shape:
        if j < len(shape) and shape[j] % n == 0:
            shape[j] //= n
            out.append(shape[j] * strides[j])
            j += shape[j] == 1
        elif n == 1:
            out.append(out[-1] if out else 0)
        else:
            return None
    return Layout(tuple(out), src.row, src.holes)


def view_layout(e: Eqn, src: Layout, in_shape: Sequence[int], out_shape: Sequence[int]) -> Layout | None:
    """The layout of ``e``'s output, a view of a value of ``in_shape`` laid out as
    ``src``; None where MLX copies (a reshape it cannot make a view of). Views whose
    rules are not written here (``AsStrided``, ``Split``, ...) are taken as neither
    row-contiguous nor free of holes, and a reshape of them copies."""
    p, a = e.prim, e.args
    if p in ("Reshape", "Flatten", "Unflatten"):
        return _reshape(src, in_shape, out_shape)
    if p in ("StopGradient", "Depends"):
        return src
    if p == "Transpose" and a:
        strides = tuple(src.strides[i] for i in a[0])
        broadcast = any(st == 0 and n > 1 for n, st in zip(in_shape, src.strides))
        row = check_contiguity(out_shape, strides)[1] if not src.holes and not broadcast else src.row
        return Layout(strides, row, src.holes)
    if p == "Slice" and len(a) >= 3:
        strides = tuple(st * step for st, step in zip(src.strides, a[2]))
        size, row = check_contiguity(out_shape, strides)
        span = 1 + sum(abs(st) * (n - 1) for st, n in zip(strides, out_shape))
        return Layout(strides, row, size != span)
    if p == "ExpandDims":
        strides_l = list(src.strides)
        for ax in sorted(a[0] if a and isinstance(a[0], list | tuple) else a):
            strides_l.insert(ax, 1)
        return Layout(tuple(strides_l), src.row, src.holes)
    if p == "Squeeze":
        axes = set(a[0] if a and isinstance(a[0], list | tuple) else a)
        return Layout(tuple(st for i, st in enumerate(src.strides) if i not in axes), src.row, src.holes)
    if p == "Broadcast":
        lead = (0,) * (len(out_shape) - len(in_shape))
        spread = lead + tuple(0 if n == 1 else st for n, st in zip(in_shape, src.strides))
        return Layout(spread, src.row and math.prod(out_shape) == math.prod(in_shape), src.holes)
    return Layout(dense(out_shape).strides, False, True)
