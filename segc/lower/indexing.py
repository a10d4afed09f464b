"""Indexing primitives: gathers and scatters."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import mlx.core as mx

from ..ir import Eqn
from .prim import no_flops, rule
from .shapes import assign, describe_at

_MOVE = {"memory": "move", "flops": no_flops}
_GATHER_REBUILT = (
    "slice sizes other than 1 on a gathered axis, partial slices elsewhere, or several gathered axes "
    "not leading: a gather of single elements over every axis"
)


def _full_index(x_ndim: int, idx: Sequence[mx.array], axes: Sequence[int], sizes: Sequence[int]) -> list[mx.array]:
    """Index arrays for *every* axis of ``x``, broadcast to ``B + sizes`` (``B`` the index
    shape): element ``(b, s)`` reads/writes ``x[idx_0[b] + s_0, ..., s_d, ...]``, which is
    what Gather/Scatter with these axes and slice sizes address."""
    b = tuple(idx[0].shape) if idx else ()
    nb = len(b)
    out = []
    pos = dict(zip(axes, idx))
    for d in range(x_ndim):
        shape = [1] * (nb + x_ndim)
        shape[nb + d] = sizes[d]
        r = mx.arange(sizes[d], dtype=mx.int32).reshape(shape)
        if d in pos:
            i = pos[d]
            r = i.reshape(b + (1,) * x_ndim) + r.astype(i.dtype) if sizes[d] > 1 else i.reshape(b + (1,) * x_ndim)
        out.append(mx.broadcast_to(r, b + tuple(sizes)))
    return out


def _leading(axes: Sequence[int], sizes: Sequence[int], shape: Sequence[int]) -> bool:
    """Axes ``0..k-1``, slice size 1 on each, whole axes after: what ``x[i, j]`` builds."""
    k = len(axes)
    return (
        list(axes) == list(range(k))
        and all(sizes[a] == 1 for a in axes)
        and all(sizes[d] == shape[d] for d in range(k, len(shape)))
    )


@rule(
    "Gather",
    check=lambda e, ins: None if e.args[0] else "a Gather without index arrays has no MLX op",
    refused="no index arrays",
    rebuilt=_GATHER_REBUILT,
    **_MOVE,
)
def _gather(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    """``Gather(axes, slice_sizes)`` over ``x`` with one (broadcast) index array per axis.

    MLX has no Python gather. ``mx.take`` (one axis) and ``x[i, j, ...]`` (leading axes)
    build exactly this primitive for slice size 1 on gathered axes and whole other axes;
    any other form is rebuilt as a gather of single elements over every axis, which moves
    the same elements into the same places.
    """
    x, idx = ins[0], ins[1:]
    axes, sizes = list(args[0]), list(args[1])
    out_shape = e.outs[0].shape
    if len(axes) == 1 and sizes[axes[0]] == 1 and all(sizes[d] == x.shape[d] for d in range(x.ndim) if d != axes[0]):
        a = axes[0]
        nb = idx[0].ndim
        r = mx.take(x, idx[0], axis=a)  # x.shape[:a] + B + x.shape[a+1:]
        perm = list(range(a, a + nb)) + list(range(a)) + list(range(a + nb, r.ndim))
        return mx.reshape(mx.transpose(r, perm), out_shape)
    if _leading(axes, sizes, x.shape):
        return mx.reshape(x[tuple(idx)], out_shape)
    return mx.reshape(x[tuple(_full_index(x.ndim, idx, axes, sizes))], out_shape)


@rule(
    "Scatter",
    check=lambda e, ins: None if e.args[1] else "a Scatter without index arrays has no MLX op",
    refused="no index arrays",
    rebuilt="scattered axes not leading, or partial slices: a scatter of single elements over every axis",
    describe=describe_at,
    **_MOVE,
)
def _scatter(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    """``Scatter(reduce, axes)``: ``x``, one index array per axis, updates ``B + S``."""
    x, idx, u = ins[0], ins[1:-1], ins[-1]
    reduce, axes = args[0], list(args[1])
    nb = idx[0].ndim if idx else 0
    sizes = list(u.shape[nb:])
    if _leading(axes, sizes, x.shape):
        # x.at[i, j] expects updates of shape B + x.shape[k:], and reshapes them back
        u2 = mx.reshape(u, tuple(u.shape[:nb]) + tuple(x.shape[len(axes) :]))
        return assign(x, tuple(idx), u2, reduce)
    return assign(x, tuple(_full_index(x.ndim, idx, axes, sizes)), u, reduce)


@rule("GatherAxis")
def _gather_axis(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.take_along_axis(ins[0], ins[1], axis=args[0])


@rule(
    "ScatterAxis",
    rebuilt="Sum: a Scatter(Sum) of single elements, in the same order",
    describe=lambda a: "assign" if a[0] == 1 else "add",
)
def _scatter_axis(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    x, idx, u = ins
    reduce, axis = args
    if reduce == 1:  # None
        return mx.put_along_axis(x, idx, u, axis=axis)
    # ScatterAxis(Sum) has no Python op (it is take_along_axis's VJP): scatter-add the
    # same updates element by element, in the same order
    key = []
    for d in range(x.ndim):
        if d == axis:
            key.append(idx)
        else:
            shape = [1] * idx.ndim
            shape[d] = idx.shape[d]
            key.append(mx.broadcast_to(mx.arange(idx.shape[d], dtype=mx.int32).reshape(shape), idx.shape))
    return x.at[tuple(key)].add(u)


def _check_masked_scatter(e: Eqn, ins: list) -> str | None:
    if ins[0].shape[:1] != (1,) or ins[2].shape[:1] != (1,) or len(ins[2].shape) != 2:
        return "a batch of more than one (Python's x[mask] = v makes a batch of one)"
    return None


@rule(
    "MaskedScatter",
    check=_check_masked_scatter,
    refused="a batch of more than one",
    memory="move",
    flops=no_flops,
)
def _masked_scatter(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    """``x[mask] = v``: Python's assignment expands ``x``, ``mask`` and the flattened
    values by a leading axis of one and makes this primitive of them, so it is made
    again from the rows, and the axis put back."""
    x, mask, values = ins
    if values.size == 0:  # nothing to write (MLX's kernel would divide by zero on it)
        return mx.array(x)
    y = copy.copy(x[0])  # a new handle: __setitem__ rebinds only it
    y[mask[0]] = values[0]
    return mx.expand_dims(y, 0)
