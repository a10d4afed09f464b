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

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from . import dtypes
from .errors import UnsupportedPrimitive
from .ir import Eqn, Graph, Segment

Rule = Callable[[list[mx.array], tuple, Eqn], Any]
RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    def deco(f: Rule) -> Rule:
        for n in names:
            RULES[n] = f
        return f

    return deco


def _unary(name: str, op: Callable[[mx.array], mx.array]) -> None:
    RULES[name] = lambda ins, args, e: op(ins[0])


def _binary(name: str, op: Callable[[mx.array, mx.array], mx.array]) -> None:
    RULES[name] = lambda ins, args, e: op(ins[0], ins[1])


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
    "Sigmoid": mx.sigmoid,
    "Sign": mx.sign,
    "Sin": mx.sin,
    "Sinh": mx.sinh,
    "Square": mx.square,
    "Tan": mx.tan,
    "Tanh": mx.tanh,
    "StopGradient": mx.stop_gradient,
    "Copy": lambda x: mx.array(x),
}.items():
    _unary(_n, _op)

for _n, _op2 in {
    "Add": mx.add,
    "ArcTan2": mx.arctan2,
    "Divide": mx.divide,
    "Equal": mx.equal,
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


@rule("Broadcast")
def _broadcast(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.broadcast_to(ins[0], e.outs[0].shape)


@rule("Reshape")
def _reshape(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.reshape(ins[0], e.outs[0].shape)


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


@rule("Slice")
def _slice(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    start, stop, strides = args
    return ins[0][tuple(slice(a, b, s) for a, b, s in zip(start, stop, strides))]


@rule("Concatenate")
def _concatenate(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.concatenate(ins, axis=args[0])


@rule("Arange")
def _arange(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    start, stop, step = args
    return mx.arange(start, stop, step, dtype=dtypes.to_mx(e.outs[0].dtype))


_REDUCE = {0: mx.all, 1: mx.any, 2: mx.sum, 3: mx.prod, 4: mx.min, 5: mx.max}


@rule("Reduce")
def _reduce(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return _REDUCE[args[0]](ins[0], axis=list(args[1]), keepdims=True)


@rule("Softmax")
def _softmax(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.softmax(ins[0], axis=-1, precise=bool(args[0]))


@rule("Gather")
def _gather(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    """``Gather(axes, slice_sizes)`` over ``x`` with one index array per axis.

    MLX has no Python gather; ``x[idx...]`` with full slices elsewhere builds the same
    primitive when each gathered axis has slice size 1 and the others are whole.
    """
    x, idx = ins[0], ins[1:]
    axes, sizes = list(args[0]), list(args[1])
    ok = all(sizes[a] == 1 for a in axes) and all(sizes[d] == x.shape[d] for d in range(x.ndim) if d not in axes)
    if not ok or axes != sorted(axes):
        raise UnsupportedPrimitive("Gather", f"axes={axes} slice_sizes={sizes} has no MLX op")
    out = mx.take(x, idx[0], axis=axes[0]) if len(axes) == 1 else None
    if out is None:
        key: list[Any] = [slice(None)] * x.ndim
        for a, i in zip(axes, idx):
            key[a] = i
        out = x[tuple(key)]
    return mx.reshape(out, e.outs[0].shape)


@rule("Depends")
def _depends(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
    n = len(e.outs)
    return list(mx.depends(ins[:n], ins[n:]))


# --------------------------------------------------------------------------- driving


def check_supported(g: Graph) -> None:
    """Raise for the first equation without a rule, before anything runs."""
    where = "start"
    for e in g.eqns:
        if e.is_pseudo:
            where = str(e.args[0]) if e.args else where
            continue
        if e.prim not in RULES:
            raise UnsupportedPrimitive(
                e.prim, f"no lowering rule (equation #{e.id})", where=f"{g.name}, after boundary {where!r}"
            )


def lower_eqn(e: Eqn, ins: list[mx.array]) -> list[mx.array]:
    r = RULES.get(e.prim)
    if r is None:
        raise UnsupportedPrimitive(e.prim, f"no lowering rule (equation #{e.id})")
    out = r(ins, e.args, e)
    return list(out) if isinstance(out, list | tuple) else [out]


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
