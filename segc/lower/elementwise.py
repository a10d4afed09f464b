"""Elementwise primitives: unary and binary math, comparisons, casts, select."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from .. import dtypes
from ..ir import Eqn
from .prim import Prim, Rule, define, rule


def _unary(op: Callable[[mx.array], mx.array]) -> Rule:
    return lambda ins, args, e: op(ins[0])


def _binary(op: Callable[..., mx.array]) -> Rule:
    return lambda ins, args, e: op(ins[0], ins[1])


for _name, _op in {
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
}.items():
    define(Prim(_name, _unary(_op), fusible=True))

_BINARY: dict[str, Callable[..., mx.array]] = {
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
}
for _name, _op2 in _BINARY.items():
    define(Prim(_name, _binary(_op2), fusible=True))

define(Prim("FloorDivide", _binary(mx.floor_divide)))


@rule("Equal", fusible=True, rebuilt="equal_nan=True: (a == b) | (isnan(a) & isnan(b)), a boolean")
def _equal(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    a, b = ins
    if not (args and args[0]):
        return mx.equal(a, b)
    # Equal(equal_nan=True) exists in Python only inside mx.array_equal's reduction;
    # its boolean result is rebuilt from ops with the same truth table.
    return mx.logical_or(mx.equal(a, b), mx.logical_and(mx.isnan(a), mx.isnan(b)))


_BITWISE = {
    0: mx.bitwise_and,
    1: mx.bitwise_or,
    2: mx.bitwise_xor,
    3: mx.left_shift,
    4: mx.right_shift,
}


@rule("BitwiseBinary", fusible=True)
def _bitwise(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return _BITWISE[args[0]](ins[0], ins[1])


@rule("DivMod")
def _divmod(ins: list[mx.array], args: tuple, e: Eqn) -> list[mx.array]:
    return list(mx.divmod(ins[0], ins[1]))


@rule("Sqrt", fusible=True, describe=lambda a: "rsqrt" if a[0] else "sqrt")
def _sqrt(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.rsqrt(ins[0]) if args and args[0] else mx.sqrt(ins[0])


@rule("Log", fusible=True, describe=lambda a: ("log2", "log10", "log")[a[0]])
def _log(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    base = args[0] if args else 2
    return {0: mx.log2, 1: mx.log10, 2: mx.log}[base](ins[0])


@rule("Select", fusible=True)
def _select(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.where(ins[0], ins[1], ins[2])


@rule("AsType", fusible=True, memory="move")
def _astype(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return ins[0].astype(dtypes.to_mx(args[0].name))


@rule("View")
def _view(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return ins[0].view(dtypes.to_mx(args[0].name))


@rule("Hadamard")
def _hadamard(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.hadamard_transform(ins[0], scale=args[0])
