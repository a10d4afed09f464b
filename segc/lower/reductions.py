"""Reductions, scans, softmax and sorting."""

from __future__ import annotations

import mlx.core as mx

from ..ir import Eqn
from .prim import normalize_flops, reduce_flops, rule

_REDUCE = {0: mx.all, 1: mx.any, 2: mx.sum, 3: mx.prod, 4: mx.min, 5: mx.max}
_SCAN = {0: mx.cummax, 1: mx.cummin, 2: mx.cumsum, 3: mx.cumprod, 4: mx.logcumsumexp}


@rule("Reduce", flops=reduce_flops, describe=lambda a: _REDUCE[a[0]].__name__)
def _reduce(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return _REDUCE[args[0]](ins[0], axis=list(args[1]), keepdims=True)


@rule("ArgReduce", flops=reduce_flops, describe=lambda a: "argmax" if a[0] == 1 else "argmin")
def _arg_reduce(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    op = mx.argmax if args[0] == 1 else mx.argmin
    return op(ins[0], axis=args[1], keepdims=True)


@rule("Scan", flops=reduce_flops, describe=lambda a: _SCAN[a[0]].__name__ + (" reverse" if a[2] else ""))
def _scan(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    kind, axis, reverse, inclusive = args
    return _SCAN[kind](ins[0], axis=axis, reverse=reverse, inclusive=inclusive)


@rule("Softmax", flops=normalize_flops)
def _softmax(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.softmax(ins[0], axis=-1, precise=bool(args[0]))


@rule("LogSumExp", flops=reduce_flops)
def _logsumexp(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.logsumexp(ins[0], axis=-1, keepdims=True)


@rule("Sort")
def _sort(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.sort(ins[0], axis=args[0])


@rule("ArgSort")
def _argsort(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.argsort(ins[0], axis=args[0])


@rule("SearchSorted")
def _searchsorted(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.searchsorted(ins[0], ins[1], side="right" if args[0] else "left")


@rule("Partition")
def _partition(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.partition(ins[0], args[0], axis=args[1])


@rule("ArgPartition")
def _argpartition(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    return mx.argpartition(ins[0], args[0], axis=args[1])
