"""A quantized product of many rows as MLX's product of its dequantized weight, where a
device check finds that this keeps ``quantized_matmul``'s bytes (issue 13: the 4-bit
prefill).

On the H200 (compute capability 9), MLX 0.32 runs ``quantized_matmul`` of two rows or
more with its ``qmm_sm90`` kernel, which leaves most of the GPU idle: 41.5 us for 512
rows of a 2048 x 2048 4-bit weight, where ``x @ mx.dequantize(w).T`` (MLX's dequantize,
then its cuBLAS product) takes 10.3 us, and 193 against 33 us for the 8192-wide down
projection (``benchmarks/prefill_qmm.py``). Both dequantize each weight to the activation's
type the same way and accumulate in float32 over the inner dimension in the same order,
so at most shapes they give the same bytes; not at all of them (with 8192 inputs and 16
or 128 rows cuBLAS sums in another order). So a product is rewritten only at a shape
where :func:`same_bits` found the same bytes on the default device, over draws that
expose a change of summation order (the check runs once per shape and process, when a
graph is lowered).

The dequantized weight is a temporary of ``rows x cols`` elements of the activation's
type (four times a 4-bit weight's bytes), freed once its product has run: a prefill's
peak grows by the largest such weight and whatever MLX keeps alive in one command
buffer. One-row products (decode) keep MLX's ``qmv`` or segc's own kernels.

Setting: :data:`DEQUANTIZED_PRODUCTS`, ``"auto"`` (a CUDA GPU with MLX of the series
the check was built on, unless ``SEGC_DEQUANTIZED_PRODUCTS=0``) or ``"never"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from .. import dtypes
from ..ir import Eqn
from . import checked
from .products import cuda_wanted

DEQUANTIZED_PRODUCTS = "auto"  # read when a graph is lowered
MIN_ROWS = 64  # below this the dequantized weight's bytes can cost more than the product saves
DRAWS = 6  # half random normal, half of mixed powers of two

Key = tuple[tuple[int, ...], tuple[int, ...], str, str, int, int, bool]
Product = Callable[[mx.array, mx.array, mx.array, mx.array, int, int, bool], mx.array]


def wanted(setting: str | None = None) -> bool:
    """Whether lowering asks :func:`same_bits` at all (``setting`` defaults to
    :data:`DEQUANTIZED_PRODUCTS`)."""
    return cuda_wanted(DEQUANTIZED_PRODUCTS if setting is None else setting, "DEQUANTIZED_PRODUCTS")


def candidate(e: Eqn, avals: dict[str, tuple[tuple[int, ...], Any]]) -> Key | None:
    """The shape key of a ``QuantizedMatmul`` this could rewrite: affine quantization, a
    2-D packed weight, scales and biases of the activation's (floating) type, at least
    :data:`MIN_ROWS` rows."""
    if e.prim != "QuantizedMatmul" or len(e.ins) != 4 or len(e.args) < 4 or e.args[2] != 0:
        return None
    x, w, s, b = (avals.get(v) for v in e.ins)
    if x is None or w is None or s is None or b is None or x[1] not in ("bf16", "f16", "f32"):
        return None
    if len(w[0]) != 2 or w[1] != "u32" or s[1] != x[1] or b[1] != x[1]:
        return None
    if math.prod(x[0][:-1]) < MIN_ROWS:
        return None
    return (tuple(x[0]), tuple(w[0]), str(x[1]), str(w[1]), int(e.args[0]), int(e.args[1]), bool(e.args[3]))


def product(
    x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int, t: bool
) -> mx.array:
    """``quantized_matmul`` as MLX's product of the dequantized weight. ``x`` is made
    row-contiguous first, as ``quantized_matmul`` makes it (a no-op where it is): the
    check compared products of such rows, and a strided ``x`` could take another cuBLAS
    algorithm."""
    full = mx.dequantize(w, scales, biases, group_size=group_size, bits=bits, dtype=x.dtype)
    return mx.contiguous(x) @ (full.T if t else full)


def _draw(key: Key, seed: int) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    xshape, wshape, xdt, _, group_size, bits, _ = key
    k = mx.random.split(mx.random.key(seed), 5)
    dt = dtypes.to_mx(xdt)
    w = mx.random.randint(0, 2**31 - 1, wshape, key=k[0]).astype(mx.uint32)
    cols = wshape[1] * 32 // bits  # the packed axis unpacked
    sshape = (wshape[0], cols // group_size)
    scales = (0.05 * mx.random.normal(sshape, key=k[1])).astype(dt)
    biases = (0.05 * mx.random.normal(sshape, key=k[2])).astype(dt)
    if seed % 2:  # +-2**0..2**6: partial sums of every size, so the order shows in the bits
        e = mx.random.randint(0, 7, xshape, key=k[3]).astype(mx.float32)
        sign = mx.where(mx.random.bernoulli(0.5, xshape, key=k[4]), 1.0, -1.0)
        x = (sign * mx.power(2.0, e)).astype(dt)
    else:
        x = mx.random.normal(xshape, key=k[3]).astype(dt)
    return x, w, scales, biases


def reference(
    x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int, t: bool
) -> mx.array:
    """MLX's ``quantized_matmul``: the bytes :func:`product` must give."""
    return mx.quantized_matmul(x, w, scales, biases, transpose=t, group_size=group_size, bits=bits)


def agree(key: Key, f: Product, g: Product) -> bool:
    """Whether ``f`` and ``g`` give the same bytes on each of ``DRAWS`` draws of
    ``key``'s shapes (on the default device)."""
    group_size, bits, t = key[4], key[5], key[6]
    for seed in range(DRAWS):
        x, w, s, b = _draw(key, seed)
        a, c = f(x, w, s, b, group_size, bits, t), g(x, w, s, b, group_size, bits, t)
        mx.eval(a, c)
        if not dtypes.same_bytes(a, c):
            return False
    return True


def same_bits(key: Key) -> bool:
    """Whether :func:`product` gives ``quantized_matmul``'s bytes at ``key``'s shapes on
    the default device (the answer kept for the process)."""
    return checked.once("dequantized", key, lambda: agree(key, reference, product))


def rule(ins: list[mx.array], args: tuple, e: Eqn) -> mx.array:
    """The replay rule of a ``QuantizedMatmul`` that :func:`same_bits` let through."""
    x, w, s, b = ins
    return product(x, w, s, b, int(args[0]), int(args[1]), bool(args[3]))
