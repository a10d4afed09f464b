"""Shape and data-movement primitives: views, slices, concatenation, padding, fills."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from .. import dtypes
from ..backend import on_cuda
from ..ir import Eqn
from .prim import no_flops, rule

_VIEW = {"memory": "view", "flops": no_flops}
_VIEW_KEEP = {"memory": "view_keep", "flops": no_flops}
_RESHAPE = {"memory": "reshape", "flops": no_flops}
_MOVE = {"memory": "move", "flops": no_flops}
_SLICE_REBUILT = "a stop before the front (negative): restated from the element count"

# SliceUpdate / Scatter reduce types, and "none" (a plain assignment)
AT = {0: "maximum", 1: "minimum", 2: "add", 3: "multiply"}
NONE = 4


@rule("Copy", rebuilt="always: returns its input (no Python op makes a Copy)", **_MOVE)
def _copy(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return ins[0]


@rule("StopGradient", **_VIEW_KEEP)
def _stop_gradient(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.stop_gradient(ins[0])


@rule("Broadcast", fusible=True, **_VIEW)
def _broadcast(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.broadcast_to(ins[0], e.outs[0].shape)


@rule("Reshape", **_RESHAPE)
def _reshape(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.reshape(ins[0], list(args[0]) if args else e.outs[0].shape)


@rule("Transpose", **_VIEW)
def _transpose(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.transpose(ins[0], list(args[0]))


@rule("ExpandDims", **_VIEW_KEEP)
def _expand_dims(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.expand_dims(ins[0], list(args[0]))


@rule("Squeeze", **_VIEW_KEEP)
def _squeeze(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.squeeze(ins[0], list(args[0]))


@rule("Flatten", **_RESHAPE)
def _flatten(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.flatten(ins[0], args[0], args[1])


@rule("Unflatten", **_RESHAPE)
def _unflatten(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.unflatten(ins[0], args[0], list(args[1]))


@rule("AsStrided", **_VIEW)
def _as_strided(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    shape, strides, offset = args
    return mx.as_strided(ins[0], list(shape), list(strides), offset)


def slices(args: tuple, counts: Sequence[int]) -> tuple[slice, ...]:
    """Python slices taking ``counts[d]`` elements from ``start[d]`` by ``strides[d]``.

    MLX states a slice after normalising it; a non-negative stop means what it means in
    Python, but a reversed slice running to the front has ``stop = -n - 1``, which
    Python's slice cannot restate: there the element count (the output shape) is used.
    An empty slice is stated as one: a reversed slice whose start lies before the front
    has ``start = -1``, the last element to Python (``x[-8:1:-3]`` of five)."""
    start, stop, strides = args
    out = []
    for a, b, s, n in zip(start, stop, strides, counts):
        if n == 0:
            out.append(slice(0, 0, 1))
        elif b >= 0:
            out.append(slice(a, b, s))
        else:
            end = a + s * n
            out.append(slice(a, None if end < 0 else end, s))
    return tuple(out)


@rule("Slice", rebuilt=_SLICE_REBUILT, **_VIEW)
def _slice(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return ins[0][slices(args, e.outs[0].shape)]


def assign(x: mx.array, key: tuple, u: mx.array, reduce: int) -> mx.array:
    """``x`` with ``u`` written (or reduced) into ``x[key]``, as a new array."""
    if reduce == NONE:
        y = copy.copy(x)  # a new handle on the same array: __setitem__ rebinds only it
        y[key] = u
        return y
    return getattr(x.at[key], AT[reduce])(u)


def describe_at(a: tuple) -> str:
    """A SliceUpdate's or Scatter's reduce type in words."""
    return "assign" if a[0] == NONE else AT[a[0]]


@rule("SliceUpdate", rebuilt=_SLICE_REBUILT, describe=describe_at, **_MOVE)
def _slice_update(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    x, u = ins
    return assign(x, slices(args[1:], u.shape), u, args[0])


@rule("DynamicSlice")
def _dynamic_slice(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.slice(ins[0], ins[1], list(args[0]), list(args[1]))


# A write of one position at an array index (segc's dynamic KV cache writes each decode
# token so) costs MLX's CUDA build two kernels and about 15 us of host time: the index is
# turned into a byte offset by a kernel of its own, JIT-looked-up by name on every call
# (``compute_dynamic_offset`` in mlx/backend/cuda/slicing.cpp). A select over the buffer,
# ``where(arange == index, update, buffer)``, is one kernel that ``mx.compile`` fuses with
# the comparison, copies the same bytes, and updates a donated buffer in place; it reads
# and writes the whole buffer, so it is used only up to SELECT_WRITE_BYTES a buffer
# (docs/lowering.md). "auto": on CUDA only; "always" / "never" for tests and measurements.
SELECT_WRITE = "auto"
SELECT_WRITE_BYTES = 8 << 20


def _select_write(x: mx.array, u: mx.array, axes: Sequence[int]) -> int | None:
    """The axis of a one-position write that ``_dynamic_slice_update`` makes a select."""
    if SELECT_WRITE == "never" or len(axes) != 1 or x.nbytes > SELECT_WRITE_BYTES or u.ndim != x.ndim:
        return None
    if SELECT_WRITE == "auto" and not on_cuda():
        return None
    a = axes[0] % x.ndim
    if u.shape[a] != 1 or any(u.shape[i] != x.shape[i] for i in range(x.ndim) if i != a):
        return None
    return a


@functools.lru_cache(maxsize=64)
def _positions(n: int, dtype: mx.Dtype, shape: tuple[int, ...]) -> mx.array:
    """``arange(n)`` shaped to ``shape``, made from host data: a constant of the compiled
    segment (one buffer for every layer's write), not an ``Arange`` kernel per write."""
    return mx.array(np.arange(n).reshape(shape), dtype=dtype)


@rule(
    "DynamicSliceUpdate",
    rebuilt="on CUDA, a write of one whole position into a buffer of at most 8 MiB: a select over the buffer",
)
def _dynamic_slice_update(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    x, u, start = ins
    a = _select_write(x, u, args[0])
    if a is None:
        return mx.slice_update(x, u, start, list(args[0]))
    # (the primitive's update already has the buffer's dtype: mx.slice_update casts it)
    shape = tuple(x.shape[i] if i == a else 1 for i in range(x.ndim))
    hit = _positions(x.shape[a], start.dtype, shape) == start.reshape(())
    return mx.where(hit, u, x)


@rule("Concatenate", **_MOVE)
def _concatenate(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.concatenate(ins, axis=args[0])


@rule("Split", **_VIEW)
def _split(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
    return list(mx.split(ins[0], list(args[0]), axis=args[1]))


@rule("Pad", **_MOVE)
def _pad(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    x, value = ins
    axes, lo, hi = args
    width = [(0, 0)] * x.ndim
    for a, low, high in zip(axes, lo, hi):
        width[a] = (low, high)
    # mx.pad states every axis; a Pad over fewer axes moves the same elements
    return mx.pad(x, width, constant_values=value)


@rule("Full", **_MOVE)
def _full(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    o = e.outs[0]
    return mx.full(o.shape, ins[0], dtype=dtypes.to_mx(o.dtype))


# An integer range is made from host data: a constant of the compiled segment, not an
# Arange kernel per call (a decode step's mask makes two). Integers are exact either way.
ARANGE_CONSTANT_MAX = 1 << 16  # values; a longer range keeps MLX's kernel (no host copy)


def host_range(e: Eqn) -> tuple[int, int, int] | None:
    """``(start, step, n)`` when the ``Arange`` equation ``e`` is lowered as host data:
    an integer dtype, whole start, stop and step, at most ``ARANGE_CONSTANT_MAX`` values
    (MLX's count, the recorded shape, agreeing with Python's), every one within the
    dtype (a range that wraps is MLX's business). The cost model reads it too: such a
    range launches no kernel. Float ranges (``bf16`` included, whose NumPy holder is
    ``uint16``) always keep MLX's kernel, which rounds as eager does."""
    if e.prim != "Arange" or len(e.outs) != 1 or len(e.outs[0].shape) != 1:
        return None
    start, stop, step = e.args
    (n,) = e.outs[0].shape
    name = e.outs[0].dtype
    if not all(float(a).is_integer() for a in (start, stop, step)) or n > ARANGE_CONSTANT_MAX:
        return None
    if not dtypes.is_dtype_name(name) or not mx.issubdtype(dtypes.to_mx(name), mx.integer):
        return None  # by MLX's dtype: NumPy holds bf16's bits as u16, an integer type
    a, b, c = int(start), int(stop), int(step)
    if c == 0 or len(range(a, b, c)) != n:
        return None
    info = np.iinfo(dtypes.np_dtype(name))
    if n and not (info.min <= min(a, a + (n - 1) * c) and max(a, a + (n - 1) * c) <= info.max):
        return None
    return a, c, n


@rule(
    "Arange",
    rebuilt="an integer range with whole start and step, of at most 65536 values that fit its dtype: a constant from host data",
    **_MOVE,
)
def _arange(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    r = host_range(e)
    if r is None:
        start, stop, step = args
        return mx.arange(start, stop, step, dtype=dtypes.to_mx(e.outs[0].dtype))
    # a fresh array each time (a range another segment also makes may reach this one as
    # an input too: one object as both would confuse mx.compile), from host data
    a, c, n = r
    return mx.array((a + c * np.arange(n, dtype=np.int64)).astype(dtypes.np_dtype(e.outs[0].dtype)))


@rule("NumberOfElements", rebuilt="always: a constant computed from the static shape as its eval does")
def _number_of_elements(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    axes, inverted, dt = args
    shape = ins[0].shape
    n = float(math.prod(shape[a] for a in axes))
    # NumberOfElements::eval casts the (inverted) count held in a double to the dtype
    return mx.array(1.0 / n if inverted else n, dtype=dtypes.to_mx(dt.name))
