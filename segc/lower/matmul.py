"""Matrix products (plain, gathered, quantized), quantization and convolution."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from .. import dtypes
from ..ir import Eqn, Var
from .prim import Check, Prim, define, matmul_flops, rule


def _conv_flops(e: Eqn, vs: dict[str, Var]) -> int:
    w = vs[e.ins[1]]
    return 2 * sum(o.size for o in e.outs) * (w.size // max(w.shape[0], 1))


define(Prim("Matmul", lambda ins, args, e: mx.matmul(ins[0], ins[1]), flops=matmul_flops))

_QMODE = {0: "affine", 1: "mxfp4", 2: "mxfp8", 3: "nvfp4"}


def _addmm_flops(e: Eqn, vs: dict[str, Var]) -> int:
    """``alpha * (a @ b) + beta * c``: the product's 2*M*N*K, then M*N for the add and
    M*N for each of ``alpha`` and ``beta`` that is not 1."""
    out = sum(o.size for o in e.outs)
    alpha, beta = (e.args[0], e.args[1]) if len(e.args) >= 2 else (1.0, 1.0)
    return matmul_flops(e, vs) + out * (1 + (alpha != 1) + (beta != 1))


@rule("AddMM", flops=_addmm_flops)
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


@rule("GatherMM", flops=matmul_flops)
def _gather_mm(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    a, b, li, ri = ins
    li2, ri2, srt = _sorted_indices(li, ri, *map(bool, args))
    return mx.gather_mm(a, b, li2, ri2, sorted_indices=srt)


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


def _quant_inputs(ins: list[mx.array], mode: int, n_before: int) -> list[Any]:
    """Split (x, w, scales, [biases], *rest) (``_check_quant`` counted them): biases
    exist for the affine mode only."""
    has_bias = mode == 0
    head = ins[: n_before + 1]
    biases = ins[n_before + 1] if has_bias else None
    return [*head, biases, *ins[n_before + 1 + has_bias :]]


@rule(
    "QuantizedMatmul",
    check=_check_quant(2, 0, 2),
    refused="an unknown quantization mode, or inputs beyond (x, w, scales[, biases]) (a global scale)",
    flops=matmul_flops,
)
def _quantized_matmul(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    group_size, bits, mode, transpose = args
    x, w, scales, biases = _quant_inputs(ins, mode, 2)
    return mx.quantized_matmul(
        x, w, scales, biases, transpose=bool(transpose), group_size=group_size, bits=bits, mode=_QMODE[mode]
    )


@rule(
    "GatherQMM",
    check=_check_quant(2, 2, 2),
    refused="an unknown quantization mode, or a global scale input",
    flops=matmul_flops,
)
def _gather_qmm(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    group_size, bits, mode, transpose, left_sorted, right_sorted = args
    x, w, scales, biases, li, ri = _quant_inputs(ins, mode, 2)
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


def _check_quantize(e: Eqn, ins: list[Var]) -> str | None:
    if e.args[3]:  # dequantize: (w, scales[, biases])
        return _check_quant(1, 0, 2)(e, ins)
    if e.args[2] not in _QMODE:
        return f"unknown quantization mode {e.args[2]}"
    return None if len(ins) == 1 else "quantizing with a global scale is not rebuilt"


@rule(
    "Quantize",
    check=_check_quantize,
    refused="an unknown quantization mode, or a global scale input",
)
def _quantize(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array | list[mx.array]:
    group_size, bits, mode, dequantize = args
    if not dequantize:
        return list(mx.quantize(ins[0], group_size=group_size, bits=bits, mode=_QMODE[mode]))
    w, scales, biases = _quant_inputs(ins, mode, 1)
    return mx.dequantize(
        w, scales, biases, group_size=group_size, bits=bits, mode=_QMODE[mode], dtype=dtypes.to_mx(e.outs[0].dtype)
    )


@rule("Convolution", flops=_conv_flops)
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
