"""Whether a product over concatenated weights keeps the bits of separate products.

The ``concat_projections`` pass (``segc.passes.concat``) asks this once per group shape:
both forms run on the default device on the draws below and their raw bytes are compared.
The arithmetic a kernel does depends on the shapes (which algorithm, which split of the
inner dimension), not on the values, so comparisons at one shape answer for every call of
that shape on this device; the answers are kept for the process (:func:`clear`).

Random draws are a weak test of that, which is why the draws are built to expose an
order. Two summation orders give the same float for most random inputs when a product
has few outputs and a short inner dimension, and for nearly all of them once the sum is
rounded to float16 or bfloat16 (on the H200 a float32 ``AddMM`` of 8 inputs and 1 + 1
outputs agreed on random data and differed on a model's weights; a float16 one of 96
inputs did so with sixteen random draws). So two thirds of the ``DRAWS`` draws are
*cancelling*: products of ``+-2**24`` that cancel exactly, among products of ``+-1``
that a partial sum of ``2**24`` absorbs. The result is a small integer, exact in every
float type, that counts the small terms the order kept, so two orders that differ give
different numbers in almost every draw (``tests/test_concat.py`` shows it). The
other draws are random normal values. Quantized products draw their packed weights,
scales and biases at random, with a cancelling ``x``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from .. import dtypes
from ..ir import Var

_KNOWN: dict[tuple, bool] = {}
DRAWS = 12  # a third random normal, two thirds cancelling
ROWS = 64  # distinct rows of a cancelling weight


def clear() -> None:
    _KNOWN.clear()


def _random(shape: Sequence[int], dtype: str, key: mx.array) -> mx.array:
    dt = dtypes.to_mx(dtype)
    if dt == mx.uint32:  # packed quantized weights: any bits are valid
        return mx.random.randint(0, 2**31 - 1, tuple(shape), key=key).astype(mx.uint32)
    return (0.05 * mx.random.normal(tuple(shape), key=key)).astype(dt)


def _cancelling(
    prim: str, x: Var, wshapes: Sequence[Sequence[tuple[int, ...]]], wdtypes: Sequence[str], seed: int
) -> tuple[mx.array, list[list[mx.array]]]:
    """An input and members' weights whose products are ``+-2**24`` (cancelling exactly
    in each output) and ``-1, 0, 1`` (see the module's docstring); biases small integers."""
    r = np.random.default_rng(seed)
    dim = x.shape[-1]
    big = r.random(dim) < 0.5
    row = np.where(big, 2.0**12, 1.0) * r.choice([-1.0, 1.0], dim)
    xa = mx.array(np.broadcast_to(row, x.shape)).astype(dtypes.to_mx(x.dtype))
    where = np.flatnonzero(big)
    ws: list[list[mx.array]] = []
    for m in wshapes:
        if prim == "QuantizedMatmul":
            ws.append([_random(s, d, mx.random.key(seed * 7919 + i)) for i, (s, d) in enumerate(zip(m, wdtypes))])
            continue
        # ROWS patterns, tiled on the device: enough to vary the order between outputs
        # without a host array of the whole weight
        n, k = m[0][0], len(where) // 2 * 2
        w = r.choice([-1.0, 0.0, 1.0], (min(n, ROWS), dim)).astype(np.float32)
        w[:, big] = 0.0
        for j in range(w.shape[0]):
            p = r.permutation(where)[:k]
            w[j, p] = 2.0**12 * np.sign(row[p]) * np.r_[np.ones(k // 2), -np.ones(k // 2)]
        block = mx.array(w).astype(dtypes.to_mx(wdtypes[0]))
        parts = [mx.tile(block, (-(-n // block.shape[0]), 1))[:n]]
        parts += [
            mx.array(r.integers(-4, 5, s).astype(np.float32)).astype(dtypes.to_mx(d))
            for s, d in zip(m[1:], wdtypes[1:])
        ]
        ws.append(parts)
    return xa, ws


def _product(prim: str, x: mx.array, ws: list[mx.array], args: tuple[Any, ...]) -> mx.array:
    if prim == "Matmul":
        return x @ ws[0].T
    if prim == "AddMM":
        out = (*x.shape[:-1], ws[0].shape[0])
        return mx.addmm(mx.broadcast_to(ws[1], out), x, ws[0].T, alpha=args[0], beta=args[1])
    group_size, bits = int(args[0]), int(args[1])
    return mx.quantized_matmul(x, ws[0], ws[1], ws[2], transpose=True, group_size=group_size, bits=bits)


def same_bits(
    prim: str, x: Var, wshapes: Sequence[Sequence[tuple[int, ...]]], wdtypes: Sequence[str], args: tuple[Any, ...]
) -> bool:
    """Whether one product over the members' weights concatenated along their rows gives,
    sliced, each member's product byte for byte (on the default device)."""
    key = (
        prim,
        x.shape,
        x.dtype,
        tuple(tuple(map(tuple, w)) for w in wshapes),
        tuple(wdtypes),
        args,
        str(mx.default_device()),  # an mx.Device compares by value but hashes by identity
    )
    if key in _KNOWN:
        return _KNOWN[key]
    if prim not in ("Matmul", "AddMM", "QuantizedMatmul") or (
        prim == "QuantizedMatmul" and (len(args) < 3 or args[2] != 0)
    ):
        _KNOWN[key] = False  # only the forms the pass makes, affine quantization
        return False
    ok = all(_agree(prim, x, wshapes, wdtypes, args, seed) for seed in range(DRAWS))
    _KNOWN[key] = ok
    return ok


def _agree(
    prim: str,
    x: Var,
    wshapes: Sequence[Sequence[tuple[int, ...]]],
    wdtypes: Sequence[str],
    args: tuple[Any, ...],
    seed: int,
) -> bool:
    """One draw: the concatenated product's slices against the members' own products."""
    if seed % 3:
        xa, ws = _cancelling(prim, x, wshapes, wdtypes, seed)
    else:
        keys = mx.random.split(mx.random.key(seed), 1 + len(wshapes) * len(wdtypes))
        xa = _random(x.shape, x.dtype, keys[0])
        ws = [
            [_random(s, d, keys[1 + i * len(wdtypes) + j]) for j, (s, d) in enumerate(zip(m, wdtypes))]
            for i, m in enumerate(wshapes)
        ]
    cat = [mx.concatenate([m[j] for m in ws], axis=0) for j in range(len(wdtypes))]
    y = _product(prim, xa, cat, args)
    start = 0
    for m in ws:
        ref = _product(prim, xa, m, args)
        n = ref.shape[-1]
        if not dtypes.same_bytes(y[..., start : start + n], ref):
            return False
        start += n
    return True
