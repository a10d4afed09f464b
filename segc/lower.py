"""Lowering: rebuild each traced primitive with the MLX op that creates it.

One table, :data:`RULES`, maps a primitive's name to a rule
``rule(ins, args, eqn) -> array | list[array]``; ``args`` is the primitive's exported
state (see ``mlx/primitives.h``: ``state()``) in canonical form (tuples, ``DTypeArg``).
A primitive with no rule raises :class:`segc.UnsupportedPrimitive`; the whole graph is
checked before anything runs (:func:`check_supported`).

Each rule must build *the same primitive* the trace recorded (same kernel, same
arguments), so replaying a segment is bit-identical to running the model eagerly.
Inputs arrive already broadcast and cast: the trace records those steps as their own
primitives.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from . import dtypes
from .errors import UnsupportedPrimitive
from .ir import Eqn, Graph, Segment, Var

Rule = Callable[[list[mx.array], tuple, Eqn], Any]
RULES: dict[str, Rule] = {}

# How a rule relates to the primitive it replaces (docs/lowering.md lists both kinds;
# the tests retrace every rule and check it):
# - exact: the rule calls the MLX op that creates the same primitive with the same state.
# - REBUILT[name] says when no MLX Python op creates the primitive with that state, so
#   the rule computes the same values another way: by pure data movement, as a boolean
#   result, or as a constant computed the way the primitive computes it. The bits
#   cannot differ.
REBUILT: dict[str, str] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    def deco(f: Rule) -> Rule:
        for n in names:
            RULES[n] = f
        return f

    return deco


def _unsupported(e: Eqn, why: str) -> UnsupportedPrimitive:
    return UnsupportedPrimitive(e.prim, f"{why} (equation #{e.id}, arguments {list(e.args)})")


def _unary(name: str, op: Callable[[mx.array], mx.array]) -> None:
    RULES[name] = lambda ins, args, e: op(ins[0])


def _binary(name: str, op: Callable[[mx.array, mx.array], mx.array]) -> None:
    RULES[name] = lambda ins, args, e: op(ins[0], ins[1])


# --------------------------------------------------------------------------- elementwise

for _n, _op in {
    "Abs": mx.abs,
    "ArcCos": mx.arccos,
    "ArcCosh": mx.arccosh,
    "ArcSin": mx.arcsin,
    "ArcSinh": mx.arcsinh,
    "ArcTan": mx.arctan,
    "ArcTanh": mx.arctanh,
    "Ceil": mx.ceil,
    "Conjugate": mx.conjugate,
    "Cos": mx.cos,
    "Cosh": mx.cosh,
    "Erf": mx.erf,
    "ErfInv": mx.erfinv,
    "Exp": mx.exp,
    "Expm1": mx.expm1,
    "Floor": mx.floor,
    "Imag": mx.imag,
    "Log1p": mx.log1p,
    "LogicalNot": mx.logical_not,
    "Negative": mx.negative,
    "Real": mx.real,
    "Round": mx.round,
    "Sigmoid": mx.sigmoid,
    "Sign": mx.sign,
    "Sin": mx.sin,
    "Sinh": mx.sinh,
    "Square": mx.square,
    "Tan": mx.tan,
    "Tanh": mx.tanh,
    "StopGradient": mx.stop_gradient,
}.items():
    _unary(_n, _op)

for _n, _op2 in {
    "Add": mx.add,
    "ArcTan2": mx.arctan2,
    "Divide": mx.divide,
    "Greater": mx.greater,
    "GreaterEqual": mx.greater_equal,
    "Less": mx.less,
    "LessEqual": mx.less_equal,
    "LogAddExp": mx.logaddexp,
    "LogicalAnd": mx.logical_and,
    "LogicalOr": mx.logical_or,
    "Maximum": mx.maximum,
    "Minimum": mx.minimum,
    "Multiply": mx.multiply,
    "NotEqual": mx.not_equal,
    "Power": mx.power,
    "Remainder": mx.remainder,
    "Subtract": mx.subtract,
    "FloorDivide": mx.floor_divide,
    "Matmul": mx.matmul,
}.items():
    _binary(_n, _op2)


@rule("Copy")
def _copy(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    # MLX's Python API has no op that makes a Copy; its value is its input's
    return ins[0]


REBUILT["Slice"] = "a stop before the front (negative): restated from the element count"
REBUILT["SliceUpdate"] = REBUILT["Slice"]
REBUILT["Copy"] = "always: returns its input (no Python op makes a Copy)"


@rule("Equal")
def _equal(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    a, b = ins
    if not (args and args[0]):
        return mx.equal(a, b)
    # Equal(equal_nan=True) exists in Python only inside mx.array_equal's reduction;
    # its boolean result is rebuilt from ops with the same truth table.
    return mx.logical_or(mx.equal(a, b), mx.logical_and(mx.isnan(a), mx.isnan(b)))


REBUILT["Equal"] = "equal_nan=True: (a == b) | (isnan(a) & isnan(b)), a boolean"

_BITWISE = {
    0: mx.bitwise_and,
    1: mx.bitwise_or,
    2: mx.bitwise_xor,
    3: mx.left_shift,
    4: mx.right_shift,
}


@rule("BitwiseBinary")
def _bitwise(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return _BITWISE[args[0]](ins[0], ins[1])


@rule("DivMod")
def _divmod(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
    return list(mx.divmod(ins[0], ins[1]))


@rule("Sqrt")
def _sqrt(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.rsqrt(ins[0]) if args and args[0] else mx.sqrt(ins[0])


@rule("Log")
def _log(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    base = args[0] if args else 2
    return {0: mx.log2, 1: mx.log10, 2: mx.log}[base](ins[0])


@rule("Select")
def _select(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.where(ins[0], ins[1], ins[2])


@rule("AsType")
def _astype(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return ins[0].astype(dtypes.to_mx(args[0].name))


@rule("View")
def _view(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return ins[0].view(dtypes.to_mx(args[0].name))


@rule("Hadamard")
def _hadamard(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.hadamard_transform(ins[0], scale=args[0])


# --------------------------------------------------------------------------- shapes


@rule("Broadcast")
def _broadcast(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.broadcast_to(ins[0], e.outs[0].shape)


@rule("Reshape")
def _reshape(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.reshape(ins[0], list(args[0]) if args else e.outs[0].shape)


@rule("Transpose")
def _transpose(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.transpose(ins[0], list(args[0]))


@rule("ExpandDims")
def _expand_dims(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.expand_dims(ins[0], list(args[0]))


@rule("Squeeze")
def _squeeze(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.squeeze(ins[0], list(args[0]))


@rule("Flatten")
def _flatten(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.flatten(ins[0], args[0], args[1])


@rule("Unflatten")
def _unflatten(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.unflatten(ins[0], args[0], list(args[1]))


@rule("AsStrided")
def _as_strided(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    shape, strides, offset = args
    return mx.as_strided(ins[0], list(shape), list(strides), offset)


def _slices(args: tuple, counts: Sequence[int]) -> tuple[slice, ...]:
    """Python slices taking ``counts[d]`` elements from ``start[d]`` by ``strides[d]``.

    MLX states a slice after normalising it; a non-negative stop means what it means in
    Python, but a reversed slice running to the front has ``stop = -n - 1``, which
    Python's slice cannot restate: there the element count (the output shape) is used."""
    start, stop, strides = args
    out = []
    for a, b, s, n in zip(start, stop, strides, counts):
        if b >= 0:
            out.append(slice(a, b, s))
        elif n == 0:
            out.append(slice(0, 0, 1))
        else:
            end = a + s * n
            out.append(slice(a, None if end < 0 else end, s))
    return tuple(out)


@rule("Slice")
def _slice(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return ins[0][_slices(args, e.outs[0].shape)]


_AT = {0: "maximum", 1: "minimum", 2: "add", 3: "multiply"}  # SliceUpdate / Scatter reduce types
_NONE = 4


@rule("SliceUpdate")
def _slice_update(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    x, u = ins
    key = _slices(args[1:], u.shape)
    if args[0] == _NONE:
        y = copy.copy(x)  # a new handle on the same array: __setitem__ rebinds only it
        y[key] = u
        return y
    return getattr(x.at[key], _AT[args[0]])(u)


@rule("DynamicSlice")
def _dynamic_slice(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.slice(ins[0], ins[1], list(args[0]), list(args[1]))


@rule("DynamicSliceUpdate")
def _dynamic_slice_update(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.slice_update(ins[0], ins[1], ins[2], list(args[0]))


@rule("Concatenate")
def _concatenate(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.concatenate(ins, axis=args[0])


@rule("Split")
def _split(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
    return list(mx.split(ins[0], list(args[0]), axis=args[1]))


@rule("Pad")
def _pad(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    x, value = ins
    axes, lo, hi = args
    width = [(0, 0)] * x.ndim
    for a, low, high in zip(axes, lo, hi):
        width[a] = (low, high)
    # mx.pad states every axis; a Pad over fewer axes moves the same elements
    return mx.pad(x, width, constant_values=value)


@rule("Full")
def _full(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    o = e.outs[0]
    return mx.full(o.shape, ins[0], dtype=dtypes.to_mx(o.dtype))


@rule("Arange")
def _arange(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    start, stop, step = args
    return mx.arange(start, stop, step, dtype=dtypes.to_mx(e.outs[0].dtype))


@rule("NumberOfElements")
def _number_of_elements(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    axes, inverted, dt = args
    shape = ins[0].shape
    n = float(math.prod(shape[a] for a in axes))
    # NumberOfElements::eval casts the (inverted) count held in a double to the dtype
    return mx.array(1.0 / n if inverted else n, dtype=dtypes.to_mx(dt.name))


REBUILT["NumberOfElements"] = "always: a constant computed from the static shape as its eval does"

# --------------------------------------------------------------------------- reductions

_REDUCE = {0: mx.all, 1: mx.any, 2: mx.sum, 3: mx.prod, 4: mx.min, 5: mx.max}


@rule("Reduce")
def _reduce(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return _REDUCE[args[0]](ins[0], axis=list(args[1]), keepdims=True)


@rule("ArgReduce")
def _arg_reduce(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    op = mx.argmax if args[0] == 1 else mx.argmin
    return op(ins[0], axis=args[1], keepdims=True)


_SCAN = {0: mx.cummax, 1: mx.cummin, 2: mx.cumsum, 3: mx.cumprod, 4: mx.logcumsumexp}


@rule("Scan")
def _scan(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    kind, axis, reverse, inclusive = args
    return _SCAN[kind](ins[0], axis=axis, reverse=reverse, inclusive=inclusive)


@rule("Softmax")
def _softmax(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.softmax(ins[0], axis=-1, precise=bool(args[0]))


@rule("LogSumExp")
def _logsumexp(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.logsumexp(ins[0], axis=-1, keepdims=True)


@rule("Sort")
def _sort(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.sort(ins[0], axis=args[0])


@rule("ArgSort")
def _argsort(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.argsort(ins[0], axis=args[0])


@rule("Partition")
def _partition(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.partition(ins[0], args[0], axis=args[1])


@rule("ArgPartition")
def _argpartition(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.argpartition(ins[0], args[0], axis=args[1])


# --------------------------------------------------------------------------- indexing


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


@rule("Gather")
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
    if not axes:
        raise _unsupported(e, "a Gather without index arrays has no MLX op")
    if len(axes) == 1 and sizes[axes[0]] == 1 and all(sizes[d] == x.shape[d] for d in range(x.ndim) if d != axes[0]):
        a = axes[0]
        nb = idx[0].ndim
        r = mx.take(x, idx[0], axis=a)  # x.shape[:a] + B + x.shape[a+1:]
        perm = list(range(a, a + nb)) + list(range(a)) + list(range(a + nb, r.ndim))
        return mx.reshape(mx.transpose(r, perm), out_shape)
    if _leading(axes, sizes, x.shape):
        return mx.reshape(x[tuple(idx)], out_shape)
    return mx.reshape(x[tuple(_full_index(x.ndim, idx, axes, sizes))], out_shape)


REBUILT["Gather"] = (
    "slice sizes other than 1 on a gathered axis, partial slices elsewhere, or several gathered axes "
    "not leading: a gather of single elements over every axis"
)


def _scatter_into(x: mx.array, key: tuple, u: mx.array, reduce: int) -> mx.array:
    if reduce == _NONE:
        y = copy.copy(x)
        y[key] = u
        return y
    return getattr(x.at[key], _AT[reduce])(u)


@rule("Scatter")
def _scatter(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    """``Scatter(reduce, axes)``: ``x``, one index array per axis, updates ``B + S``."""
    x, idx, u = ins[0], ins[1:-1], ins[-1]
    reduce, axes = args[0], list(args[1])
    nb = idx[0].ndim if idx else 0
    sizes = list(u.shape[nb:])
    if not axes:
        raise _unsupported(e, "a Scatter without index arrays has no MLX op")
    if _leading(axes, sizes, x.shape):
        # x.at[i, j] expects updates of shape B + x.shape[k:], and reshapes them back
        u2 = mx.reshape(u, tuple(u.shape[:nb]) + tuple(x.shape[len(axes) :]))
        return _scatter_into(x, tuple(idx), u2, reduce)
    return _scatter_into(x, tuple(_full_index(x.ndim, idx, axes, sizes)), u, reduce)


REBUILT["Scatter"] = "scattered axes not leading, or partial slices: a scatter of single elements over every axis"


@rule("GatherAxis")
def _gather_axis(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.take_along_axis(ins[0], ins[1], axis=args[0])


@rule("ScatterAxis")
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


REBUILT["ScatterAxis"] = "Sum: a Scatter(Sum) of single elements, in the same order"

# --------------------------------------------------------------------------- matmuls

_QMODE = {0: "affine", 1: "mxfp4", 2: "mxfp8", 3: "nvfp4"}


@rule("AddMM")
def _addmm(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    a, b, c = ins
    return mx.addmm(c, a, b, alpha=args[0], beta=args[1])


def _sorted_indices(li: mx.array, ri: mx.array, left_sorted: bool, right_sorted: bool) -> tuple[Any, Any, bool]:
    """``gather_mm``/``gather_qmm`` state ``right_sorted = sorted_indices and no
    lhs_indices were given`` (and the converse): the recorded index that was the default
    arange is passed as None again, so the op rebuilds it and states the same flags."""
    if left_sorted and right_sorted:
        return None, None, True
    if right_sorted:
        return None, ri, True
    if left_sorted:
        return li, None, True
    return li, ri, False


@rule("GatherMM")
def _gather_mm(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    a, b, li, ri = ins
    li2, ri2, srt = _sorted_indices(li, ri, *map(bool, args))
    return mx.gather_mm(a, b, li2, ri2, sorted_indices=srt)


def _quant_inputs(e: Eqn, ins: list[mx.array], mode: int, n_before: int, n_after: int) -> list[Any]:
    """Split (x, w, scales, [biases], *rest): biases exist for the affine mode only."""
    has_bias = mode == 0
    want = n_before + 1 + has_bias + n_after
    if len(ins) != want:
        raise _unsupported(e, f"{len(ins)} inputs for mode {_QMODE.get(mode, mode)!r}, expected {want}")
    head = ins[: n_before + 1]
    biases = ins[n_before + 1] if has_bias else None
    return [*head, biases, *ins[n_before + 1 + has_bias :]]


@rule("QuantizedMatmul")
def _quantized_matmul(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    group_size, bits, mode, transpose = args
    x, w, scales, biases = _quant_inputs(e, ins, mode, 2, 0)
    return mx.quantized_matmul(
        x, w, scales, biases, transpose=bool(transpose), group_size=group_size, bits=bits, mode=_QMODE[mode]
    )


@rule("GatherQMM")
def _gather_qmm(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    group_size, bits, mode, transpose, left_sorted, right_sorted = args
    x, w, scales, biases, li, ri = _quant_inputs(e, ins, mode, 2, 2)
    li2, ri2, srt = _sorted_indices(li, ri, bool(left_sorted), bool(right_sorted))
    return mx.gather_qmm(
        x,
        w,
        scales,
        biases,
        li2,
        ri2,
        transpose=bool(transpose),
        group_size=group_size,
        bits=bits,
        mode=_QMODE[mode],
        sorted_indices=srt,
    )


@rule("Quantize")
def _quantize(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array | list[mx.array]:
    group_size, bits, mode, dequantize = args
    if not dequantize:
        if len(ins) != 1:
            raise _unsupported(e, "quantizing with a global scale is not rebuilt")
        return list(mx.quantize(ins[0], group_size=group_size, bits=bits, mode=_QMODE[mode]))
    w, scales, biases = _quant_inputs(e, ins, mode, 1, 0)
    return mx.dequantize(
        w, scales, biases, group_size=group_size, bits=bits, mode=_QMODE[mode], dtype=dtypes.to_mx(e.outs[0].dtype)
    )


@rule("Convolution")
def _convolution(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    strides, lo, hi, kdil, idil, groups, flip = args
    return mx.conv_general(
        ins[0],
        ins[1],
        stride=list(strides),
        padding=(list(lo), list(hi)),
        kernel_dilation=list(kdil),
        input_dilation=list(idil),
        groups=groups,
        flip=bool(flip),
    )


# --------------------------------------------------------------------------- fast (whole on the GPU)


@rule("RMSNorm")
def _rms_norm(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    x, w = ins
    # no weight is passed as the scalar 1 that mx.fast.rms_norm makes for None
    return mx.fast.rms_norm(x, w if w.ndim == 1 else None, args[0])


@rule("LayerNorm")
def _layer_norm(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    x, w, b = ins
    return mx.fast.layer_norm(x, w if w.ndim == 1 else None, b if b.ndim == 1 else None, args[0])


@rule("RoPE")
def _rope(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    dims, traditional, base, scale, forward = args
    if not forward:
        raise _unsupported(e, "the inverse rotation (RoPE's VJP) has no MLX op")
    x, offset = ins[0], ins[1]
    if len(ins) == 3:
        return mx.fast.rope(x, dims, traditional=bool(traditional), base=None, scale=scale, offset=offset, freqs=ins[2])
    return mx.fast.rope(x, dims, traditional=bool(traditional), base=base, scale=scale, offset=offset)


@rule("ScaledDotProductAttention")
def _sdpa(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    scale, causal, has_sinks, output_lse, force_fused = [*args, False][:5]
    if output_lse:
        raise _unsupported(e, "the logsumexp output is made only under a gradient trace")
    q, k, v = ins[:3]
    rest = ins[3:]
    sinks = rest.pop() if has_sinks else None
    if causal and rest:
        raise _unsupported(e, "a causal attention with an array mask")
    mask: Any = "causal" if causal else (rest[0] if rest else None)
    return mx.fast.scaled_dot_product_attention(
        q, k, v, scale=scale, mask=mask, sinks=sinks, force_fused=bool(force_fused)
    )


# --------------------------------------------------------------------------- random, markers


@rule("RandomBits")
def _random_bits(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    """``RandomBits(shape, width)``: Python exposes it only as ``mx.random.split(key, n)``
    (shape ``(n, 2)``, width 4). The bits depend only on the key and the number of 32-bit
    words, so any output of an even whole number of words is split's, viewed and reshaped."""
    shape, width = args
    (key,) = ins
    nbytes = math.prod(shape) * width
    if key.shape != (2,) or nbytes % 8 != 0:
        raise _unsupported(e, "only random bits of an even number of 32-bit words (per key) can be rebuilt")
    words = mx.random.split(key, nbytes // 8)
    if nbytes == 0:
        return mx.zeros(tuple(shape), dtype=dtypes.to_mx(e.outs[0].dtype))
    return mx.reshape(words.view(dtypes.to_mx(e.outs[0].dtype)), tuple(shape))


REBUILT["RandomBits"] = "not (n, 2) of width 4: mx.random.split's words, viewed and reshaped"


@rule("Depends")
def _depends(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
    n = len(e.outs)
    return list(mx.depends(ins[:n], ins[n:]))


# Known primitives that no rule handles, and why: UnsupportedPrimitive says so.
UNSUPPORTED: dict[str, str] = {
    "BlockMaskedMM": "its state (block size) does not say which of its optional mask inputs are present",
    "Contiguous": "MLX cannot export it (no state)",
    "BitwiseInvert": "MLX cannot export it (no state)",
    "CumLogAddExp": "MLX cannot export it (mx.logcumsumexp)",
    "CustomTransforms": "MLX cannot export it",
    "Load": "an unevaluated lazy array from mx.load: evaluate the weights before tracing",
    "QQMatmul": "MLX cannot export it",
    "GatherQQMM": "MLX cannot export it",
    "SegmentedMM": "MLX cannot export it",
    "LUF": "MLX cannot export it",
    "BroadcastAxes": "no Python op builds it; it appears only inside MLX's own shapeless compile",
    "MaskedScatter": "no rule yet: boolean-mask assignment (x[mask] = v)",
    "SearchSorted": "no rule yet",
    "FFT": "no rule yet (mx.fft ops; CPU only)",
    "QRF": "no rule yet (linalg, CPU only)",
    "SVD": "no rule yet (linalg, CPU only)",
    "Inverse": "no rule yet (linalg, CPU only)",
    "Cholesky": "no rule yet (linalg, CPU only)",
    "Eig": "no rule yet (linalg, CPU only)",
    "Eigh": "no rule yet (linalg, CPU only)",
}


# --------------------------------------------------------------------------- pre-checks

Check = Callable[[Eqn, list[Var]], "str | None"]


def _check_random_bits(e: Eqn, ins: list[Var]) -> str | None:
    shape, width = e.args
    if ins[0].shape != (2,) or (math.prod(shape) * width) % 8 != 0:
        return "only random bits of an even number of 32-bit words (per key) can be rebuilt"
    return None


def _check_quant(n_before: int, n_after: int, mode_at: int) -> Check:
    def check(e: Eqn, ins: list[Var]) -> str | None:
        mode = e.args[mode_at]
        if mode not in _QMODE:
            return f"unknown quantization mode {mode}"
        want = n_before + 1 + (mode == 0) + n_after
        if len(ins) != want:
            return f"{len(ins)} inputs for mode {_QMODE[mode]!r}, expected {want} (a global scale is not rebuilt)"
        return None

    return check


def _check_sdpa(e: Eqn, ins: list[Var]) -> str | None:
    _, causal, has_sinks, output_lse = e.args[:4]
    if output_lse:
        return "the logsumexp output is made only under a gradient trace"
    if causal and len(ins) > 3 + bool(has_sinks):
        return "a causal attention with an array mask"
    return None


# Conditions under which a rule cannot rebuild its primitive; checked before anything
# runs. REFUSED says the same in words (docs/lowering.md).
REFUSED: dict[str, str] = {
    "RandomBits": "the output is not an even number of 32-bit words per key",
    "QuantizedMatmul": "an unknown quantization mode, or inputs beyond (x, w, scales[, biases]) (a global scale)",
    "GatherQMM": "an unknown quantization mode, or a global scale input",
    "RoPE": "forward=False (the VJP's inverse rotation)",
    "ScaledDotProductAttention": "it outputs the logsumexp (gradient traces only); causal with an array mask",
    "Gather": "no index arrays",
    "Scatter": "no index arrays",
}
CHECKS: dict[str, Check] = {
    "RandomBits": _check_random_bits,
    "QuantizedMatmul": _check_quant(2, 0, 2),
    "GatherQMM": _check_quant(2, 2, 2),
    "RoPE": lambda e, ins: None if e.args[4] else "the inverse rotation (RoPE's VJP) has no MLX op",
    "ScaledDotProductAttention": _check_sdpa,
    "Gather": lambda e, ins: None if e.args[0] else "a Gather without index arrays has no MLX op",
    "Scatter": lambda e, ins: None if e.args[1] else "a Scatter without index arrays has no MLX op",
}


# --------------------------------------------------------------------------- driving


def check_supported(g: Graph) -> None:
    """Raise for the first equation without a rule, or whose arguments its rule cannot
    rebuild (:data:`CHECKS`), before anything runs."""
    where = "start"
    vs = g.vars()
    for e in g.eqns:
        if e.is_pseudo:
            where = str(e.args[0]) if e.args else where
            continue
        at = f"{g.name}, after boundary {where!r}"
        if e.prim not in RULES:
            why = UNSUPPORTED.get(e.prim, "no lowering rule")
            raise UnsupportedPrimitive(e.prim, f"{why} (equation #{e.id})", where=at)
        check = CHECKS.get(e.prim)
        reason = check(e, [vs[v] for v in e.ins]) if check is not None else None
        if reason is not None:
            raise UnsupportedPrimitive(e.prim, f"{reason} (equation #{e.id}, arguments {list(e.args)})", where=at)


def segment_fn(g: Graph, seg: Segment) -> Callable[..., list[mx.array]]:
    """A function of the segment's inputs returning its outputs, replaying its equations."""
    consts = {c.var.name: c.value for c in g.consts}
    eqns = seg.eqns(g)
    in_names, out_names = seg.inputs, seg.outputs
    return replay_fn(eqns, in_names, out_names, consts)


def replay_fn(
    eqns: Sequence[Eqn], in_names: Sequence[str], out_names: Sequence[str], consts: dict[str, Any]
) -> Callable[..., list[mx.array]]:
    plan = [(RULES[e.prim], e, e.ins, tuple(o.name for o in e.outs)) for e in eqns]

    def run(*xs: mx.array) -> list[mx.array]:
        env: dict[str, Any] = dict(consts)
        env.update(zip(in_names, xs))
        for r, e, ins, outs in plan:
            res = r([env[v] for v in ins], e.args, e)
            if isinstance(res, mx.array):
                env[outs[0]] = res
            else:
                env.update(zip(outs, res))
        return [env[v] for v in out_names]

    return run
